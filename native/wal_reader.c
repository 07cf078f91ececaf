/*
 * wal_reader.c -- validate records against the rules in wal_reader.h.
 *
 * The end of the WAL is the first position that fails them.  Whether that is
 * a torn tail (cut it and go on) or damage to data that had been made durable
 * (report it) is decided by wal_beyond: every record carries the flushed LSN
 * of its time (as flushed_gap), so a valid record further on whose hint lies
 * past x proves that a flush had covered x.
 */
#include "wal_reader.h"

#include <errno.h>
#include <stdlib.h>

#include "crc32c.h"

const char *wal_status_text(int status)
{
    switch (status) {
    case WAL_OK: return "ok";
    case WAL_NO_SEGMENT: return "segment missing";
    case WAL_BAD_POSITION: return "not a record position";
    case WAL_BAD_PAGE: return "invalid or stale page header";
    case WAL_BAD_CONT: return "page continuation length mismatch";
    case WAL_BAD_TYPE: return "unknown record type";
    case WAL_BAD_PREV: return "prev-link mismatch";
    case WAL_BAD_CRC: return "CRC mismatch";
    case WAL_SOURCE_ERROR: return "segment source failed";
    case WAL_VOID_RECORD: return "a void range (its writer died before finishing it)";
    }
    return "unknown";
}

/* page_at -- the page holding usable position u, its header checked (rule 2). */
static int page_at(const wal_src *s, uint64_t u, const uint8_t **page, uint64_t *page_lsn)
{
    uint64_t lsn = wal_lsn(&s->g, u);
    *page_lsn = lsn - lsn % WAL_PAGE_SIZE;
    int err = 0;
    const uint8_t *base = s->segment(s->ctx, *page_lsn / s->g.seg_size, &err);
    if (err)
        return WAL_SOURCE_ERROR;
    if (!base)
        return WAL_NO_SEGMENT;
    const uint8_t *p = base + *page_lsn % s->g.seg_size;
    if (!s->salvage && !wal_page_ok(&s->g, *page_lsn, p))
        return WAL_BAD_PAGE;
    *page = p;
    return WAL_OK;
}

int wal_page_ok(const wal_geom *g, uint64_t page_lsn, const uint8_t *p)
{
    wal_page_hdr h;
    memcpy(&h, p, sizeof(h));
    return h.magic == WAL_PAGE_MAGIC && h.page_lsn == page_lsn && h.wal_id_lo == g->wal_id_lo &&
           h.crc == crc32c_update(0, p, offsetof(wal_page_hdr, crc));
}

/* walk -- visit the stream bytes [from, to) page by page, checking each page;
 * when rec_end is nonzero also check continuation lengths (rule 3). */
typedef int (*visit_fn)(void *arg, uint64_t u, const uint8_t *bytes, uint64_t n);

static int walk(const wal_src *s, uint64_t rec_start, uint64_t rec_end, uint64_t from,
                uint64_t to, visit_fn visit, void *arg, uint64_t *bad_lsn)
{
    uint64_t u = from;
    while (u < to) {
        const uint8_t *page;
        uint64_t page_lsn, in_page = u % WAL_PAGE_USABLE;
        int st = page_at(s, u, &page, &page_lsn);
        if (st == WAL_OK && rec_end && in_page == 0 && !s->salvage) {
            uint32_t rem = le_load32(page + offsetof(wal_page_hdr, rem_len));
            if (rem != (u == rec_start ? 0 : rec_end - u))
                st = WAL_BAD_CONT;
        }
        if (st != WAL_OK) {
            *bad_lsn = page_lsn;
            return st;
        }
        uint64_t n = WAL_PAGE_USABLE - in_page;
        if (n > to - u)
            n = to - u;
        if ((st = visit(arg, u, page + WAL_PAGE_HDR + in_page, n)))
            return st;
        u += n;
    }
    return WAL_OK;
}

struct gather { uint8_t *dst; };

static int gather_visit(void *arg, uint64_t u, const uint8_t *bytes, uint64_t n)
{
    (void)u;
    struct gather *g = arg;
    memcpy(g->dst, bytes, n);
    g->dst += n;
    return 0;
}

struct body {
    uint64_t pay_from, pay_to; /* payload's usable range */
    uint32_t crc;
    int pieces;
    uint64_t first_u;
    uint8_t *dst;              /* where the payload is copied as it is checked, or NULL */
};

static int body_visit(void *arg, uint64_t u, const uint8_t *bytes, uint64_t n)
{
    struct body *b = arg;
    uint64_t lo = u > b->pay_from ? u : b->pay_from;
    uint64_t hi = u + n < b->pay_to ? u + n : b->pay_to;
    if (lo < hi) {
        if (b->pieces++ == 0)
            b->first_u = lo;
        if (b->dst)
            b->crc = crc32c_copy(b->crc, b->dst + (lo - b->pay_from), bytes + (lo - u), hi - lo);
        else
            b->crc = crc32c_update(b->crc, bytes + (lo - u), hi - lo);
    }
    return 0;
}

static int read_record(const wal_src *s, uint64_t lsn, uint64_t expect_prev, wal_record *r,
                       int check_body, uint8_t *dst);

int wal_read(const wal_src *s, uint64_t lsn, uint64_t expect_prev, wal_record *r)
{
    return read_record(s, lsn, expect_prev, r, 1, NULL);
}

int wal_peek(const wal_src *s, uint64_t lsn, uint64_t expect_prev, wal_record *r)
{
    return read_record(s, lsn, expect_prev, r, 0, NULL);
}

int wal_read_into(const wal_src *s, uint64_t lsn, uint64_t expect_prev, wal_record *r,
                  uint8_t *dst)
{
    return read_record(s, lsn, expect_prev, r, 1, dst);
}

/* read_record -- wal_read; without check_body, rules 1-4 for the header's bytes only (the
 * pages the rest spans and the CRC unchecked): enough to step over records known good.
 * dst: the payload is copied there in the same pass as its CRC (room for length bytes). */
static int read_record(const wal_src *s, uint64_t lsn, uint64_t expect_prev, wal_record *r,
                       int check_body, uint8_t *dst)
{
    memset(r, 0, sizeof(*r));
    r->lsn = r->bad_lsn = lsn;
    int64_t su = wal_usable(&s->g, lsn);
    if (su < 0 || lsn % WAL_ALIGN)
        return WAL_BAD_POSITION;
    uint64_t u = (uint64_t)su;

    wal_rec_hdr h;
    struct gather gh = {(uint8_t *)&h};
    int st = walk(s, u, 0, u, u + WAL_REC_HDR, gather_visit, &gh, &r->bad_lsn);
    if (st != WAL_OK)
        return st;
    r->bad_lsn = lsn;
    r->length = h.length;
    r->prev_lsn = h.prev_lsn;
    r->crc = h.crc;
    r->type = h.info & 0xff;
    r->durable_hint = lsn - h.flushed_gap;
    if (h.info != WAL_REC_DATA && h.info != WAL_REC_VOID)
        return WAL_BAD_TYPE;
    if (expect_prev == WAL_ANY_PREV ? h.prev_lsn >= lsn : h.prev_lsn != expect_prev)
        return WAL_BAD_PREV;

    uint64_t end = u + wal_rec_size(h.length);
    if (!check_body) {
        r->next_lsn = wal_lsn(&s->g, end);
        return WAL_OK;
    }
    struct body b = {u + WAL_REC_HDR, u + WAL_REC_HDR + h.length, 0, 0, 0, dst};
    b.crc = crc32c_update(0, (const uint8_t *)&h + 4, WAL_REC_HDR - 4);
    if ((st = walk(s, u, end, u, end, body_visit, &b, &r->bad_lsn)) != WAL_OK)
        return st;
    r->bad_lsn = lsn;
    if (b.crc != h.crc)
        return WAL_BAD_CRC;
    r->contiguous = b.pieces <= 1;
    r->payload_lsn = wal_lsn(&s->g, b.pieces ? b.first_u : b.pay_from);
    r->next_lsn = wal_lsn(&s->g, end);
    return WAL_OK;
}

static int skip_visit(void *arg, uint64_t u, const uint8_t *bytes, uint64_t n)
{
    (void)arg, (void)u, (void)bytes, (void)n;
    return 0;
}

int wal_check_pages(const wal_src *s, wal_record *r)
{
    uint64_t u = (uint64_t)wal_usable(&s->g, r->lsn), end = u + wal_rec_size(r->length);
    return walk(s, u, end, u, end, skip_visit, NULL, &r->bad_lsn);
}

int wal_copy_payload(const wal_src *s, const wal_record *r, uint8_t *dst)
{
    return wal_copy_head(s, r, dst, r->length);
}

int wal_copy_head(const wal_src *s, const wal_record *r, uint8_t *dst, uint64_t n)
{
    uint64_t u = (uint64_t)wal_usable(&s->g, r->lsn) + WAL_REC_HDR, bad;
    struct gather g = {dst};
    return walk(s, u, 0, u, u + (n < r->length ? n : r->length), gather_visit, &g, &bad);
}

void wal_follow(const wal_src *s, uint64_t lsn, uint64_t expect_prev, uint64_t stop_lsn,
                wal_scan_result *r)
{
    memset(r, 0, sizeof(*r));
    wal_record rec;
    while (lsn < stop_lsn) {
        int st = read_record(s, lsn, expect_prev, &rec, 0, NULL);
        if (st != WAL_OK) {
            r->status = st;
            r->bad_lsn = rec.bad_lsn;
            break;
        }
        if (rec.type == WAL_REC_DATA) { /* a void record closes a range: no record */
            r->count++;
            r->bytes += rec.length;
        }
        r->last_lsn = expect_prev = lsn;
        lsn = rec.next_lsn;
    }
    r->end_lsn = lsn;
}

int wal_first_record(const wal_src *s, uint64_t segno, uint64_t *lsn)
{
    uint64_t u = segno * s->g.seg_usable;
    for (;;) {
        const uint8_t *page;
        uint64_t page_lsn;
        *lsn = wal_lsn(&s->g, u);
        int st = page_at(s, u, &page, &page_lsn);
        if (st != WAL_OK)
            return st;
        uint32_t rem = le_load32(page + offsetof(wal_page_hdr, rem_len));
        if (rem % WAL_ALIGN)
            return WAL_BAD_CONT;
        if (rem < WAL_PAGE_USABLE) {
            *lsn = wal_lsn(&s->g, u + rem);
            return WAL_OK;
        }
        u += WAL_PAGE_USABLE; /* the page is all continuation */
    }
}

/* page_may_hold_current -- a page past the end whose bytes could be taken for new
 * records once a new record makes its header valid again: its header is this
 * cycle's, or it is damaged and the page is not all zeros.  A valid header of an
 * older cycle marks the whole page stale, which recovery leaves alone. */
static int page_may_hold_current(const wal_src *s, uint64_t page_lsn, const uint8_t *page)
{
    wal_page_hdr h;
    memcpy(&h, page, sizeof(h));
    int valid = h.magic == WAL_PAGE_MAGIC && h.wal_id_lo == s->g.wal_id_lo &&
                h.crc == crc32c_update(0, page, offsetof(wal_page_hdr, crc));
    if (valid)
        return h.page_lsn >= page_lsn;
    for (uint32_t i = 0; i < WAL_PAGE_SIZE; i += 8)
        if (le_load64(page + i))
            return 1;
    return 0;
}

/* holds_record_of_cycle -- whether a page whose header is an older cycle's holds the header
 * of a record of this one anyway: one whose prev-link field points at or past min_prev (every
 * record of this cycle past the end does; an older cycle's all point below the oldest
 * segment) and before its own position.  A crash leaves such pages: a record stored before
 * the insertion that owes the page its header got there, or the page cache writing back the
 * record's half of the page and not the header's.  Recovery must wipe them: once a record of
 * the same size lands where the unfinished one was, the header is valid again and the old
 * record links to it.  A false alarm only wipes a stale page. */
static int holds_record_of_cycle(uint64_t page_lsn, const uint8_t *page, uint64_t min_prev)
{
    for (uint64_t off = WAL_PAGE_HDR; off + WAL_REC_HDR <= WAL_PAGE_SIZE; off += WAL_ALIGN) {
        uint64_t prev = le_load64(page + off + offsetof(wal_rec_hdr, prev_lsn));
        uint32_t info = le_load32(page + off + offsetof(wal_rec_hdr, info));
        if ((info == WAL_REC_DATA || info == WAL_REC_VOID) && prev >= min_prev && prev < page_lsn + off)
            return 1;
    }
    return 0;
}

/* claimed_end -- where the record whose header lies at x claims to end, when that header is
 * plausible: rules 1-4 for its bytes (its type known, its prev-link link, or below x and at or
 * past floor when link is WAL_ANY_PREV) and every segment its extent runs through exists;
 * otherwise x.  *confirmed: a valid record at that end links to x (its length is then not the
 * damage).  The record may be damaged (its CRC unchecked): a valid-looking record image that
 * its payload carries is no record of the WAL, and the searches past a cut trust no record
 * inside the extent, but one linked to x itself while the extent is unconfirmed (x's genuine
 * successor, had the damage been to x's length). */
static uint64_t claimed_end(const wal_src *s, uint64_t x, uint64_t link, uint64_t floor,
                            int *confirmed)
{
    wal_record r;
    *confirmed = 0;
    if (read_record(s, x, link, &r, 0, NULL) != WAL_OK || r.prev_lsn < floor)
        return x;
    for (uint64_t segno = x / s->g.seg_size; segno <= (r.next_lsn - 1) / s->g.seg_size; segno++) {
        int err = 0;
        if (!s->segment(s->ctx, segno, &err) || err)
            return x;
    }
    uint64_t end = r.next_lsn;
    *confirmed = read_record(s, end, x, &r, 1, NULL) == WAL_OK;
    return end;
}

/* durable_past -- a valid record at c written after the one at x was flushed:
 * its hint passes x, and it links to x or later (a stale record left in a
 * recycled page links back into the older cycle), or to x itself when exact. */
static int durable_past(const wal_src *s, uint64_t c, uint64_t x, int exact)
{
    wal_record rec;
    return wal_read(s, c, WAL_ANY_PREV, &rec) == WAL_OK && rec.durable_hint > x &&
           (exact ? rec.prev_lsn == x : rec.prev_lsn >= x);
}

/* durable_in_page -- durable_past for the records that start in the page at page_lsn,
 * followed from its first one (c) while they hold: a record reserved after x was flushed
 * need not be the first of its page.  Returns its LSN, or 0. */
static uint64_t durable_in_page(const wal_src *s, uint64_t c, uint64_t page_lsn, uint64_t x)
{
    wal_record rec;
    uint64_t prev = WAL_ANY_PREV;
    while (c < page_lsn + WAL_PAGE_SIZE && wal_read(s, c, prev, &rec) == WAL_OK) {
        if (rec.durable_hint > x && rec.prev_lsn >= x)
            return c;
        prev = c;
        c = rec.next_lsn;
    }
    return 0;
}

int wal_beyond(const wal_src *s, uint64_t x, uint64_t last_segno, uint64_t min_prev,
               uint64_t *durable_lsn, uint64_t **pages, size_t *npages)
{
    size_t cap = 64;
    *durable_lsn = 0;
    *npages = 0;
    if (!(*pages = malloc(cap * sizeof(uint64_t))))
        return -ENOMEM;
    /* records later in x's own page (found by trying every aligned position); inside the
     * extent the damaged record at x claims, only its successor (claimed_end) */
    uint64_t page_end = x - x % WAL_PAGE_SIZE + WAL_PAGE_SIZE;
    int confirmed;
    uint64_t extent = claimed_end(s, x, WAL_ANY_PREV, min_prev, &confirmed);
    for (uint64_t c = confirmed ? extent : x + WAL_ALIGN; c + WAL_REC_HDR <= page_end &&
         !*durable_lsn; c += WAL_ALIGN)
        if (durable_past(s, c, x, c < extent))
            *durable_lsn = c;
    /* then every later page: the first record of those with a valid header */
    int64_t xu = wal_usable(&s->g, x);
    uint64_t u = (xu < 0 ? 0 : (uint64_t)xu) / WAL_PAGE_USABLE * WAL_PAGE_USABLE;
    uint64_t stop = (last_segno + 1) * s->g.seg_usable;
    for (u += WAL_PAGE_USABLE; u < stop; u += WAL_PAGE_USABLE) {
        uint64_t lsn = wal_lsn(&s->g, u), page_lsn = lsn - WAL_PAGE_HDR;
        int err = 0;
        const uint8_t *base = s->segment(s->ctx, page_lsn / s->g.seg_size, &err);
        if (err)
            return -EIO;
        if (!base) {
            u = (u / s->g.seg_usable + 1) * s->g.seg_usable - WAL_PAGE_USABLE; /* next segment */
            continue;
        }
        const uint8_t *page = base + page_lsn % s->g.seg_size;
        if (!page_may_hold_current(s, page_lsn, page) &&
            !holds_record_of_cycle(page_lsn, page, min_prev))
            continue;
        if (*npages == cap) {
            uint64_t *more = realloc(*pages, 2 * cap * sizeof(uint64_t));
            if (!more)
                return -ENOMEM;
            *pages = more;
            cap *= 2;
        }
        (*pages)[(*npages)++] = page_lsn;
        uint32_t rem = le_load32(page + offsetof(wal_page_hdr, rem_len));
        if (!*durable_lsn && rem < WAL_PAGE_USABLE && rem % WAL_ALIGN == 0)
            *durable_lsn = durable_in_page(s, wal_lsn(&s->g, u + rem), page_lsn, x);
    }
    return 0;
}

/* push -- append one record found to *out (grown as needed). */
static int push(wal_found **out, size_t *n, size_t *cap, const wal_record *r)
{
    if (*n == *cap) {
        size_t more = *cap ? 2 * *cap : 64;
        wal_found *grown = realloc(*out, more * sizeof(wal_found));
        if (!grown)
            return -ENOMEM;
        *out = grown;
        *cap = more;
    }
    (*out)[(*n)++] = (wal_found){r->lsn, r->next_lsn, r->length, r->crc};
    return 0;
}

/* chain -- follow the chain from start while it holds, its first record linked at or past
 * floor (and to exact, unless WAL_ANY_PREV), appending each record (not void) to *out;
 * returns where it broke, or 0 with *err. */
static uint64_t chain(const wal_src *s, uint64_t start, uint64_t floor, uint64_t exact,
                      wal_found **out, size_t *n, size_t *cap, int *err)
{
    uint64_t lsn = start, prev = WAL_ANY_PREV;
    wal_record r;
    /* the first record's link checked before its CRC: a long claimed length costs nothing */
    if (read_record(s, start, WAL_ANY_PREV, &r, 0, NULL) != WAL_OK || r.prev_lsn < floor ||
        (exact != WAL_ANY_PREV && r.prev_lsn != exact))
        return start;
    while (read_record(s, lsn, prev, &r, 1, NULL) == WAL_OK &&
           (prev != WAL_ANY_PREV || r.prev_lsn >= floor)) {
        if (r.type != WAL_REC_VOID && (*err = push(out, n, cap, &r)))
            return 0;
        prev = lsn;
        lsn = r.next_lsn;
    }
    return lsn;
}

int wal_salvage(const wal_src *s, uint64_t x, const uint64_t *pages, size_t npages, uint64_t link,
                uint64_t floor, wal_found **out, size_t *nout)
{
    size_t cap = 0;
    int err = 0;
    *out = NULL;
    *nout = 0;
    if (link != WAL_ANY_PREV && link > floor)
        floor = link;
    wal_record r;
    int confirmed = 0;
    uint64_t extent = read_record(s, x, WAL_ANY_PREV, &r, 1, NULL) == WAL_OK ? x
                      : claimed_end(s, x, link, floor, &confirmed);
    uint64_t reach = confirmed ? extent : x;
    uint64_t page = x - x % WAL_PAGE_SIZE, from = x;
    for (size_t i = 0;; i++) {
        uint64_t end = page + WAL_PAGE_SIZE;
        int source_err = 0; /* (a failing source fails each read below as well) */
        const uint8_t *base = s->segment(s->ctx, page / s->g.seg_size, &source_err);
        const uint8_t *bytes = base && !source_err ? base + page % s->g.seg_size : NULL;
        for (uint64_t c = from > reach ? from : reach; c < end; c += WAL_ALIGN) {
            /* most positions hold no known type: rejected without the reader's page walk */
            if (bytes && c + WAL_REC_HDR <= end) {
                uint32_t info = le_load32(bytes + (c - page) + offsetof(wal_rec_hdr, info));
                if (info != WAL_REC_DATA && info != WAL_REC_VOID)
                    continue;
            }
            uint64_t broke = chain(s, c, floor, c < extent ? x : WAL_ANY_PREV, out, nout, &cap,
                                   &err);
            if (err)
                return err;
            if (broke > c) /* (positions below it lie inside the records found) */
                c = broke - WAL_ALIGN;
            if (broke > reach)
                reach = broke;
        }
        while (i < npages && pages[i] <= x)
            i++;
        if (i >= npages)
            return 0;
        page = pages[i];
        from = page + WAL_PAGE_HDR;
    }
}
