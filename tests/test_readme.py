"""The README's Python example runs as written (at a smaller size, on the CPU), so it cannot drift
from the API."""

import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _first_python_block():
    text = open(README).read()
    m = re.search(r"```python\n(.*?)```", text, re.S)
    assert m, "README.md has no python example"
    return m.group(1)


@pytest.mark.slow
def test_readme_python_example_runs(tmp_path, monkeypatch):
    code = _first_python_block()
    # same calls, a size two CPU cores run in seconds
    small = (code.replace("100_000, 128, n_queries=1_000", "12_000, 16, n_queries=100")
             .replace("data[:50_000]", "data[:6_000]").replace("data[50_000:]", "data[6_000:]"))
    assert small != code, "the README example's sizes changed: update this test's substitutions"
    monkeypatch.chdir(tmp_path)  # it writes graph.knng, index.knnk, base.fbin and work/
    import knnkit

    knnkit.set_output("input")
    exec(compile(small, "README.md", "exec"), {"__name__": "readme_example"})
    assert (tmp_path / "index.knnk").exists() and (tmp_path / "work" / "manifest.json").exists()


def test_readme_dask_example_runs(tmp_path, monkeypatch):
    """The README's Dask block, on two in-process CPU workers and small data."""
    pytest.importorskip("distributed")
    import numpy as np

    text = open(README).read()
    section = text[text.index("## Scale-out on Dask"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    small = code.replace("LocalCluster(n_workers=2)", "LocalCluster(n_workers=2, processes=False, dashboard_address=None)")
    assert small != code, "the README's Dask example changed: update this test's substitution"
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    env = {"__name__": "readme_dask", "data": rng.random((4000, 8), dtype=np.float32),
           "queries": rng.random((50, 8), dtype=np.float32)}
    try:
        exec(compile(small, "README.md", "exec"), env)
    finally:
        env["client"].close()
        env["client"].cluster.close()
    assert (tmp_path / "index_dir" / "manifest.json").exists()
