"""``knnkit.load``: open a saved KnnGraph or GraphIndex by the magic bytes at the start of the file."""

__all__ = ["load"]

GRAPH_MAGIC = b"KNNKGRPH"
INDEX_MAGIC = b"KNNKINDX"


def load(path, **kwargs):
    """Load a :class:`KnnGraph` or :class:`GraphIndex` written by its ``save`` method.

    Parameters
    ----------
    path : str or os.PathLike
        File written by ``KnnGraph.save`` or ``GraphIndex.save``.
    """
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic == GRAPH_MAGIC:
        from .graph import KnnGraph

        return KnnGraph.load(path, **kwargs)
    if magic == INDEX_MAGIC:
        from .index import GraphIndex

        return GraphIndex.load(path, **kwargs)
    raise ValueError(f"{path}: not a knnkit file (unknown magic {magic!r})")
