/*
 * wal_batch.h -- many records in one call: the chain from a position (wal_fill) or the
 * records at given LSNs (wal_fetch), each validated as wal_read does (wal_reader.h's rules)
 * and its payload copied, in the same pass as its CRC, into one buffer the caller owns.
 *
 * Pure C over a wal_src: the binding runs it without the GIL.  A record that lies in one
 * page (most records under 8 KiB) is read straight from a page whose header was checked
 * once for all the records in it; any other, and any record that fails there, takes
 * wal_read_into's page walk, which gives the same answer and the same status.
 */
#ifndef PMEMWAL_BATCH_H
#define PMEMWAL_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "wal_reader.h"

#define WAL_BATCH_FULL (-1) /* (read_one) the record does not fit in what is left */

/* wal_batch -- the records read so far, in arrays of room `cap` the caller provides;
 * payload i is data[off[i] .. off[i] + len[i]).  want: set when the first record of a call
 * did not fit in data_cap (its length): give it that much room and call again.  Without
 * arrays (lsn NULL) and data (NULL) a batch counts the records and their payload bytes
 * (n, data_used), each checked all the same; crc and next (each record's CRC and the LSN
 * after it) are filled when given. */
typedef struct wal_batch {
    uint64_t *lsn, *prev, *off, *next;
    uint32_t *len, *crc;
    size_t cap, n;
    uint8_t *data;
    uint64_t data_cap, data_used, want;
    uint64_t page_lsn;     /* the page whose header was checked last (0: none) */
    const uint8_t *page;
} wal_batch;

/* wal_batch_read -- the record at lsn (linked to expect_prev), its payload copied to
 * b->data + b->data_used when it is a data record, b left as it was (nothing pushed):
 * WAL_OK, WAL_BATCH_FULL when it does not fit (b->want set when b is empty), or its status. */
int wal_batch_read(const wal_src *s, wal_batch *b, uint64_t lsn, uint64_t expect_prev,
                   wal_record *r);

/* wal_fill -- follow the chain from *lsn (linked to *prev; WAL_ANY_PREV: any earlier LSN)
 * until stop_lsn, the batch is full or a record fails.  Void records are stepped over.
 * On return *lsn is the next record to read (the failing one on failure) and *prev the last
 * record read, void ones included; *bad_lsn where validation failed.  Returns WAL_OK when it
 * reached stop_lsn or filled the batch, else the failing record's status. */
int wal_fill(const wal_src *s, uint64_t *lsn, uint64_t *prev, uint64_t stop_lsn, wal_batch *b,
             uint64_t *bad_lsn);

/* wal_fetch -- the records at lsns[*done ..count), each on its own (any earlier prev-link),
 * until the batch is full or one fails; *done counts those read.  A void range there is
 * WAL_VOID_RECORD: no record starts at that LSN. */
int wal_fetch(const wal_src *s, const uint64_t *lsns, size_t count, size_t *done, wal_batch *b,
              uint64_t *bad_lsn);

#endif
