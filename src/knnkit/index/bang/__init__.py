"""BANG (Karthik et al., "BANG: Billion-Scale Approximate Nearest Neighbor Search using a Single
GPU"): a search index whose graph and full-precision vectors stay in host memory while the GPU
walks the graph on PQ codes (:class:`HostIndex`, the engine of ``GraphIndex.build(...,
placement="host")``). ``_pq.py``: product quantisation (sections 2.3, 4.2); ``_search_cpu.py``: the
CPU twin of the walk and the exact re-ranking (4.9); ``_search_gpu.py`` + ``bang.cu``: the GPU
loop with host-side neighbour gathers, prefetch (4.6) and pipelined query batches (4.3). See
``NOTES.md``.
"""

from ._engine import BANG_SEARCH_KEYS, HostIndex, host_bytes

__all__ = ["HostIndex", "host_bytes", "BANG_SEARCH_KEYS"]
