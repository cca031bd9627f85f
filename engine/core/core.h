/* The engine's compiled core: what its files share (the extension module `seglogfs.engine._core`
 * is built from every .c file of this folder; module.c lists its functions, and each file says what its
 * own do). Helpers used in more than one file's per-record loops are static inline here, so that
 * each loop keeps them inlined. */
#ifndef SEGLOGFS_CORE_H
#define SEGLOGFS_CORE_H

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

/* -- records sections: varints and a record's fields ------------------------------------------ */
typedef struct {
    const uint8_t *data;
    Py_ssize_t end;
    Py_ssize_t position;
} reader_t;

/* A zig-zag varint at the reader's position; 0 on success, -1 past the end, -2 over ten bytes. */
static inline int read_long_varint(reader_t *r, int64_t *value) {
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

static inline Py_ssize_t varint_size(int64_t value) {
    uint64_t zigzag = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    Py_ssize_t size = 1;
    while (zigzag >= 0x80) { zigzag >>= 7; size++; }
    return size;
}

static inline uint8_t *put_varint(uint8_t *at, int64_t value) {
    uint64_t zigzag = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (zigzag >= 0x80) { *at++ = (uint8_t)(zigzag | 0x80); zigzag >>= 7; }
    *at++ = (uint8_t)zigzag;
    return at;
}

/* -- decimals ------------------------------------------------------------------------------------ */
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
static inline uint8_t *put_decimal(uint8_t *at, int64_t value) {
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

static inline Py_ssize_t decimal_size(int64_t value) {
    uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    return (value < 0) + digits_of(magnitude);
}

/* -- batch headers -------------------------------------------------------------------------------- */
static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

#define BATCH_HEADER_BYTES 61
#define ATTRIBUTE_COMPRESSION 0x07
#define ATTRIBUTE_LOG_APPEND_TIME 0x08
#define ATTRIBUTE_CONTROL 0x20


/* Whether any of `n` blobs (starts[i], lengths[i]) lies outside `size` bytes of data; a length of
 * -1 is a null, allowed where `nulls` says so. */
static inline int blobs_outside(const int64_t *s, const int64_t *l, Py_ssize_t n, Py_ssize_t size, int nulls) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (l[i] < (nulls ? -1 : 0) || (l[i] > 0 && (s[i] < 0 || s[i] > size - l[i]))) return 1;
    return 0;
}

/* -- across files ------------------------------------------------------------------------------- */
/* decode.c */
int walk_batch(const Py_buffer *section, Py_ssize_t count, long long base_offset, long long base_timestamp,
               PyObject *append_time_obj, long long min_offset, const Py_buffer *offsets, const Py_buffer *ends,
               int64_t **fields, Py_ssize_t *kept);
/* crc32c.c */
extern int crc32c_hardware;
void crc32c_init(void);
uint32_t crc32c_of(const uint8_t *data, size_t length, int hardware);

/* The module's functions (module.c lists them; each file's comment says what its own do). */
#define CORE_FUNCTION(name) PyObject *name(PyObject *self, PyObject *args)
CORE_FUNCTION(record_fields);
CORE_FUNCTION(encode_records);
CORE_FUNCTION(encode_value_run);
CORE_FUNCTION(encode_columns);
CORE_FUNCTION(json_text_sizes);
CORE_FUNCTION(render_json_section);
CORE_FUNCTION(render_text_section);
CORE_FUNCTION(render_text_range);
CORE_FUNCTION(render_json_range);
CORE_FUNCTION(gather);
CORE_FUNCTION(blob_lengths);
CORE_FUNCTION(crc32c);
CORE_FUNCTION(crc32c_without_hardware);
CORE_FUNCTION(crc32c_without_folding);
CORE_FUNCTION(crc32c_folding);
CORE_FUNCTION(murmur2);
CORE_FUNCTION(keep_freed_memory);
CORE_FUNCTION(allocates_ahead);
CORE_FUNCTION(allocate_ahead);
#undef CORE_FUNCTION

#endif
