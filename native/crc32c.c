/*
 * crc32c.c -- CRC-32C with the CPU's crc32 instruction where present.
 *
 * The implementation is chosen once, on first use, from cpuid (SSE4.2): the
 * hardware path runs three independent crc32 chains over three thirds of
 * each large block, because the instruction has a latency of three cycles but
 * a throughput of one; the partial CRCs are merged by "shifting" a register
 * over a block of zeros, done with four table lookups (crc32c_shift below;
 * CRC is linear, so crc(A||B) = shift_len(B)(crc(A)) ^ crc0(B)).  Where the
 * CPU has carry-less multiplication, blocks of FOLD_MIN (256) bytes and more
 * are instead folded (Intel's "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ"), which also carries the copy: the same loads are stored,
 * or streamed past the cache for persistent memory.  Three folding paths:
 * "pclmul" (eight 128-bit lanes, 128 bytes a step, 16-byte stores),
 * "avx2-vpclmulqdq" (four 256-bit registers, 128 bytes a step, 32-byte
 * stores) and "avx512-vpclmulqdq" (four 512-bit registers, 256 bytes a step,
 * 64-byte stores).  The folding constants are x^(D+32) and x^(D-32) mod P,
 * bit-reflected and shifted left by one, for a folding distance of D bits
 * (the same derivation gives zlib's published CRC-32 constants); all three
 * paths reduce to four 128-bit lanes, which fold_finish folds together
 * (D = 128) and finishes with the crc32 instruction.
 * Without SSE4.2 a slicing-by-8 table implementation is used.  All produce the
 * standard CRC-32C (iSCSI, RFC 3720): crc32c("123456789") == 0xE3069283.
 *
 * PMEMWAL_CPU=table|sse42|pclmul|avx2|avx512 forces a path (read once, at
 * first use); one the CPU lacks falls back to the best path below it that it
 * has, and crc32c_impl() names the path in use.  PMEMWAL_NO_CRC_HW=1 is the
 * same as PMEMWAL_CPU=table.  pclmul is taken only when named: on Zen 4 a
 * 128-bit carry-less multiply issues every two cycles, and the eight lanes
 * fold about half as fast as the three crc32 chains (benchmarks/crc.py), so
 * without VPCLMULQDQ the default, and the fallback, is sse4.2.
 */
#include "crc32c.h"
#include "trace.h"

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
/* fold_fn: raw CRC register over len bytes (a multiple of 64, at least FOLD_MIN), copied to
 * dst on the way when dst is not NULL, with non-temporal stores when nt (dst 64-byte aligned);
 * NULL where the chosen path does not fold. */
static uint32_t (*fold_fn)(uint32_t, unsigned char *, const unsigned char *, size_t, int);
/* copy_run_fn: raw CRC register over len bytes copied to dst, one word at a time (short
 * copies, such as a small record's payload read back), or NULL on the table path. */
static uint32_t (*copy_run_fn)(uint32_t, unsigned char *, const unsigned char *, size_t);
/* copy_pair_fn: crc32c_copy_after2's two chains interleaved, or NULL on the table path. */
static void (*copy_pair_fn)(size_t, const unsigned char *, const unsigned char *, unsigned char *,
                            size_t, uint32_t *, const unsigned char *, const unsigned char *,
                            unsigned char *, size_t, uint32_t *);
#define FOLD_MIN 256
static const char *impl_name = "none";

/* the paths, in order of preference; PMEMWAL_CPU takes the env names */
enum { PATH_TABLE, PATH_SSE42, PATH_PCLMUL, PATH_AVX2, PATH_AVX512, NPATHS };
static const struct { const char *env, *name; } paths[NPATHS] = {
    {"table", "table"}, {"sse42", "sse4.2"}, {"pclmul", "pclmul"},
    {"avx2", "avx2-vpclmulqdq"}, {"avx512", "avx512-vpclmulqdq"},
};

static uint32_t update_table(uint32_t crc, const unsigned char *p, size_t len);

/* build_shift -- shift[k][b]: a register holding byte b at byte k, run over len zeros. */
static void build_shift(uint32_t shift[4][256], size_t len)
{
    static const unsigned char zeros[LONG_BLOCK];
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            shift[k][b] = update_table(b << (8 * k), zeros, len);
}

/* crc32c_shift -- crc run over the zeros its shift tables were built for. */
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

#define PCL_TARGET __attribute__((target("pclmul,sse4.2")))
#define AVX2_TARGET __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2")))
#define FOLD_TARGET __attribute__((target("avx512f,avx512bw,vpclmulqdq,pclmul,sse4.2")))
#define INLINE __attribute__((always_inline)) static inline
/* folding constants: (x^(D+32), x^(D-32)) mod P for a distance of D bits, see the top */
#define K128_LO 0xf20c0dfell
#define K128_HI 0x14cd00bd6ll
#define K512_LO 0x740eef02ll
#define K512_HI 0x9e4addf8ll
#define K1024_LO 0x6992cea2ll
#define K1024_HI 0xd3b6092ll
#define K2048_LO 0xdcb17aa4ll
#define K2048_HI 0xb9e02b86ll
#define K_128(k) _mm_set_epi64x(k##_HI, k##_LO)
#define K_256(k) _mm256_set_epi64x(k##_HI, k##_LO, k##_HI, k##_LO)
#define K_512(k) _mm512_set_epi64(k##_HI, k##_LO, k##_HI, k##_LO, k##_HI, k##_LO, k##_HI, k##_LO)

/* fold128 -- x carried 128+D bits further (k for D), ready to be xored with the data there. */
PCL_TARGET INLINE __m128i fold128(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* fold_finish -- four consecutive 128-bit lanes folded into one (D = 128) and reduced to the
 * raw CRC register with the crc32 instruction: the last step of every folding path. */
PCL_TARGET INLINE uint32_t fold_finish(__m128i l0, __m128i l1, __m128i l2, __m128i l3)
{
    const __m128i k128 = K_128(K128);
    __m128i lane = _mm_xor_si128(fold128(l0, k128), l1);
    lane = _mm_xor_si128(fold128(lane, k128), l2);
    lane = _mm_xor_si128(fold128(lane, k128), l3);
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(lane));
    return (uint32_t)_mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(lane, 1));
}

/* FOLD_DISPATCH -- a fold_fn that calls body (always inlined) with dst and nt constant, so
 * that the loops carry no test of them. */
#define FOLD_DISPATCH(target, name, body)                                                   \
    target static uint32_t name(uint32_t crc, unsigned char *dst, const unsigned char *p,  \
                                size_t len, int nt)                                        \
    {                                                                                       \
        if (!dst)                                                                           \
            return body(crc, NULL, p, len, 0);                                              \
        return nt ? body(crc, dst, p, len, 1) : body(crc, dst, p, len, 0);                  \
    }

/* ---- pclmul: 128-bit lanes */

/* load16 -- 16 bytes at p, also stored to dst (streamed when nt) unless dst is NULL. */
PCL_TARGET INLINE __m128i load16(unsigned char *dst, const unsigned char *p, int nt)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    if (dst && nt) {
        _mm_stream_si128((__m128i *)dst, v); /* dst is 64-byte aligned */
        trace_stream(dst, 16);
    } else if (dst)
        _mm_storeu_si128((__m128i *)dst, v);
    return v;
}

/* fold_body_pclmul -- fold_fn with eight 128-bit lanes, 128 bytes a step (D = 1024). */
PCL_TARGET INLINE uint32_t fold_body_pclmul(uint32_t crc, unsigned char *dst,
                                            const unsigned char *p, size_t len, int nt)
{
    const __m128i k1024 = K_128(K1024), k512 = K_128(K512);
    __m128i a[8]; /* unrolled below, so that the accumulators live in registers */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        a[i] = load16(dst ? dst + 16 * i : NULL, p + 16 * i, nt);
    a[0] = _mm_xor_si128(a[0], _mm_cvtsi32_si128((int)crc));
    for (p += 128, dst = dst ? dst + 128 : NULL, len -= 128; len >= 128; p += 128, len -= 128) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            a[i] = _mm_xor_si128(fold128(a[i], k1024), load16(dst ? dst + 16 * i : NULL,
                                                                p + 16 * i, nt));
        dst = dst ? dst + 128 : NULL;
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* eight lanes to four, 64 bytes on */
        a[i + 4] = _mm_xor_si128(fold128(a[i], k512), a[i + 4]);
    if (len) { /* a last 64 bytes */
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            a[i + 4] = _mm_xor_si128(fold128(a[i + 4], k512),
                                     load16(dst ? dst + 16 * i : NULL, p + 16 * i, nt));
    }
    return fold_finish(a[4], a[5], a[6], a[7]);
}
/* fold_copy_pclmul -- the pclmul path's fold_fn. */
FOLD_DISPATCH(PCL_TARGET, fold_copy_pclmul, fold_body_pclmul)

/* ---- avx2-vpclmulqdq: 256-bit registers */

/* fold256 -- fold128 on both lanes of x. */
AVX2_TARGET INLINE __m256i fold256(__m256i x, __m256i k)
{
    return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00),
                            _mm256_clmulepi64_epi128(x, k, 0x11));
}

/* load32 -- 32 bytes at p, also stored to dst (streamed when nt) unless dst is NULL. */
AVX2_TARGET INLINE __m256i load32(unsigned char *dst, const unsigned char *p, int nt)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    if (dst && nt) {
        _mm256_stream_si256((__m256i *)dst, v); /* dst is 64-byte aligned */
        trace_stream(dst, 32);
    } else if (dst)
        _mm256_storeu_si256((__m256i *)dst, v);
    return v;
}

/* fold_body_avx2 -- fold_fn with four 256-bit registers, 128 bytes a step (D = 1024). */
AVX2_TARGET INLINE uint32_t fold_body_avx2(uint32_t crc, unsigned char *dst,
                                           const unsigned char *p, size_t len, int nt)
{
    const __m256i k1024 = K_256(K1024), k512 = K_256(K512);
    __m256i a[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        a[i] = load32(dst ? dst + 32 * i : NULL, p + 32 * i, nt);
    a[0] = _mm256_xor_si256(a[0], _mm256_setr_epi32((int)crc, 0, 0, 0, 0, 0, 0, 0));
    for (p += 128, dst = dst ? dst + 128 : NULL, len -= 128; len >= 128; p += 128, len -= 128) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            a[i] = _mm256_xor_si256(fold256(a[i], k1024), load32(dst ? dst + 32 * i : NULL,
                                                                   p + 32 * i, nt));
        dst = dst ? dst + 128 : NULL;
    }
    a[2] = _mm256_xor_si256(fold256(a[0], k512), a[2]); /* four registers to two */
    a[3] = _mm256_xor_si256(fold256(a[1], k512), a[3]);
    if (len) { /* a last 64 bytes */
        a[2] = _mm256_xor_si256(fold256(a[2], k512), load32(dst, p, nt));
        a[3] = _mm256_xor_si256(fold256(a[3], k512), load32(dst ? dst + 32 : NULL, p + 32, nt));
    }
    return fold_finish(_mm256_castsi256_si128(a[2]), _mm256_extracti128_si256(a[2], 1),
                       _mm256_castsi256_si128(a[3]), _mm256_extracti128_si256(a[3], 1));
}
/* fold_copy_avx2 -- the avx2 path's fold_fn. */
FOLD_DISPATCH(AVX2_TARGET, fold_copy_avx2, fold_body_avx2)

/* ---- avx512-vpclmulqdq: 512-bit registers */

/* fold512 -- fold128 on all four lanes of x. */
FOLD_TARGET INLINE __m512i fold512(__m512i x, __m512i k)
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                            _mm512_clmulepi64_epi128(x, k, 0x11));
}

/* load64 -- 64 bytes at p, also stored to dst (streamed when nt) unless dst is NULL. */
FOLD_TARGET INLINE __m512i load64(unsigned char *dst, const unsigned char *p, int nt)
{
    __m512i v = _mm512_loadu_si512(p);
    if (dst && nt) {
        _mm512_stream_si512((void *)dst, v); /* dst is 64-byte aligned */
        trace_stream(dst, 64);
    } else if (dst)
        _mm512_storeu_si512(dst, v);
    return v;
}

/* fold_body_avx512 -- fold_fn with four 512-bit registers, 256 bytes a step (D = 2048). */
FOLD_TARGET INLINE uint32_t fold_body_avx512(uint32_t crc, unsigned char *dst,
                                             const unsigned char *p, size_t len, int nt)
{
    const __m512i k2048 = K_512(K2048), k512 = K_512(K512);
    __m512i a[4]; /* unrolled below, so that the four accumulators live in registers */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        a[i] = load64(dst ? dst + 64 * i : NULL, p + 64 * i, nt);
    a[0] = _mm512_xor_si512(a[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    for (p += 256, dst = dst ? dst + 256 : NULL, len -= 256; len >= 256; p += 256, len -= 256) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            a[i] = _mm512_xor_si512(fold512(a[i], k2048), load64(dst ? dst + 64 * i : NULL,
                                                                   p + 64 * i, nt));
        dst = dst ? dst + 256 : NULL;
    }
#pragma GCC unroll 3
    for (int i = 1; i < 4; i++)
        a[i] = _mm512_xor_si512(fold512(a[i - 1], k512), a[i]);
    for (; len >= 64; p += 64, len -= 64) {
        a[3] = _mm512_xor_si512(fold512(a[3], k512), load64(dst, p, nt));
        dst = dst ? dst + 64 : NULL;
    }
    return fold_finish(_mm512_extracti32x4_epi32(a[3], 0), _mm512_extracti32x4_epi32(a[3], 1),
                       _mm512_extracti32x4_epi32(a[3], 2), _mm512_extracti32x4_epi32(a[3], 3));
}
/* fold_copy_avx512 -- the avx512 path's fold_fn. */
FOLD_DISPATCH(FOLD_TARGET, fold_copy_avx512, fold_body_avx512)

/* cpu_has_path -- whether this CPU (and the OS's saved register state) can run path. */
static int cpu_has_path(int path)
{
    unsigned a, b, c, d, c1;
    if (path == PATH_TABLE)
        return 1;
    if (!__get_cpuid(1, &a, &b, &c1, &d) || !(c1 & bit_SSE4_2))
        return 0;
    if (path == PATH_SSE42)
        return 1;
    if (!(c1 & bit_PCLMUL))
        return 0;
    if (path == PATH_PCLMUL)
        return 1;
    if (!(c1 & bit_OSXSAVE) || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(c & bit_VPCLMULQDQ))
        return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (path == PATH_AVX2) /* the OS saves SSE and AVX state */
        return (lo & 0x6) == 0x6 && (b & bit_AVX2);
    /* PATH_AVX512: SSE, AVX and AVX-512 state */
    return (lo & 0xE6) == 0xE6 && (b & bit_AVX512F) && (b & bit_AVX512BW);
}

/* hw_run -- one crc32 chain, 8 bytes at a time, then bytes. */
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

/* copy_run -- hw_run, each word also stored to dst: one pass for a short copy. */
__attribute__((target("sse4.2"))) static uint32_t
copy_run(uint32_t crc, unsigned char *d, const unsigned char *p, size_t len)
{
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        memcpy(d, &word, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        d += 8;
        len -= 8;
    }
    crc = (uint32_t)c;
    while (len--) { /* each byte loaded once: the copy is what the CRC covered */
        unsigned char v = *p++;
        *d++ = v;
        crc = __builtin_ia32_crc32qi(crc, v);
    }
    return crc;
}

/* copy_pair -- two short copies at once (each a head's CRC, then copy_run's), their crc32
 * chains interleaved: one chain is latency-bound (a crc32 a word, three cycles each), two
 * run in about the time of one. */
__attribute__((target("sse4.2"))) static void
copy_pair(size_t head, const unsigned char *ha, const unsigned char *sa, unsigned char *da,
          size_t la, uint32_t *ca, const unsigned char *hb, const unsigned char *sb,
          unsigned char *db, size_t lb, uint32_t *cb)
{
    uint64_t a = hw_run(~0u, ha, head), b = hw_run(~0u, hb, head);
    size_t n = (la < lb ? la : lb) & ~(size_t)7;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t x, y;
        memcpy(&x, sa + i, 8);
        memcpy(&y, sb + i, 8);
        memcpy(da + i, &x, 8);
        memcpy(db + i, &y, 8);
        a = __builtin_ia32_crc32di(a, x);
        b = __builtin_ia32_crc32di(b, y);
    }
    *ca = ~copy_run((uint32_t)a, da + n, sa + n, la - n);
    *cb = ~copy_run((uint32_t)b, db + n, sb + n, lb - n);
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

/* update_hw -- the crc32-instruction CRC: folding for large blocks where the path folds. */
__attribute__((target("sse4.2"))) static uint32_t
update_hw(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = __builtin_ia32_crc32qi(crc, *p++);
        len--;
    }
    if (fold_fn && len >= FOLD_MIN) {
        size_t body = len & ~(size_t)63;
        crc = fold_fn(crc, NULL, p, body, 0);
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
        trace_stream(d - SHORT_BLOCK / 8, 3 * SHORT_BLOCK); /* the three chains' blocks */
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
        __builtin_ia32_movnti64(d, (long long)w);
        trace_stream(d++, 8);
        p += 8;
        len -= 8;
    }
    *sp = p;
    *dp = (unsigned char *)d;
    *lenp = len;
    return crc;
}

#else
/* cpu_has_path -- only the table path away from x86-64. */
static int cpu_has_path(int path) { return path == PATH_TABLE; }
#define update_hw update_table
#define fold_copy_pclmul NULL
#define fold_copy_avx2 NULL
#define fold_copy_avx512 NULL
#define copy_run NULL
#define copy_pair NULL
/* nt_three -- never called: no streaming path away from x86-64. */
static uint32_t nt_three(uint32_t crc, unsigned char **dp, const unsigned char **sp, size_t *lenp)
{
    (void)dp; (void)sp; (void)lenp;
    return crc;
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
    int want = NPATHS - 1; /* the best the CPU has, unless PMEMWAL_CPU says otherwise */
    const char *cpu = getenv("PMEMWAL_CPU"), *off = getenv("PMEMWAL_NO_CRC_HW");
    for (int i = 0; cpu && i < NPATHS; i++)
        if (!strcmp(cpu, paths[i].env) || !strcmp(cpu, paths[i].name))
            want = i;
    if (off && *off && *off != '0')
        want = PATH_TABLE;
    /* pclmul only when asked for by name: its 128-bit multiplies (two cycles each on Zen 4)
     * fold slower than three crc32 chains run (benchmarks/crc.py) */
    int named = want == PATH_PCLMUL;
    while (!cpu_has_path(want) || (want == PATH_PCLMUL && !named))
        want--;
    update_fn = want == PATH_TABLE ? update_table : update_hw;
    copy_run_fn = want == PATH_TABLE ? NULL : copy_run;
    copy_pair_fn = want == PATH_TABLE ? NULL : copy_pair;
    fold_fn = want == PATH_PCLMUL   ? fold_copy_pclmul
              : want == PATH_AVX2   ? fold_copy_avx2
              : want == PATH_AVX512 ? fold_copy_avx512
                                    : NULL;
    impl_name = paths[want].name;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* crc32c_update -- see crc32c.h. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, crc32c_init);
    return ~update_fn(~crc, buf, len);
}

/* crc32c_copy -- see crc32c.h; one pass where the path folds. */
uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len)
{
    const unsigned char *s = src;
    unsigned char *d = dst;
    pthread_once(&init_once, crc32c_init);
    if (copy_run_fn && len < FOLD_MIN)
        return ~copy_run_fn(~crc, d, s, len);
    if (fold_fn && len >= FOLD_MIN) { /* one pass: the folding loads are stored */
        size_t body = len & ~(size_t)63;
        crc = ~fold_fn(~crc, d, s, body, 0);
        s += body;
        d += body;
        len -= body;
    }
    /* Otherwise two passes over a block small enough to stay in L1: the copy
     * reads it back from cache, so the cost is close to the CRC alone.  The CRC is
     * taken over the copy, not the source: a source that changes meanwhile (a mapping
     * rewritten under a read) must not leave a copy other than what the CRC covered. */
    while (len) {
        size_t n = len < 4096 ? len : 4096;
        memcpy(d, s, n);
        crc = crc32c_update(crc, d, n);
        s += n;
        d += n;
        len -= n;
    }
    return crc;
}

/* crc32c_copy_after -- see crc32c.h. */
uint32_t crc32c_copy_after(const void *head, size_t head_len, void *dst, const void *src,
                           size_t len)
{
    pthread_once(&init_once, crc32c_init);
    uint32_t crc = update_fn(~0u, head, head_len);
    if (copy_run_fn && len < FOLD_MIN)
        return ~copy_run_fn(crc, dst, src, len);
    return crc32c_copy(~crc, dst, src, len);
}

/* crc32c_copy_after2 -- see crc32c.h. */
void crc32c_copy_after2(size_t head, const void *ha, const void *sa, void *da, size_t la,
                        uint32_t *ca, const void *hb, const void *sb, void *db, size_t lb,
                        uint32_t *cb)
{
    pthread_once(&init_once, crc32c_init);
    if (copy_pair_fn && la < FOLD_MIN && lb < FOLD_MIN) {
        copy_pair_fn(head, ha, sa, da, la, ca, hb, sb, db, lb, cb);
        return;
    }
    *ca = crc32c_copy_after(ha, head, da, sa, la);
    *cb = crc32c_copy_after(hb, head, db, sb, lb);
}

/* crc32c_impl -- see crc32c.h. */
const char *crc32c_impl(void)
{
    pthread_once(&init_once, crc32c_init);
    return impl_name;
}

/* crc32c_copy_nt -- see crc32c.h; 64-byte aligned streaming where the path folds. */
uint32_t crc32c_copy_nt(uint32_t crc, void *dst, const void *src, size_t len, int pad)
{
    pthread_once(&init_once, crc32c_init);
    if (update_fn != update_hw || ((uintptr_t)dst & 7))
        return crc32c_copy(crc, dst, src, len); /* no streaming path: cached copy */
    unsigned char *d = dst;
    const unsigned char *s = src;
    crc = ~crc;
    if (fold_fn && len >= FOLD_MIN + 64) {
        size_t head = (64 - ((uintptr_t)d & 63)) & 63; /* 8-byte words up to 64-byte alignment */
        len -= head;
        crc = nt_three(crc, &d, &s, &head);
        size_t body = len & ~(size_t)63;
        crc = fold_fn(crc, d, s, body, 1);
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
            trace_stream(d, 8);
        } else {
            memcpy(d, tail, len);
        }
    }
    return crc;
}

/* crc32c_streaming -- see crc32c.h. */
int crc32c_streaming(void)
{
    pthread_once(&init_once, crc32c_init);
    return update_fn == update_hw;
}
