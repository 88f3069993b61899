"""Thirty-eighth session: the failing managed-memory test, replayed with its memory map, repeated."""
import os
import sys
import tempfile

import numpy as np
import cupy as cp

import knnkit
from knnkit.datasets import make_clustered
from knnkit.index.bang import _search_gpu as sg

tmp = tempfile.mkdtemp()
rng = np.random.default_rng(5)
X = np.asarray(make_clustered(6000 + 200, 24, random_state=5, device="cpu")).astype(np.float16)
np.save(os.path.join(tmp, "x.npy"), X[:6000])
Xm = np.load(os.path.join(tmp, "x.npy"), mmap_mode="r")
index = knnkit.GraphIndex.build(Xm, placement="host", device="gpu", random_state=5)
Q = X[6000:][rng.permutation(200)]
knnkit.set_memory_budget(1 << 20)
e = index._engine
print("graph", type(e._graph).__name__, "data", type(e._data).__name__, flush=True)
sg.configure(access="gather")
dg, ig = (cp.asnumpy(a) for a in index.search(Q, k=10, beam=48))
for rep in range(3):
    for memory in ("managed", "pinned"):
        sg.configure(access="mapped", mapped_memory=memory)
        dm, im = (cp.asnumpy(a) for a in index.search(Q, k=10, beam=48))
        st = sg.last_stats()
        views = e._bang_mapped["views"]
        ok_g = np.array_equal(cp.asnumpy(views[0]), np.asarray(e._graph))
        ok_d = np.array_equal(cp.asnumpy(views[1]), np.asarray(e._data))
        print(rep, memory, st["mapped_memory"], st["rerank_mode"], "mismatch", int((im != ig).sum()),
              "dist equal", np.array_equal(dm, dg), "copies ok", ok_g, ok_d, "iters", st["iterations"],
              "exp", round(st["expansions_mean"], 2), flush=True)
sg.configure(access="gather")
dg2, ig2 = (cp.asnumpy(a) for a in index.search(Q, k=10, beam=48))
print("gather again equal", np.array_equal(ig2, ig), np.array_equal(dg2, dg))
sys.stdout.flush()
