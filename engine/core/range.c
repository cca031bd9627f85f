/* A file's range of batches read, checked and rendered in one call (text or JSON Lines).
 *
 * render_text_range(fd, start, end, size, create_label, append_label, partition_field, print_offset,
 *                   print_key, print_value, separator, line_end, null, small_batch_records[, nowait])
 *                   -> bytes or None
 * render_json_range(fd, start, end, size, prefix, create_kind, append_kind[, nowait]) -> bytes or None
 *     The batches of a file's bytes [start, end), read from `fd` by the core itself, rendered as
 *     render_text_section and render_json_section render each (`create_label`/`append_label`:
 *     the timestamp label of CreateTime and of LogAppendTime batches, both None when not
 *     shown; `create_kind`/`append_kind` likewise for JSON Lines), in one call with the GIL
 *     released once: `size` bytes (-1: as many as it takes, in a block sized from the batch
 *     headers; a block too large to be had gives None). None, rather than other bytes, when
 *     the range is not that: a batch that is not v2, cut short or past `end`, whose CRC does
 *     not hold or whose records section is malformed, a record count the batch cannot hold, a
 *     compressed batch, a record with headers (JSON Lines), a read that fails or comes back
 *     short, a rendering of another size, an offset or time past int64, a negative last offset
 *     delta, and in text a record with headers in a batch of at most `small_batch_records`
 *     (which the caller decodes record by record). Control batches render to nothing. The caller renders such a
 *     range batch by batch, which says why. With `nowait` (for an event loop) the bytes are read
 *     only if they are all in the OS page cache: BlockingIOError otherwise, and where the file
 *     system cannot tell (no RWF_NOWAIT) or the file ends before `end`.
 */

#include "core.h"
#include "json.h"
#include "text.h"


typedef struct {
    int json;
    text_args_t text;           /* text: its section is unused (each batch's own) */
    Py_buffer labels[2];        /* text: the CreateTime and LogAppendTime labels (obj NULL: not shown) */
    int have_partition;
    Py_ssize_t small_batch_records; /* text: batches this small are decoded record by record in Python */
    Py_buffer prefix, kinds[2]; /* JSON Lines: the prefix, "CreateTime" and "LogAppendTime" */
} range_args_t;

#define WOULD_WAIT (-1)

/* The file's bytes [start, end) read whole into a new block (`*data`: free it); 0 on a short or
 * failed read. With `nowait`, read only from the OS page cache: WOULD_WAIT when a byte is not
 * there, the file system cannot tell, or the file ends first. Needs no GIL. */
static int read_range(int fd, int64_t start, int64_t end, uint8_t **data, int nowait) {
    int64_t length = end - start;
    *data = malloc(length > 0 ? (size_t)length : 1);
    if (*data == NULL) return 0;
    for (int64_t done = 0; done < length;) {
        ssize_t got;
        if (nowait) {
            struct iovec piece = {*data + done, (size_t)(length - done)};
            got = preadv2(fd, &piece, 1, start + done, RWF_NOWAIT);
            if (got < 0 && (errno == EAGAIN || errno == EOPNOTSUPP || errno == EINVAL)) return WOULD_WAIT;
            if (got == 0) return WOULD_WAIT; /* (the file ends first: left to a read that may wait, which says so) */
        } else {
            got = pread(fd, *data + done, (size_t)(length - done), start + done);
        }
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        done += got;
    }
    return 1;
}

/* At least the size the batches of `data` (`length` bytes) render to, from their headers alone:
 * every byte of a batch taken for key or value bytes, each escaped (JSON Lines: six bytes for
 * one, more than base64 takes), and each record's fixed parts at their widest (a decimal of
 * twenty characters, a null key and value). 0 when the batches do not tile the bytes (the
 * rendering then fails as well). Needs no GIL. */
static int range_bound(const range_args_t *a, const uint8_t *data, int64_t length, Py_ssize_t *bound) {
    const int64_t decimal = 20;
    int64_t per_record;
    if (a->json) {
        int64_t kind = a->kinds[0].len > a->kinds[1].len ? a->kinds[0].len : a->kinds[1].len;
        per_record = a->prefix.len + kind + (int64_t)JSON_FIXED + 2 * decimal + 2 * 13;
    } else {
        const text_args_t *t = &a->text;
        int64_t label = a->labels[0].len > a->labels[1].len ? a->labels[0].len : a->labels[1].len;
        per_record = 5 * t->separator.len + t->line_end.len + label + decimal + t->partition_field.len + 7 + decimal +
                     2 * t->null.len;
    }
    int64_t total = 0;
    for (int64_t position = 0; position < length;) {
        if (length - position < BATCH_HEADER_BYTES) return 0;
        int64_t batch_bytes = 12 + (int64_t)(int32_t)be32(data + position + 8);
        int64_t count = (int32_t)be32(data + position + 57);
        if (batch_bytes < BATCH_HEADER_BYTES || batch_bytes > length - position || count < 0) return 0;
        /* A count the batch cannot hold (a record takes seven bytes at least): damage the render
         * pass reports as None, not a block of hundreds of GB asked for first. */
        if (count > (batch_bytes - BATCH_HEADER_BYTES) / 7) return 0;
        total += (a->json ? 6 : 1) * batch_bytes + count * per_record;
        position += batch_bytes;
    }
    *bound = (Py_ssize_t)total;
    return 1;
}

/* Render the batches of `data` (`length` bytes read from the file) into `out` (`size` bytes): 1
 * when they fill it exactly, or (`used` not NULL) when they fit in it, `*used` the bytes they
 * take; 0 when the range holds anything else — a batch that is not v2, whose length, CRC or
 * records section is wrong, a compressed batch, a record with headers in JSON Lines, a
 * rendering of another size. Control batches render to nothing. Needs no GIL. */
static int render_batches(const range_args_t *a, const uint8_t *data, int64_t length, uint8_t *out, Py_ssize_t size,
                          Py_ssize_t *used) {
    uint8_t *at = out, *limit = out + size;
    for (int64_t position = 0; position < length;) {
        const uint8_t *batch = data + position;
        if (length - position < BATCH_HEADER_BYTES) return 0;
        int64_t batch_bytes = 12 + (int64_t)(int32_t)be32(batch + 8);
        if (batch_bytes < BATCH_HEADER_BYTES || batch_bytes > length - position || batch[16] != 2) return 0;
        if (crc32c_of(batch + 21, (size_t)(batch_bytes - 21), crc32c_hardware) != be32(batch + 17)) return 0;
        position += batch_bytes;
        unsigned attributes = (unsigned)batch[21] << 8 | batch[22];
        if (attributes & ATTRIBUTE_COMPRESSION) return 0;
        /* A negative last offset delta or record count: what check_batch refuses. */
        if ((int32_t)be32(batch + 23) < 0 || (int32_t)be32(batch + 57) < 0) return 0;
        if (attributes & ATTRIBUTE_CONTROL) continue;
        /* Each record walked as `walk` walks it, and its line written at once, while it is in the cache. */
        int64_t count = (int32_t)be32(batch + 57), base_offset = (int64_t)be64(batch);
        int64_t base_timestamp = (int64_t)be64(batch + 27), max_timestamp = (int64_t)be64(batch + 35);
        int log_append_time = (attributes & ATTRIBUTE_LOG_APPEND_TIME) != 0;
        const uint8_t *section = batch + BATCH_HEADER_BYTES;
        const Py_buffer *kind = &a->kinds[log_append_time];
        const Py_buffer *label = a->labels[log_append_time].obj != NULL ? &a->labels[log_append_time] : NULL;
        reader_t r = {section, batch_bytes - BATCH_HEADER_BYTES, 0};
        int64_t f[FIELDS];
        const char *why;
        for (int64_t i = 0; i < count; i++) {
            if (walk_record(&r, f, &why) != 0) return 0;
            /* An offset or time past int64 (damage, which the batch renderers name), and, in text,
             * headers in a batch small enough for the record-at-a-time path, are left to the batch renderers. */
            int64_t offset, timestamp = max_timestamp;
            if (__builtin_add_overflow(base_offset, f[2], &offset)) return 0;
            if (!log_append_time && __builtin_add_overflow(base_timestamp, f[1], &timestamp)) return 0;
            if (a->json) {
                uint8_t valid[2] = {1, 1};
                if (f[7] != 0) return 0;
                /* A key and value of ASCII bytes (nearly every record) are UTF-8, and their text is at
                 * most six bytes a byte (\u00XX): with room for that, the line is written without
                 * being measured first (its escapes found once, as it is written). */
                Py_ssize_t most = a->prefix.len + kind->len + (Py_ssize_t)JSON_FIXED + 2 * 20 + 2 * 4 +
                                  6 * ((f[4] > 0 ? f[4] : 0) + (f[6] > 0 ? f[6] : 0));
                int ascii = most <= limit - at && all_ascii(section + (f[4] > 0 ? f[3] : 0), f[4]) &&
                            all_ascii(section + (f[6] > 0 ? f[5] : 0), f[6]);
                Py_ssize_t need = ascii ? 0
                                        : json_lines_size(section, 1, &offset, &timestamp, &f[3], &f[4], &f[5], &f[6],
                                                          a->prefix.len, kind->len, valid);
                if (need > limit - at) return 0;
                at = put_json_lines(out, at, section, 1, &offset, &timestamp, &f[3], &f[4], &f[5], &f[6],
                                    a->prefix.buf, a->prefix.len, kind->buf, kind->len, valid, NULL);
            } else {
                if (f[7] != 0 && count <= a->small_batch_records) return 0;
                Py_ssize_t need = text_lines_size(&a->text, label, a->have_partition, 1, &offset, &timestamp, &f[4], &f[6]);
                if (need > limit - at) return 0;
                at = put_text_lines(&a->text, label, a->have_partition, 1, section, &offset, &timestamp, &f[3], &f[4],
                                    &f[5], &f[6], out, at, NULL);
            }
        }
        if (r.position != r.end) return 0;
    }
    if (used == NULL) return at == limit;
    *used = at - out;
    return 1;
}

/* The bytes object the range renders into, or None; `size` -1: as many as it takes (rendered
 * into a block of `range_bound`, then cut to what it took). The GIL released while it reads and
 * renders. */
static PyObject *render_range(const range_args_t *a, int fd, long long start, long long end, Py_ssize_t size,
                              int nowait) {
    if (start < 0 || end < start || size < -1) {
        PyErr_SetString(PyExc_ValueError, "a range renderer: a bad range or size");
        return NULL;
    }
    uint8_t *data = NULL;
    int ok, exact = size != -1;
    Py_ssize_t used = 0;
    PyObject *result = NULL;
    if (exact) {
        /* The size known: the block made first, and the GIL released once for the read and the
         * rendering (the render-ahead thread waited for it in between, on a busy event loop). */
        result = PyBytes_FromStringAndSize(NULL, size);
        if (result == NULL) return NULL;
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
        Py_BEGIN_ALLOW_THREADS
        ok = read_range(fd, start, end, &data, nowait);
        if (ok == 1) ok = render_batches(a, data, end - start, out, size, NULL);
        Py_END_ALLOW_THREADS
    } else {
        Py_BEGIN_ALLOW_THREADS
        ok = read_range(fd, start, end, &data, nowait);
        if (ok == 1) ok = range_bound(a, data, end - start, &size);
        Py_END_ALLOW_THREADS
        if (ok == 1) {
            result = PyBytes_FromStringAndSize(NULL, size);
            if (result == NULL && PyErr_ExceptionMatches(PyExc_MemoryError)) {
                PyErr_Clear(); /* (a bound too large to be had: left to the batch renderers, as they are) */
                ok = 0;
            }
        }
        if (result != NULL) {
            uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
            Py_BEGIN_ALLOW_THREADS
            ok = render_batches(a, data, end - start, out, size, &used);
            Py_END_ALLOW_THREADS
        }
    }
    if (ok == WOULD_WAIT) {
        free(data);
        Py_XDECREF(result);
        errno = EAGAIN;
        return PyErr_SetFromErrno(PyExc_BlockingIOError);
    }
    free(data);
    if (ok && result != NULL && !exact && _PyBytes_Resize(&result, used) < 0) return NULL; /* (result freed) */
    if (ok && result != NULL) return result;
    Py_XDECREF(result);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static void release_optional(Py_buffer *buffer) {
    if (buffer->obj != NULL) PyBuffer_Release(buffer);
}

static int optional_buffer(PyObject *object, Py_buffer *buffer) {
    return object == Py_None ? 0 : PyObject_GetBuffer(object, buffer, PyBUF_SIMPLE);
}

/* render_text_range(fd, start, end, size, create_label, append_label, partition, print_offset, print_key,
 *                   print_value, separator, line_end, null, small_batch_records) -> bytes or None */
PyObject *render_text_range(PyObject *self, PyObject *args) {
    range_args_t a;
    memset(&a, 0, sizeof a);
    int fd;
    long long start, end;
    Py_ssize_t size;
    PyObject *create_obj, *append_obj, *partition_obj, *result = NULL;
    int nowait = 0;
    if (!PyArg_ParseTuple(args, "iLLnOOOpppy*y*y*n|p", &fd, &start, &end, &size, &create_obj, &append_obj,
                          &partition_obj, &a.text.print_offset, &a.text.print_key, &a.text.print_value,
                          &a.text.separator, &a.text.line_end, &a.text.null, &a.small_batch_records, &nowait))
        return NULL;
    if ((create_obj == Py_None) != (append_obj == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "render_text_range: both timestamp labels, or neither");
        goto done;
    }
    if (optional_buffer(create_obj, &a.labels[0]) < 0 || optional_buffer(append_obj, &a.labels[1]) < 0 ||
        optional_buffer(partition_obj, &a.text.partition_field) < 0)
        goto done;
    a.have_partition = partition_obj != Py_None;
    result = render_range(&a, fd, start, end, size, nowait);
done:
    release_optional(&a.labels[0]);
    release_optional(&a.labels[1]);
    release_optional(&a.text.partition_field);
    PyBuffer_Release(&a.text.separator);
    PyBuffer_Release(&a.text.line_end);
    PyBuffer_Release(&a.text.null);
    return result;
}

/* render_json_range(fd, start, end, size, prefix, create_kind, append_kind) -> bytes or None */
PyObject *render_json_range(PyObject *self, PyObject *args) {
    range_args_t a;
    memset(&a, 0, sizeof a);
    a.json = 1;
    int fd;
    long long start, end;
    Py_ssize_t size;
    int nowait = 0;
    if (!PyArg_ParseTuple(args, "iLLny*y*y*|p", &fd, &start, &end, &size, &a.prefix, &a.kinds[0], &a.kinds[1],
                          &nowait))
        return NULL;
    PyObject *result = render_range(&a, fd, start, end, size, nowait);
    PyBuffer_Release(&a.prefix);
    PyBuffer_Release(&a.kinds[0]);
    PyBuffer_Release(&a.kinds[1]);
    return result;
}
