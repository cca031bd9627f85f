/* JSON Lines text, a record at a time: the JSON text of a key or value (engine.text.json_records'
 * bytes_json_text), sized and written, and a record's line. Inline: json.c's and range.c's loops. */
#ifndef SEGLOGFS_JSON_H
#define SEGLOGFS_JSON_H

#include "core.h"

/* The length of a complete, strictly valid UTF-8 sequence at `p` (as Python's strict decoder
 * takes it: no overlong forms, no surrogates, nothing above U+10FFFF), or 0. */
static inline Py_ssize_t utf8_sequence(const uint8_t *p, Py_ssize_t left) {
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
static inline int64_t json_text_size(const uint8_t *data, int64_t length, int *valid) {
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
static inline uint8_t *put_json_text(uint8_t *at, const uint8_t *data, int64_t length, int valid) {
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


#endif
