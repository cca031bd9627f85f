/* The engine's compiled core: the per-record loops of Kafka's v2 records.
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
 *
 * encode_columns(n, value_data, value_starts, value_lengths, key_data, key_starts, key_lengths,
 *                timestamp_delta, batch_firsts, ends)
 *     The records sections of consecutive batches from columns: record i's value is
 *     value_data[value_starts[i]:][:value_lengths[i]] (length -1: null; starts and lengths int64
 *     buffers), its key likewise (key_data None: every key null), every timestamp delta
 *     `timestamp_delta`, no headers; offset deltas count from 0 again at each of `batch_firsts`
 *     (the index of each batch's first record, int64, the first 0). Writes each record's end
 *     position into `ends` (int64) and returns the bytes. The GIL is released while it copies.
 *
 * json_text_sizes(section, starts, lengths, out)
 *     For each blob section[starts[i]:][:lengths[i]] (length -1: null), the length in UTF-8 of
 *     the JSON text the JSON Lines format gives it (engine.text.json_records.bytes_json_text): a
 *     string when the bytes are UTF-8 (strictly, as Python decodes), `null`, else
 *     {"base64":"..."}. Into `out` (int64). The GIL is released while it scans.
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
 *
 * gather(section, starts, lengths, out, out_offsets)
 *     Arrow `binary` buffers from blobs: each blob section[starts[i]:][:lengths[i]] (length -1:
 *     null, which takes no bytes) is copied into `out` one after the other, from
 *     out_offsets[0] on, and out_offsets[i + 1] (int32) set to where blob i ends. starts and
 *     lengths are int64 buffers of n, out_offsets int32 of n + 1 (its first already set).
 *     ValueError when a blob lies outside the section or `out` is too short. The GIL is
 *     released while it copies.
 *
 * crc32c(data) -> int
 *     CRC-32C (Castagnoli) of a buffer, Kafka's batch checksum: on a machine with VPCLMULQDQ
 *     (AVX-512), buffers of 1 KiB and more folded by carry-less multiplication; else the SSE4.2
 *     instruction where the machine has it, three chains at once; a table loop elsewhere
 *     (crc32c_without_folding and crc32c_without_hardware, for the tests). The GIL is released
 *     for buffers of 64 KiB or more.
 *
 * murmur2(data, starts, lengths, out)
 *     Kafka's `Utils.murmur2` (the default partitioner's hash; seed 0x9747b28c) of each blob
 *     data[starts[i]:][:lengths[i]] (starts and lengths int64 buffers, every blob inside `data`),
 *     as a signed 32-bit value widened into `out` (int64). The GIL is released while it hashes.
 *
 * keep_freed_memory(most) -> bool
 *     Have the C allocator (glibc's) serve blocks of up to `most` bytes from its heap and keep
 *     up to twice that freed at the heap's top, rather than map each big block anew and
 *     unmap it when freed: every rendered batch is such a block, and each fresh mapping
 *     faults in zeroed pages again (a text batch of 100-byte records rendered four times
 *     slower). A process setting (the CLI's); False where the allocator has no such setting.
 *
 * encode_value_run(values, start, stop, room, most) -> (records, end)
 *     encode_records of values[start:end] alone (no keys, no headers, offset deltas from 0,
 *     every timestamp delta 0: one time for the batch), after `room` bytes: `end` is `stop`
 *     (negative: the list's end), or with `most` >= 0 as far as the records' estimated sizes
 *     (a value's bytes + ESTIMATED_RECORD_VARINTS) stay within `most` (one record at least).
 *     A producer's values split into batches as engine.record.records.encode_batches splits them,
 *     without the list sliced or measured apart.
 *
 * allocates_ahead(fd) -> bool
 * allocate_ahead(fd, offset, length) -> int
 *     Disk blocks for a large write, allocated before it: fallocate(FALLOC_FL_KEEP_SIZE) of
 *     [offset, offset + length), the file's size unchanged. Where the file system delays
 *     allocation (ext4), a buffered write into blocks allocated already skips reserving each
 *     page as it copies: a 1 MiB append is a third faster, but a 4 KiB one twice as slow
 *     (the call's own cost). allocates_ahead says whether `fd`'s file system is of the kind
 *     where that holds (ext4's magic number, which ext2 and ext3 share: there allocate_ahead
 *     fails with EOPNOTSUPP). allocate_ahead returns 0, or the errno (advice: the write goes
 *     ahead either way and meets the same ENOSPC or EIO itself). The GIL is released during
 *     the call.
 *
 * encode_records(values, keys, header_blobs, timestamp_deltas, offset_deltas[, room])
 *     The records section of a v2 batch: per record its length, attributes (0), timestamp delta,
 *     offset delta, key, value and header blob (the header count and headers, encoded: b"\x00"
 *     for none). `values` is a list of bytes or None; `keys` and `header_blobs` a list or None
 *     (none); `timestamp_deltas` an int (every record) or a list; `offset_deltas` None (0..n-1)
 *     or a list. Byte for byte what engine.record.records.build_batch lays out. With `room` > 0 the
 *     result is a bytearray whose first `room` bytes are left for the caller to fill (a batch's
 *     header: the batch is then built in place, its records never copied again).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* fallocate */
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/falloc.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#endif
#ifdef __GLIBC__
#include <malloc.h>
#define KEEP_MOST (32 << 20)
#endif
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#define FIELDS 8
/* What a batch split weighs a record at beyond its value's bytes: the module's
 * ESTIMATED_RECORD_VARINTS, which engine.record.records and the Spark writer take from here. */
#define ESTIMATED_RECORD_VARINTS 12
#define MAX_VARINT 10

/* -- decoding ------------------------------------------------------------------------------- */
typedef struct {
    const uint8_t *data;
    Py_ssize_t end;
    Py_ssize_t position;
} reader_t;

/* A zig-zag varint at the reader's position; 0 on success, -1 past the end, -2 over ten bytes. */
static int read_long_varint(reader_t *r, int64_t *value) {
    uint64_t result = 0;
    int shift = 0;
    for (int i = 0; i < MAX_VARINT; i++) {
        if (r->position >= r->end) return -1;
        uint8_t byte = r->data[r->position++];
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            *value = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            return 0;
        }
        shift += 7;
    }
    return -2;
}

/* `read_long_varint`, with the one- and two-byte cases inline: nearly every field of a record
 * (a length or an offset delta below 8192). */
static inline int read_varint(reader_t *r, int64_t *value) {
    Py_ssize_t left = r->end - r->position;
    if (left > 0) {
        const uint8_t *p = r->data + r->position;
        if (p[0] < 0x80) {
            r->position++;
            *value = (int64_t)(p[0] >> 1) ^ -(int64_t)(p[0] & 1);
            return 0;
        }
        if (left > 1 && p[1] < 0x80) {
            uint64_t zigzag = (uint64_t)(p[0] & 0x7F) | (uint64_t)p[1] << 7;
            r->position += 2;
            *value = (int64_t)(zigzag >> 1) ^ -(int64_t)(zigzag & 1);
            return 0;
        }
    }
    return read_long_varint(r, value);
}

/* Kafka's 32-bit varint (ByteUtils.readVarint: a length, a count, an offset delta): at most five
 * bytes, of which the low 32 bits count (the fifth byte's high bits are dropped, as Kafka drops
 * them); 0 on success, -1 past the end, -2 over five bytes. */
#define MAX_VARINT32 5
static inline int read_int_varint(reader_t *r, int32_t *value) {
    Py_ssize_t left = r->end - r->position;
    const uint8_t *p = r->data + r->position;
    if (left > 0 && p[0] < 0x80) {
        r->position++;
        *value = (int32_t)(p[0] >> 1) ^ -(int32_t)(p[0] & 1);
        return 0;
    }
    uint32_t result = 0;
    for (int i = 0; i < MAX_VARINT32; i++) {
        if (r->position >= r->end) return -1;
        uint8_t byte = r->data[r->position++];
        result |= (uint32_t)(byte & 0x7F) << (7 * i);
        if (byte < 0x80) {
            *value = (int32_t)(result >> 1) ^ -(int32_t)(result & 1);
            return 0;
        }
    }
    return -2;
}

/* The fields of the record at the reader's position, as `walk` lays them out a column each (f[0]
 * its start ... f[7] its header count), the reader moved past it; -1 with `*why` when it is
 * malformed. Kafka's DefaultRecord rules, as engine.record.records.decode_records applies them: the
 * length, offset delta, key and value lengths and the header fields are 32-bit varints, the
 * timestamp delta a 64-bit one; a negative key or value length is a null key or value (f[4], f[6]
 * -1); a negative header count or header key length, a field past the record, or bytes left over
 * after its headers make it invalid. Headers are checked, not laid out (callers that show them
 * decode the record in Python). Always inline: in the range renderers' loop the reader stays in
 * registers (text and JSON Lines of 100-byte records 5 % faster). */
static inline __attribute__((always_inline)) int walk_record(reader_t *r, int64_t *f, const char **why) {
    int32_t length, value, headers;
    f[0] = r->position;
    if (read_int_varint(r, &length) != 0) { *why = "its length is not a varint"; return -1; }
    if (length < 0 || length > r->end - r->position) { *why = "its length runs past the records section"; return -1; }
    reader_t body = {r->data, r->position + length, r->position};
    r->position += length;
    if (body.position >= body.end) { *why = "it has no attributes"; return -1; }
    body.position++; /* attributes: unused in v2 records */
    if (read_varint(&body, &f[1]) != 0) { *why = "its timestamp delta runs past it"; return -1; }
    if (read_int_varint(&body, &value) != 0) { *why = "its offset delta runs past it"; return -1; }
    f[2] = value;
    if (read_int_varint(&body, &value) != 0) { *why = "its key length runs past it"; return -1; }
    f[4] = value < 0 ? -1 : value;
    f[3] = body.position;
    if (f[4] > body.end - body.position) { *why = "its key runs past it"; return -1; }
    if (f[4] > 0) body.position += f[4];
    if (read_int_varint(&body, &value) != 0) { *why = "its value length runs past it"; return -1; }
    f[6] = value < 0 ? -1 : value;
    f[5] = body.position;
    if (f[6] > body.end - body.position) { *why = "its value runs past it"; return -1; }
    if (f[6] > 0) body.position += f[6];
    if (read_int_varint(&body, &headers) != 0 || headers < 0) { *why = "its header count is bad"; return -1; }
    f[7] = headers;
    /* (each header takes two bytes at least: a count larger than that is refused unwalked) */
    if (headers > (body.end - body.position) / 2) { *why = "its headers run past it"; return -1; }
    for (int32_t h = 0; h < headers; h++) {
        if (read_int_varint(&body, &value) != 0 || value < 0) { *why = "a header key length is bad"; return -1; }
        if (value > body.end - body.position) { *why = "a header key runs past it"; return -1; }
        body.position += value;
        if (read_int_varint(&body, &value) != 0) { *why = "a header value length runs past it"; return -1; }
        if (value > 0 && value > body.end - body.position) { *why = "a header value runs past it"; return -1; }
        if (value > 0) body.position += value;
    }
    if (body.position != body.end) { *why = "bytes are left over after its headers"; return -1; }
    return 0;
}

/* Whether `count` records can be in `size` bytes: a record takes seven at least (a length,
 * attributes, timestamp and offset deltas, key and value lengths and a header count of one byte
 * each). Checked before anything is sized by the count. */
#define MIN_RECORD_BYTES 7
static inline int count_fits(Py_ssize_t count, Py_ssize_t size) { return count >= 0 && count <= size / MIN_RECORD_BYTES; }

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

static PyObject *record_fields(PyObject *self, PyObject *args) {
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

/* -- encoding ------------------------------------------------------------------------------- */
static Py_ssize_t varint_size(int64_t value) {
    uint64_t zigzag = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    Py_ssize_t size = 1;
    while (zigzag >= 0x80) { zigzag >>= 7; size++; }
    return size;
}

static uint8_t *put_varint(uint8_t *at, int64_t value) {
    uint64_t zigzag = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (zigzag >= 0x80) { *at++ = (uint8_t)(zigzag | 0x80); zigzag >>= 7; }
    *at++ = (uint8_t)zigzag;
    return at;
}

/* item i of a list or None as (pointer, length); length -1 for None. */
static inline int blob_of(PyObject *list, Py_ssize_t i, const char **data, Py_ssize_t *length, const char *what) {
    PyObject *item = list == Py_None ? Py_None : PyList_GET_ITEM(list, i);
    if (item == Py_None) { *data = NULL; *length = -1; return 0; }
    if (PyBytes_Check(item)) { *data = PyBytes_AS_STRING(item); *length = PyBytes_GET_SIZE(item); return 0; }
    if (PyByteArray_Check(item)) { *data = PyByteArray_AS_STRING(item); *length = PyByteArray_GET_SIZE(item); return 0; }
    PyErr_Format(PyExc_TypeError, "%s %zd is %.80s, not bytes or None", what, i, Py_TYPE(item)->tp_name);
    return -1;
}

static inline int int_of(PyObject *source, Py_ssize_t i, int64_t fallback, int64_t *value) {
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
        const char *value;
        Py_ssize_t length;
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
        const char *value;
        Py_ssize_t length;
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

static PyObject *encode_value_run(PyObject *self, PyObject *args) {
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

static PyObject *encode_records(PyObject *self, PyObject *args) {
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
        const char *data;
        Py_ssize_t key_length, value_length, blob_length;
        int64_t ts, od;
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
        const char *key, *value, *blob;
        Py_ssize_t key_length, value_length, blob_length;
        int64_t ts, od;
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

/* Whether any of `n` blobs (starts[i], lengths[i]) lies outside `size` bytes of data; a length of
 * -1 is a null, allowed where `nulls` says so. */
static int blobs_outside(const int64_t *s, const int64_t *l, Py_ssize_t n, Py_ssize_t size, int nulls) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (l[i] < (nulls ? -1 : 0) || (l[i] > 0 && (s[i] < 0 || s[i] > size - l[i]))) return 1;
    return 0;
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

static PyObject *encode_columns(PyObject *self, PyObject *args) {
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

/* -- JSON text sizes and rendering ------------------------------------------------------------ */
static uint8_t *put_decimal(uint8_t *at, int64_t value);
static Py_ssize_t decimal_size(int64_t value);
/* The length of a complete, strictly valid UTF-8 sequence at `p` (as Python's strict decoder
 * takes it: no overlong forms, no surrogates, nothing above U+10FFFF), or 0. */
static Py_ssize_t utf8_sequence(const uint8_t *p, Py_ssize_t left) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return left >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogates */
        return 3;
    }
    if (c < 0xF5) {
        if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return 0; /* above U+10FFFF */
        return 4;
    }
    return 0;
}

/* 0x80 in each byte of `x` that is zero, exactly (no false positives above a zero byte). */
static inline uint64_t zero_bytes(uint64_t x) {
    const uint64_t low7 = 0x7F7F7F7F7F7F7F7FULL;
    return ~(((x & low7) + low7) | x | low7);
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Nonzero when a byte of `w` may be one a JSON string escapes (below 0x20, '"', '\\'): the
 * classic test for a zero byte, cheap, with false positives above a true one. */
static inline uint64_t maybe_escaped(uint64_t w) {
    uint64_t quote = w ^ (ONES * '"'), backslash = w ^ (ONES * '\\');
    return ((w - ONES * 0x20) & ~w & HIGHS) | ((quote - ONES) & ~quote & HIGHS) | ((backslash - ONES) & ~backslash & HIGHS);
}

/* 0x80 in each byte of `w` that a JSON string escapes: below 0x20, '"' or '\\', exactly. */
static inline uint64_t escaped_bytes(uint64_t w) {
    if (!maybe_escaped(w)) return 0;
    return zero_bytes(w & (ONES * 0xE0)) | zero_bytes(w ^ (ONES * '"')) | zero_bytes(w ^ (ONES * '\\'));
}

/* Whether the `length` bytes of `data` are all ASCII (none when `length` < 0). */
static inline int all_ascii(const uint8_t *data, int64_t length) {
    int64_t i = 0;
    uint64_t high = 0;
#ifdef __SSE2__
    __m128i any = _mm_setzero_si128();
    for (; length - i >= 16; i += 16) any = _mm_or_si128(any, _mm_loadu_si128((const __m128i *)(data + i)));
    if (_mm_movemask_epi8(any)) return 0;
#endif
    for (; length - i >= 8; i += 8) {
        uint64_t w;
        memcpy(&w, data + i, 8);
        high |= w;
    }
    for (; i < length; i++) high |= data[i];
    return (high & HIGHS) == 0;
}

/* The length of engine.text.json_records.bytes_json_text(data) in UTF-8: "null"; a JSON string as
 * json's encode_basestring writes it (\" \\ \b \f \n \r \t, other bytes below 0x20 as \u00XX,
 * the rest as they are); {"base64":"..."} when the bytes are not UTF-8. `*valid` (when not
 * NULL) says whether they are UTF-8 (null: yes). */
static int64_t json_text_size(const uint8_t *data, int64_t length, int *valid) {
    if (valid != NULL) *valid = 1;
    if (length < 0) return 4;
    int64_t size = 2;
    Py_ssize_t i = 0;
    while (i < length) {
#ifdef __SSE2__
        if (length - i >= 16) { /* sixteen ASCII bytes at a time, each '"' and '\\' counted */
            const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1F);
            __m128i x = _mm_loadu_si128((const __m128i *)(data + i));
            unsigned odd = (unsigned)_mm_movemask_epi8(_mm_or_si128(x, _mm_cmpeq_epi8(_mm_max_epu8(x, control), control)));
            if (!odd) {
                unsigned marks =
                    (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)));
                size += 16;
                for (; marks; marks &= marks - 1) size++; /* (rare; no popcount instruction assumed) */
                i += 16;
                continue;
            }
        }
        if (length - i < 16 && length >= 16) { /* the last bytes of a longer text: its last sixteen, those counted shifted out */
            const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1F);
            int left = (int)(length - i);
            __m128i x = _mm_loadu_si128((const __m128i *)(data + length - 16));
            unsigned odd = (unsigned)_mm_movemask_epi8(_mm_or_si128(x, _mm_cmpeq_epi8(_mm_max_epu8(x, control), control)));
            if (!(odd >> (16 - left))) {
                unsigned marks =
                    (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)));
                size += left;
                for (marks >>= 16 - left; marks; marks &= marks - 1) size++;
                break;
            }
        }
#endif
        if (length - i >= 8) { /* eight ASCII bytes at a time, each '"' and '\\' counted */
            uint64_t w;
            memcpy(&w, data + i, 8);
            if (!((w & HIGHS) | maybe_escaped(w))) { size += 8; i += 8; continue; }
            if (!(w & HIGHS) && !zero_bytes(w & (ONES * 0xE0))) {
                uint64_t marks = zero_bytes(w ^ (ONES * '"')) | zero_bytes(w ^ (ONES * '\\'));
                size += 8 + (int64_t)((((marks >> 7) * ONES) >> 56)); /* one more byte for each */
                i += 8;
                continue;
            }
        }
        /* A word with a control or non-ASCII byte (or the tail): a byte at a time to its end. */
        for (Py_ssize_t stop = length - i >= 8 ? i + 8 : length; i < stop;) {
            uint8_t c = data[i];
            if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) { size++; i++; continue; }
            if (c < 0x80) {
                size += (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') ? 2 : 6;
                i++;
                continue;
            }
            Py_ssize_t n = utf8_sequence(data + i, length - i);
            if (n == 0) {
                if (valid != NULL) *valid = 0;
                return 13 + 4 * ((length + 2) / 3); /* {"base64":"..."} */
            }
            size += n;
            i += n;
        }
    }
    return size;
}

static const char BASE64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static const char HEX[] = "0123456789abcdef";

/* A byte a JSON string escapes (below 0x20, '"', '\\'), as json's encode_basestring does. */
static inline uint8_t *put_escape(uint8_t *at, uint8_t c) {
    *at++ = '\\';
    switch (c) {
        case '"': *at++ = '"'; break;
        case '\\': *at++ = '\\'; break;
        case '\b': *at++ = 'b'; break;
        case '\f': *at++ = 'f'; break;
        case '\n': *at++ = 'n'; break;
        case '\r': *at++ = 'r'; break;
        case '\t': *at++ = 't'; break;
        default: *at++ = 'u'; *at++ = '0'; *at++ = '0'; *at++ = HEX[c >> 4]; *at++ = HEX[c & 15];
    }
    return at;
}

/* bytes_json_text(data) written at `at` (json_text_size(data, length) bytes), `valid` as
 * json_text_size found it. */
static uint8_t *put_json_text(uint8_t *at, const uint8_t *data, int64_t length, int valid) {
    if (length < 0) { memcpy(at, "null", 4); return at + 4; }
    if (!valid) {
        memcpy(at, "{\"base64\":\"", 11);
        at += 11;
        int64_t i = 0;
        for (; i + 3 <= length; i += 3) {
            uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8 | data[i + 2];
            *at++ = BASE64[v >> 18]; *at++ = BASE64[(v >> 12) & 63]; *at++ = BASE64[(v >> 6) & 63]; *at++ = BASE64[v & 63];
        }
        if (length - i == 1) {
            uint32_t v = (uint32_t)data[i] << 16;
            *at++ = BASE64[v >> 18]; *at++ = BASE64[(v >> 12) & 63]; *at++ = '='; *at++ = '=';
        } else if (length - i == 2) {
            uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8;
            *at++ = BASE64[v >> 18]; *at++ = BASE64[(v >> 12) & 63]; *at++ = BASE64[(v >> 6) & 63]; *at++ = '=';
        }
        memcpy(at, "\"}", 2);
        return at + 2;
    }
    *at++ = '"';
    int64_t i = 0;
#ifdef __SSE2__
    /* Sixteen bytes at a time: stored whole, then the output moves on to the first byte to
     * escape (the bytes stored past it are written over next). The stores stay inside this
     * text: sixteen input bytes are left, and the text of a byte is never shorter than it. */
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1F);
    while (length - i >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(data + i));
        __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)),
                                       _mm_cmpeq_epi8(_mm_max_epu8(x, control), control));
        unsigned mask = (unsigned)_mm_movemask_epi8(special);
        _mm_storeu_si128((__m128i *)at, x);
        if (!mask) {
            at += 16;
            i += 16;
            continue;
        }
        int plain = __builtin_ctz(mask);
        at += plain;
        i += plain;
        at = put_escape(at, data[i++]);
    }
    /* The last bytes (fewer than sixteen) of a longer text: its last sixteen loaded, those
     * already written shifted out of the mask. */
    while (i < length && length >= 16) {
        int left = (int)(length - i);
        __m128i x = _mm_loadu_si128((const __m128i *)(data + length - 16));
        __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)),
                                       _mm_cmpeq_epi8(_mm_max_epu8(x, control), control));
        unsigned mask = (unsigned)_mm_movemask_epi8(special) >> (16 - left);
        int plain = mask ? __builtin_ctz(mask) : left;
        memcpy(at, data + i, (size_t)plain);
        at += plain;
        i += plain;
        if (i < length) at = put_escape(at, data[i++]);
    }
#endif
    while (i < length) {
        /* A run of bytes copied as they are (valid UTF-8 included), found eight at a time up to
         * the first byte that is escaped, exactly from the word's bytes. */
        int64_t run = i;
        uint64_t escaped = 0;
        while (length - run >= 8) {
            uint64_t w;
            memcpy(&w, data + run, 8);
            escaped = escaped_bytes(w);
            if (escaped) break;
            run += 8;
        }
        if (escaped)
            run += __builtin_ctzll(escaped) >> 3;
        else
            while (run < length && data[run] >= 0x20 && data[run] != '"' && data[run] != '\\') run++;
        memcpy(at, data + i, (size_t)(run - i));
        at += run - i;
        i = run;
        if (i == length) break;
        at = put_escape(at, data[i++]);
    }
    *at++ = '"';
    return at;
}

/* A batch's records walked (as record_fields walks them) into a new array of their fields
 * (`*fields`: PyMem_Free it), those with offsets >= min_offset (each record on its own, as Kafka's
 * consumer skips records below its position: offsets need not rise) moved to the columns' first
 * `*kept` rows: their offsets written into `offsets`, and the timestamps consumers see
 * (`append_time_obj`, when not None, is every record's) over their timestamp deltas. An offset or
 * a timestamp past int64 (base + delta) is damage, as a malformed record is: ValueError. The
 * record count is checked against the section's bytes before anything is sized by it. -1 with an
 * exception set. */
static int walk_batch(const Py_buffer *section, Py_ssize_t count, long long base_offset, long long base_timestamp,
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

static const char JSON_T1[] = ",\"timestamp\":", JSON_T2[] = ",\"timestampType\":\"", JSON_T3[] = "\",\"key\":",
                  JSON_T4[] = ",\"value\":", JSON_T5[] = ",\"headers\":[]}\n";
#define JSON_FIXED (sizeof JSON_T1 + sizeof JSON_T2 + sizeof JSON_T3 + sizeof JSON_T4 + sizeof JSON_T5 - 5)

/* The size of the JSON Lines of rows [0, n) of walked columns (every key and value inside the
 * section: `walk` checked it); valid[2i], valid[2i + 1]: whether row i's key and value are UTF-8.
 * Needs no GIL. */
static inline Py_ssize_t json_lines_size(const uint8_t *data, Py_ssize_t n, const int64_t *off, const int64_t *ts,
                                  const int64_t *ks, const int64_t *kl, const int64_t *vs, const int64_t *vl,
                                  Py_ssize_t prefix_len, Py_ssize_t kind_len, uint8_t *valid) {
    Py_ssize_t fixed = prefix_len + kind_len + (Py_ssize_t)JSON_FIXED, total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int key_valid, value_valid;
        total += fixed + decimal_size(off[i]) + decimal_size(ts[i]) +
                 json_text_size(data + (kl[i] > 0 ? ks[i] : 0), kl[i], &key_valid) +
                 json_text_size(data + (vl[i] > 0 ? vs[i] : 0), vl[i], &value_valid);
        valid[2 * i] = (uint8_t)key_valid;
        valid[2 * i + 1] = (uint8_t)value_valid;
    }
    return total;
}

/* Write those lines from `at`, as json_lines_size measured them; end[i] (when `end` is not NULL)
 * where row i's line ends, counted from `base`. Returns where the last ends. Needs no GIL. */
static inline uint8_t *put_json_lines(uint8_t *base, uint8_t *at, const uint8_t *data, Py_ssize_t n, const int64_t *off,
                               const int64_t *ts, const int64_t *ks, const int64_t *kl, const int64_t *vs,
                               const int64_t *vl, const uint8_t *prefix, Py_ssize_t prefix_len, const uint8_t *kind,
                               Py_ssize_t kind_len, const uint8_t *valid, int64_t *end) {
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(at, prefix, prefix_len); at += prefix_len;
        at = put_decimal(at, off[i]);
        memcpy(at, JSON_T1, sizeof JSON_T1 - 1); at += sizeof JSON_T1 - 1;
        at = put_decimal(at, ts[i]);
        memcpy(at, JSON_T2, sizeof JSON_T2 - 1); at += sizeof JSON_T2 - 1;
        memcpy(at, kind, kind_len); at += kind_len;
        memcpy(at, JSON_T3, sizeof JSON_T3 - 1); at += sizeof JSON_T3 - 1;
        at = put_json_text(at, data + (kl[i] > 0 ? ks[i] : 0), kl[i], valid[2 * i]);
        memcpy(at, JSON_T4, sizeof JSON_T4 - 1); at += sizeof JSON_T4 - 1;
        at = put_json_text(at, data + (vl[i] > 0 ? vs[i] : 0), vl[i], valid[2 * i + 1]);
        memcpy(at, JSON_T5, sizeof JSON_T5 - 1); at += sizeof JSON_T5 - 1;
        if (end != NULL) end[i] = at - base;
    }
    return at;
}

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
static PyObject *render_json_section(PyObject *self, PyObject *args) {
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

static PyObject *json_text_sizes(PyObject *self, PyObject *args) {
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

/* -- Arrow binary columns ------------------------------------------------------------------- */
static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer section, starts, lengths, out, offsets;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*", &section, &starts, &lengths, &out, &offsets)) return NULL;
    Py_ssize_t n = starts.len / 8;
    const int64_t *s = (const int64_t *)starts.buf, *l = (const int64_t *)lengths.buf;
    int32_t *o = (int32_t *)offsets.buf;
    int failed = lengths.len < n * 8 || offsets.len < (n + 1) * 4 || o[0] < 0 ||
                 blobs_outside(s, l, n, section.len, 1);
    int64_t total = failed ? 0 : o[0];
    for (Py_ssize_t i = 0; !failed && i < n; i++) total += l[i] > 0 ? l[i] : 0;
    failed = failed || total > out.len || total > INT32_MAX;
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        uint8_t *to = (uint8_t *)out.buf;
        const uint8_t *from = (const uint8_t *)section.buf;
        int32_t at = o[0];
        for (Py_ssize_t i = 0; i < n; i++) {
            if (l[i] > 0) {
                memcpy(to + at, from + s[i], (size_t)l[i]);
                at += (int32_t)l[i];
            }
            o[i + 1] = at;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&section);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&out);
    PyBuffer_Release(&offsets);
    if (failed) {
        PyErr_SetString(PyExc_ValueError, "gather: a blob lies outside the section, or the output is short");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- CRC-32C ---------------------------------------------------------------------------------- */
/* Kafka's batch checksum: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and
 * final xor 0xFFFFFFFF). On x86-64 with SSE4.2 the crc32 instruction checksums three blocks at once
 * (three independent chains keep its pipeline full), their checksums joined by the algebra of
 * CRCs: over A||B the register is x^(8|B|)·crc(A) + crc(B) (mod the polynomial, in GF(2)); elsewhere
 * a table-driven byte loop. */
#define CRC32C_POLY 0x82F63B78u
#define CRC32C_BLOCK 4096 /* each of the three chains' share of a round */

static uint32_t crc32c_table[8][256];
static uint32_t crc32c_x2n[32];         /* x^(2^k) mod the polynomial */
static uint32_t crc32c_shift[2][4][256]; /* ·x^(8·BLOCK) and ·x^(16·BLOCK), a byte of the register at a time */
/* What the machine does: 0 the table loop, CRC32C_CHAINS the crc32 instruction (SSE4.2), and
 * CRC32C_FOLDING carry-less multiplication as well (VPCLMULQDQ, AVX-512). */
#define CRC32C_CHAINS 1
#define CRC32C_FOLDING 2
static int crc32c_hardware;

/* a·b modulo the polynomial (reflected: the high bit of a word is x^0) */
static uint32_t crc32c_multiply(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, product = 0;
    for (;;) {
        if (a & m) {
            product ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
    }
    return product;
}

/* x^n modulo the polynomial (x^(8n): what a register becomes over n zero bytes, as a factor) */
static uint32_t crc32c_xn(uint64_t n) {
    uint32_t factor = 1u << 31; /* x^0 */
    for (unsigned k = 0; n; n >>= 1, k++)
        if (n & 1) factor = crc32c_multiply(crc32c_x2n[k & 31], factor);
    return factor;
}

/* Folding (Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", reflected): a
 * 128-bit piece A of the message, D bits before the piece it is folded into, is replaced by what
 * is congruent to it there: A's first eight bytes times x^(D+31) and its last eight times
 * x^(D-33) (mod the polynomial; the exponents for the reflected order of bits and a carry-less
 * product one bit short), which xor into that piece. What is left, one piece and the tail, is
 * checksummed by the crc32 instruction from a register of 0: it has the message's remainder. */
#define CRC32C_FOLDS 5
static const uint64_t CRC32C_FOLD_BITS[CRC32C_FOLDS] = {128, 256, 384, 512, 2048}; /* the distances D */
static uint64_t crc32c_fold[CRC32C_FOLDS][2];                                      /* (x^(D+31), x^(D-33)) */

static void crc32c_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc32c_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc32c_table[t][n] = (crc32c_table[t - 1][n] >> 8) ^ crc32c_table[0][crc32c_table[t - 1][n] & 0xFF];
    uint32_t p = 1u << 30; /* x^1 */
    crc32c_x2n[0] = p;
    for (int k = 1; k < 32; k++) crc32c_x2n[k] = p = crc32c_multiply(p, p);
    for (int t = 0; t < 2; t++) {
        uint32_t factor = crc32c_xn(8 * (uint64_t)(t + 1) * CRC32C_BLOCK);
        for (int k = 0; k < 4; k++)
            for (uint32_t n = 0; n < 256; n++) crc32c_shift[t][k][n] = crc32c_multiply(factor, n << (8 * k));
    }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    crc32c_hardware = __builtin_cpu_supports("sse4.2") ? CRC32C_CHAINS : 0;
    if (crc32c_hardware && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("vpclmulqdq") &&
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"))
        crc32c_hardware = CRC32C_FOLDING;
    for (int d = 0; d < CRC32C_FOLDS; d++) {
        crc32c_fold[d][0] = crc32c_xn(CRC32C_FOLD_BITS[d] + 31);
        crc32c_fold[d][1] = crc32c_xn(CRC32C_FOLD_BITS[d] - 33);
    }
#endif
}

/* a register carried over one block of zero bytes (t = 0) or two (t = 1) */
static inline uint32_t crc32c_shifted(int t, uint32_t crc) {
    return crc32c_shift[t][0][crc & 0xFF] ^ crc32c_shift[t][1][(crc >> 8) & 0xFF] ^ crc32c_shift[t][2][(crc >> 16) & 0xFF] ^
           crc32c_shift[t][3][crc >> 24];
}

/* the register over `data`, eight bytes a step (slicing by eight) */
static uint32_t crc32c_portable(uint32_t crc, const uint8_t *data, size_t length) {
    while (length && ((uintptr_t)data & 7)) { crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *data++) & 0xFF]; length--; }
    while (length >= 8) {
        uint64_t word;
        memcpy(&word, data, 8);
        word ^= crc; /* (little-endian: the register meets the first four bytes) */
        crc = crc32c_table[7][word & 0xFF] ^ crc32c_table[6][(word >> 8) & 0xFF] ^
              crc32c_table[5][(word >> 16) & 0xFF] ^ crc32c_table[4][(word >> 24) & 0xFF] ^
              crc32c_table[3][(word >> 32) & 0xFF] ^ crc32c_table[2][(word >> 40) & 0xFF] ^
              crc32c_table[1][(word >> 48) & 0xFF] ^ crc32c_table[0][word >> 56];
        data += 8;
        length -= 8;
    }
    while (length--) crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *data++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *data, size_t length) {
    while (length && ((uintptr_t)data & 7)) { crc = __builtin_ia32_crc32qi(crc, *data++); length--; }
    uint64_t c0 = crc;
    while (length >= 3 * CRC32C_BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *a = data, *b = data + CRC32C_BLOCK, *c = data + 2 * CRC32C_BLOCK;
        for (size_t i = 0; i < CRC32C_BLOCK; i += 8) {
            uint64_t wa, wb, wc;
            memcpy(&wa, a + i, 8);
            memcpy(&wb, b + i, 8);
            memcpy(&wc, c + i, 8);
            c0 = __builtin_ia32_crc32di(c0, wa);
            c1 = __builtin_ia32_crc32di(c1, wb);
            c2 = __builtin_ia32_crc32di(c2, wc);
        }
        c0 = crc32c_shifted(1, (uint32_t)c0) ^ crc32c_shifted(0, (uint32_t)c1) ^ (uint32_t)c2;
        data += 3 * CRC32C_BLOCK;
        length -= 3 * CRC32C_BLOCK;
    }
    while (length >= 8) {
        uint64_t word;
        memcpy(&word, data, 8);
        c0 = __builtin_ia32_crc32di(c0, word);
        data += 8;
        length -= 8;
    }
    crc = (uint32_t)c0;
    while (length--) crc = __builtin_ia32_crc32qi(crc, *data++);
    return crc;
}
#endif

#define CRC32C_FOLD_MIN 1024 /* shorter buffers: the three chains (the folding's set-up costs more) */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

__attribute__((target("sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq"))) static inline __m128i
crc32c_fold128(__m128i piece, int d) {
    __m128i k = _mm_set_epi64x((long long)crc32c_fold[d][1], (long long)crc32c_fold[d][0]);
    return _mm_xor_si128(_mm_clmulepi64_si128(piece, k, 0x00), _mm_clmulepi64_si128(piece, k, 0x11));
}

__attribute__((target("sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq"))) static inline __m512i
crc32c_fold512(__m512i pieces, int d) {
    __m512i k = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)crc32c_fold[d][1], (long long)crc32c_fold[d][0]));
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(pieces, k, 0x00), _mm512_clmulepi64_epi128(pieces, k, 0x11));
}

/* The register over `data` (at least CRC32C_FOLD_MIN bytes): 256 bytes a round, four 64-byte
 * registers of four pieces each folded 2048 bits forward; then the four registers into one, its
 * four pieces into one, and that piece and the tail by the crc32 instruction. */
__attribute__((target("sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq"))) static uint32_t
crc32c_folded(uint32_t crc, const uint8_t *data, size_t length) {
    __m512i z0 = _mm512_loadu_si512(data), z1 = _mm512_loadu_si512(data + 64), z2 = _mm512_loadu_si512(data + 128),
            z3 = _mm512_loadu_si512(data + 192);
    z0 = _mm512_xor_si512(z0, _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128((int)crc), 0));
    for (data += 256, length -= 256; length >= 256; data += 256, length -= 256) {
        z0 = _mm512_xor_si512(crc32c_fold512(z0, 4), _mm512_loadu_si512(data));
        z1 = _mm512_xor_si512(crc32c_fold512(z1, 4), _mm512_loadu_si512(data + 64));
        z2 = _mm512_xor_si512(crc32c_fold512(z2, 4), _mm512_loadu_si512(data + 128));
        z3 = _mm512_xor_si512(crc32c_fold512(z3, 4), _mm512_loadu_si512(data + 192));
    }
    /* (each register's pieces 512 bits before the next's; each piece of the last 128 bits before the next) */
    z1 = _mm512_xor_si512(z1, crc32c_fold512(z0, 3));
    z2 = _mm512_xor_si512(z2, crc32c_fold512(z1, 3));
    z3 = _mm512_xor_si512(z3, crc32c_fold512(z2, 3));
    __m128i x = _mm512_extracti32x4_epi32(z3, 3);
    x = _mm_xor_si128(x, crc32c_fold128(_mm512_extracti32x4_epi32(z3, 0), 2));
    x = _mm_xor_si128(x, crc32c_fold128(_mm512_extracti32x4_epi32(z3, 1), 1));
    x = _mm_xor_si128(x, crc32c_fold128(_mm512_extracti32x4_epi32(z3, 2), 0));
    uint64_t c = __builtin_ia32_crc32di(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = __builtin_ia32_crc32di(c, (uint64_t)_mm_extract_epi64(x, 1));
    return crc32c_sse42((uint32_t)c, data, length);
}
#endif

/* CRC-32C of `data` (a whole checksum, conditioning included) */
static uint32_t crc32c_of(const uint8_t *data, size_t length, int hardware) {
    uint32_t crc = 0xFFFFFFFFu;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (hardware >= CRC32C_FOLDING && length >= CRC32C_FOLD_MIN) return ~crc32c_folded(crc, data, length);
    if (hardware) return ~crc32c_sse42(crc, data, length);
#else
    (void)hardware;
#endif
    return ~crc32c_portable(crc, data, length);
}

#define CRC32C_RELEASE_GIL_BYTES (64 * 1024) /* (releasing the GIL costs more than a short checksum) */

static PyObject *crc32c_entry(PyObject *self, PyObject *args, int hardware) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    uint32_t crc;
    if (data.len >= CRC32C_RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc32c_of(data.buf, (size_t)data.len, hardware);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc32c_of(data.buf, (size_t)data.len, hardware);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *crc32c(PyObject *self, PyObject *args) { return crc32c_entry(self, args, crc32c_hardware); }

static PyObject *crc32c_without_hardware(PyObject *self, PyObject *args) { return crc32c_entry(self, args, 0); }

static PyObject *crc32c_without_folding(PyObject *self, PyObject *args) {
    return crc32c_entry(self, args, crc32c_hardware < CRC32C_CHAINS ? crc32c_hardware : CRC32C_CHAINS);
}

static PyObject *crc32c_folding(PyObject *self, PyObject *args) { return PyBool_FromLong(crc32c_hardware >= CRC32C_FOLDING); }

/* -- the allocator and the disk -------------------------------------------------------------- */
static PyObject *keep_freed_memory(PyObject *self, PyObject *args) {
    Py_ssize_t most;
    if (!PyArg_ParseTuple(args, "n", &most)) return NULL;
    if (most < 0) {
        PyErr_SetString(PyExc_ValueError, "keep_freed_memory: a size is not negative");
        return NULL;
    }
#ifdef __GLIBC__
    /* (glibc caps the mapping threshold at 32 MiB on 64-bit machines and refuses more) */
    int threshold = (int)(most < KEEP_MOST ? most : KEEP_MOST);
    return PyBool_FromLong(mallopt(M_MMAP_THRESHOLD, threshold) && mallopt(M_TRIM_THRESHOLD, 2 * threshold));
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *allocates_ahead(PyObject *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd)) return NULL;
#ifdef __linux__
    struct statfs about;
    int known;
    Py_BEGIN_ALLOW_THREADS
    known = fstatfs(fd, &about) == 0;
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(known && about.f_type == EXT4_SUPER_MAGIC);
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *allocate_ahead(PyObject *self, PyObject *args) {
    int fd;
    long long offset, length;
    if (!PyArg_ParseTuple(args, "iLL", &fd, &offset, &length)) return NULL;
    if (offset < 0 || length <= 0) {
        PyErr_SetString(PyExc_ValueError, "allocate_ahead: the offset must not be negative, the length must be positive");
        return NULL;
    }
#ifdef __linux__
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)length) == 0 ? 0 : errno;
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(error);
#else
    return PyLong_FromLong(EOPNOTSUPP);
#endif
}

/* -- lengths of a list's byte strings -------------------------------------------------------------- */
/* blob_lengths(blobs, out): out[i] = len(blobs[i]), 0 for None (the sizes a batch split weighs). */
static PyObject *blob_lengths(PyObject *self, PyObject *args) {
    PyObject *blobs;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "O!w*", &PyList_Type, &blobs, &out)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(blobs);
    if (out.len < n * 8) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "blob_lengths: the output holds fewer int64 than the list has items");
        return NULL;
    }
    int64_t *length = (int64_t *)out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(blobs, i);
        if (PyBytes_CheckExact(item)) length[i] = PyBytes_GET_SIZE(item);
        else if (item == Py_None) length[i] = 0;
        else {
            Py_ssize_t size = PyObject_Size(item);
            if (size < 0) { PyBuffer_Release(&out); return NULL; }
            length[i] = size;
        }
    }
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* -- the default partitioner's hash ------------------------------------------------------------ */
static int32_t murmur2_of(const uint8_t *data, int64_t length) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    int64_t whole = length & ~(int64_t)3;
    for (int64_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 | (uint32_t)data[i + 2] << 16 |
                     (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3: h ^= (uint32_t)data[whole + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)data[whole + 1] << 8;  /* fall through */
    case 1: h ^= (uint32_t)data[whole]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

static PyObject *murmur2(PyObject *self, PyObject *args) {
    Py_buffer data, starts, lengths, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &data, &starts, &lengths, &out)) return NULL;
    Py_ssize_t n = starts.len / 8;
    const int64_t *s = (const int64_t *)starts.buf, *l = (const int64_t *)lengths.buf;
    int failed = lengths.len < n * 8 || out.len < n * 8 || blobs_outside(s, l, n, data.len, 0);
    if (!failed) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            ((int64_t *)out.buf)[i] = murmur2_of((const uint8_t *)data.buf + s[i], l[i]);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&out);
    if (failed) {
        PyErr_SetString(PyExc_ValueError, "murmur2: a blob lies outside the data, or the output is short");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- text rendering ------------------------------------------------------------------------- */
static const uint64_t POWERS_OF_TEN[20] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL, 1000000000ULL,
    10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
    1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL, 1000000000000000000ULL,
    10000000000000000000ULL,
};

/* The number of decimal digits of `magnitude`: its bit length times log10(2) (1233 / 4096),
 * which is exact or one short, corrected by one comparison. (`| 1`: 0 has one digit; setting
 * the low bit never changes the count, as no power of ten above 1 is odd.) */
static inline Py_ssize_t digits_of(uint64_t magnitude) {
    uint64_t m = magnitude | 1;
    int guess = ((64 - __builtin_clzll(m)) * 1233) >> 12;
    return guess + (m >= POWERS_OF_TEN[guess]);
}

static const char DIGIT_PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* `value` in decimal at `at`; returns the end. Two digits a division, from the last. */
static uint8_t *put_decimal(uint8_t *at, int64_t value) {
    uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    if (value < 0) *at++ = '-';
    uint8_t *end = at + digits_of(magnitude), *p = end;
    while (magnitude >= 100) {
        uint64_t pair = magnitude % 100;
        magnitude /= 100;
        p -= 2;
        memcpy(p, DIGIT_PAIRS + 2 * pair, 2);
    }
    if (magnitude >= 10) memcpy(p - 2, DIGIT_PAIRS + 2 * magnitude, 2);
    else p[-1] = (uint8_t)('0' + magnitude);
    return end;
}

static Py_ssize_t decimal_size(int64_t value) {
    uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    return (value < 0) + digits_of(magnitude);
}

typedef struct {
    Py_buffer section, timestamp_label, partition_field, separator, line_end, null;
    int print_offset, print_key, print_value;
} text_args_t;

/* The size of the console lines of rows [0, n) of walked columns (every key and value inside the
 * section: `walk` checked it); `label` NULL: no timestamps shown. Needs no GIL. */
static inline Py_ssize_t text_lines_size(const text_args_t *a, const Py_buffer *label, int have_partition, Py_ssize_t n,
                                  const int64_t *off, const int64_t *ts, const int64_t *kl, const int64_t *vl) {
    int fields = (label != NULL) + have_partition + a->print_offset + a->print_key + a->print_value;
    Py_ssize_t separators = fields > 1 ? (fields - 1) * a->separator.len : 0;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = separators + a->line_end.len;
        if (label != NULL) size += label->len + decimal_size(ts[i]);
        if (have_partition) size += a->partition_field.len;
        if (a->print_offset) size += 7 + decimal_size(off[i]);
        if (a->print_key) size += kl[i] < 0 ? a->null.len : kl[i];
        if (a->print_value) size += vl[i] < 0 ? a->null.len : vl[i];
        total += size;
    }
    return total;
}

/* Write those lines from `at`; end[i] (when `end` is not NULL) where row i's line ends, counted
 * from `base`. Returns where the last ends. Needs no GIL. */
static inline uint8_t *put_text_lines(const text_args_t *a, const Py_buffer *label, int have_partition, Py_ssize_t n,
                               const uint8_t *section, const int64_t *off, const int64_t *ts, const int64_t *ks,
                               const int64_t *kl, const int64_t *vs, const int64_t *vl, uint8_t *base, uint8_t *at,
                               int64_t *end) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int first = 1;
#define SEPARATE() do { if (!first) { memcpy(at, a->separator.buf, a->separator.len); at += a->separator.len; } first = 0; } while (0)
        if (label != NULL) {
            SEPARATE();
            memcpy(at, label->buf, label->len);
            at = put_decimal(at + label->len, ts[i]);
        }
        if (have_partition) {
            SEPARATE();
            memcpy(at, a->partition_field.buf, a->partition_field.len);
            at += a->partition_field.len;
        }
        if (a->print_offset) {
            SEPARATE();
            memcpy(at, "Offset:", 7);
            at = put_decimal(at + 7, off[i]);
        }
        if (a->print_key) {
            SEPARATE();
            if (kl[i] < 0) { memcpy(at, a->null.buf, a->null.len); at += a->null.len; }
            else { memcpy(at, section + ks[i], kl[i]); at += kl[i]; }
        }
        if (a->print_value) {
            SEPARATE();
            if (vl[i] < 0) { memcpy(at, a->null.buf, a->null.len); at += a->null.len; }
            else { memcpy(at, section + vs[i], vl[i]); at += vl[i]; }
        }
#undef SEPARATE
        memcpy(at, a->line_end.buf, a->line_end.len);
        at += a->line_end.len;
        if (end != NULL) end[i] = at - base;
    }
    return at;
}

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
static PyObject *render_text_section(PyObject *self, PyObject *args) {
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

/* -- a range of batches, rendered whole ------------------------------------------------------ */
static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

#define BATCH_HEADER_BYTES 61
#define ATTRIBUTE_COMPRESSION 0x07
#define ATTRIBUTE_LOG_APPEND_TIME 0x08
#define ATTRIBUTE_CONTROL 0x20

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
static PyObject *render_text_range(PyObject *self, PyObject *args) {
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
static PyObject *render_json_range(PyObject *self, PyObject *args) {
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

static PyMethodDef methods[] = {
    {"render_json_section", render_json_section, METH_VARARGS,
     "render_json_section(section, count, base_offset, base_timestamp, log_append_time, min_offset, prefix, "
     "timestamp_type, offsets, ends) -> (bytes, n), or None when a record has headers"},
    {"render_text_range", render_text_range, METH_VARARGS,
     "render_text_range(fd, start, end, size, create_label, append_label, partition, print_offset, print_key, "
     "print_value, separator, line_end, null, small_batch_records[, nowait]) -> bytes, or None (see the module)"},
    {"render_json_range", render_json_range, METH_VARARGS,
     "render_json_range(fd, start, end, size, prefix, create_kind, append_kind[, nowait]) -> bytes, or None (see the "
     "module)"},
    {"render_text_section", render_text_section, METH_VARARGS,
     "render_text_section(section, count, base_offset, base_timestamp, log_append_time, min_offset, label, "
     "partition, print_offset, print_key, print_value, separator, line_end, null, offsets, ends) -> (bytes, n)"},
    {"json_text_sizes", json_text_sizes, METH_VARARGS,
     "json_text_sizes(section, starts, lengths, out): per blob, the UTF-8 length of its JSON text."},
    {"encode_columns", encode_columns, METH_VARARGS,
     "encode_columns(n, value_data, value_starts, value_lengths, key_data, key_starts, key_lengths, "
     "timestamp_delta, batch_firsts, ends) -> bytes (see the module)."},
    {"gather", gather, METH_VARARGS,
     "gather(section, starts, lengths, out, out_offsets): blobs into Arrow binary buffers (see the module)."},
    {"crc32c", crc32c, METH_VARARGS, "crc32c(data) -> int: CRC-32C (Castagnoli) of a buffer."},
    {"crc32c_without_folding", crc32c_without_folding, METH_VARARGS,
     "crc32c_without_folding(data) -> int: crc32c without carry-less multiplication (the three chains, or the table loop)."},
    {"crc32c_folding", crc32c_folding, METH_NOARGS, "crc32c_folding() -> bool: whether crc32c folds long buffers."},
    {"crc32c_without_hardware", crc32c_without_hardware, METH_VARARGS,
     "crc32c_without_hardware(data) -> int: crc32c by the portable table loop (what machines without SSE4.2 use)."},
    {"keep_freed_memory", keep_freed_memory, METH_VARARGS,
     "keep_freed_memory(most) -> bool: the allocator keeps freed blocks of up to `most` bytes (see the module)."},
    {"allocates_ahead", allocates_ahead, METH_VARARGS,
     "allocates_ahead(fd) -> bool: whether blocks allocated before a large write make it faster there."},
    {"allocate_ahead", allocate_ahead, METH_VARARGS,
     "allocate_ahead(fd, offset, length) -> 0 or errno: fallocate(FALLOC_FL_KEEP_SIZE) of the range."},
    {"blob_lengths", blob_lengths, METH_VARARGS, "blob_lengths(blobs, out): out[i] = len(blobs[i]), 0 for None."},
    {"murmur2", murmur2, METH_VARARGS,
     "murmur2(data, starts, lengths, out): Kafka's murmur2 of each blob, signed, into out (int64)."},
    {"record_fields", record_fields, METH_VARARGS,
     "record_fields(section, count, out): eight int64 columns of count records into out (see the module)."},
    {"encode_value_run", encode_value_run, METH_VARARGS,
     "encode_value_run(values, start, stop, room, most) -> (bytearray or bytes, end) (see the module)."},
    {"encode_records", encode_records, METH_VARARGS,
     "encode_records(values, keys, header_blobs, timestamp_deltas, offset_deltas) -> bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_core",
    "The engine's compiled core: the per-record loops of Kafka's v2 records (see _core.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    crc32c_init();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntMacro(m, ESTIMATED_RECORD_VARINTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
