"""knnkit._core.jit.parallel_for / chunks: the thread runner of the CPU kernels."""

import threading

import numpy as np
import pytest

from knnkit._core.jit import chunks, parallel_for


def test_chunks_cover_the_range():
    for n, parts in [(0, 4), (1, 4), (10, 3), (10, 10), (7, 100)]:
        c = chunks(n, parts)
        assert c[0][0] == 0 and c[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(c, c[1:]))
        assert len(c) == max(1, min(parts, n))


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_parallel_for_returns_in_task_order(threads):
    assert parallel_for(lambda t: t * t, 37, threads=threads) == [t * t for t in range(37)]
    assert parallel_for(lambda t: t, 0, threads=threads) == []


def test_parallel_for_uses_several_threads_and_raises_the_task_error():
    seen = set()
    barrier = threading.Barrier(2, timeout=10)

    def task(t):
        seen.add(threading.get_ident())
        if t < 2:
            barrier.wait()   # two tasks at once: needs two threads
        return t

    assert parallel_for(task, 8, threads=2) == list(range(8))
    assert len(seen) == 2

    def bad(t):
        if t == 3:
            raise ValueError("task 3")
        return t

    with pytest.raises(ValueError, match="task 3"):
        parallel_for(bad, 10, threads=2)


def test_kernel_decorator_runs_without_warnings(recwarn):
    from knnkit._core.jit import Family

    fam = Family("test_kernel", "test", seconds=0)

    @fam.kernel(cache=False)
    def total(a, lo, hi):
        s = 0.0
        for i in range(lo, hi):
            s += a[i]
        return s

    a = np.arange(10, dtype=np.float64)
    assert sum(parallel_for(lambda c: total(a, c * 5, c * 5 + 5), 2, threads=2)) == 45.0
    assert not [w for w in recwarn if "parallel" in str(w.message)]


def test_parallel_for_in_a_forked_child():
    """A child forked after the pool started (multiprocessing's fork start method) gets its own pool
    instead of waiting forever on the parent's threads."""
    import multiprocessing as mp
    import os

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    parallel_for(lambda t: t, 4, threads=2)   # the pool exists in the parent
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        out = pool.apply_async(_child_sum).get(timeout=60)
    assert out == sum(range(16))


def _child_sum():
    return sum(parallel_for(lambda t: t, 16, threads=2))


def test_parallel_for_nested_does_not_deadlock():
    """A task that calls parallel_for again (nested) finishes: the inner loop runs serially on
    the pool thread instead of queueing behind the outer tasks."""
    import concurrent.futures
    import threading

    from knnkit._core.jit import parallel_for

    def outer(t):
        return sum(parallel_for(lambda u: u + t, 5, threads=4))

    ex = concurrent.futures.ThreadPoolExecutor(1)
    fut = ex.submit(parallel_for, outer, 8, 4)
    assert fut.result(timeout=60) == [sum(range(5)) + 5 * t for t in range(8)]
    ex.shutdown()
    assert threading.active_count() < 50
