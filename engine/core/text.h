/* Console text, a record at a time: a record's line as kafka-console-consumer prints it, sized and
 * written. Inline: text.c's and range.c's loops. */
#ifndef SEGLOGFS_TEXT_H
#define SEGLOGFS_TEXT_H

#include "core.h"

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


#endif
