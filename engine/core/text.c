/* Console text: a batch's records as kafka-console-consumer prints them (text.h writes a line).
 *
 * render_text_section(section, count, base_offset, base_timestamp, log_append_time, min_offset,
 *                     timestamp_label, partition_field, print_offset, print_key, print_value,
 *                     separator, line_end, null, offsets, ends) -> (bytes, n)
 *     The records of a batch with offsets >= `min_offset` (each record on its own: offsets
 *     need not rise), straight from its uncompressed
 *     records section (walked as record_fields walks it; no columns are made), as
 *     kafka-console-consumer prints them, a line each: the fields shown, in its order —
 *     `timestamp_label` and the timestamp (label None: not shown; `log_append_time`, when not
 *     None, is every record's), `partition_field` (None: not shown), "Offset:" and the offset,
 *     the key, the value (`null` for a null one) — joined by `separator`, each line ended by
 *     `line_end`. The n records' offsets and line ends go into `offsets` and `ends` (int64
 *     buffers of `count`). ValueError as record_fields raises it, and for a record whose offset
 *     or timestamp (base + delta) is past int64. The GIL is released while it walks and writes.
 */

#include "core.h"

#include "text.h"

/* The lines of rows [0, n) of walked columns, `end[i]` where row i's line ends; NULL with an
 * exception. */
static PyObject *text_lines(const text_args_t *a, int have_label, int have_partition, Py_ssize_t n, const int64_t *off,
                            const int64_t *ts, const int64_t *ks, const int64_t *kl, const int64_t *vs,
                            const int64_t *vl, int64_t *end) {
    const Py_buffer *label = have_label ? &a->timestamp_label : NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, text_lines_size(a, label, have_partition, n, off, ts, kl, vl));
    if (result == NULL) return NULL;
    uint8_t *base = (uint8_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    put_text_lines(a, label, have_partition, n, a->section.buf, off, ts, ks, kl, vs, vl, base, base, end);
    Py_END_ALLOW_THREADS
    return result;
}

static void release_text_args(text_args_t *a) {
    PyBuffer_Release(&a->section);
    if (a->timestamp_label.obj) PyBuffer_Release(&a->timestamp_label);
    if (a->partition_field.obj) PyBuffer_Release(&a->partition_field);
    PyBuffer_Release(&a->separator);
    PyBuffer_Release(&a->line_end);
    PyBuffer_Release(&a->null);
}

/* render_text_section(section, count, base_offset, base_timestamp, log_append_time, min_offset, label, partition,
 *                     print_offset, print_key, print_value, separator, line_end, null, offsets, ends)
 * -> (bytes, n): the console lines of a batch's records with offsets >= min_offset, straight from its records
 * section (walked here, as record_fields walks it: no columns made); offsets[i] and ends[i] of the n lines.
 * `log_append_time`: None, or the time every record shows (a LogAppendTime batch). */
PyObject *render_text_section(PyObject *self, PyObject *args) {
    text_args_t a;
    memset(&a, 0, sizeof a);
    Py_ssize_t count, n;
    long long base_offset, base_timestamp, min_offset;
    PyObject *append_time_obj, *label_obj, *partition_obj, *result = NULL;
    Py_buffer offsets, ends;
    int64_t *fields = NULL;
    if (!PyArg_ParseTuple(args, "y*nLLOLOOpppy*y*y*w*w*", &a.section, &count, &base_offset, &base_timestamp,
                          &append_time_obj, &min_offset, &label_obj, &partition_obj, &a.print_offset, &a.print_key,
                          &a.print_value, &a.separator, &a.line_end, &a.null, &offsets, &ends))
        return NULL;
    int have_label = label_obj != Py_None, have_partition = partition_obj != Py_None;
    if (have_label && PyObject_GetBuffer(label_obj, &a.timestamp_label, PyBUF_SIMPLE) < 0) goto done;
    if (have_partition && PyObject_GetBuffer(partition_obj, &a.partition_field, PyBUF_SIMPLE) < 0) goto done;
    if (walk_batch(&a.section, count, base_offset, base_timestamp, append_time_obj, min_offset, &offsets, &ends,
                   &fields, &n) < 0)
        goto done;
    PyObject *lines = text_lines(&a, have_label, have_partition, n, offsets.buf, fields + count, fields + 3 * count,
                                 fields + 4 * count, fields + 5 * count, fields + 6 * count, ends.buf);
    if (lines != NULL) result = Py_BuildValue("(Nn)", lines, n);
done:
    PyMem_Free(fields);
    release_text_args(&a);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&ends);
    return result;
}
