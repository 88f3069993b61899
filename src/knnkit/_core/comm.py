"""Collectives between the devices of one computation: what a descent shared between GPUs needs
(:func:`knnkit.graph.nndescent._gpu.nndescent_gpu`'s ``peer``): an all-gather of equal-sized
device arrays and a sum of a small counter, both in stream order.

* :class:`NcclPeer`: one process per GPU (a Dask worker each), NCCL through CuPy
  (``cupy.cuda.nccl``), the pattern cuML's and RAFT's Dask layers use. Rank 0 makes the unique id
  (:func:`nccl_unique_id`), every rank passes it to :class:`NcclPeer`; all ranks must construct
  it at the same time (NCCL's initialisation waits for all of them).
* :class:`ThreadPeer`: ranks as threads of one process (each its own device, or all on one
  device), exchanging through device copies; tests run the shared descent with it on one GPU.

A peer also says which rows are its own (``lo``, ``hi``): the nodes whose joins it runs and whose
lists it returns.
"""

import os
import threading

__all__ = ["NcclPeer", "ThreadPeer", "nccl_available", "nccl_unique_id"]

# NVLink multicast (NVLS) stays off unless the caller has decided otherwise: the machines this
# project runs on ask for it (a program using it can take a shared host's GPUs out of service)
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}


def _nccl():
    for key, value in _NCCL_ENV.items():
        os.environ.setdefault(key, value)
    from cupy.cuda import nccl

    return nccl


def nccl_available():
    """Whether CuPy can load NCCL in this process (False without a GPU, CuPy or the library)."""
    try:
        nccl = _nccl()
        nccl.get_version()
        return True
    except Exception:  # ImportError, or the library missing when first called
        return False


def nccl_unique_id():
    """A new NCCL unique id (as CuPy gives it; it names a listening socket of THIS process, so rank
    0 must call it)."""
    return _nccl().get_unique_id()


def _parts(a):
    """The arrays of one exchange message: ``a`` itself, or the arrays of a tuple."""
    return a if isinstance(a, tuple) else (a,)


class _Peer:
    """What every peer has: its rank among ``size`` and every rank's own rows."""

    def set_bounds(self, bounds):
        """Every rank's own rows ``(lo, hi)`` for the next computation (a peer serves many)."""
        if len(bounds) != self.size:
            raise ValueError(f"{len(bounds)} row ranges for {self.size} ranks")
        self.bounds = [(int(a), int(b)) for a, b in bounds]
        self.lo, self.hi = self.bounds[self.rank]


class NcclPeer(_Peer):
    """Rank ``rank`` of ``size`` GPUs (one per process) joined by NCCL.

    Parameters
    ----------
    uid : bytes
        From :func:`nccl_unique_id` on rank 0.
    rank : int
    bounds : list of (int, int)
        Every rank's own rows ``(lo, hi)``, in rank order.
    """

    def __init__(self, uid, rank, bounds):
        import cupy

        nccl = _nccl()
        self.rank, self.size = int(rank), len(bounds)
        self.set_bounds(bounds)
        self._nccl = nccl
        self._comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._stream = lambda: cupy.cuda.get_current_stream().ptr

    def _type(self, a):
        import numpy as np

        nccl = self._nccl
        return {np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.float32): nccl.NCCL_FLOAT32,
                np.dtype(np.uint64): nccl.NCCL_UINT64, np.dtype(np.int64): nccl.NCCL_INT64,
                np.dtype(np.uint8): nccl.NCCL_UINT8, np.dtype(np.int8): nccl.NCCL_INT8,
                np.dtype(np.float16): nccl.NCCL_FLOAT16}[np.dtype(a.dtype)]

    def exchange(self, sends, recvs):
        """Point to point, all pairs at once: ``sends[r]`` goes to rank r, ``recvs[r]`` comes from
        it (entries for this rank are ignored; C-contiguous arrays, or tuples of them, all sent in
        one group; rank r's ``recvs[s]`` has the sizes of rank s's ``sends[r]``)."""
        nccl, stream = self._nccl, self._stream()
        nccl.groupStart()
        try:
            for r in range(self.size):
                if r == self.rank:
                    continue
                # (a pair's sizes agree on both ranks, so both skip an empty message)
                for a in _parts(sends[r]):
                    if a.size:
                        self._comm.send(a.data.ptr, int(a.size), self._type(a), r, stream)
                for b in _parts(recvs[r]):
                    if b.size:
                        self._comm.recv(b.data.ptr, int(b.size), self._type(b), r, stream)
        finally:
            nccl.groupEnd()

    def share_rows(self, arrays):
        """Every rank's own rows of each array (rows ``bounds[r]``) to every rank, in place."""
        nccl, stream = self._nccl, self._stream()
        nccl.groupStart()
        try:
            for a in arrays:
                for r, (lo, hi) in enumerate(self.bounds):
                    if hi > lo:
                        part = a[lo:hi]
                        self._comm.bcast(part.data.ptr, int(part.size), self._type(part), r, stream)
        finally:
            nccl.groupEnd()

    def allgather(self, send, recv):
        """``recv[r]`` = rank r's ``send`` (C-contiguous, equal sizes everywhere)."""
        self._comm.allGather(send.data.ptr, recv.data.ptr, int(send.size), self._type(send), self._stream())

    def broadcast(self, buf, root):
        """``buf`` = rank ``root``'s ``buf``, in place."""
        self._comm.bcast(buf.data.ptr, int(buf.size), self._type(buf), int(root), self._stream())

    def allreduce_sum(self, buf):
        """``buf`` = the sum over ranks, in place."""
        self._comm.allReduce(buf.data.ptr, buf.data.ptr, int(buf.size), self._type(buf), self._nccl.NCCL_SUM,
                             self._stream())

    def abort(self):
        """Give the communicator up at once (a rank may have failed: destroy could wait forever)."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.abort()


class _Exchange:
    """What the threads of a :class:`ThreadPeer` group share: a barrier and one slot per rank."""

    def __init__(self, size):
        self.barrier = threading.Barrier(size)
        self.slots = [None] * size


class ThreadPeer(_Peer):
    """Rank ``rank`` of ``size`` threads of this process (make them with :meth:`group`); each thread
    works on its current CuPy device. Collectives wait for every rank (a barrier), copy between
    devices, and return with the result in place."""

    def __init__(self, exchange, rank, bounds):
        self._x, self.rank, self.size = exchange, int(rank), len(bounds)
        self.set_bounds(bounds)

    @classmethod
    def group(cls, bounds):
        """One peer per ``(lo, hi)`` of ``bounds`` (every rank's own rows), in rank order."""
        x = _Exchange(len(bounds))
        return [cls(x, r, bounds) for r in range(len(bounds))]

    def _share(self, a):
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        self._x.slots[self.rank] = a
        self._x.barrier.wait()

    def _done(self):
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        self._x.barrier.wait()  # nobody changes a shared array before every rank has read it

    @staticmethod
    def _copy(dst, src):
        """``dst[...] = src`` (same size), through the host when they are on different devices."""
        import cupy

        if src.device == dst.device:
            cupy.copyto(dst, src.reshape(dst.shape))
        else:
            dst.set(src.get().reshape(dst.shape))

    def exchange(self, sends, recvs):
        self._share(sends)
        for r in range(self.size):
            if r != self.rank:
                for dst, src in zip(_parts(recvs[r]), _parts(self._x.slots[r][self.rank])):
                    self._copy(dst, src)
        self._done()

    def share_rows(self, arrays):
        self._share(arrays)
        for r, (lo, hi) in enumerate(self.bounds):
            if r != self.rank and hi > lo:
                for mine, theirs in zip(arrays, self._x.slots[r]):
                    self._copy(mine[lo:hi], theirs[lo:hi])
        self._done()

    def allgather(self, send, recv):
        self._share(send)
        for r, a in enumerate(self._x.slots):
            self._copy(recv[r], a)
        self._done()

    def broadcast(self, buf, root):
        self._share(buf)
        if self.rank != int(root):
            self._copy(buf, self._x.slots[int(root)])
        self._done()

    def allreduce_sum(self, buf):

        self._share(buf)
        total = sum(a.get() for a in self._x.slots)
        self._done()
        buf.set(total.astype(buf.dtype, copy=False))

    def abort(self):
        self._x.barrier.abort()
