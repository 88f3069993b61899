"""Small stable sorts for the Numba kernels, written out: Numba's own ``np.argsort(kind="mergesort")``
costs about a second of compile per key type, these a few tenths. Both are bottom-up merge sorts
that sort the key and a companion array in place (plain loops only: a slice assignment such as
``a[:] = b`` alone pulls in about two seconds of Numba's generic array code on first compile).

- :func:`sort_pairs`: ascending by ``(key, val)`` (distance, then index), NaN keys last in their
  order, as ``np.argsort(key, kind="stable")`` followed by ordering equal keys by ``val``. With
  ``val`` the positions ``0 .. m-1`` it is the stable sort by key.
- :func:`stable_sort_by_key`: integer keys, the order of ``np.argsort(key, kind="stable")``.
"""

import numpy as np

from .._core.jit import Family

njit = Family("sort", "sorting", seconds=0.5).njit

__all__ = ["stable_sort_by_key", "sort_pairs"]


@njit(cache=True)
def sort_pairs(key, val):
    """Sort ``(key, val)`` pairs ascending by key, then val (NaN keys last, in their order); in place."""
    m = key.shape[0]
    k2 = np.empty_like(key)
    v2 = np.empty_like(val)
    width = 1
    flip = False
    while width < m:
        if flip:
            sk, sv, dk, dv = k2, v2, key, val
        else:
            sk, sv, dk, dv = key, val, k2, v2
        for s0 in range(0, m, 2 * width):
            mid = min(s0 + width, m)
            e = min(s0 + 2 * width, m)
            i = s0
            j = mid
            for o in range(s0, e):
                take_j = False
                if i >= mid:
                    take_j = True
                elif j < e:   # the right run's head first only when strictly before (stability)
                    a = sk[j]
                    b = sk[i]
                    if a < b:
                        take_j = True
                    elif a == b:
                        take_j = sv[j] < sv[i]
                    elif b != b:
                        take_j = a == a
                if take_j:
                    dk[o] = sk[j]
                    dv[o] = sv[j]
                    j += 1
                else:
                    dk[o] = sk[i]
                    dv[o] = sv[i]
                    i += 1
        flip = not flip
        width *= 2
    if flip:
        for t in range(m):
            key[t] = k2[t]
            val[t] = v2[t]


@njit(cache=True)
def stable_sort_by_key(key, val):
    """Sort integer ``key`` ascending, ``val`` along, equal keys in their order; in place."""
    m = key.shape[0]
    k2 = np.empty_like(key)
    v2 = np.empty_like(val)
    width = 1
    flip = False
    while width < m:
        if flip:
            sk, sv, dk, dv = k2, v2, key, val
        else:
            sk, sv, dk, dv = key, val, k2, v2
        for s0 in range(0, m, 2 * width):
            mid = min(s0 + width, m)
            e = min(s0 + 2 * width, m)
            i = s0
            j = mid
            for o in range(s0, e):
                if i >= mid or (j < e and sk[j] < sk[i]):
                    dk[o] = sk[j]
                    dv[o] = sv[j]
                    j += 1
                else:
                    dk[o] = sk[i]
                    dv[o] = sv[i]
                    i += 1
        flip = not flip
        width *= 2
    if flip:
        for t in range(m):
            key[t] = k2[t]
            val[t] = v2[t]
