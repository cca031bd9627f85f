/* JSON Lines: a batch's records, and the sizes of keys' and values' JSON texts (json.h writes them).
 *
 * json_text_sizes(section, starts, lengths, out)
 *     For each blob section[starts[i]:][:lengths[i]] (length -1: null), the length in UTF-8 of
 *     the JSON text the JSON Lines format gives it (engine.text.json_records.bytes_json_text): a
 *     string when the bytes are UTF-8 (strictly, as Python decodes), `null`, else
 *     {"base64":"..."}. Into `out` (int64). The GIL is released while it scans.
 *
 * render_json_section(section, count, base_offset, base_timestamp, log_append_time, min_offset,
 *                     prefix, timestamp_type, offsets, ends) -> (bytes, n) or None
 *     A batch's records with offsets >= `min_offset` as JSON Lines (engine.text.json_records
 *     .record_to_json's format), straight from its records section as render_text_section
 *     renders text: `prefix` (the topic and partition part, up to "offset":), the offset, the
 *     timestamp, the timestamp type, key and value as `json_text_sizes` describes them,
 *     "headers":[] and a newline; the n records' offsets and line ends into `offsets` and
 *     `ends`. None when one of those records has headers (the caller decodes them). The GIL is
 *     released while it walks, measures and writes.
 */

#include "core.h"

#include "json.h"

/* The JSON Lines of rows [0, n) of walked columns, `end[i]` where row i's line ends; NULL with an
 * exception. */
static PyObject *json_lines(const uint8_t *data, Py_ssize_t n, const int64_t *off, const int64_t *ts,
                            const int64_t *ks, const int64_t *kl, const int64_t *vs, const int64_t *vl,
                            const Py_buffer *prefix, const Py_buffer *kind, int64_t *end) {
    uint8_t *valid = PyMem_Malloc(n > 0 ? 2 * (size_t)n : 1); /* per record: key, value UTF-8 */
    if (valid == NULL) return PyErr_NoMemory();
    Py_ssize_t total;
    Py_BEGIN_ALLOW_THREADS /* (the measure pass scans every byte too) */
    total = json_lines_size(data, n, off, ts, ks, kl, vs, vl, prefix->len, kind->len, valid);
    Py_END_ALLOW_THREADS
    PyObject *result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        PyMem_Free(valid);
        return NULL;
    }
    uint8_t *base = (uint8_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    put_json_lines(base, base, data, n, off, ts, ks, kl, vs, vl, prefix->buf, prefix->len, kind->buf, kind->len, valid,
                   end);
    Py_END_ALLOW_THREADS
    PyMem_Free(valid);
    return result;
}

/* render_json_section(section, count, base_offset, base_timestamp, log_append_time, min_offset, prefix,
 *                     timestamp_type, offsets, ends) -> (bytes, n) or None
 * The JSON Lines of a batch's records with offsets >= min_offset, straight from its records section, as
 * render_text_section does for text; None when one of them has headers (rendered record by record). */
PyObject *render_json_section(PyObject *self, PyObject *args) {
    Py_buffer section, prefix, kind, offsets, ends;
    Py_ssize_t count, n;
    long long base_offset, base_timestamp, min_offset;
    PyObject *append_time_obj, *result = NULL;
    int64_t *fields = NULL;
    if (!PyArg_ParseTuple(args, "y*nLLOLy*y*w*w*", &section, &count, &base_offset, &base_timestamp, &append_time_obj,
                          &min_offset, &prefix, &kind, &offsets, &ends))
        return NULL;
    if (walk_batch(&section, count, base_offset, base_timestamp, append_time_obj, min_offset, &offsets, &ends, &fields,
                   &n) < 0)
        goto done;
    const int64_t *header_counts = fields + 7 * count;
    for (Py_ssize_t i = 0; i < n; i++)
        if (header_counts[i]) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    PyObject *lines = json_lines(section.buf, n, offsets.buf, fields + count, fields + 3 * count, fields + 4 * count,
                                 fields + 5 * count, fields + 6 * count, &prefix, &kind, ends.buf);
    if (lines != NULL) result = Py_BuildValue("(Nn)", lines, n);
done:
    PyMem_Free(fields);
    PyBuffer_Release(&section);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&kind);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&ends);
    return result;
}

PyObject *json_text_sizes(PyObject *self, PyObject *args) {
    Py_buffer section, starts, lengths, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &section, &starts, &lengths, &out)) return NULL;
    Py_ssize_t n = starts.len / 8;
    const int64_t *s = (const int64_t *)starts.buf, *l = (const int64_t *)lengths.buf;
    int failed = lengths.len < n * 8 || out.len < n * 8 || blobs_outside(s, l, n, section.len, 1);
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            ((int64_t *)out.buf)[i] = json_text_size((const uint8_t *)section.buf + (l[i] > 0 ? s[i] : 0), l[i], NULL);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&section);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&out);
    if (failed) {
        PyErr_SetString(PyExc_ValueError, "json_text_sizes: a blob lies outside the section, or the output is short");
        return NULL;
    }
    Py_RETURN_NONE;
}
