/*
 * wal_format.h -- the on-disk format, version 1 (docs/FORMAT.md is the prose).
 *
 * A WAL is a directory of segment files of one power-of-two size S.  Page 0
 * of every segment holds the segment header (written by pmemwal/format.py);
 * pages 1.. are data pages of WAL_PAGE_SIZE bytes, each starting with a page
 * header.  Records form one dense stream over the usable bytes of the data
 * pages: a record header may be split across pages, records are 8-byte
 * aligned, and nothing is skipped.  An LSN is a byte position in the WAL
 * (segment = LSN / S, offset = LSN % S), page headers included; the writer
 * works internally in "usable positions" u (bytes of the stream, headers
 * excluded) because reserving space is then a single addition.
 */
#ifndef PMEMWAL_FORMAT_H
#define PMEMWAL_FORMAT_H

#include <stdint.h>
#include <string.h>

#define WAL_FORMAT_VERSION 2
#define WAL_PAGE_SIZE 8192u
#define WAL_PAGE_HDR 24u                           /* page header bytes */
#define WAL_PAGE_USABLE (WAL_PAGE_SIZE - WAL_PAGE_HDR) /* 8168 */
#define WAL_REC_HDR 24u                            /* record header bytes */
#define WAL_ALIGN 8u
#define WAL_PAGE_MAGIC 0x31505750u                 /* "PWP1" little-endian */
#define WAL_REC_DATA 1u                            /* record type: user payload */
#define WAL_REC_VOID 2u                            /* record type: a closed range, no record */
#define WAL_GAP_MAX 0xFFFFFFFFu                    /* saturated flushed_gap */

/*
 * Page header, at the first byte of every data page (little-endian):
 *   0  u32 magic       WAL_PAGE_MAGIC
 *   4  u32 rem_len     bytes of a record begun on an earlier page that lie in
 *                      this page's usable area and after it (0: none; a record
 *                      starting exactly at the usable area also gives 0)
 *   8  u64 page_lsn    LSN of this page's first byte: what makes bytes left by
 *                      an older use of a recycled segment recognisable
 *  16  u32 wal_id_lo   low 32 bits of the WAL identifier
 *  20  u32 crc         CRC-32C of bytes 0..19
 *
 * Record header (24 bytes, then the payload, then zero padding to 8 bytes):
 *   0  u32 crc         CRC-32C of header bytes 4..23, then the payload
 *   4  u32 length      payload bytes
 *   8  u64 prev_lsn    LSN of the previous record (0: none known); inside the
 *                      CRC so that a stale body can never pass with a new link
 *  16  u32 info        low byte: record type; other bits zero.  WAL_REC_DATA: a
 *                      record.  WAL_REC_VOID: zeros over a range whose writer died
 *                      before finishing it (shared WALs): readers step over it
 *  20  u32 flushed_gap this record's LSN minus the flushed LSN when it was
 *                      reserved (saturating): a record whose LSN - gap lies
 *                      beyond a damaged record proves that the damaged one had
 *                      been made durable, so damage is told from a torn tail
 */
typedef struct wal_page_hdr {
    uint32_t magic;
    uint32_t rem_len;
    uint64_t page_lsn;
    uint32_t wal_id_lo;
    uint32_t crc;
} wal_page_hdr;

typedef struct wal_rec_hdr {
    uint32_t crc;
    uint32_t length;
    uint64_t prev_lsn;
    uint32_t info;
    uint32_t flushed_gap;
} wal_rec_hdr;

_Static_assert(sizeof(wal_page_hdr) == WAL_PAGE_HDR, "page header layout");
_Static_assert(sizeof(wal_rec_hdr) == WAL_REC_HDR, "record header layout");

/* wal_geom -- what a WAL's positions depend on. */
typedef struct wal_geom {
    uint64_t seg_size;       /* bytes per segment file, a power of two */
    uint64_t seg_usable;     /* usable stream bytes per segment */
    uint32_t wal_id_lo;
    uint32_t seg_shift;      /* log2(seg_size): an LSN's segment without a division */
} wal_geom;

static inline void wal_geom_init(wal_geom *g, uint64_t seg_size, uint32_t wal_id_lo)
{
    g->seg_size = seg_size;
    g->seg_usable = (seg_size / WAL_PAGE_SIZE - 1) * WAL_PAGE_USABLE;
    g->wal_id_lo = wal_id_lo;
    g->seg_shift = (uint32_t)__builtin_ctzll(seg_size);
}

/* wal_rec_size -- bytes a record of len payload bytes takes in the stream. */
static inline uint64_t wal_rec_size(uint64_t len)
{
    return (WAL_REC_HDR + len + WAL_ALIGN - 1) & ~(uint64_t)(WAL_ALIGN - 1);
}

/* wal_lsn -- LSN of usable position u; a page boundary maps to the next page's data. */
static inline uint64_t wal_lsn(const wal_geom *g, uint64_t u)
{
    uint64_t seg = u / g->seg_usable, r = u % g->seg_usable;
    return seg * g->seg_size + (1 + r / WAL_PAGE_USABLE) * WAL_PAGE_SIZE +
           WAL_PAGE_HDR + r % WAL_PAGE_USABLE;
}

/* wal_lsn_end -- LSN just past usable byte u - 1 (a page boundary maps to the page's end). */
static inline uint64_t wal_lsn_end(const wal_geom *g, uint64_t u)
{
    return u ? wal_lsn(g, u - 1) + 1 : wal_lsn(g, 0);
}

/* wal_usable -- usable position of an LSN; -1 when it lies in a header. */
static inline int64_t wal_usable(const wal_geom *g, uint64_t lsn)
{
    uint64_t seg = lsn >> g->seg_shift, off = lsn & (g->seg_size - 1);
    uint64_t page = off / WAL_PAGE_SIZE, in = off % WAL_PAGE_SIZE;
    if (page == 0 || in < WAL_PAGE_HDR)
        return -1;
    return (int64_t)(seg * g->seg_usable + (page - 1) * WAL_PAGE_USABLE + in - WAL_PAGE_HDR);
}

static inline uint64_t le_load64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t le_load32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }

#endif
