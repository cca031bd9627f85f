/* The engine's compiled core, the extension module `seglogfs.engine._core`: the per-record loops of
 * Kafka's v2 records, built from every .c file of this folder as one extension. Its functions, by
 * file (each file's comment says what they do; engine/_core.pyi gives their Python signatures):
 *
 *   decode.c   record_fields                       a records section walked into columns
 *   encode.c   encode_records, encode_value_run,   records sections of v2 batches
 *              encode_columns
 *   json.c     json_text_sizes, render_json_section
 *   text.c     render_text_section
 *   range.c    render_text_range, render_json_range  a file's range of batches in one call
 *   columns.c  gather, blob_lengths                Arrow binary columns; lengths of byte strings
 *   crc32c.c   crc32c (and its variants for the tests)
 *   murmur2.c  murmur2
 *   system.c   keep_freed_memory, allocates_ahead, allocate_ahead
 *
 * core.h holds what they share (varints, a record's fields, decimals, batch header fields), json.h
 * and text.h a record's line in each format; their per-record helpers are inline, so that every
 * loop keeps them inlined. Each function releases the GIL while it works (crc32c from 64 KiB).
 */

#include "core.h"

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
    "The engine's compiled core: the per-record loops of Kafka's v2 records (see engine/core/module.c).", -1, methods,
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
