/* crc32c.h -- CRC-32C (Castagnoli), the checksum of every pmemwal record and header. */
#ifndef PMEMWAL_CRC32C_H
#define PMEMWAL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c_update -- extend crc (0 to start) over len bytes of buf. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len);

/* crc32c_copy -- copy len bytes from src to dst and extend crc over them in one pass. */
uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len);

/* crc32c_copy_after -- the CRC (from 0) of head_len bytes at head and then of len bytes
 * copied from src to dst: a record's header and payload, read back in one call. */
uint32_t crc32c_copy_after(const void *head, size_t head_len, void *dst, const void *src,
                           size_t len);

/* crc32c_copy_after2 -- crc32c_copy_after of two (head bytes each), into *ca and *cb: two
 * small records read back at once, about as fast as one. */
void crc32c_copy_after2(size_t head, const void *ha, const void *sa, void *da, size_t la,
                        uint32_t *ca, const void *hb, const void *sb, void *db, size_t lb,
                        uint32_t *cb);

/* crc32c_copy_nt -- as crc32c_copy, but with non-temporal stores that bypass the
 * cache (a persistent-memory copy: the caller issues the fence).  dst and len
 * must be multiples of 8 apart from a ragged end, which is padded with zeros to
 * 8 bytes when pad is set (the record format's padding) and stored normally
 * otherwise. */
uint32_t crc32c_copy_nt(uint32_t crc, void *dst, const void *src, size_t len, int pad);

/* crc32c_streaming -- whether crc32c_copy_nt really streams (needs SSE4.2). */
int crc32c_streaming(void);

/* crc32c_impl -- the path chosen at start-up: "table", "sse4.2", "pclmul", "avx2-vpclmulqdq"
 * or "avx512-vpclmulqdq" (PMEMWAL_CPU forces one: see crc32c.c). */
const char *crc32c_impl(void);

#endif
