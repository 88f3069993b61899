"""The per-thread code of ``index/connect.cu`` compiled for the host (``-DCN_HOST_ONLY``: plain C++,
atomics as plain reads and writes) and run thread by thread in shuffled orders, against the host
algorithms of ``_connect.py``: ECL-CC hooking gives the union-find's roots (the smallest id of each
component) whatever the order of the edges; the BFS visit/push gives the host BFS's reachable set;
the edge length steps give a sequential float32 sum; the long-edge rule gives that of
``short_edge_components``. Needs a C++ compiler (skipped without one). Races and warp votes are
the GPU tests' part (``test_connect_gpu.py``)."""

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

from knnkit._core.cuda import PACKAGE_DIR
from knnkit.index._connect import _bfs_tree, _union_find_roots

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

HARNESS = r"""
#include <cmath>
#include "connect.cu"

extern "C" {
// cc_init (a row split over 32 lanes, then the min), cc_hook over the edges in `order`, cc_flatten
void h_components(const int* g, int n, int R, const long long* order, long long m, int* parent) {
    for (int v = 0; v < n; ++v) {
        int p = v;
        for (int lane = 0; lane < 32; ++lane) {
            const int q = cn_init_part(g, n, R, v, lane, 32, v);
            if (q < p) p = q;
        }
        parent[v] = p;
    }
    for (long long i = 0; i < m; ++i) cn_hook_edge(g, n, R, parent, order[i]);
    for (int v = 0; v < n; ++v) {
        const int r = cn_root(parent, v);
        if (r != parent[v]) parent[v] = r;
    }
}

// hooking only (parents as given): the invariants after every single edge are checked by the caller
void h_hook(const int* g, int n, int R, long long e, int* parent) { cn_hook_edge(g, n, R, parent, e); }

// bfs_seed then bfs_expand level by level; returns the number reached, levels in *n_levels
long long h_bfs(const int* g, int n, int R, const int* src, int m, unsigned int* bits, int* qa, int* qb,
                int* n_levels) {
    int size = 0;
    for (int i = 0; i < m; ++i)
        if (cn_visit(bits, n, src[i])) qa[size++] = src[i];
    long long reached = size;
    int levels = 0;
    int* cur = qa;
    int* nxt = qb;
    while (size > 0) {
        int next_size = 0;
        for (long long e = 0; e < (long long)size * R; ++e) {
            const int u = cur[e / R];
            const int v = g[(long long)u * R + e % R];
            if (cn_visit(bits, n, v)) nxt[next_size++] = v;
        }
        reached += next_size;
        size = next_size;
        int* t = cur; cur = nxt; nxt = t;
        ++levels;
    }
    *n_levels = levels;
    return reached;
}

void h_sqdist(const float* X, int n, int d, const int* g, int R, float* out) {
    for (long long e = 0; e < (long long)n * R; ++e) {
        const int u = (int)(e / R), v = g[e];
        if (v < 0 || v >= n) { out[e] = NAN; continue; }
        float s = 0.f;
        for (int k = 0; k < d; ++k) s = cn_sq_step(s, X[(long long)v * d + k], X[(long long)u * d + k]);
        out[e] = s;
    }
}

long long h_short(const int* g, const float* dist, const float* near, int n, int R, float factor, int* out) {
    long long n_long = 0;
    for (long long e = 0; e < (long long)n * R; ++e) {
        const bool lng = cn_is_long(g, dist, near, n, R, factor, e);
        out[e] = lng ? -1 : g[e];
        n_long += lng;
    }
    return n_long;
}
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler on PATH")
    d = tmp_path_factory.mktemp("connect_host")
    src = d / "harness.cpp"
    src.write_text(HARNESS)
    so = d / "harness.so"
    inc = os.path.join(PACKAGE_DIR, "index")
    cmd = [CXX, "-std=c++17", "-O2", "-shared", "-fPIC", "-DCN_HOST_ONLY", "-I", inc, str(src), "-o", str(so)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    L = ctypes.CDLL(str(so))
    L.h_bfs.restype = ctypes.c_longlong
    L.h_short.restype = ctypes.c_longlong
    return L


def _p(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def _i(x):
    return ctypes.c_int(int(x))


def _graphs(rng):
    out = []
    n = 2000
    g = rng.integers(0, n, (n, 8)).astype(np.int32)
    g[rng.random(g.shape) < 0.75] = -1
    out.append(("random_holes", g))
    n = 1001
    g = rng.integers(0, n, (n, 2)).astype(np.int32)
    g[rng.random(g.shape) < 0.8] = -1
    out.append(("many_components", g))
    n = 3000
    g = np.full((n, 2), -1, np.int32)
    perm = rng.permutation(n)
    g[perm[:-1], 1] = perm[1:]            # a chain in random id order
    out.append(("chain", g))
    n = 2000
    g = np.full((n, 1), -1, np.int32)
    g[1:, 0] = np.arange(n - 1)           # a descending chain: the deepest trees for the hooking
    out.append(("descending_chain", g))
    n = 257
    g = np.tile(np.arange(n, dtype=np.int32)[:, None], (1, 3))
    g[::4, 2] = (np.arange(0, n, 4) * 7 + 3) % n
    g[3, 1] = n + 100                     # ids >= n are empty slots
    out.append(("self_loops", g))
    n = 700
    g = rng.integers(0, n, (n, 40)).astype(np.int32)   # a row wider than a warp
    g[rng.random(g.shape) < 0.98] = -1
    out.append(("wide_rows", g))
    return out


def test_hooking_gives_union_find_roots(lib, rng):
    for name, g in _graphs(rng):
        n, R = g.shape
        want = _union_find_roots(g).astype(np.int32)
        for order in (rng.permutation(n * R), np.arange(n * R)[::-1].copy(), np.arange(n * R)):
            order = np.ascontiguousarray(order, np.int64)
            parent = np.empty(n, np.int32)
            lib.h_components(_p(g), _i(n), _i(R), _p(order), ctypes.c_longlong(order.size), _p(parent))
            assert np.array_equal(parent, want), name


def test_hooking_invariants_edge_by_edge(lib, rng):
    """After every single hook: parent[x] <= x, and x and parent[x] are in one component."""
    n = 300
    g = rng.integers(0, n, (n, 3)).astype(np.int32)
    g[rng.random(g.shape) < 0.6] = -1
    comp = _union_find_roots(g)
    parent = np.arange(n, dtype=np.int32)
    for e in rng.permutation(n * 3):
        lib.h_hook(_p(g), _i(n), _i(3), ctypes.c_longlong(int(e)), _p(parent))
        assert (parent <= np.arange(n)).all() and (comp[parent] == comp).all()


def test_bfs_equals_host(lib, rng):
    for name, g in _graphs(rng):
        n, R = g.shape
        src = np.concatenate([rng.choice(n, 2, replace=False), [-1, n + 5]]).astype(np.int32)
        bits = np.zeros((n + 31) // 32, np.uint32)
        qa, qb = np.empty(n, np.int32), np.empty(n, np.int32)
        levels = ctypes.c_int(0)
        reached = lib.h_bfs(_p(g), _i(n), _i(R), _p(src), _i(src.size), _p(bits), _p(qa), _p(qb),
                            ctypes.byref(levels))
        parent = np.empty(n, np.int64)
        want = _bfs_tree(g, np.unique(src[(src >= 0) & (src < n)]).astype(np.int64), parent, np.empty(n, np.int64))
        mask = ((bits[np.arange(n) >> 5] >> (np.arange(n) & 31).astype(np.uint32)) & 1).astype(bool)
        assert reached == want and np.array_equal(mask, parent != -2), name
    assert levels.value >= 1


def test_edge_lengths_and_long_rule(lib, rng):
    n, d, R = 400, 45, 9
    X = rng.standard_normal((n, d)).astype(np.float32) * np.float32(3.7)
    X[7] = X[3]
    g = rng.integers(0, n, (n, R)).astype(np.int32)
    g[rng.random(g.shape) < 0.15] = -1
    g[3, 0], g[7, 0], g[5, 1] = 7, 3, n + 1
    out = np.empty((n, R), np.float32)
    lib.h_sqdist(_p(X), _i(n), _i(d), _p(g), _i(R), _p(out))
    valid = (g >= 0) & (g < n)
    ref = np.zeros((n, R), np.float32)
    for k in range(d):
        t = X[np.where(valid, g, 0), k] - X[:, None, k]
        ref = ref + t * t
    assert np.isnan(out[~valid]).all() and np.array_equal(out[valid], ref[valid])
    near = np.where(out > 0, out, np.inf).min(axis=1)
    near = np.where(np.isfinite(near), near, 0).astype(np.float32)
    gi = np.where(valid, g, 0)
    for factor in (64.0, 1.2, 1.01):
        short = np.empty_like(g)
        got = lib.h_short(_p(g), _p(out), _p(near), _i(n), _i(R), ctypes.c_float(factor), _p(short))
        long_ = (out > np.float32(factor) * np.maximum(near[:, None], near[gi])) & (near[:, None] > 0) & (near[gi] > 0)
        assert got == long_.sum() and np.array_equal(short, np.where(long_, -1, g))
    assert got > 0
