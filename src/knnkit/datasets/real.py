"""Loaders for the small real data sets used in tests and examples (SIFT10K, Fashion-MNIST).

Each loader looks for its files in, in order: the ``path`` given, ``$KNNKIT_DATA/<name>``, the
user's cache (``$XDG_CACHE_HOME/knnkit/<name>``, by default ``~/.cache/knnkit/<name>``), the
location a system package installs (Fashion-MNIST's Debian package), and ``.data/<name>`` under
the current directory.
"""

import gzip
import os

import numpy as np

from .. import io

__all__ = ["load_siftsmall", "load_texmex", "load_fashion_mnist", "read_idx", "find_data_dir", "cache_dir"]

# where the Debian package dataset-fashion-mnist puts its files
_SYSTEM_DIRS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}


def cache_dir():
    """The user's knnkit data cache: ``$XDG_CACHE_HOME/knnkit`` or ``~/.cache/knnkit``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "knnkit")
_HOW_TO_GET = {
    "siftsmall": "download ftp://ftp.irisa.fr/local/texmex/corpus/siftsmall.tar.gz, unpack it and pass its "
                 "folder as path= or put it in $KNNKIT_DATA/siftsmall",
    "fashion-mnist": "install it with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu) or download the "
                     "four *-ubyte.gz files from https://github.com/zalandoresearch/fashion-mnist into "
                     "$KNNKIT_DATA/fashion-mnist",
}


def _candidates(name, path):
    if path is not None:
        path = os.fspath(path)
        return [path, os.path.join(path, name)]
    dirs = []
    env = os.environ.get("KNNKIT_DATA")
    if env:
        dirs += [os.path.join(env, name), env]
    dirs.append(os.path.join(cache_dir(), name))
    if name in _SYSTEM_DIRS:
        dirs.append(_SYSTEM_DIRS[name])
    dirs.append(os.path.join(os.getcwd(), ".data", name))
    return dirs


def find_data_dir(name, files, path=None):
    """The first candidate folder holding every one of ``files`` for data set ``name``.

    Raises FileNotFoundError listing the folders searched and how to get the data.
    """
    dirs = _candidates(name, path)
    for d in dirs:
        if all(os.path.isfile(os.path.join(d, f)) for f in files):
            return d
    how = _HOW_TO_GET.get(name, f"put the files in $KNNKIT_DATA/{name}")
    raise FileNotFoundError(f"{name}: could not find {', '.join(files)} in any of {', '.join(dirs)}; {how}")


def load_texmex(name, path=None):
    """Load a TEXMEX data set ``<name>_base.fvecs``, ``<name>_query.fvecs``, ``<name>_groundtruth.ivecs``.

    Parameters
    ----------
    name : str
        File prefix, e.g. ``"siftsmall"`` or ``"sift"`` (also the folder name searched).
    path : str, optional
        Folder holding the files (or its parent).

    Returns
    -------
    base : (n, d) float32
    queries : (nq, d) float32
    groundtruth : (nq, k) int64
        Indices of the exact nearest base vectors (squared Euclidean) of every query, nearest first.
    """
    files = [f"{name}_base.fvecs", f"{name}_query.fvecs", f"{name}_groundtruth.ivecs"]
    folder = find_data_dir(name, files, path)
    base, queries, gt = (io.read(os.path.join(folder, f)) for f in files)
    return base, queries, gt.astype(np.int64)


def load_siftsmall(path=None):
    """SIFT10K (``siftsmall``): 10,000 base and 100 query SIFT descriptors (128-D) with exact ground truth.

    Parameters
    ----------
    path : str, optional
        Folder holding ``siftsmall_{base,query}.fvecs`` and ``siftsmall_groundtruth.ivecs``. By default
        ``$KNNKIT_DATA/siftsmall``, ``~/.cache/knnkit/siftsmall``, then ``.data/siftsmall``.

    Returns
    -------
    base : (10000, 128) float32
    queries : (100, 128) float32
    groundtruth : (100, 100) int64
        The 100 nearest base vectors of every query (squared Euclidean), nearest first.

    Examples
    --------
    >>> from knnkit.datasets import load_siftsmall
    >>> base, queries, gt = load_siftsmall()  # doctest: +SKIP
    >>> base.shape, queries.shape, gt.shape  # doctest: +SKIP
    ((10000, 128), (100, 128), (100, 100))
    """
    return load_texmex("siftsmall", path)


_IDX_TYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path):
    """Read an IDX file (the MNIST format), gzip-compressed when the name ends in ``.gz``."""
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic {raw[:4].hex()})")
    dtype, ndim = _IDX_TYPES[raw[2]], raw[3]
    shape = tuple(int(v) for v in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path}: truncated or inconsistent: header says shape {shape} ({expected} bytes), "
                         f"file has {len(raw)} bytes")
    return np.frombuffer(raw, dtype, offset=offset).reshape(shape).astype(dtype.newbyteorder("="))


def load_fashion_mnist(path=None, *, return_labels=False):
    """Fashion-MNIST: 60,000 training and 10,000 test images of 28 x 28 pixels, as 784-D uint8 rows.

    Parameters
    ----------
    path : str, optional
        Folder holding ``train-images-idx3-ubyte.gz`` and ``t10k-images-idx3-ubyte.gz`` (and the label
        files when ``return_labels``). By default ``$KNNKIT_DATA/fashion-mnist``,
        ``/usr/share/datasets/fashion-mnist`` (``apt-get install dataset-fashion-mnist``), then
        ``.data/fashion-mnist``.
    return_labels : bool
        Also return the class labels (0-9).

    Returns
    -------
    train : (60000, 784) uint8
    test : (10000, 784) uint8
    train_labels, test_labels : (60000,), (10000,) uint8
        Only with ``return_labels=True``.

    Examples
    --------
    >>> from knnkit.datasets import load_fashion_mnist
    >>> train, test = load_fashion_mnist()  # doctest: +SKIP
    >>> train.shape, test.dtype  # doctest: +SKIP
    ((60000, 784), dtype('uint8'))
    """
    images = ["train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"]
    labels = ["train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    folder = find_data_dir("fashion-mnist", images + (labels if return_labels else []), path)
    train, test = (read_idx(os.path.join(folder, f)) for f in images)
    train, test = train.reshape(len(train), -1), test.reshape(len(test), -1)
    if not return_labels:
        return train, test
    return (train, test) + tuple(read_idx(os.path.join(folder, f)) for f in labels)
