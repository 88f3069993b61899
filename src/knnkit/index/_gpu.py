"""GPU twin of the search index's device work (same signatures as :mod:`._cpu`): block-per-query
graph search (``search.cu`` via ``_search_gpu.py``) and RobustPrune (``prune.cu`` via
``_prune_gpu.py``)."""

from ._prune_gpu import prune_gpu
from ._search_gpu import search_gpu

__all__ = ["search", "prune"]


def search(X, graph, queries, k, *, seeds, beam, tau, max_iters, metric, xnorm_max=None, nn1_max=None,
           X_fp16=None):
    """Search ``graph`` over prepared ``X`` (cupy) for the ``k`` nearest points of each query;
    ``X_fp16`` walks a float16 copy and re-ranks exactly (see :func:`._search_gpu.search_gpu`)."""
    return search_gpu(X, graph, queries, k, seeds=seeds, beam=beam, tau=tau, max_iters=max_iters, metric=metric,
                      X_fp16=X_fp16, xnorm_max=xnorm_max, nn1_max=nn1_max)


def prune(X, cand_idx, cand_dist, R, alpha, metric, *, fill=True):
    """RobustPrune of every node's candidates on the GPU; see :func:`._prune_gpu.prune_gpu`."""
    return prune_gpu(X, cand_idx, cand_dist, R, alpha, metric, fill=fill)
