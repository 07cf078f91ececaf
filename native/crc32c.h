/* crc32c.h -- CRC-32C (Castagnoli), the checksum of every pmemwal record and header. */
#ifndef PMEMWAL_CRC32C_H
#define PMEMWAL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c_update -- extend crc (0 to start) over len bytes of buf. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len);

/* crc32c_copy -- copy len bytes from src to dst and extend crc over them in one pass. */
uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len);

/* crc32c_impl -- "sse4.2" or "table": which implementation was chosen at start-up. */
const char *crc32c_impl(void);

#endif
