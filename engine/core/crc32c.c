/* CRC-32C, Kafka's batch checksum.
 *
 * crc32c(data) -> int
 *     CRC-32C (Castagnoli) of a buffer, Kafka's batch checksum: on a machine with VPCLMULQDQ
 *     (AVX-512), buffers of 1 KiB and more folded by carry-less multiplication; else the SSE4.2
 *     instruction where the machine has it, three chains at once; a table loop elsewhere
 *     (crc32c_without_folding and crc32c_without_hardware, for the tests). The GIL is released
 *     for buffers of 64 KiB or more.
 */

#include "core.h"

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
int crc32c_hardware;

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

void crc32c_init(void) {
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
uint32_t crc32c_of(const uint8_t *data, size_t length, int hardware) {
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

PyObject *crc32c(PyObject *self, PyObject *args) { return crc32c_entry(self, args, crc32c_hardware); }

PyObject *crc32c_without_hardware(PyObject *self, PyObject *args) { return crc32c_entry(self, args, 0); }

PyObject *crc32c_without_folding(PyObject *self, PyObject *args) {
    return crc32c_entry(self, args, crc32c_hardware < CRC32C_CHAINS ? crc32c_hardware : CRC32C_CHAINS);
}

PyObject *crc32c_folding(PyObject *self, PyObject *args) { return PyBool_FromLong(crc32c_hardware >= CRC32C_FOLDING); }
