/* Encoding: records sections of v2 batches, from Python lists or from column buffers.
 *
 * encode_records(values, keys, header_blobs, timestamp_deltas, offset_deltas[, room])
 *     The records section of a v2 batch: per record its length, attributes (0), timestamp delta,
 *     offset delta, key, value and header blob (the header count and headers, encoded: b"\x00"
 *     for none). `values` is a list of bytes or None; `keys` and `header_blobs` a list or None
 *     (none); `timestamp_deltas` an int (every record) or a list; `offset_deltas` None (0..n-1)
 *     or a list. Byte for byte what engine.record.builder.build_batch lays out. With `room` > 0 the
 *     result is a bytearray whose first `room` bytes are left for the caller to fill (a batch's
 *     header: the batch is then built in place, its records never copied again).
 *
 * encode_value_run(values, start, stop, room, most) -> (records, end)
 *     encode_records of values[start:end] alone (no keys, no headers, offset deltas from 0,
 *     every timestamp delta 0: one time for the batch), after `room` bytes: `end` is `stop`
 *     (negative: the list's end), or with `most` >= 0 as far as the records' estimated sizes
 *     (a value's bytes + ESTIMATED_RECORD_VARINTS) stay within `most` (one record at least).
 *     A producer's values split into batches as engine.record.builder.encode_batches splits them,
 *     without the list sliced or measured apart.
 *
 * encode_columns(n, value_data, value_starts, value_lengths, key_data, key_starts, key_lengths,
 *                timestamp_delta, batch_firsts, ends)
 *     The records sections of consecutive batches from columns: record i's value is
 *     value_data[value_starts[i]:][:value_lengths[i]] (length -1: null; starts and lengths int64
 *     buffers), its key likewise (key_data None: every key null), every timestamp delta
 *     `timestamp_delta`, no headers; offset deltas count from 0 again at each of `batch_firsts`
 *     (the index of each batch's first record, int64, the first 0). Writes each record's end
 *     position into `ends` (int64) and returns the bytes. The GIL is released while it copies.
 */

#include "core.h"

/* item i of a list or None as (pointer, length); length -1 for None. */
static inline __attribute__((always_inline)) int blob_of(PyObject *list, Py_ssize_t i, const char **data, Py_ssize_t *length, const char *what) {
    PyObject *item = list == Py_None ? Py_None : PyList_GET_ITEM(list, i);
    if (item == Py_None) { *data = NULL; *length = -1; return 0; }
    if (PyBytes_Check(item)) { *data = PyBytes_AS_STRING(item); *length = PyBytes_GET_SIZE(item); return 0; }
    if (PyByteArray_Check(item)) { *data = PyByteArray_AS_STRING(item); *length = PyByteArray_GET_SIZE(item); return 0; }
    PyErr_Format(PyExc_TypeError, "%s %zd is %.80s, not bytes or None", what, i, Py_TYPE(item)->tp_name);
    return -1;
}

static inline __attribute__((always_inline)) int int_of(PyObject *source, Py_ssize_t i, int64_t fallback, int64_t *value) {
    if (source == Py_None) { *value = fallback; return 0; }
    PyObject *item = PyList_Check(source) ? PyList_GET_ITEM(source, i) : source;
    long long v = PyLong_AsLongLong(item);
    if (v == -1 && PyErr_Occurred()) return -1;
    *value = v;
    return 0;
}

static int check_list(PyObject *object, Py_ssize_t n, const char *what, int may_be_none) {
    if (object == Py_None && may_be_none) return 0;
    if (!PyList_Check(object) || PyList_GET_SIZE(object) != n) {
        PyErr_Format(PyExc_ValueError, "encode_records: %s must be a list of %zd items", what, n);
        return -1;
    }
    return 0;
}

/* The records of values[start:stop] alone (no keys, no headers, offset deltas from 0), every
 * record with the timestamp delta `ts` (what a producer's batch of values is), after `room` bytes
 * left for the caller; with `most` >= 0, only as many as keep the records' estimated sizes (the
 * value's bytes + ESTIMATED_RECORD_VARINTS, as encode_batches weighs them) within `most` (one at least).
 * The same bytes as encode_records, in a loop that looks at each value only. *end is the index
 * after the last record taken. */
static PyObject *encode_values(PyObject *values, Py_ssize_t start, Py_ssize_t stop, int64_t ts, Py_ssize_t room,
                               Py_ssize_t most, Py_ssize_t *end) {
    /* A record's fixed part: attributes, timestamp delta, a null key's length -1, no headers. */
    const Py_ssize_t fixed = 1 + varint_size(ts) + 1 + 1;
    Py_ssize_t total = 0, estimated = 0, i;
    for (i = start; i < stop; i++) {
        const char *value = NULL; /* (set by blob_of; initialised for the compiler's flow analysis) */
        Py_ssize_t length = -1;
        if (blob_of(values, i, &value, &length, "value")) return NULL;
        Py_ssize_t weight = (length > 0 ? length : 0) + ESTIMATED_RECORD_VARINTS;
        if (most >= 0 && i > start && estimated + weight > most) break;
        estimated += weight;
        Py_ssize_t body = fixed + varint_size(i - start) + varint_size(length) + (length > 0 ? length : 0);
        total += varint_size(body) + body;
    }
    *end = i;
    PyObject *result = room > 0 ? PyByteArray_FromStringAndSize(NULL, room + total) : PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) return NULL;
    uint8_t *at = room > 0 ? (uint8_t *)PyByteArray_AS_STRING(result) + room : (uint8_t *)PyBytes_AS_STRING(result);
    for (i = start; i < *end; i++) {
        const char *value = NULL; /* (set by blob_of; initialised for the compiler's flow analysis) */
        Py_ssize_t length = -1;
        blob_of(values, i, &value, &length, "value"); /* (checked by the first loop) */
        at = put_varint(at, fixed + varint_size(i - start) + varint_size(length) + (length > 0 ? length : 0));
        *at++ = 0;
        at = put_varint(at, ts);
        at = put_varint(at, i - start);
        *at++ = 1; /* a null key: length -1 */
        at = put_varint(at, length);
        if (length > 0) { memcpy(at, value, length); at += length; }
        *at++ = 0; /* no headers */
    }
    return result;
}

PyObject *encode_value_run(PyObject *self, PyObject *args) {
    PyObject *values;
    Py_ssize_t start, stop, room, most;
    if (!PyArg_ParseTuple(args, "O!nnnn", &PyList_Type, &values, &start, &stop, &room, &most)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (stop < 0) stop = n;
    if (start < 0 || start >= stop || stop > n || room < 0) {
        PyErr_SetString(PyExc_ValueError, "encode_value_run: start and stop must be a run of the list, room 0 or more");
        return NULL;
    }
    Py_ssize_t end;
    PyObject *records = encode_values(values, start, stop, 0, room, most, &end);
    if (records == NULL) return NULL;
    return Py_BuildValue("Nn", records, end);
}

PyObject *encode_records(PyObject *self, PyObject *args) {
    PyObject *values, *keys, *blobs, *timestamps, *deltas;
    Py_ssize_t room = 0;
    if (!PyArg_ParseTuple(args, "OOOOO|n", &values, &keys, &blobs, &timestamps, &deltas, &room)) return NULL;
    if (room < 0) { PyErr_SetString(PyExc_ValueError, "encode_records: room must be 0 or more"); return NULL; }
    if (!PyList_Check(values)) { PyErr_SetString(PyExc_TypeError, "encode_records: values must be a list"); return NULL; }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (check_list(keys, n, "keys", 1) || check_list(blobs, n, "header_blobs", 1) ||
        check_list(deltas, n, "offset_deltas", 1))
        return NULL;
    if (PyList_Check(timestamps) ? check_list(timestamps, n, "timestamp_deltas", 0) : !PyLong_Check(timestamps)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "encode_records: timestamp_deltas must be an int or a list");
        return NULL;
    }
    /* One timestamp delta for every record: read once, not a record at a time. */
    int64_t every_ts = 0;
    if (!PyList_Check(timestamps)) {
        if (int_of(timestamps, 0, 0, &every_ts)) return NULL;
        timestamps = Py_None;
    }
    if (keys == Py_None && blobs == Py_None && deltas == Py_None && timestamps == Py_None) {
        Py_ssize_t stop;
        return encode_values(values, 0, n, every_ts, room, -1, &stop);
    }
    /* First pass: the size of every record. */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data = NULL;
        Py_ssize_t key_length = -1, value_length = -1, blob_length = -1;
        int64_t ts = 0, od = 0;
        if (blob_of(keys, i, &data, &key_length, "key") || blob_of(values, i, &data, &value_length, "value") ||
            blob_of(blobs, i, &data, &blob_length, "header blob") || int_of(timestamps, i, every_ts, &ts) ||
            int_of(deltas, i, i, &od))
            return NULL;
        if (blob_length < 0) blob_length = 1;
        Py_ssize_t body = 1 + varint_size(ts) + varint_size(od) + varint_size(key_length) +
                          (key_length > 0 ? key_length : 0) + varint_size(value_length) +
                          (value_length > 0 ? value_length : 0) + blob_length;
        total += varint_size(body) + body;
    }
    PyObject *result = room > 0 ? PyByteArray_FromStringAndSize(NULL, room + total) : PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) return NULL;
    uint8_t *at = room > 0 ? (uint8_t *)PyByteArray_AS_STRING(result) + room : (uint8_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *key = NULL, *value = NULL, *blob = NULL;
        Py_ssize_t key_length = -1, value_length = -1, blob_length = -1;
        int64_t ts = 0, od = 0;
        blob_of(keys, i, &key, &key_length, "key");
        blob_of(values, i, &value, &value_length, "value");
        blob_of(blobs, i, &blob, &blob_length, "header blob");
        int_of(timestamps, i, every_ts, &ts);
        int_of(deltas, i, i, &od);
        Py_ssize_t body = 1 + varint_size(ts) + varint_size(od) + varint_size(key_length) +
                          (key_length > 0 ? key_length : 0) + varint_size(value_length) +
                          (value_length > 0 ? value_length : 0) + (blob_length < 0 ? 1 : blob_length);
        at = put_varint(at, body);
        *at++ = 0;
        at = put_varint(at, ts);
        at = put_varint(at, od);
        at = put_varint(at, key_length);
        if (key_length > 0) { memcpy(at, key, key_length); at += key_length; }
        at = put_varint(at, value_length);
        if (value_length > 0) { memcpy(at, value, value_length); at += value_length; }
        if (blob_length < 0) { *at++ = 0; }
        else { memcpy(at, blob, blob_length); at += blob_length; }
    }
    return result;
}

/* -- encoding from column buffers ------------------------------------------------------------ */
typedef struct {
    const uint8_t *data;
    const int64_t *starts;
    const int64_t *lengths; /* -1: null */
} column_t;

static Py_ssize_t record_size(const column_t *keys, const column_t *values, Py_ssize_t i, int64_t ts, int64_t od,
                              Py_ssize_t *body_out) {
    int64_t key_length = keys->data ? keys->lengths[i] : -1;
    int64_t value_length = values->lengths[i];
    Py_ssize_t body = 1 + varint_size(ts) + varint_size(od) + varint_size(key_length) + (key_length > 0 ? key_length : 0) +
                      varint_size(value_length) + (value_length > 0 ? value_length : 0) + 1;
    *body_out = body;
    return varint_size(body) + body;
}


static int check_column(Py_buffer *starts, Py_buffer *lengths, Py_ssize_t n, Py_ssize_t data_length, const char *what) {
    if (starts->len < n * 8 || lengths->len < n * 8) {
        PyErr_Format(PyExc_ValueError, "encode_columns: fewer than %zd %s starts or lengths", n, what);
        return -1;
    }
    if (blobs_outside((const int64_t *)starts->buf, (const int64_t *)lengths->buf, n, data_length, 1)) {
        PyErr_Format(PyExc_ValueError, "encode_columns: a %s lies outside its data", what);
        return -1;
    }
    return 0;
}

PyObject *encode_columns(PyObject *self, PyObject *args) {
    Py_buffer vdata, vstarts, vlengths, kdata = {0}, kstarts = {0}, klengths = {0}, firsts, ends;
    PyObject *kdata_obj, *kstarts_obj, *klengths_obj;
    long long timestamp_delta;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "ny*y*y*OOOLy*w*", &n, &vdata, &vstarts, &vlengths, &kdata_obj, &kstarts_obj,
                          &klengths_obj, &timestamp_delta, &firsts, &ends))
        return NULL;
    PyObject *result = NULL;
    int have_keys = kdata_obj != Py_None;
    if (have_keys) {
        if (PyObject_GetBuffer(kdata_obj, &kdata, PyBUF_SIMPLE) < 0) goto done;
        if (PyObject_GetBuffer(kstarts_obj, &kstarts, PyBUF_SIMPLE) < 0) goto done;
        if (PyObject_GetBuffer(klengths_obj, &klengths, PyBUF_SIMPLE) < 0) goto done;
    }
    if (n < 0 || ends.len < n * 8 || firsts.len % 8 != 0 || firsts.len == 0 ||
        check_column(&vstarts, &vlengths, n, vdata.len, "value") ||
        (have_keys && check_column(&kstarts, &klengths, n, kdata.len, "key"))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "encode_columns: bad batch starts or ends");
        goto done;
    }
    column_t values = {(const uint8_t *)vdata.buf, (const int64_t *)vstarts.buf, (const int64_t *)vlengths.buf};
    column_t keys = {have_keys ? (const uint8_t *)kdata.buf : NULL, have_keys ? (const int64_t *)kstarts.buf : NULL,
                     have_keys ? (const int64_t *)klengths.buf : NULL};
    const int64_t *first = (const int64_t *)firsts.buf;
    Py_ssize_t batches = firsts.len / 8;
    if (first[0] != 0) { PyErr_SetString(PyExc_ValueError, "encode_columns: the first batch must start at 0"); goto done; }
    /* First pass: sizes (offset deltas restart at each batch's first record). */
    Py_ssize_t total = 0, batch = 0, body;
    for (Py_ssize_t i = 0; i < n; i++) {
        while (batch + 1 < batches && first[batch + 1] <= i) batch++;
        total += record_size(&keys, &values, i, timestamp_delta, i - first[batch], &body);
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto done;
    uint8_t *base = (uint8_t *)PyBytes_AS_STRING(result);
    int64_t *end = (int64_t *)ends.buf;
    Py_BEGIN_ALLOW_THREADS
    uint8_t *at = base;
    batch = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        while (batch + 1 < batches && first[batch + 1] <= i) batch++;
        int64_t od = i - first[batch];
        record_size(&keys, &values, i, timestamp_delta, od, &body);
        int64_t key_length = keys.data ? keys.lengths[i] : -1;
        int64_t value_length = values.lengths[i];
        at = put_varint(at, body);
        *at++ = 0;
        at = put_varint(at, timestamp_delta);
        at = put_varint(at, od);
        at = put_varint(at, key_length);
        if (key_length > 0) { memcpy(at, keys.data + keys.starts[i], key_length); at += key_length; }
        at = put_varint(at, value_length);
        if (value_length > 0) { memcpy(at, values.data + values.starts[i], value_length); at += value_length; }
        *at++ = 0;
        end[i] = at - base;
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&vdata);
    PyBuffer_Release(&vstarts);
    PyBuffer_Release(&vlengths);
    if (kdata.obj) PyBuffer_Release(&kdata);
    if (kstarts.obj) PyBuffer_Release(&kstarts);
    if (klengths.obj) PyBuffer_Release(&klengths);
    PyBuffer_Release(&firsts);
    PyBuffer_Release(&ends);
    return result;
}

