"""CPU twin of the search index's device work (same signatures as :mod:`._gpu`): best-first
graph search with the GGNN slack stop (Numba, ``_search_cpu.py``) and RobustPrune
(``_prune_cpu.py``). The engine chooses the twin in one place (``_core.backend.twin``)."""

from ._prune_cpu import prune_cpu
from ._search_cpu import search_cpu

__all__ = ["search", "prune"]


def search(X, graph, queries, k, *, seeds, beam, tau, max_iters, metric, xnorm_max=None, nn1_max=None,
           X_fp16=None):
    """Search ``graph`` over prepared ``X`` for the ``k`` nearest points of each query (internal
    metric); see :func:`._search_cpu.search_cpu`. ``X_fp16`` (the GPU's half-precision walk) has
    no CPU counterpart and is ignored."""
    return search_cpu(X, graph, queries, k, seeds=seeds, beam=beam, tau=tau, max_iters=max_iters, metric=metric,
                      xnorm_max=xnorm_max, nn1_max=nn1_max)


def prune(X, cand_idx, cand_dist, R, alpha, metric, *, fill=True):
    """RobustPrune of every node's candidates to ``R`` out-edges; see :func:`._prune_cpu.prune_cpu`."""
    return prune_cpu(X, cand_idx, cand_dist, R, alpha, metric, fill=fill)
