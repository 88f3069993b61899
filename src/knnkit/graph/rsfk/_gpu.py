"""RSFK on the GPU (CuPy): launches the kernels of ``rsfk.cu``.

Tree levels: one side (or projection) kernel and one partition kernel per level, with a CuPy prefix
sum (or, for the projection split, a CuPy radix argsort) between them; the only host transfer per
level is the largest node size (one scalar) that tells the driver whether another level is needed.
Leaves: one of the three warp-centric k-NN set update kernels, one thread block per leaf.
"""

import numpy as np

from ..._core.cuda import get_module, kernel_path

__all__ = ["GpuBackend"]

_KERNEL = kernel_path(__file__, "rsfk.cu")
_NAMES = ("rsfk_side_sample", "rsfk_project", "rsfk_partition", "rsfk_leaf_atomic", "rsfk_leaf_tiles",
          "rsfk_leaf_diagonal", "rsfk_nne", "rsfk_fill")

#: threads per block of the warp-per-item kernels and of the leaf kernels (8 warps)
_BLOCK = 256


def _kernels():
    mod = get_module(_KERNEL, options=("-lineinfo",))
    return {name: mod.get_function(name) for name in _NAMES}


def _warp_grid(n):
    return ((int(n) * 32 + _BLOCK - 1) // _BLOCK,)


class GpuBackend:
    """The array operations the forest driver needs, on the current CUDA device."""

    name = "gpu"

    def __init__(self):
        import cupy

        self.xp = cupy
        self.k = _kernels()
        self._locks = None

    def sync(self):
        self.xp.cuda.get_current_stream().synchronize()

    def inv_norms(self, X):
        cp = self.xp
        return (1.0 / cp.maximum(cp.sqrt(cp.einsum("ij,ij->i", X, X)), 1e-30)).astype(cp.float32)

    def side_sample(self, X, metric, inv_norm, perm, lo, hi, leaf_size, seed, tree, level, side):
        n, d = X.shape
        self.k["rsfk_side_sample"](_warp_grid(n), (_BLOCK,), (
            X, np.int32(n), np.int32(d), np.int32(metric), inv_norm, perm, lo, hi, np.int32(leaf_size),
            np.uint64(seed), np.int32(tree), np.int32(level), side))

    def project(self, X, perm, lo, hi, leaf_size, seed, tree, level, proj):
        n, d = X.shape
        self.k["rsfk_project"](_warp_grid(n), (_BLOCK,), (
            X, np.int32(n), np.int32(d), perm, lo, hi, np.int32(leaf_size), np.uint64(seed), np.int32(tree),
            np.int32(level), proj))

    def argsort(self, key):
        return self.xp.argsort(key)  # CUB radix sort: stable

    def partition(self, perm, lo, hi, side, cum, leaf_size, min_child, mode, force, out_perm, out_lo, out_hi):
        n = perm.shape[0]
        self.k["rsfk_partition"](((n + _BLOCK - 1) // _BLOCK,), (_BLOCK,), (
            np.int32(n), perm, lo, hi, side, cum, np.int32(leaf_size), np.int32(min_child), np.int32(mode),
            np.int32(bool(force)), out_perm, out_lo, out_hi))

    def new_lists(self, n, K):
        cp = self.xp
        return cp.full((n, K), -1, cp.int32), cp.full((n, K), cp.inf, cp.float32)

    def leaf_update(self, X, metric, perm, leaf_lo, leaf_hi, idx, dist, variant, leaf_size):
        cp = self.xp
        n, d = X.shape
        K = idx.shape[1]
        nleaves = int(leaf_lo.shape[0])
        if variant == "auto":
            variant = "tiles"  # the paper's fastest (its Figures: real datasets and FAISS comparison)
        args = (X, np.int32(d), np.int32(metric), perm, leaf_lo, leaf_hi, np.int32(nleaves), idx, dist, np.int32(K))
        grid = (max(1, min(nleaves, 1 << 20)),)
        if variant == "atomic":
            if self._locks is None or self._locks.shape[0] < n:
                self._locks = cp.zeros(n, cp.int32)
            self.k["rsfk_leaf_atomic"](grid, (_BLOCK,), args + (self._locks,))
        elif variant == "tiles":
            self.k["rsfk_leaf_tiles"](grid, (_BLOCK,), args)
        elif variant == "diagonal":
            self.k["rsfk_leaf_diagonal"](grid, (_BLOCK,), args, shared_mem=4 * int(leaf_size))
        else:
            raise ValueError(f"leaf_update must be 'auto', 'atomic', 'tiles' or 'diagonal', got {variant!r}")
        return variant

    def nne(self, X, metric, idx, dist, reverse=None):
        """One NNE pass: each point is offered the neighbours of its neighbours in a snapshot of
        ``idx`` (with ``reverse``, an (n, R) array of reverse neighbours padded with -1: of its
        forward and reverse neighbours, both taken from the snapshot extended by ``reverse``)."""
        cp = self.xp
        n, d = X.shape
        snapshot = idx.copy() if reverse is None else cp.ascontiguousarray(cp.concatenate([idx, reverse], axis=1))
        self.k["rsfk_nne"](_warp_grid(n), (_BLOCK,), (
            X, np.int32(n), np.int32(d), np.int32(metric), snapshot, np.int32(snapshot.shape[1]), idx, dist,
            np.int32(idx.shape[1])))

    def fill(self, X, metric, idx, dist):
        n, d = X.shape
        self.k["rsfk_fill"](_warp_grid(n), (_BLOCK,), (
            X, np.int32(n), np.int32(d), np.int32(metric), idx, dist, np.int32(idx.shape[1])))
