"""Data sets: seeded synthetic generators (CPU or GPU) and loaders for small real data sets.

Examples
--------
>>> from knnkit import datasets
>>> data, queries = datasets.make_clustered(2000, 64, n_queries=100, random_state=0, device="cpu")
>>> data.shape, queries.shape
((2000, 64), (100, 64))
"""

from .synthetic import make_clustered, make_uniform
from .real import load_siftsmall, load_texmex, load_fashion_mnist, read_idx, find_data_dir

__all__ = ["make_clustered", "make_uniform", "load_siftsmall", "load_texmex", "load_fashion_mnist", "read_idx",
           "find_data_dir", "load"]


def load(path, **kwargs):
    """Read a vector file by its extension (same as :func:`knnkit.io.read`).

    Examples
    --------
    >>> from knnkit import datasets
    >>> base = datasets.load("siftsmall_base.fvecs")  # doctest: +SKIP
    """
    from .. import io

    return io.read(path, **kwargs)
