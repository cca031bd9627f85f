/* Kafka's murmur2, the default partitioner's hash.
 *
 * murmur2(data, starts, lengths, out)
 *     Kafka's `Utils.murmur2` (the default partitioner's hash; seed 0x9747b28c) of each blob
 *     data[starts[i]:][:lengths[i]] (starts and lengths int64 buffers, every blob inside `data`),
 *     as a signed 32-bit value widened into `out` (int64). The GIL is released while it hashes.
 */

#include "core.h"

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

PyObject *murmur2(PyObject *self, PyObject *args) {
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
