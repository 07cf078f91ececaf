/*
 * crc32c.c -- CRC-32C with the CPU's crc32 instruction where present.
 *
 * The implementation is chosen once, on first use, from cpuid (SSE4.2): the
 * hardware path runs three independent crc32 chains over three thirds of
 * each large block, because the instruction has a latency of three cycles but
 * a throughput of one; the partial CRCs are merged by "shifting" a register
 * over a block of zeros, done with four table lookups (crc32c_shift below;
 * CRC is linear, so crc(A||B) = shift_len(B)(crc(A)) ^ crc0(B)).  Where the
 * CPU has AVX-512 carry-less multiplication (VPCLMULQDQ), blocks of 256 bytes
 * and more are instead folded 64 bytes at a time (Intel's "Fast CRC
 * Computation Using PCLMULQDQ"), which also carries the copy: the same
 * 64-byte loads are stored, or streamed past the cache for persistent memory.
 * The folding constants are x^(D+32) and x^(D-32) mod P, bit-reflected and
 * shifted left by one (the same derivation gives zlib's published CRC-32
 * constants); the folded 128 bits are finished with the crc32 instruction.
 * Without SSE4.2, or with PMEMWAL_NO_CRC_HW=1, a slicing-by-8 table
 * implementation is used.  Both produce the
 * standard CRC-32C (iSCSI, RFC 3720): crc32c("123456789") == 0xE3069283.
 */
#include "crc32c.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];

/* shift tables: zeros_N[k][b] = CRC contribution of byte b followed by N zero bytes */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256
static uint32_t long_shift[4][256];
static uint32_t short_shift[4][256];

static uint32_t (*update_fn)(uint32_t, const unsigned char *, size_t);
static int has_fold; /* AVX-512 VPCLMULQDQ folding for blocks of FOLD_MIN and more */
#define FOLD_MIN 256
static const char *impl_name = "none";

static uint32_t update_table(uint32_t crc, const unsigned char *p, size_t len);

/* build_shift -- shift[k][b]: a register holding byte b at byte k, run over len zeros. */
static void build_shift(uint32_t shift[4][256], size_t len)
{
    static const unsigned char zeros[LONG_BLOCK];
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            shift[k][b] = update_table(b << (8 * k), zeros, len);
}

static inline uint32_t crc32c_shift(uint32_t shift[4][256], uint32_t crc)
{
    return shift[0][crc & 0xff] ^ shift[1][(crc >> 8) & 0xff] ^
           shift[2][(crc >> 16) & 0xff] ^ shift[3][crc >> 24];
}

/* update_table -- slicing-by-8 software CRC on the raw (pre-inverted) register. */
static uint32_t update_table(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        word ^= crc;
        crc = table[7][word & 0xff] ^ table[6][(word >> 8) & 0xff] ^
              table[5][(word >> 16) & 0xff] ^ table[4][(word >> 24) & 0xff] ^
              table[3][(word >> 32) & 0xff] ^ table[2][(word >> 40) & 0xff] ^
              table[1][(word >> 48) & 0xff] ^ table[0][word >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#define FOLD_TARGET __attribute__((target("avx512f,avx512bw,vpclmulqdq,pclmul,sse4.2")))
#define K_LO(lo, hi) _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)

FOLD_TARGET static inline __m512i fold512(__m512i x, __m512i k)
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                            _mm512_clmulepi64_epi128(x, k, 0x11));
}

FOLD_TARGET static inline __m128i fold128(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

FOLD_TARGET static inline void put64(unsigned char *dst, __m512i v, int nt)
{
    if (nt)
        _mm512_stream_si512((void *)dst, v); /* dst is 64-byte aligned */
    else
        _mm512_storeu_si512(dst, v);
}

/* fold_copy -- raw CRC register over len bytes (a multiple of 64, at least 256),
 * copying them to dst on the way when dst is not NULL. */
FOLD_TARGET static uint32_t fold_copy(uint32_t crc, unsigned char *dst, const unsigned char *p,
                                      size_t len, int nt)
{
    const __m512i k2048 = K_LO(0xdcb17aa4ll, 0xb9e02b86ll), k512 = K_LO(0x740eef02ll, 0x9e4addf8ll);
    __m512i a[4]; /* unrolled below, so that the four accumulators live in registers */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        a[i] = _mm512_loadu_si512(p + 64 * i);
        if (dst)
            put64(dst + 64 * i, a[i], nt);
    }
    a[0] = _mm512_xor_si512(a[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    for (p += 256, dst = dst ? dst + 256 : NULL, len -= 256; len >= 256; p += 256, len -= 256) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512i b = _mm512_loadu_si512(p + 64 * i);
            if (dst)
                put64(dst + 64 * i, b, nt);
            a[i] = _mm512_xor_si512(fold512(a[i], k2048), b);
        }
        dst = dst ? dst + 256 : NULL;
    }
#pragma GCC unroll 3
    for (int i = 1; i < 4; i++)
        a[i] = _mm512_xor_si512(fold512(a[i - 1], k512), a[i]);
    for (; len >= 64; p += 64, len -= 64) {
        __m512i b = _mm512_loadu_si512(p);
        if (dst) {
            put64(dst, b, nt);
            dst += 64;
        }
        a[3] = _mm512_xor_si512(fold512(a[3], k512), b);
    }
    const __m128i k128 = _mm_set_epi64x(0x14cd00bd6ll, 0xf20c0dfell);
    __m128i lane = _mm512_extracti32x4_epi32(a[3], 0);
    lane = _mm_xor_si128(fold128(lane, k128), _mm512_extracti32x4_epi32(a[3], 1));
    lane = _mm_xor_si128(fold128(lane, k128), _mm512_extracti32x4_epi32(a[3], 2));
    lane = _mm_xor_si128(fold128(lane, k128), _mm512_extracti32x4_epi32(a[3], 3));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(lane));
    return (uint32_t)_mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(lane, 1));
}

static int cpu_has_vpclmul(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
        return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xE6) != 0xE6) /* the OS saves SSE, AVX and AVX-512 state */
        return 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX512F) && (b & bit_AVX512BW) &&
           (c & bit_VPCLMULQDQ);
}

__attribute__((target("sse4.2"))) static uint32_t
hw_run(uint32_t crc, const unsigned char *p, size_t len)
{
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        len -= 8;
    }
    crc = (uint32_t)c;
    while (len--)
        crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}

/* hw_three -- three interleaved chains over blocks of 3*block bytes. */
__attribute__((target("sse4.2"))) static uint32_t
hw_three(uint32_t crc, const unsigned char **pp, size_t *lenp, size_t block,
         uint32_t shift[4][256])
{
    const unsigned char *p = *pp;
    size_t len = *lenp;
    while (len >= 3 * block) {
        uint64_t c0 = crc, c1 = 0, c2 = 0;
        const unsigned char *end = p + block;
        do {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + block, 8);
            memcpy(&w2, p + 2 * block, 8);
            c0 = __builtin_ia32_crc32di(c0, w0);
            c1 = __builtin_ia32_crc32di(c1, w1);
            c2 = __builtin_ia32_crc32di(c2, w2);
            p += 8;
        } while (p < end);
        crc = crc32c_shift(shift, (uint32_t)c0) ^ (uint32_t)c1;
        crc = crc32c_shift(shift, crc) ^ (uint32_t)c2;
        p += 2 * block;
        len -= 3 * block;
    }
    *pp = p;
    *lenp = len;
    return crc;
}

__attribute__((target("sse4.2"))) static uint32_t
update_hw(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = __builtin_ia32_crc32qi(crc, *p++);
        len--;
    }
    if (has_fold && len >= FOLD_MIN) {
        size_t body = len & ~(size_t)63;
        crc = fold_copy(crc, NULL, p, body, 0);
        p += body;
        len -= body;
    }
    crc = hw_three(crc, &p, &len, LONG_BLOCK, long_shift);
    crc = hw_three(crc, &p, &len, SHORT_BLOCK, short_shift);
    return hw_run(crc, p, len);
}

/* nt_three -- crc32c_copy_nt's body: three chains, each word also streamed to dst. */
__attribute__((target("sse4.2"))) static uint32_t
nt_three(uint32_t crc, unsigned char **dp, const unsigned char **sp, size_t *lenp)
{
    const unsigned char *p = *sp;
    long long *d = (long long *)*dp;
    size_t len = *lenp;
    while (len >= 3 * SHORT_BLOCK) {
        uint64_t c0 = crc, c1 = 0, c2 = 0;
        const unsigned char *end = p + SHORT_BLOCK;
        do {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + SHORT_BLOCK, 8);
            memcpy(&w2, p + 2 * SHORT_BLOCK, 8);
            c0 = __builtin_ia32_crc32di(c0, w0);
            c1 = __builtin_ia32_crc32di(c1, w1);
            c2 = __builtin_ia32_crc32di(c2, w2);
            __builtin_ia32_movnti64(d, (long long)w0);
            __builtin_ia32_movnti64(d + SHORT_BLOCK / 8, (long long)w1);
            __builtin_ia32_movnti64(d + 2 * SHORT_BLOCK / 8, (long long)w2);
            p += 8;
            d++;
        } while (p < end);
        crc = crc32c_shift(short_shift, (uint32_t)c0) ^ (uint32_t)c1;
        crc = crc32c_shift(short_shift, crc) ^ (uint32_t)c2;
        p += 2 * SHORT_BLOCK;
        d += 2 * SHORT_BLOCK / 8;
        len -= 3 * SHORT_BLOCK;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        crc = (uint32_t)__builtin_ia32_crc32di(crc, w);
        __builtin_ia32_movnti64(d++, (long long)w);
        p += 8;
        len -= 8;
    }
    *sp = p;
    *dp = (unsigned char *)d;
    *lenp = len;
    return crc;
}

static int cpu_has_sse42(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_2);
}
#else
static int cpu_has_sse42(void) { return 0; }
static int cpu_has_vpclmul(void) { return 0; }
#define update_hw update_table
static uint32_t fold_copy(uint32_t crc, unsigned char *dst, const unsigned char *p, size_t len, int nt)
{
    (void)dst; (void)p; (void)len; (void)nt;
    return crc; /* never called: has_fold stays 0 */
}
static uint32_t nt_three(uint32_t crc, unsigned char **dp, const unsigned char **sp, size_t *lenp)
{
    (void)dp; (void)sp; (void)lenp;
    return crc; /* never called: no SSE4.2, no streaming path */
}
#endif

/* crc32c_init -- tables and the implementation choice; idempotent. */
static void crc32c_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? (crc >> 1) ^ POLY : crc >> 1;
        table[0][n] = crc;
    }
    for (int n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++)
            table[k][n] = table[0][table[k - 1][n] & 0xff] ^ (table[k - 1][n] >> 8);
    build_shift(long_shift, LONG_BLOCK);
    build_shift(short_shift, SHORT_BLOCK);
    const char *off = getenv("PMEMWAL_NO_CRC_HW");
    if (cpu_has_sse42() && !(off && *off && *off != '0')) {
        update_fn = update_hw;
        impl_name = "sse4.2";
        if ((has_fold = cpu_has_vpclmul()))
            impl_name = "avx512-vpclmulqdq";
    } else {
        update_fn = update_table;
        impl_name = "table";
    }
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, crc32c_init);
    return ~update_fn(~crc, buf, len);
}

uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len)
{
    const unsigned char *s = src;
    unsigned char *d = dst;
    pthread_once(&init_once, crc32c_init);
    if (has_fold && len >= FOLD_MIN) { /* one pass: the folding loads are stored */
        size_t body = len & ~(size_t)63;
        crc = ~fold_copy(~crc, d, s, body, 0);
        s += body;
        d += body;
        len -= body;
    }
    /* Otherwise two passes over a block small enough to stay in L1: the copy
     * reads it back from cache, so the cost is close to the CRC alone. */
    while (len) {
        size_t n = len < 4096 ? len : 4096;
        crc = crc32c_update(crc, s, n);
        memcpy(d, s, n);
        s += n;
        d += n;
        len -= n;
    }
    return crc;
}

const char *crc32c_impl(void)
{
    pthread_once(&init_once, crc32c_init);
    return impl_name;
}

uint32_t crc32c_copy_nt(uint32_t crc, void *dst, const void *src, size_t len, int pad)
{
    pthread_once(&init_once, crc32c_init);
    if (update_fn != update_hw || ((uintptr_t)dst & 7))
        return crc32c_copy(crc, dst, src, len); /* no streaming path: cached copy */
    unsigned char *d = dst;
    const unsigned char *s = src;
    crc = ~crc;
    if (has_fold && len >= FOLD_MIN + 64) {
        size_t head = (64 - ((uintptr_t)d & 63)) & 63; /* 8-byte words up to 64-byte alignment */
        len -= head;
        crc = nt_three(crc, &d, &s, &head);
        size_t body = len & ~(size_t)63;
        crc = fold_copy(crc, d, s, body, 1);
        d += body;
        s += body;
        len -= body;
    }
    crc = ~nt_three(crc, &d, &s, &len);
    if (len) { /* ragged end */
        unsigned char tail[8] = {0};
        memcpy(tail, s, len);
        crc = crc32c_update(crc, tail, len);
        if (pad) {
            uint64_t w;
            memcpy(&w, tail, 8);
            __builtin_ia32_movnti64((long long *)d, (long long)w);
        } else {
            memcpy(d, tail, len);
        }
    }
    return crc;
}

int crc32c_streaming(void)
{
    pthread_once(&init_once, crc32c_init);
    return update_fn == update_hw;
}
