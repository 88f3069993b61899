"""Lane-level Python emulation of the survivor append + warp merge protocols of
src/knnkit/exact/fused_topk.cu, compared with a plain sort: random rows, duplicates, worst-case
descending keys, self exclusion, columns past n, kc 1..400. A check of the algorithms (ranks,
in-place scatter order, buffer bounds), not of the CUDA code itself.

* v1 (``-DFT_SEL_V1``: ft_select_chunk / ft_merge_row): one row at a time, shared atomics, merge
  when the buffer holds > CAP - 8 before a slow step.
* v2 (default: ft_select_chunk2 / ft_merge_row2): a whole warp (MT = 1 or 2: 16 or 32 rows, lane
  (g, t4) holding rows 16 mt + 8 h + g and columns 2 t4, 2 t4 + 1 of every 8-column step), counts
  packed one byte per row in a lane register, quad prefix sums by xor shuffles, merge only when
  count + this step's survivors would pass CAP, NaN keys for columns past n and self, and the merge
  without global binary search (list slots in registers for kc <= 128, else streamed top slot
  first, one slot read ahead). Every shared-memory buffer write is checked to land on a fresh slot
  below CAP, and every merge write on a target no other lane writes and no unread element holds.
  Each v2 warp runs twice: in the original main loop's order and in the main loop v2's order
  (``pipelined``: a whole-half vote against the thresholds as of the half's start gates the half's
  4 steps, each then re-tested; NOTES_topk.md, "Pipelined main loop").

    python benchmarks/emulate_fused_merge.py [--trials 300]
"""

import argparse
import logging
import math
import random

INF = float("inf")
NAN = float("nan")
NOIDX = 0x7FFFFFFF
CAP = 32
REG_SLOTS = 4


def less(a, ia, b, ib):
    return a < b or (a == b and ia < ib)


# ------------------------------------------------------------------------------------------- v1


def merge(L_d, L_i, kc, buf, st):
    cnt = len(buf)
    bk = [buf[l][0] if l < cnt else INF for l in range(32)]
    bi = [buf[l][1] if l < cnt else NOIDX for l in range(32)]
    bk, bi = sort32(bk, bi)
    brank = [None] * 32
    for l in range(cnt):
        lo = 0
        step = 1024
        while step:
            p = lo + step - 1
            if p < kc and less(L_d[p], L_i[p], bk[l], bi[l]):
                lo += step
            step >>= 1
        brank[l] = l + lo
    nslot = (kc + 31) >> 5
    for s in range(nslot - 1, -1, -1):
        reads = []
        for l in range(32):
            i = s * 32 + l
            lk, li = (L_d[i], L_i[i]) if i < kc else (INF, NOIDX)
            lo = 0
            step = 32
            while step:
                p = lo + step - 1
                if p < cnt and less(bk[p & 31], bi[p & 31], lk, li):
                    lo += step
                step >>= 1
            reads.append((i, lk, li, i + lo))
        for i, lk, li, rank in reads:
            if i < kc and rank < kc:
                L_d[rank], L_i[rank] = lk, li
                if rank == kc - 1:
                    st["thr"] = (lk, li)
    for l in range(cnt):
        if brank[l] < kc:
            L_d[brank[l]], L_i[brank[l]] = bk[l], bi[l]
            if brank[l] == kc - 1:
                st["thr"] = (bk[l], bi[l])
    buf.clear()


def run(n, kc, self_id, keys):
    L_d = [INF] * kc
    L_i = [NOIDX] * kc
    buf = []
    st = {"thr": (INF, NOIDX)}
    thr_reg = INF
    for c0 in range(0, n, 64):
        for j in range(8):
            cols = [c0 + j * 8 + e for e in range(8)]
            ks = [keys[min(c, n - 1)] for c in cols]  # clamped rows past n
            if not any(k <= thr_reg for k in ks):
                continue
            if len(buf) > CAP - 8:
                merge(L_d, L_i, kc, buf, st)
                thr_reg = st["thr"][0]
            for c, k in zip(cols, ks):
                if c < n and c != self_id and less(k, c, *st["thr"]):
                    buf.append((k, c))
                    assert len(buf) <= CAP
    if buf:
        merge(L_d, L_i, kc, buf, st)
    return L_d, L_i


# ------------------------------------------------------------------------------------------- v2


def sort32(bk, bi):
    """ft_sort32: bitonic sort of one (key, index) pair per lane, ascending."""
    bk, bi = bk[:], bi[:]
    size = 2
    while size <= 32:
        stride = size >> 1
        while stride > 0:
            ok = [bk[l ^ stride] for l in range(32)]
            oi = [bi[l ^ stride] for l in range(32)]
            nk, ni = bk[:], bi[:]
            for l in range(32):
                up = (l & size) == 0
                lower = (l & stride) == 0
                take_min = lower == up
                other_less = less(ok[l], oi[l], bk[l], bi[l])
                if other_less if take_min else less(bk[l], bi[l], ok[l], oi[l]):
                    nk[l], ni[l] = ok[l], oi[l]
            bk, bi = nk, ni
            stride >>= 1
        size <<= 1
    return bk, bi


def slot_ranks(lk, li, bk, bi, cnt):
    """ft_slot_ranks: per lane, lo = # buffer entries before its list element, cb = # slot
    elements before its buffer entry (two 6-step shuffle searches)."""
    lo, cb = [0] * 32, [0] * 32
    step = 32
    while step:
        for l in range(32):
            p, q = lo[l] + step - 1, cb[l] + step - 1
            if p < cnt and less(bk[p & 31], bi[p & 31], lk[l], li[l]):
                lo[l] += step
            if q < 32 and less(lk[q & 31], li[q & 31], bk[l], bi[l]):
                cb[l] += step
        step >>= 1
    return lo, cb


class Row:
    """A row's state: global list, shared threshold, shared buffer (None: never written since the
    last merge, so a second write to a slot is caught)."""

    def __init__(self, kc, valid):
        self.L_d, self.L_i = [INF] * kc, [NOIDX] * kc
        self.thr = INF if valid else -INF
        self.buf = [None] * CAP


def apply_writes(row, writes, unread, seen):
    """Writes of one phase of the merge, in a random lane order: targets distinct from each other
    and from the merge's earlier writes (seen), none on an element not yet read."""
    targets = {t for t, _, _ in writes}
    assert len(targets) == len(writes) and not targets & seen, "two writes to one slot"
    assert not targets & unread, "a write lands on an unread list element"
    seen |= targets
    random.shuffle(writes)
    kc = len(row.L_d)
    for t, k, i in writes:
        row.L_d[t], row.L_i[t] = k, i
        if t == kc - 1:
            row.thr = k


def merge_v2(row, cnt):
    """ft_merge_row2."""
    kc = len(row.L_d)
    assert 0 < cnt <= CAP and all(row.buf[l] is not None for l in range(cnt))
    bk = [row.buf[l][0] if l < cnt else INF for l in range(32)]
    bi = [row.buf[l][1] if l < cnt else NOIDX for l in range(32)]
    before = [0] * 32
    seen = set()
    if kc <= 32 * REG_SLOTS:
        lk = [[row.L_d[s * 32 + l] if s * 32 + l < kc else INF for l in range(32)] for s in range(REG_SLOTS)]
        li = [[row.L_i[s * 32 + l] if s * 32 + l < kc else NOIDX for l in range(32)] for s in range(REG_SLOTS)]
        bk, bi = sort32(bk, bi)
        writes = []
        for s in range(REG_SLOTS):
            lo, cb = slot_ranks(lk[s], li[s], bk, bi, cnt)
            for l in range(32):
                before[l] += cb[l]
                i = s * 32 + l
                if i < kc and lo[l] > 0 and i + lo[l] < kc:
                    writes.append((i + lo[l], lk[s][l], li[s][l]))
        apply_writes(row, writes, set(), seen)  # every element read first
    else:
        nslot = (kc + 31) >> 5
        s = nslot - 1
        lk = [row.L_d[s * 32 + l] if s * 32 + l < kc else INF for l in range(32)]
        li = [row.L_i[s * 32 + l] if s * 32 + l < kc else NOIDX for l in range(32)]
        bk, bi = sort32(bk, bi)
        while s >= 0:
            if s > 0:  # the next slot, read before this slot's writes
                nk = [row.L_d[(s - 1) * 32 + l] for l in range(32)]
                ni = [row.L_i[(s - 1) * 32 + l] for l in range(32)]
            lo, cb = slot_ranks(lk, li, bk, bi, cnt)
            writes = []
            for l in range(32):
                before[l] += cb[l]
                i = s * 32 + l
                if i < kc and lo[l] > 0 and i + lo[l] < kc:
                    writes.append((i + lo[l], lk[l], li[l]))
            apply_writes(row, writes, set(range(0, max(0, (s - 1) * 32))), seen)
            if s > 0:
                lk, li = nk, ni
            s -= 1
    writes = [(l + before[l], bk[l], bi[l]) for l in range(cnt) if l + before[l] < kc]
    apply_writes(row, writes, set(), seen)
    row.buf = [None] * CAP


def byte(x, r):
    return (x >> (8 * r)) & 0xFF


def run_v2(n, kc, keys, sids, valid, MT, pipelined=False):
    """One warp of 16 MT rows through ft_select_chunk2 / ft_flush_rows2; keys[r][c] (any floats,
    duplicates allowed), sids[r] the excluded column (-1: none), valid[r] False: a row past m.
    pipelined: the order of fused_topk_fp16_ar's main loop v2 (ft_keys_half / ft_slow_half): the
    steps of each 32-column half are entered only when a warp vote over the whole half, against
    the thresholds at the start of the half, fires; each step is then re-tested as before."""
    WR = 16 * MT
    rows = [Row(kc, valid[r]) for r in range(WR)]

    def lrow(g, mt, h):
        return mt * 16 + h * 8 + g

    lanes = [(lane >> 2, lane & 3) for lane in range(32)]
    thr = [[[rows[lrow(g, mt, h)].thr for h in range(2)] for mt in range(MT)] for g, _ in lanes]
    sid = [[[sids[lrow(g, mt, h)] for h in range(2)] for mt in range(MT)] for g, _ in lanes]
    cntpk = [0] * 32

    def merge_flagged(need):
        for p in range(32):
            if need >> p & 1:
                r, g = p & 3, p >> 2
                merge_v2(rows[lrow(g, r >> 1, r & 1)], byte(cntpk[p], r))
        for lane, (g, _) in enumerate(lanes):
            for mt in range(MT):
                for h in range(2):
                    thr[lane][mt][h] = rows[lrow(g, mt, h)].thr

    for c0 in range(0, n, 64):
        # acc[lane][mt][j][e]: key of row (mt, e >> 1) at column c0 + 8 j + 2 t4 + (e & 1)
        acc = [[[[keys[lrow(g, mt, e >> 1)][min(c0 + j * 8 + 2 * t4 + (e & 1), n - 1)] for e in range(4)]
                 for j in range(8)] for mt in range(MT)] for g, t4 in lanes]
        hit = [c0 + 64 > n or any(0 <= sid[lane][mt][h] - c0 < 64 for mt in range(MT) for h in range(2))
               for lane in range(32)]
        if any(hit):
            for lane, (g, t4) in enumerate(lanes):
                for j in range(8):
                    for mt in range(MT):
                        for e in range(4):
                            c = c0 + j * 8 + 2 * t4 + (e & 1)
                            if c >= n or c == sid[lane][mt][e >> 1]:
                                acc[lane][mt][j][e] = NAN
        for j in range(8):
            if pipelined and j % 4 == 0:  # ft_keys_half's vote, thresholds as of the half's start
                half = any(acc[lane][mt][jj][e] <= thr[lane][mt][e >> 1]
                           for lane in range(32) for mt in range(MT) for jj in range(j, j + 4) for e in range(4))
            if pipelined and not half:
                continue
            if not any(acc[lane][mt][j][e] <= thr[lane][mt][e >> 1]
                       for lane in range(32) for mt in range(MT) for e in range(4)):
                continue
            for _ in range(2):
                sv = [[[acc[lane][mt][j][e] <= thr[lane][mt][e >> 1] for e in range(4)] for mt in range(MT)]
                      for lane in range(32)]
                x = [sum((sv[lane][mt][2 * h] + sv[lane][mt][2 * h + 1]) << (8 * (2 * mt + h))
                         for mt in range(MT) for h in range(2)) for lane in range(32)]
                px = [x[lane ^ 1] for lane in range(32)]
                pair = [x[lane] + px[lane] for lane in range(32)]
                opp = [pair[lane ^ 2] for lane in range(32)]
                tot = [pair[lane] + opp[lane] for lane in range(32)]
                ex = [(px[lane] if lane & 1 else 0) + (opp[lane] if lane & 2 else 0) for lane in range(32)]
                for lane in range(32):
                    for r in range(4):
                        assert byte(cntpk[lane], r) <= CAP and byte(tot[lane], r) <= 8
                over = [(cntpk[lane] + tot[lane] + (0x7F - CAP) * 0x01010101) & 0x80808080 for lane in range(32)]
                need = sum(((over[lane] >> (8 * t4 + 7)) & 1) << lane for lane, (_, t4) in enumerate(lanes))
                if not need:
                    break
                merge_flagged(need)
                for lane in range(32):
                    mine = (need >> (lane & ~3)) & 0xF
                    cntpk[lane] &= ~(((mine * 0x00204081) & 0x01010101) * 0xFF) & 0xFFFFFFFF
            else:
                raise AssertionError("a second merge round in one step")
            for lane, (g, t4) in enumerate(lanes):
                pos = cntpk[lane] + ex[lane]
                cntpk[lane] += tot[lane]
                ca = c0 + j * 8 + 2 * t4
                for mt in range(MT):
                    for h in range(2):
                        row = rows[lrow(g, mt, h)]
                        o = byte(pos, 2 * mt + h)
                        s0, s1 = sv[lane][mt][2 * h], sv[lane][mt][2 * h + 1]
                        for s, slot, e in ((s0, o, 0), (s1, o + s0, 1)):
                            if s:
                                assert slot < CAP and row.buf[slot] is None, "buffer slot reused or past CAP"
                                row.buf[slot] = (acc[lane][mt][j][2 * h + e], ca + e)
            for lane, (g, _) in enumerate(lanes):  # the counts agree with the buffers
                for mt in range(MT):
                    for h in range(2):
                        row = rows[lrow(g, mt, h)]
                        assert byte(cntpk[lane], 2 * mt + h) == sum(b is not None for b in row.buf)
    need = sum((byte(cntpk[lane], t4) != 0) << lane for lane, (_, t4) in enumerate(lanes))
    if need:
        merge_flagged(need)
    return rows


# ------------------------------------------------------------------------------------------ main


def reference(keys, n, kc, sid):
    ref = sorted((keys[c], c) for c in range(n) if c != sid and not math.isnan(keys[c]))[:kc]
    return ref + [(INF, NOIDX)] * (kc - len(ref))


def random_row(n, dup, descending):
    keys = [float(random.randint(0, 5)) if dup else random.random() for _ in range(n)]
    return sorted(keys, reverse=True) if descending else keys


def check_v1(trials):
    for trial in range(trials):
        n = random.randint(1, 700)
        kc = min(random.choice([1, 2, 5, 31, 32, 33, 64, 100, 128, 200, 400]), max(1, n))
        keys = random_row(n, random.random() < 0.4, random.random() < 0.3)
        sid = random.randint(-1, n - 1)
        L_d, L_i = run(n, kc, sid, keys)
        assert list(zip(L_d, L_i)) == reference(keys, n, kc, sid), ("v1", trial, n, kc)


def check_v2(trials):
    for trial in range(trials):
        n = random.randint(1, 700)
        kc = min(random.choice([1, 2, 5, 31, 32, 33, 64, 100, 127, 128, 129, 200, 400]), max(1, n))
        MT = random.choice([1, 2])
        WR = 16 * MT
        dup = random.random() < 0.4
        keys = [random_row(n, dup, random.random() < 0.3) for _ in range(WR)]
        if random.random() < 0.2:  # rows with identical keys (ties across the whole row)
            keys = [[1.0] * n for _ in range(WR)]
        elif random.random() < 0.3:  # ascending rows with a few late drops: isolated survivors late
            keys = [sorted(random.random() for _ in range(n)) for _ in range(WR)]
            for row in keys:
                for _ in range(3):
                    row[random.randrange(n)] = -random.random()
        sids = [random.randint(-1, n - 1) for _ in range(WR)]
        valid = [random.random() > 0.1 for _ in range(WR)]
        for pipelined in (False, True):  # main loop v1 / v2 order
            rows = run_v2(n, kc, keys, sids, valid, MT, pipelined)
            for r in range(WR):
                got = list(zip(rows[r].L_d, rows[r].L_i))
                want = reference(keys[r], n, kc, sids[r]) if valid[r] else [(INF, NOIDX)] * kc
                assert got == want, ("v2", trial, r, n, kc, MT, pipelined)


def main(trials=300, seed=1):
    random.seed(seed)
    check_v1(trials)
    check_v2(max(1, trials // 5))
    return trials


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO)
    main(a.trials, a.seed)
    logging.getLogger(__name__).info("merge/append emulation: %d v1 rows and %d v2 warps OK", a.trials,
                                     max(1, a.trials // 5))
