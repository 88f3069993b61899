"""The "device" array of the tests' NumPy stand-ins for CuPy (``_bang_fake_gpu``,
``_connect_fake_gpu``): a NumPy subclass with ``.data.ptr`` and ``.get()``."""

import types

import numpy as np


class FakeArray(np.ndarray):
    """A host array posing as a device array (``.data.ptr``, ``.get``)."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def get(self, stream=None, out=None):
        if out is not None:
            out[...] = np.asarray(self)
            return out
        return np.array(self)


def dev(a):
    return np.array(a).view(FakeArray)


def _h(a):
    """The plain ndarray behind a (possibly fake) array, sharing memory."""
    return a.view(np.ndarray) if isinstance(a, np.ndarray) else a
