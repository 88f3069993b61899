"""Thirty-eighth session: why mapped access over managed memory does not give the gather's bits.
Checks the managed copies against their sources as the GPU reads them, and walks with variants."""
import ctypes
import sys

import numpy as np
import cupy as cp

import knnkit
from knnkit.datasets import make_clustered
from knnkit.index.bang import _search_gpu as sg

X = np.asarray(make_clustered(6000 + 200, 24, random_state=5, device="cpu")).astype(np.float16)
rng = np.random.default_rng(5)
index = knnkit.GraphIndex.build(X[:6000], placement="host", device="gpu", random_state=5)
Q = X[6000:][rng.permutation(200)]
knnkit.set_memory_budget(1 << 20)
e = index._engine
g, d = np.asarray(e._graph), np.asarray(e._data)
print("graph", g.shape, g.dtype, g.flags.c_contiguous, "data", d.shape, d.dtype, d.flags.c_contiguous)


def run(memory, label):
    if e._bang_mapped is not None and e._bang_mapped.get("finalizer") is not None:
        e._bang_mapped["finalizer"]()
    e._bang_mapped = None
    sg.configure(access="mapped", mapped_memory=memory)
    dm, im = index.search(Q, k=10, beam=48)
    views = e._bang_mapped["views"]
    gv, dv = cp.asnumpy(views[0]), cp.asnumpy(views[1])
    # the GPU's own read of every row, through the walk's kernel
    cand = cp.arange(g.shape[0], dtype=cp.int32)
    out = cp.empty(g.size, cp.int32)
    sg._kernel("bang_gather_graph")((256,), (256,), (cand, np.int64(g.shape[0]), views[0], np.int32(g.shape[1]), out))
    kern_rows = cp.asnumpy(out).reshape(g.shape)
    print(label, sg.last_stats()["mapped_memory"], "graph copy ok", np.array_equal(gv, g), "data copy ok",
          np.array_equal(dv, d), "kernel rows ok", np.array_equal(kern_rows, g), flush=True)
    return cp.asnumpy(dm), cp.asnumpy(im)


sg.configure(access="gather")
dg, ig = (cp.asnumpy(a) for a in index.search(Q, k=10, beam=48))
for memory in ("pinned", "managed", "pinned", "managed"):
    dm, im = run(memory, memory)
    print("  ids equal", np.array_equal(im, ig), "mismatch", int((im != ig).sum()), "dist equal", np.array_equal(dm, dg))
    bad = np.nonzero((im != ig).any(1))[0][:3]
    for q in bad:
        print("   q", q, "gather", ig[q][:10], dg[q][:4], "\n        mapped", im[q][:10], dm[q][:4])

# variants of the managed copy
orig = sg._managed_copy


def variant(kind):
    def make(cp_, a, dev):
        lib = sg._driver()
        nbytes = max(1, a.nbytes)
        ptr = ctypes.c_ulonglong()
        assert lib.cuMemAllocManaged(ctypes.byref(ptr), nbytes, 1) == 0
        out = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr.value))[:a.nbytes]
        out = out.view(a.dtype).reshape(a.shape)
        if kind == "advise_after":
            out[...] = a
        for advice, where in ((3, sg._MemLocation(2, 0)), (5, sg._MemLocation(1, dev))):
            if kind == "no_advice":
                break
            if kind == "preferred_only" and advice == 5:
                break
            rc = lib.cuMemAdvise_v2(ptr.value, nbytes, advice, where)
            assert rc == 0, rc
        if kind != "advise_after":
            out[...] = a
        return out, ptr.value
    return make


for kind in ("advise_after", "no_advice", "preferred_only"):
    sg._managed_copy = variant(kind)
    dm, im = run("managed", kind)
    print("  ids equal", np.array_equal(im, ig), "mismatch", int((im != ig).sum()), "dist equal", np.array_equal(dm, dg),
          "free_gb", round(cp.cuda.runtime.memGetInfo()[0] / 1e9, 2))
sg._managed_copy = orig
sys.stdout.flush()
