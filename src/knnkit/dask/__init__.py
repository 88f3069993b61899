"""knnkit on Dask: exact k-NN, k-NN graphs and a sharded, replicated search index over the
workers of a ``dask.distributed`` cluster (``dask_cuda.LocalCUDACluster`` gives one worker per
GPU; a ``LocalCluster`` of CPU workers runs the same code).

Dask arrays in, dask arrays out: given dask-array queries (``knn`` without queries: dask data),
``knn`` and ``ShardedIndex.search`` return dask arrays whose blocks stay on the workers, and
``knn_graph`` given dask data returns a dask-backed :class:`~knnkit.KnnGraph`; ``compute=``
overrides either way.

Install with ``pip install 'knnkit[dask]'``. Papers: GNND section 4 (one descent shared by the
GPU workers over NCCL: ``knn_graph``'s default on GPUs), GGNN section 5.5 (sharding, replication,
every point searched in every other shard: the partition schedules' second stage), GNND section
5 (GGM merges of partition graphs).

>>> import knnkit.dask
>>> sorted(knnkit.dask.__all__)
['ShardedIndex', 'knn', 'knn_graph']
"""

from ._api import knn, knn_graph
from ._index import ShardedIndex

__all__ = ["knn", "knn_graph", "ShardedIndex"]
