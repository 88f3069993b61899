"""A cache-line prefetch for Numba kernels (Numba has none of its own).

``cache_hint()`` returns ``prefetch(arr, row, col)``, callable inside ``njit`` code: LLVM's
``llvm.prefetch`` of ``&arr[row, col]`` (read, high locality, data), or a no-op where this LLVM
does not compile that intrinsic. A hint only: no load waits on it and no result depends on it.
Used by the CPU graph search (neighbour vectors requested before their distances) and the CPU
NN-Descent join (the next node's samples requested one node ahead)."""

import numpy as np
from llvmlite import binding as _llvm, ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .config import logger

__all__ = ["cache_hint", "prefetch_intrinsic"]


@intrinsic
def prefetch_intrinsic(typingctx, arr, row, col):
    """``llvm.prefetch`` of ``&arr[row, col]`` (2-D, in bounds): read, locality 3, data."""
    sig = types.void(arr, row, col)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        r = context.cast(builder, args[1], signature.args[1], types.intp)
        c = context.cast(builder, args[2], signature.args[2], types.intp)
        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data,
                                        shape=cgutils.unpack_tuple(builder, ary.shape),
                                        strides=cgutils.unpack_tuple(builder, ary.strides),
                                        layout=aryty.layout, inds=[r, c])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        name = "llvm.prefetch.p0" if _llvm.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            name)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def _probe(a):
    prefetch_intrinsic(a, 0, 0)


@njit(inline="always")
def _noop(a, row, col):
    pass


_chosen = None


def cache_hint():
    """The prefetch to call in kernels: the intrinsic when this LLVM compiles it, else a no-op
    (same results). Decided once per process, before the kernels that use it compile."""
    global _chosen
    if _chosen is None:
        try:
            _probe(np.zeros((1, 1), np.float32))
            _chosen = prefetch_intrinsic
        except Exception as e:  # an LLVM without the intrinsic's name: kernels run without prefetch
            logger.info("prefetch intrinsic unavailable (%s); CPU kernels run without it", e)
            _chosen = _noop
    return _chosen
