"""The squared-L2 rounding certificate's bound within the k-th's reach, shared by the CPU and GPU
twins (``_cpu._certify``, ``_gpu.certify``); array-module agnostic.

A GEMM key ``|x_c|^2 - 2 q_c.x_c`` (centred float32 operands) errs by at most a multiple of
``u (d + 2)`` times the norms involved. Bounding it with the largest data norm made every row of
heavy-tailed data (Cauchy: the largest norm is an outlier's) fail the certificate and take the
float64 fallback. But a point farther from the centre than ``|q_c| + d_k`` (``d_k`` the k-th
candidate's exact distance) is strictly farther than the k-th, whatever its key: only points
within that reach need the bound, so it takes the smaller of the reach and the largest norm."""

U = 2.0 ** -24


def reach_bound(xp, qn, qn_rel, kth, xmax, dim):
    """``(eps, upper)`` per query row, float64 arrays of ``xp``.

    ``qn``: the centred queries' norms, with relative error at most ``qn_rel`` (float32 sums:
    ``4 (d + 2) u``; float64 sums: ~0); ``kth``: the k-th candidate's exact squared distance
    (float32, inf where the row has fewer than k candidates); ``xmax``: the largest centred data
    norm (from float32 sums). ``eps`` bounds the key error of every point within the reach;
    ``upper`` bounds the k-th's own key from its exact distance (inf where ``kth`` is not finite).
    A row is certified when its last candidate's approximate key minus ``eps`` exceeds ``upper``:
    then every point left out is strictly farther than the k-th."""
    finite = xp.isfinite(kth)
    q_hi = qn * (1 + qn_rel) * (1 + 1e-9)
    q_lo = qn * (1 - qn_rel) * (1 - 1e-9)
    dk = xp.sqrt(xp.where(finite, kth, 0).astype(xp.float64) * (1 + 2.0 ** -20))
    # |x - q| >= |x_c| - |q_c| up to the centring's rounding (u |x_c| + u |q_c|)
    reach = (dk + q_hi * (1 + 4 * U)) * (1 + 1e-6) + 1e-30
    xb = xp.minimum(xmax * (1 + 4 * (dim + 2) * U), reach)
    acc = 4 * (dim + 2) * U  # float32 accumulation, with a 4x margin
    eps = 1.05 * (2 * acc * q_hi * xb + (dim + 2) * U * xb ** 2 + 4 * U * (xb ** 2 + 2 * q_hi * xb)) + 1e-30
    # the k-th's key |x_c - q_c|^2 - |q_c|^2, its distance in the centred operands within the
    # centring's rounding of the exact one
    r = dk * (1 + 1e-6) + 4 * U * (q_hi + xb)
    return eps, xp.where(finite, r * r - q_lo * q_lo, xp.inf)
