"""``import knnkit`` stays light (issue "Fit where users already work"): no Numba, scipy, CuPy,
matplotlib, h5py or tqdm at import, and well under a second; and the first-run compile announcement
of ``knnkit._core.jit``."""

import os
import subprocess
import sys

import knnkit

HEAVY = ("numba", "scipy", "cupy", "matplotlib", "h5py", "tqdm", "llvmlite")
ENV = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(knnkit.__file__)))


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=ENV).stdout


def test_import_loads_no_heavy_module():
    out = _run(f"import sys, knnkit; print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert out.strip() == "[]", out


def test_import_is_fast():
    # the import alone, timed inside a fresh interpreter (min of 3: CI machines are noisy); the
    # target is < 0.5 s, the bound is loose so a slow CI does not flake
    code = "import time; t = time.perf_counter(); import knnkit; print(time.perf_counter() - t)"
    best = min(float(_run(code)) for _ in range(3))
    assert best < 1.0, f"import knnkit took {best:.2f} s"


def test_jit_announces_first_cold_compile(tmp_path):
    """A kernel compiled with no cache entry is announced once per family (INFO log); a second
    compile of the same family, and a cache hit in a new process, are silent."""
    code = """
import logging, sys
import numpy as np
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from knnkit._core.jit import Family, compile_times
fam = Family("t", "test kernels", seconds=1)
@fam.njit(cache=True)
def add(a, b):
    return a + b
add(1, 2)
add(1.0, 2.0)   # a second compile: no second line
print("times", sorted(compile_times()))
"""
    src = tmp_path / "kern.py"
    src.write_text(code)
    env = dict(ENV, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    run = lambda: subprocess.run([sys.executable, str(src)], capture_output=True, text=True, check=True,
                                 env=env).stdout
    first = run()
    assert first.count("knnkit: compiling CPU kernels for test kernels (first run only, ~1 s)...") == 1, first
    assert "times ['t']" in first
    second = run()   # both signatures now in the cache
    assert "compiling" not in second, second


def test_jit_import_does_not_need_numba_until_used():
    out = _run("import sys; import knnkit._core.jit; print('numba' in sys.modules)")
    assert out.strip() == "False"
