"""``knnkit.load`` and ``knnkit.methods``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core.persist import container_kind, sniff
from .._core.registry import REGISTRY
from .._core.types import PathLike

if TYPE_CHECKING:
    from .index import GraphIndex
    from .knngraph import KnnGraph

__all__ = ["load", "methods"]


def load(path: PathLike, **kwargs: Any) -> KnnGraph | GraphIndex:
    """Load a :class:`KnnGraph` or :class:`GraphIndex` written by its ``save`` method.

    Parameters
    ----------
    path : str or os.PathLike
        File written by ``KnnGraph.save`` or ``GraphIndex.save`` (this release or the first).
    **kwargs
        Passed to the class's ``load`` (``device=``, ``mmap=``).

    Raises
    ------
    ValueError
        Not a knnkit file, or a corrupted one.
    """
    from .index import GraphIndex
    from .knngraph import KnnGraph

    fmt = sniff(path)
    if fmt == "legacy-graph":
        return KnnGraph.load(path, **kwargs)
    if fmt == "legacy-index":
        return GraphIndex.load(path, **kwargs)
    if fmt == "container":
        meta_kind = container_kind(path)
        if meta_kind == "graph":
            return KnnGraph.load(path, **kwargs)
        if meta_kind == "index":
            return GraphIndex.load(path, **kwargs)
        raise ValueError(f"{path}: a knnkit {meta_kind!r} file, not a graph or an index")
    raise ValueError(f"{path}: not a knnkit file (unknown magic bytes)")


def methods(task: str | None = None) -> list[dict[str, Any]]:
    """The registered methods: a list of dicts (name, task, devices, metrics, dtypes, exact, summary).

    Parameters
    ----------
    task : {"exact", "graph"}, optional
        Only the methods of this task.

    Examples
    --------
    >>> import knnkit
    >>> [m["name"] for m in knnkit.methods("graph")][:2]
    ['nndescent', 'brute']
    """
    if task is not None and task not in ("exact", "graph"):
        raise ValueError(f"task must be 'exact', 'graph' or None, got {task!r}")
    return [dict(name=m.name, task=m.task, devices=m.devices, metrics=m.metrics, dtypes=m.dtypes, exact=m.exact,
                 summary=m.summary) for m in REGISTRY.list(task)]
