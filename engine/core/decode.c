/* Decoding: a records section walked into columns (walk_record, in core.h, is Kafka's DefaultRecord
 * rules).
 *
 * record_fields(section, count, out)
 *     Walk the `count` records of an uncompressed records section and write eight int64 fields
 *     per record into `out` (a writable buffer of 8 * count int64), field by field: row k of
 *     `out` seen as an (8, count) array holds field k of every record, so each field is a
 *     contiguous column. The fields: the record's start (at its length prefix), timestamp
 *     delta, offset delta, key start, key length (-1: null), value start, value length (-1:
 *     null; any negative length is null, as Kafka reads it) and header count. Raises
 *     ValueError naming the record where engine.record.records.decode_records refuses the section
 *     (Kafka's DefaultRecord rules, `walk_record`): a count more than the section can hold at
 *     seven bytes a record, a field past its record, a varint over five bytes (over ten: the
 *     timestamp delta), a negative header count or header key length, bytes left over after a
 *     record's headers or after the last record. The GIL is released while it walks.
 */

#include "core.h"

/* Walk the records into `out`, column by column (field k of record i at out[k * count + i]); on
   failure, `*bad` is the record and `*why` a reason. */
static int walk(const uint8_t *data, Py_ssize_t size, Py_ssize_t count, int64_t *out, Py_ssize_t *bad,
                const char **why) {
    reader_t r = {data, size, 0};
    int64_t f[FIELDS];
    if (!count_fits(count, size)) { *bad = count; *why = "a record count too large for the records section"; return -1; }
    for (Py_ssize_t i = 0; i < count; i++) {
        *bad = i;
        if (walk_record(&r, f, why) != 0) return -1;
        for (int k = 0; k < FIELDS; k++) out[k * count + i] = f[k];
    }
    if (r.position != size) { *bad = count; *why = "bytes follow the last record"; return -1; }
    return 0;
}

PyObject *record_fields(PyObject *self, PyObject *args) {
    Py_buffer section, out;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*nw*", &section, &count, &out)) return NULL;
    if (count < 0 || out.len / (FIELDS * (Py_ssize_t)sizeof(int64_t)) < count) {
        PyBuffer_Release(&section);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "record_fields: the output holds fewer than 8 * count int64");
        return NULL;
    }
    Py_ssize_t bad = 0;
    const char *why = NULL;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = walk((const uint8_t *)section.buf, section.len, count, (int64_t *)out.buf, &bad, &why);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&section);
    PyBuffer_Release(&out);
    if (failed) {
        if (bad == count)
            PyErr_Format(PyExc_ValueError, "%s of the batch", why);
        else
            PyErr_Format(PyExc_ValueError, "record %zd: %s", bad, why);
        return NULL;
    }
    Py_RETURN_NONE;
}


/* A batch's records walked (as record_fields walks them) into a new array of their fields
 * (`*fields`: PyMem_Free it), those with offsets >= min_offset (each record on its own, as Kafka's
 * consumer skips records below its position: offsets need not rise) moved to the columns' first
 * `*kept` rows: their offsets written into `offsets`, and the timestamps consumers see
 * (`append_time_obj`, when not None, is every record's) over their timestamp deltas. An offset or
 * a timestamp past int64 (base + delta) is damage, as a malformed record is: ValueError. The
 * record count is checked against the section's bytes before anything is sized by it. -1 with an
 * exception set. */
int walk_batch(const Py_buffer *section, Py_ssize_t count, long long base_offset, long long base_timestamp,
                      PyObject *append_time_obj, long long min_offset, const Py_buffer *offsets, const Py_buffer *ends,
                      int64_t **fields, Py_ssize_t *kept) {
    *fields = NULL;
    long long append_time = 0;
    int have_append_time = append_time_obj != Py_None;
    if (have_append_time) {
        append_time = PyLong_AsLongLong(append_time_obj);
        if (append_time == -1 && PyErr_Occurred()) return -1;
    }
    if (count < 0 || offsets->len / 8 < count || ends->len / 8 < count) {
        PyErr_SetString(PyExc_ValueError, "a section renderer: offsets and ends hold fewer than count int64");
        return -1;
    }
    if (!count_fits(count, section->len)) {
        PyErr_Format(PyExc_ValueError, "a record count of %zd is too large for a records section of %zd bytes", count,
                     section->len);
        return -1;
    }
    int64_t *walked = PyMem_Malloc((size_t)(count ? count : 1) * FIELDS * sizeof(int64_t));
    if (walked == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t bad = 0, n = 0;
    const char *why = NULL;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = walk((const uint8_t *)section->buf, section->len, count, walked, &bad, &why);
    int64_t *off = offsets->buf;
    for (Py_ssize_t i = 0; !failed && i < count; i++) {
        int64_t offset, timestamp = append_time;
        if (__builtin_add_overflow((int64_t)base_offset, walked[2 * count + i], &offset)) {
            failed = 1, bad = i, why = "its offset is past int64";
            break;
        }
        if (!have_append_time && __builtin_add_overflow((int64_t)base_timestamp, walked[count + i], &timestamp)) {
            failed = 1, bad = i, why = "its timestamp is past int64";
            break;
        }
        if (offset < min_offset) continue;
        for (int k = 0; k < FIELDS; k++) walked[k * count + n] = walked[k * count + i]; /* (n <= i) */
        walked[count + n] = timestamp;
        off[n++] = offset;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        if (bad == count) PyErr_Format(PyExc_ValueError, "%s of the batch", why);
        else PyErr_Format(PyExc_ValueError, "record %zd: %s", bad, why);
        PyMem_Free(walked);
        return -1;
    }
    *fields = walked;
    *kept = n;
    return 0;
}

