"""The CPU NN-Descent join's paired distance loop and the apply's owner test: the same values and
lists as the one-pair loop and the ``% T`` owners they replaced."""

import numpy as np
import pytest

from knnkit.graph.nndescent._cpu import (_apply_block, _dist, _dist2, _dist_row, _distinct, _join_rows_basic,
                                          _listed, nndescent_cpu)


def _data(kind, n, d, rng):
    if kind == "uniform":
        return rng.random((n, d), dtype=np.float32)
    if kind == "offset":  # far from the origin: large coordinates, small differences
        return (1000.0 + rng.standard_normal((n, d))).astype(np.float32)
    # tight clusters: differences near float32's resolution of the coordinates
    c = rng.standard_normal((4, d)) * 10
    return (c[rng.integers(0, 4, n)] + 1e-4 * rng.standard_normal((n, d))).astype(np.float32)


def _sum_order_close(got, want, X, a, b, metric):
    """``got`` equals ``want`` up to the order of a float32 sum of d terms: within d ulps of the sum of
    the terms' magnitudes (bit-identical where LLVM vectorises the one- and two-sum loops alike,
    as on the AVX-512 machines of earlier sessions; not on AMD EPYC without AVX-512)."""
    x, y = X[a].astype(np.float64), X[b].astype(np.float64)
    mag = {0: ((x - y) ** 2).sum(), 1: np.abs(x * y).sum(), 2: np.abs(x - y).sum()}[metric]
    return abs(float(got) - float(want)) <= 2.0 ** -23 * X.shape[1] * mag + 1e-38


@pytest.mark.parametrize("kind", ["uniform", "offset", "tight"])
@pytest.mark.parametrize("metric", [0, 1, 2])
def test_dist2_and_dist_row_equal_dist(kind, metric):
    rng = np.random.default_rng(3)
    for d in (1, 2, 3, 7, 8, 15, 31, 32, 33, 64, 100, 128, 300, 960):
        X = _data(kind, 40, d, rng)
        for a, b0, b1 in rng.integers(0, 40, (30, 3)):
            e0, e1 = _dist2(X, a, b0, b1, metric)
            assert _sum_order_close(e0, _dist(X, a, b0, metric), X, a, b0, metric), (d, a, b0)
            assert _sum_order_close(e1, _dist(X, a, b1, metric), X, a, b1, metric), (d, a, b1)
            e0_again, _ = _dist2(X, a, b0, b0, metric)
            assert e0_again == e0  # the first sum does not depend on the second pair
        ids = rng.integers(0, 40, 13).astype(np.int64)
        out = np.full(13, -7.0, np.float32)
        _dist_row(X, 5, ids, 2, 13, out, metric)  # an odd count: the single tail
        assert (out[:2] == -7.0).all()
        assert all(_sum_order_close(out[2 + j], _dist(X, 5, v, metric), X, 5, v, metric)
                   for j, v in enumerate(ids[2:]))


def _reference_offers(X, metric, s0, s1, new_c, new_n, old_c, old_n, ind, dist):
    """The basic join's rule pair by pair, as it was written before the distance rows, on the
    distances the rows compute (``_dist_row``: equal to ``_dist``'s up to the sum's order)."""
    K = dist.shape[1]
    P = new_c.shape[1]
    out = []
    nn = np.empty(P, np.int64)
    oo = np.empty(P, np.int64)
    for s in range(s0, s1):
        cn, co = _distinct(s, new_c, new_n, old_c, old_n, nn, oo)
        row = []
        # the loop order: for each NEW a, the later NEW ones, then the OLD ones
        pairs = []
        for i in range(cn):
            pairs += [(nn[i], nn[j]) for j in range(i + 1, cn)] + [(nn[i], oo[j]) for j in range(co)]
        for a, b in pairs:
            d = _row_dist(X, a, b, nn[:cn], oo[:co], metric)
            void_a = d > dist[a, K - 1] or _listed(ind, a, b)
            void_b = d > dist[b, K - 1] or _listed(ind, b, a)
            if (d < dist[a, K - 1] or d < dist[b, K - 1]) and not (void_a and void_b):
                row.append((a, b, d))
        out.append(row)
    return out


def _row_dist(X, a, b, nn, oo, metric):
    """The distance of the pair (a, b) as the basic join's rows compute it: ``a``'s row over the
    later NEW samples, then over the OLD ones, two at a time with a single tail."""
    i = int(np.flatnonzero(nn == a)[0])
    for ids in (nn[i + 1:], oo):
        hit = np.flatnonzero(ids == b)
        if hit.size:
            out = np.empty(ids.size, np.float32)
            _dist_row(X, a, np.ascontiguousarray(ids, np.int64), 0, ids.size, out, metric)
            return out[hit[0]]
    raise AssertionError((a, b))


@pytest.mark.parametrize("kind", ["uniform", "tight"])
def test_basic_join_offers_match_pair_by_pair_rule(kind):
    rng = np.random.default_rng(7)
    n, d, K, P = 300, 24, 12, 8
    X = _data(kind, n, d, rng)
    # lists: nearest-ish random ids with their distances, sorted; some near enough to be void
    ind = np.empty((n, K), np.int32)
    dist = np.empty((n, K), np.float32)
    for s in range(n):
        c = rng.choice(np.delete(np.arange(n), s), K, replace=False)
        dd = np.array([_dist(X, s, v, 0) for v in c], np.float32)
        o = np.argsort(dd, kind="stable")
        ind[s], dist[s] = c[o], dd[o]
    new_c = rng.integers(0, n, (n, P)).astype(np.int32)
    old_c = rng.integers(0, n, (n, P)).astype(np.int32)
    new_n = rng.integers(0, P + 1, n).astype(np.int32)
    old_n = rng.integers(0, P + 1, n).astype(np.int32)
    # samples drawn from the node's own list too, so that listed pairs occur
    new_c[:, :4] = ind[:, :4]
    old_c[:, :4] = ind[:, 4:8]
    cap = P * (P - 1) // 2 + P * P
    s0, s1 = 10, 210
    ua = np.empty((s1 - s0) * cap, np.int32)
    ub = np.empty_like(ua)
    ud = np.empty((s1 - s0) * cap, np.float32)
    uc = np.empty(s1 - s0, np.int32)
    _join_rows_basic(X, 0, s0, new_c, new_n, old_c, old_n, ind, dist, 0, cap, ua, ub, ud, uc, s0, s1)
    ref = _reference_offers(X, 0, s0, s1, new_c, new_n, old_c, old_n, ind, dist)
    assert sum(len(r) for r in ref) > 100
    for r, row in enumerate(ref):
        got = [(ua[r * cap + e], ub[r * cap + e], ud[r * cap + e]) for e in range(uc[r])]
        assert got == row, r


def test_apply_owner_mask_equals_modulo_owners():
    """Two owners (the mask) and three (``% T``) apply a buffer into the same lists."""
    rng = np.random.default_rng(11)
    n, K, rows, cap = 500, 10, 40, 30
    ind0 = np.full((n, K), -1, np.int32)
    dist0 = np.full((n, K), np.inf, np.float32)
    upd_a = rng.integers(0, n, rows * cap).astype(np.int32)
    upd_b = rng.integers(0, n, rows * cap).astype(np.int32)
    upd_d = rng.random(rows * cap, dtype=np.float32)
    upd_d[::7] = upd_d[3]  # ties
    upd_cnt = rng.integers(0, cap + 1, rows).astype(np.int32)
    lists = []
    for T in (1, 2, 3, 4):
        for symmetric in (True, False):
            ind, dist, flag = ind0.copy(), dist0.copy(), np.zeros((n, K), np.uint8)
            c = _apply_block(rows, cap, upd_a, upd_b, upd_d, upd_cnt, ind, dist, flag, symmetric, T)
            lists.append(((symmetric, T), c, ind, dist, flag))
    for sym in (True, False):
        same = [x for x in lists if x[0][0] == sym]
        for _, c, ind, dist, flag in same[1:]:
            assert c == same[0][1]
            assert np.array_equal(ind, same[0][2]) and np.array_equal(dist, same[0][3])
            assert np.array_equal(flag, same[0][4])


def test_descent_repeats_and_lists_hold_dist_values():
    """Same seed, same lists; every listed distance is ``_dist``'s value, whichever loop (paired
    rows, single pairs, the start's top-up) computed it."""
    rng = np.random.default_rng(2)
    X = rng.random((400, 8), dtype=np.float32)
    I, D, st = nndescent_cpu(X, 10, sample=5, max_iters=8, delta=0.0, metric="l2", seed=1)
    I2, D2, _ = nndescent_cpu(X, 10, sample=5, max_iters=8, delta=0.0, metric="l2", seed=1)
    assert np.array_equal(I, I2) and np.array_equal(D, D2)
    # the distances in the lists are _dist's, whichever loop computed them
    rows = np.repeat(np.arange(400), 10)
    ref = np.array([_dist(X, a, b, 0) for a, b in zip(rows, I.ravel())], np.float32).reshape(I.shape)
    assert np.array_equal(ref, D)


def test_listed_matches_membership():
    """``_listed`` compares in int32: the same answers as a plain membership test, -1 (empty
    slots) and the largest int32 id included."""
    rng = np.random.default_rng(5)
    big = np.iinfo(np.int32).max
    ind = rng.integers(-1, 60, (50, 37)).astype(np.int32)
    ind[3, 5] = big
    for a in range(50):
        for b in list(range(-1, 61)) + [big]:
            assert _listed(ind, a, np.int64(b)) == (b in ind[a]), (a, b)
