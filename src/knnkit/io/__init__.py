"""Reading and writing vector files.

Formats, chosen by the file's extension:

================  ========================================  =====================
extension         layout                                    dtype
================  ========================================  =====================
``.fvecs``        TEXMEX: each row is int32 ``d`` + d values  float32
``.ivecs``        TEXMEX                                     int32
``.bvecs``        TEXMEX                                     uint8
``.fbin``         big-ann: uint32 ``n``, uint32 ``d``, data   float32
``.ibin``         big-ann                                    int32
``.u8bin``        big-ann                                    uint8
``.i8bin``        big-ann                                    int8
``.npy``          NumPy                                      any
``.hdf5``/``.h5`` ann-benchmarks (read only, :func:`read_hdf5`)
================  ========================================  =====================

All binary formats are little-endian. :func:`open_vectors` maps a file into memory and
reads row ranges, so files larger than RAM can be processed piece by piece;
:func:`write` writes through a temporary file renamed into place, so a crash never leaves
a half-written file under the final name.

Examples
--------
>>> import numpy as np, os, tempfile
>>> from knnkit import io
>>> x = np.arange(12, dtype=np.float32).reshape(3, 4)
>>> path = os.path.join(tempfile.mkdtemp(), "x.fvecs")
>>> io.write(path, x)
>>> io.read(path, rows=(1, 3)).tolist()
[[4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]
>>> with io.open_vectors(path) as f:
...     f.shape, f[2, :2].tolist()
((3, 4), [8.0, 9.0])
"""

from .._core.vectors import (FORMATS, VectorFile, VectorWriter, atomic_write, open_vectors, read, write,
                      format_of)
from .hdf5 import read_hdf5

__all__ = ["read", "write", "open_vectors", "VectorFile", "VectorWriter", "atomic_write", "read_hdf5",
           "FORMATS", "format_of"]
