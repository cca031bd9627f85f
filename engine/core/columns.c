/* Arrow's binary columns from blobs, and the lengths of a list's byte strings.
 *
 * gather(section, starts, lengths, out, out_offsets)
 *     Arrow `binary` buffers from blobs: each blob section[starts[i]:][:lengths[i]] (length -1:
 *     null, which takes no bytes) is copied into `out` one after the other, from
 *     out_offsets[0] on, and out_offsets[i + 1] (int32) set to where blob i ends. starts and
 *     lengths are int64 buffers of n, out_offsets int32 of n + 1 (its first already set).
 *     ValueError when a blob lies outside the section or `out` is too short. The GIL is
 *     released while it copies.
 */

#include "core.h"

PyObject *gather(PyObject *self, PyObject *args) {
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

/* blob_lengths(blobs, out): out[i] = len(blobs[i]), 0 for None (the sizes a batch split weighs). */
PyObject *blob_lengths(PyObject *self, PyObject *args) {
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
