/*
 * wal_batch.c -- read many records in one call (wal_batch.h).
 */
#include "wal_batch.h"

#include "crc32c.h"

/* room -- whether a payload of len bytes fits in what is left of b; when it does not and
 * b is empty, b->want asks for that much. */
static int room(wal_batch *b, uint64_t len)
{
    if (b->n < b->cap && b->data_used + len <= b->data_cap)
        return 1;
    if (b->n == 0)
        b->want = len;
    return 0;
}

/* put -- one more record in the batch: its fields in the arrays (when it has them: a count
 * has none), its payload already at data + data_used. */
static void put(wal_batch *b, uint64_t lsn, uint64_t prev, uint32_t len, uint32_t crc,
                uint64_t next)
{
    if (b->lsn) {
        b->lsn[b->n] = lsn;
        b->prev[b->n] = prev;
        b->len[b->n] = len;
        b->off[b->n] = b->data_used;
        if (b->crc) {
            b->crc[b->n] = crc;
            b->next[b->n] = next;
        }
    }
    b->data_used += len;
    b->n++;
}

static void push(wal_batch *b, const wal_record *r)
{
    put(b, r->lsn, r->prev_lsn, r->length, r->crc, r->next_lsn);
}

/* check_copy -- the CRC of a record's header bytes 4..23 (hdr) and its payload (len bytes at
 * src), copied to the batch's data where it has one (a count checks alone). */
static uint32_t check_copy(wal_batch *b, const void *hdr, const uint8_t *src, uint32_t len)
{
    if (!b->data)
        return crc32c_update(crc32c_update(0, hdr, WAL_REC_HDR - 4), src, len);
    return crc32c_copy_after(hdr, WAL_REC_HDR - 4, b->data + b->data_used, src, len);
}

/* checked_page -- the page at page_lsn, its header valid (rule 2), remembered for the next
 * records; NULL when it is not valid or not at hand (the page walk then says why). */
static const uint8_t *checked_page(const wal_src *s, wal_batch *b, uint64_t page_lsn)
{
    if (b->page && b->page_lsn == page_lsn)
        return b->page;
    int err = 0;
    const uint8_t *base = s->segment(s->ctx, page_lsn / s->g.seg_size, &err);
    if (err || !base)
        return NULL;
    const uint8_t *page = base + page_lsn % s->g.seg_size;
    if (!wal_page_ok(&s->g, page_lsn, page))
        return NULL;
    b->page_lsn = page_lsn;
    b->page = page;
    return page;
}

/* read_in_page -- a data record that lies in one page, read from that page alone: rule 1
 * (usable position), 2 (the page's header), 3 (a record at the page's usable start finds
 * rem_len 0), 4 and 5 checked here as the walk would.  WAL_OK, WAL_BATCH_FULL, or
 * WAL_BAD_POSITION for anything else: the caller then walks (and finds the true status). */
static int read_in_page(const wal_src *s, wal_batch *b, uint64_t lsn, uint64_t expect_prev,
                        wal_record *r)
{
    int64_t su = wal_usable(&s->g, lsn);
    if (s->salvage || su < 0 || lsn % WAL_ALIGN)
        return WAL_BAD_POSITION;
    uint64_t in_page = (uint64_t)su % WAL_PAGE_USABLE;
    if (in_page + WAL_REC_HDR > WAL_PAGE_USABLE)
        return WAL_BAD_POSITION;
    const uint8_t *page = checked_page(s, b, lsn - in_page - WAL_PAGE_HDR);
    if (!page || (in_page == 0 && le_load32(page + offsetof(wal_page_hdr, rem_len)) != 0))
        return WAL_BAD_POSITION;
    const uint8_t *at = page + WAL_PAGE_HDR + in_page;
    wal_rec_hdr h;
    memcpy(&h, at, sizeof(h));
    uint64_t size = wal_rec_size(h.length);
    if (h.info != WAL_REC_DATA || in_page + size > WAL_PAGE_USABLE ||
        (expect_prev == WAL_ANY_PREV ? h.prev_lsn >= lsn : h.prev_lsn != expect_prev))
        return WAL_BAD_POSITION;
    if (!room(b, h.length))
        return WAL_BATCH_FULL;
    if (check_copy(b, (const uint8_t *)&h + 4, at + WAL_REC_HDR, h.length) != h.crc)
        return WAL_BAD_POSITION;
    memset(r, 0, sizeof(*r));
    r->lsn = r->bad_lsn = r->payload_lsn = lsn;
    r->next_lsn = in_page + size < WAL_PAGE_USABLE ? lsn + size : wal_lsn(&s->g, (uint64_t)su + size);
    r->prev_lsn = h.prev_lsn;
    r->durable_hint = lsn - h.flushed_gap;
    r->length = h.length;
    r->crc = h.crc;
    r->type = WAL_REC_DATA;
    r->contiguous = 1;
    return WAL_OK;
}

/* read_walking -- the record at lsn by the page walk (wal_read_into).  Its length is known
 * valid before room is asked for it (wal_check_pages): a damaged length asks for nothing. */
static int read_walking(const wal_src *s, wal_batch *b, uint64_t lsn, uint64_t expect_prev,
                        wal_record *r)
{
    int st = wal_peek(s, lsn, expect_prev, r);
    if (st != WAL_OK)
        return st;
    if (r->type == WAL_REC_VOID)
        return wal_read_into(s, lsn, expect_prev, r, NULL);
    if (b->n == 0 && b->data_used + r->length > b->data_cap &&
        (st = wal_check_pages(s, r)) != WAL_OK)
        return st;
    if (!room(b, r->length))
        return WAL_BATCH_FULL;
    return wal_read_into(s, lsn, expect_prev, r, b->data ? b->data + b->data_used : NULL);
}

int wal_batch_read(const wal_src *s, wal_batch *b, uint64_t lsn, uint64_t expect_prev,
                   wal_record *r)
{
    int st = read_in_page(s, b, lsn, expect_prev, r);
    return st == WAL_BAD_POSITION ? read_walking(s, b, lsn, expect_prev, r) : st;
}

/* run_header -- the header of the record at lsn when page_run may read it from the page at
 * base: a data record inside the page (neither its first nor its last), linked to prev, with
 * room in b beside n_before records of bytes_before bytes taken ahead of it. */
static int run_header(const wal_batch *b, const uint8_t *page, uint64_t base, uint64_t lsn,
                      uint64_t prev, uint64_t stop_lsn, size_t n_before, uint64_t bytes_before,
                      wal_rec_hdr *h)
{
    if (lsn >= stop_lsn || lsn <= base + WAL_PAGE_HDR || lsn - base + WAL_REC_HDR >= WAL_PAGE_SIZE)
        return 0;
    memcpy(h, page + (lsn - base), sizeof(*h));
    return h->info == WAL_REC_DATA && lsn - base + wal_rec_size(h->length) < WAL_PAGE_SIZE &&
           h->prev_lsn == prev && b->n + n_before < b->cap &&
           b->data_used + bytes_before + h->length <= b->data_cap;
}

/* page_run -- the data records from *lsn on that lie inside the page checked last, each
 * linked to the one before, read with no arithmetic but their offsets in it (a chain's
 * common case).  It leaves to wal_batch_read, which gives the status of one that fails, the
 * first record that is not such a record, fails its CRC or does not fit; and a page's first
 * and last records (rule 3; the step to the next page).  Two records at a time where it can:
 * one CRC's chain of crc32 instructions waits on itself, two interleaved run in its time. */
static void page_run(wal_batch *b, uint64_t *lsn, uint64_t *prev, uint64_t stop_lsn)
{
    const uint8_t *page = b->page;
    uint64_t base = b->page_lsn;
    wal_rec_hdr ha, hb;
    if (!page || *prev == WAL_ANY_PREV)
        return;
    while (run_header(b, page, base, *lsn, *prev, stop_lsn, 0, 0, &ha)) {
        uint64_t next = *lsn + wal_rec_size(ha.length);
        const uint8_t *at = page + (*lsn - base) + WAL_REC_HDR;
        uint32_t crc;
        if (b->data && run_header(b, page, base, next, *lsn, stop_lsn, 1, ha.length, &hb)) {
            uint32_t crc_b; /* two records at once: their CRCs' chains interleaved */
            uint8_t *dst = b->data + b->data_used;
            crc32c_copy_after2(WAL_REC_HDR - 4, (const uint8_t *)&ha + 4, at, dst, ha.length, &crc,
                               (const uint8_t *)&hb + 4, page + (next - base) + WAL_REC_HDR,
                               dst + ha.length, hb.length, &crc_b);
            if (crc != ha.crc)
                return;
            put(b, *lsn, ha.prev_lsn, ha.length, ha.crc, next);
            *prev = *lsn;
            *lsn = next;
            if (crc_b != hb.crc)
                return;
            next = *lsn + wal_rec_size(hb.length);
            put(b, *lsn, hb.prev_lsn, hb.length, hb.crc, next);
        } else {
            if (check_copy(b, (const uint8_t *)&ha + 4, at, ha.length) != ha.crc)
                return;
            put(b, *lsn, ha.prev_lsn, ha.length, ha.crc, next);
        }
        *prev = *lsn;
        *lsn = next;
    }
}

int wal_fill(const wal_src *s, uint64_t *lsn, uint64_t *prev, uint64_t stop_lsn, wal_batch *b,
             uint64_t *bad_lsn)
{
    while (*lsn < stop_lsn) {
        page_run(b, lsn, prev, stop_lsn);
        if (*lsn >= stop_lsn)
            break;
        wal_record r;
        int st = wal_batch_read(s, b, *lsn, *prev, &r);
        if (st == WAL_BATCH_FULL)
            return WAL_OK;
        if (st != WAL_OK) {
            *bad_lsn = r.bad_lsn;
            return st;
        }
        if (r.type == WAL_REC_DATA) /* a void record closes a range: no record */
            push(b, &r);
        *prev = *lsn;
        *lsn = r.next_lsn;
    }
    return WAL_OK;
}

int wal_fetch(const wal_src *s, const uint64_t *lsns, size_t count, size_t *done, wal_batch *b,
              uint64_t *bad_lsn)
{
    for (; *done < count; (*done)++) {
        wal_record r;
        int st = wal_batch_read(s, b, lsns[*done], WAL_ANY_PREV, &r);
        if (st == WAL_BATCH_FULL)
            return WAL_OK;
        if (st == WAL_OK && r.type == WAL_REC_VOID)
            st = WAL_VOID_RECORD;
        if (st != WAL_OK) {
            *bad_lsn = r.bad_lsn;
            return st;
        }
        push(b, &r);
    }
    return WAL_OK;
}
