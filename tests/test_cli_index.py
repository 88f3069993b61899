"""`knnkit index build|search`, `knnkit demo --save`, and the README's command-line block run as
written (with a smaller demo on the CPU)."""

import os
import re
import shlex

import numpy as np
import pytest

from knnkit.cli import main

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _run(line):
    args = shlex.split(line.split("#")[0])
    assert args[0] == "knnkit"
    return main(["--quiet"] + args[1:])


def test_readme_command_line_block(tmp_path, monkeypatch, capsys):
    text = open(README).read()
    block = re.search(r"## Command line\n\n```bash\n(.*?)```", text, re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.strip()]
    monkeypatch.chdir(tmp_path)
    for ln in lines:
        small = ln.replace("--n 20000 --d 32", "--n 3000 --d 8 --queries 50 --device cpu")
        small = small.replace("index build sample/data.fbin index.knnk", "index build sample/data.fbin index.knnk --device cpu")
        assert _run(small) == 0, ln
    out = capsys.readouterr().out
    assert "recall@10" in out
    for f in ("sample/data.fbin", "sample/queries.fbin", "sample/groundtruth.ivecs", "index.knnk", "res.ibin",
              "res.dist.fbin", "nn.ibin", "graph.ibin", "data.npy", "bench/bench.json"):
        assert (tmp_path / f).exists(), f
    from knnkit import io

    res, gt = io.read(str(tmp_path / "res.ibin")), io.read(str(tmp_path / "sample/groundtruth.ivecs"))
    assert res.shape == (50, 10) and (res[:, 0] == gt[:, 0]).mean() >= 0.9


def test_index_search_errors(tmp_path, capsys):
    X = np.random.default_rng(0).random((500, 4), dtype=np.float32)
    from knnkit import io

    io.write(str(tmp_path / "x.fbin"), X)
    assert main(["--quiet", "index", "build", str(tmp_path / "x.fbin"), str(tmp_path / "i.knnk"), "--device", "cpu"]) == 0
    io.write(str(tmp_path / "q.fbin"), X[:5, :3])
    assert main(["--quiet", "index", "search", str(tmp_path / "i.knnk"), str(tmp_path / "q.fbin")]) == 1
    assert "dimension" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["index", "search", str(tmp_path / "i.knnk")])  # missing QUERIES
