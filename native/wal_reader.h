/*
 * wal_reader.h -- record validation, scanning and the torn-tail/damage test.
 *
 * Pure functions over mapped segments; they never write and never trust a
 * length before the bytes it points to have been checked.  A record at LSN x
 * is valid if and only if (docs/FORMAT.md, "validity rules"):
 *   1. x is 8-byte aligned and lies in the usable area of a data page;
 *   2. every page the record touches has a valid header: magic, CRC, its own
 *      LSN as page_lsn, this WAL's identifier;
 *   3. a page the record continues into says so: rem_len == bytes left;
 *      a record starting at a page's usable area finds rem_len == 0 there;
 *   4. the header's type is known (a record, or a void one that readers step
 *      over: a range whose writer died, in a shared WAL) and its prev_lsn is the previous record's
 *      LSN (or, for the first record read, any LSN below x);
 *   5. the CRC over header bytes 4..23 and the payload matches.
 */
#ifndef PMEMWAL_READER_H
#define PMEMWAL_READER_H

#include <stddef.h>
#include <stdint.h>

#include "wal_format.h"

#define WAL_ANY_PREV UINT64_MAX

enum wal_status {
    WAL_OK = 0,
    WAL_NO_SEGMENT,   /* the record runs into a segment that does not exist */
    WAL_BAD_POSITION, /* rule 1 */
    WAL_BAD_PAGE,     /* rule 2: missing, stale or damaged page header */
    WAL_BAD_CONT,     /* rule 3 */
    WAL_BAD_TYPE,     /* rule 4 */
    WAL_BAD_PREV,     /* rule 4 */
    WAL_BAD_CRC,      /* rule 5 */
    WAL_SOURCE_ERROR, /* the segment source failed (an exception in the binding) */
    WAL_VOID_RECORD,  /* asked for a record, found a void range (wal_batch.h) */
};

/* wal_src -- where the reader finds segments: base of the mapping, or NULL.
 * salvage: page headers are not checked (rules 2 and 3 reduced to "the segment exists"),
 * for finding the records that a damaged page header alone made unreadable: what a cut
 * sets aside (pmemwal/lostfound.py).  Each record's own CRC, which covers its prev-link,
 * still has to match; never set for reading the WAL itself. */
typedef struct wal_src {
    wal_geom g;
    const uint8_t *(*segment)(void *ctx, uint64_t segno, int *error);
    void *ctx;
    int salvage;
} wal_src;

typedef struct wal_record {
    uint64_t lsn, next_lsn, prev_lsn, durable_hint;
    uint32_t length, crc, type;
    int contiguous;        /* the payload lies in one piece at payload_lsn */
    uint64_t payload_lsn;
    uint64_t bad_lsn;      /* where validation failed */
} wal_record;

typedef struct wal_scan_result {
    uint64_t end_lsn;      /* first position that is not a valid record */
    uint64_t last_lsn;     /* last valid record, 0 if none */
    uint64_t count, bytes;
    int status;            /* why the scan stopped: WAL_OK when it reached stop_lsn */
    uint64_t bad_lsn;
} wal_scan_result;

const char *wal_status_text(int status);

int wal_read(const wal_src *s, uint64_t lsn, uint64_t expect_prev, wal_record *r);

/* wal_peek -- rules 1-4 for the header's bytes only (the rest of the record unchecked):
 * its length and links, before room is made for its payload. */
int wal_peek(const wal_src *s, uint64_t lsn, uint64_t expect_prev, wal_record *r);

/* wal_read_into -- wal_read, the payload copied to dst (room for r->length bytes) in the
 * same pass as its CRC is checked: dst's bytes are the record's only when WAL_OK. */
int wal_read_into(const wal_src *s, uint64_t lsn, uint64_t expect_prev, wal_record *r,
                  uint8_t *dst);

/* wal_check_pages -- rules 2 and 3 over every page the record r (as wal_peek read it)
 * spans: whether a length read before the CRC could be checked is the record's (*r's
 * bad_lsn set on failure), at a cost per page instead of per byte. */
int wal_check_pages(const wal_src *s, wal_record *r);

/* wal_page_ok -- rule 2 for the page at page_lsn whose bytes are p. */
int wal_page_ok(const wal_geom *g, uint64_t page_lsn, const uint8_t *p);

/* wal_copy_payload -- gather a valid record's payload (len bytes) into dst. */
int wal_copy_payload(const wal_src *s, const wal_record *r, uint8_t *dst);

/* wal_copy_head -- the first min(n, length) payload bytes of a valid record into dst. */
int wal_copy_head(const wal_src *s, const wal_record *r, uint8_t *dst, uint64_t n);

/* wal_follow -- follow the chain from lsn until stop_lsn or the first record that fails,
 * reading each record's header alone (rules 1-4 for its bytes; no CRC, the pages it spans
 * unchecked): the record boundaries of a stretch known good, such as one this process
 * flushed, at a cost per record instead of per byte.  (A whole check of every record is
 * wal_fill's, without arrays: wal_batch.h.) */
void wal_follow(const wal_src *s, uint64_t lsn, uint64_t expect_prev, uint64_t stop_lsn,
                wal_scan_result *r);

/* wal_first_record -- LSN of the first record starting in segment segno or later;
 * returns WAL_OK, or the status of the first page without a valid header
 * (then *lsn is that page's first usable byte). */
int wal_first_record(const wal_src *s, uint64_t segno, uint64_t *lsn);

/* wal_beyond -- what lies past an invalid position x, up to the end of segment
 * last_segno: *durable_lsn is a valid record that links to x or later and whose
 * durable hint passes x (0 if none: x is a torn tail); pages[] the LSNs of the
 * later pages that may hold bytes of this cycle (to be wiped before writing
 * resumes), those with an older cycle's header included when a record header in
 * them links at or past min_prev (the first LSN of the oldest segment: no older
 * cycle's record does).  pages is malloc'ed. */
int wal_beyond(const wal_src *s, uint64_t x, uint64_t last_segno, uint64_t min_prev,
               uint64_t *durable_lsn, uint64_t **pages, size_t *npages);

/* wal_found -- a record wal_salvage found. */
typedef struct wal_found {
    uint64_t lsn, next_lsn;
    uint32_t length, crc;
} wal_found;

/* wal_salvage -- the valid records (not void) at or past a cut at x, as far as their own
 * bytes tell (read through a salvage source: page headers unchecked): tried at every aligned
 * position from x to the end of x's page and in the usable area of every page of pages[]
 * (ascending; those past x's page), each chain followed while it holds.  A chain's first
 * record must link at or past floor and link (the record before x; WAL_ANY_PREV: none), and
 * when the record at x is invalid but its header plausible, a chain starting inside the extent
 * it claims must link to x itself, and none is tried there once a valid record at the
 * extent's end links to x (an image its payload carries is no record).  *out (malloc'ed,
 * *nout of them, ascending) is the caller's to free; returns 0 or -ENOMEM. */
int wal_salvage(const wal_src *s, uint64_t x, const uint64_t *pages, size_t npages, uint64_t link,
                uint64_t floor, wal_found **out, size_t *nout);

#endif
