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
