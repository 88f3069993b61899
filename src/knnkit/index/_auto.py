"""Default build parameters chosen from the data's local intrinsic dimension.

The right out-degree of a search graph depends on how "high-dimensional" the neighbourhoods are,
not on the ambient dimension. We estimate the local intrinsic dimension (LID) with the
Levina-Bickel maximum-likelihood estimator on the exact 20 nearest neighbours of a few hundred
sampled points, and pick the graph degree, RobustPrune's alpha and the candidate degree from it.

Why (measured on the CPU, 100k x 96, 1,000 queries, k = 10, recall@10 at beam 32 / 64 / 128):

* ``make_clustered`` defaults (LID ~18-20), SIFT (~11), Fashion-MNIST (~16): degree 32, alpha
  1.1 already gives 0.997 at beam 32; degree 64 costs build time and QPS for nothing.
* 10 well-separated clusters, ``cluster_std=0.05`` (LID ~45: inside a cluster the isotropic
  noise dominates): degree 32 / alpha 1.1 -> 0.74 / 0.86 / 0.93; degree 48 / alpha 1.0 -> 0.84
  / 0.95 / 0.99; degree 64 / alpha 1.0 (candidate degree 96) -> 0.89 / 0.97 / 0.995; degree 64
  with alpha 1.2 -> 0.87 / 0.94 / 0.98. On noise-dominated neighbourhoods long edges do not help
  navigation (there is no low-dimensional structure to shortcut), so alpha 1.0 wins there,
  while alpha 1.1 is marginally better on the low-LID sets.
"""

import numpy as np

from ..graph._estimate import estimate_intrinsic_dim

__all__ = ["estimate_intrinsic_dim", "auto_build_params", "scale_gap", "CPU_SCALE_GAP_EXACT_MAX_N",
           "CPU_SCALE_GAP_EXACT_K"]

#: the estimate at 20 neighbours below this fraction of the one at 5 means the data is clustered
#: at a scale finer than the graph's neighbourhoods (clusters of a few points)
_SCALE_GAP = 0.5


#: Candidates of the middle tier (LID 28-40, graph degree 48) on the CPU. 96 on the GPU, where the
#: candidate graph costs little; on 2 CPU cores NN-Descent at 96 was most of the build, and 64 gave
#: the same search (suite sets of this tier, 100k, paired with hnswlib; recall at beam 64 within
#: 0.004, QPS equal or higher): broad_clusters 19.6 -> 12.0 s (hnswlib 9.0 s), skewed_norms_ip
#: 26.2 -> 17.0 s (hnswlib 5.9 s) (`benchmarks/results/cpu/cpu_candidate_degree_2026-11-29.json`).
CPU_MIDDLE_TIER_CANDIDATES = 64

#: Candidates of the low tier (LID < 28, graph degree 32) on the CPU; 64 on the GPU. Paired
#: (100k, 2 cores, `benchmarks/cpu_candidate_degree.py`, builds 64 -> 48, same recall at every beam):
#: Fashion-MNIST 15.5 -> 12.5 s (hnswlib 13.0 s), manifold 6.9 -> 5.6 s, 2-D points 4.0 -> 3.0 s,
#: skin 4.4-4.7 -> 3.5-3.7 s, duplicates 4.7-4.8 -> 3.8-4.0 s; tight_c1000 4.6-5.0 -> 5.4-5.5 s (the
#: descent takes longer to settle at 48 there) (`benchmarks/results/cpu/cpu_low_tier_k48_2026-11-29*.json`).
CPU_LOW_TIER_CANDIDATES = 48

#: The clusters-of-few-points tier's candidate lists are exact on the CPU up to this many points.
#: NN-Descent converges slowly there (its lists must find the nearest clusters, a high-dimensional
#: problem: 12 iterations at K 96), and the exact engine (GEMM tiles on every core, screened heap
#: offers) costs n^2: tight_c10000, 100k x 64, K 96, 2 cores: exact 26.4 s against NN-Descent 39.1 s,
#: whose lists held 0.73 of the exact 96 (0.976 of the first 10). On the other tiers NN-Descent was
#: the faster (100k: broad clusters K 64 12.6 s against 22.6 s exact, uniform 32-d K 48 10.7 against
#: 15.5 s, manifold K 48 5.0 against 26.4 s). The exact cost grows as n^2 against the descent's
#: ~n, so the crossover (~150k from the 100k pair) is where the rule stops.
CPU_SCALE_GAP_EXACT_MAX_N = 150_000

#: ... and those exact lists hold this many candidates (the tier's 96 were for NN-Descent's lists,
#: which held 0.73 of the exact 96). tight_c10000 100k x 64, 2 cores, exact lists of 96 / 64 / 48:
#: candidates 23.6 / 20.2 / 19.1 s, calibrated recall at beam 64 1.0 / 0.998 / 0.998, the suite's
#: queries 1.0 at beams 16-64 for all three (`benchmarks/results/cpu/scale_gap_exact_k_2026-11-30_s28.txt`).
#: 64 keeps the tier's degree 64 possible.
CPU_SCALE_GAP_EXACT_K = 64


def scale_gap(lid, lid_small):
    """True when the intrinsic-dimension estimate collapses between 5 and 20 neighbours (clusters of
    fewer points than the graph's degree; see :func:`auto_build_params`)."""
    return (lid_small is not None and lid is not None and np.isfinite(lid_small) and np.isfinite(lid)
            and lid < _SCALE_GAP * lid_small)


# The clusters-of-few-points tier keeps 96 on the CPU too: 64 built tight_c10000 100k in 14.7 s
# instead of 27.2 s and its generated queries still got 1.0, but the calibration's held-out data
# rows, whose 10th neighbour lies in another cluster, read 0.969 at beam 64 instead of 0.985:
# fewer cross-cluster candidates (`benchmarks/results/robustness/cpu_small_2026-11-29.json`).


#: The GPU's top tier: LID >= GPU_TOP_TIER_LID gets (graph_degree, intermediate_degree, alpha) =
#: GPU_TOP_TIER instead of (64, 96, 1.0). H200, 1M points, 1,000 suite queries, k = 10
#: (`benchmarks/gpu_hard_degree.py`, `benchmarks/results/h200-2026-11-29-s16/hard_degree/`): with
#: degree 64 no beam up to 2048 reached 0.99 on uniform 128-d (LID 69: 0.969) or broad 128-d (LID 64:
#: 0.972); with 128 / 128 they read 0.998 and 0.986 at 2048, QPS at 0.95 1.2-2.1x and at 0.99 2-6x
#: degree 64's (broad 96-d, LID 52, too), for a build of 3.4-4.2 s instead of 1.7-2.0 s. A wider
#: warp-parallel expansion costs the GPU walk little per hop, so the longer lists are nearly free
#: there; below LID 28 (SIFT-like, uniform 32-d) the denser graphs gained nothing. Not on the CPU
#: (each edge is a distance there) nor for host placement (BANG: each hop's list crosses PCIe).
GPU_TOP_TIER = (128, 128, 1.0)
GPU_TOP_TIER_LID = 50


def auto_build_params(lid, lid_small=None, device="gpu", top_tier=True):
    """``(graph_degree, intermediate_degree, alpha)`` for an estimated intrinsic dimension ``lid``
    (20 neighbours) and, optionally, the estimate at 5 neighbours ``lid_small``; ``device``: where
    the index is built (the CPU's middle tier takes :data:`CPU_MIDDLE_TIER_CANDIDATES` candidates);
    ``top_tier``: the GPU's :data:`GPU_TOP_TIER` is allowed (not for a host-placed index).

    A collapse of the estimate between the two scales (``lid < 0.5 * lid_small``) means clusters
    of fewer points than the graph's degree: the 20 nearest neighbours cross into other clusters
    and the far ones dominate the estimate (10,000 clusters of 10 points, 100k x 64: LID 0.49 at
    20 neighbours, 16 at 5). Such a graph must link across clusters, and navigating between the
    clusters' centres is a high-dimensional problem: degree 32 / alpha 1.1 reached recall@10 0.904
    at beam 64 and 0.867 at any beam on the GPU (100k), degree 64 / alpha 1.0 0.986 (30k x 64,
    3,000 clusters, CPU), so those get the high-dimensional parameters."""
    if scale_gap(lid, lid_small):
        return 64, 96, 1.0
    if not np.isfinite(lid) or lid < 28:
        return 32, CPU_LOW_TIER_CANDIDATES if device == "cpu" else 64, 1.1
    if lid < 40:
        return 48, CPU_MIDDLE_TIER_CANDIDATES if device == "cpu" else 96, 1.0
    if device == "gpu" and top_tier and lid >= GPU_TOP_TIER_LID:
        return GPU_TOP_TIER
    return 64, 96, 1.0
