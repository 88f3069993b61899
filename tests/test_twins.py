"""One twin rule: an algorithm package's ``_cpu.py`` and ``_gpu.py`` define their shared entry
points with the same signatures (read with ``ast``: the GPU module needs no GPU to be checked)."""

import ast
import os

import pytest

import knnkit

ROOT = os.path.dirname(knnkit.__file__)
# package -> names both twins define (functions, or classes whose public methods must match)
TWINS = {
    "exact": ["knn"],
    "graph/nndescent": ["nndescent"],
    "graph/rsfk": [("CpuBackend", "GpuBackend")],
    "exact/sweet": [("sweet_cpu", "sweet_gpu"), "_find_duplicates", "_expand_unique"],
    "index": ["search", "prune"],
}


def _defs(path):
    tree = ast.parse(open(path).read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            out[node.name] = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
    return out


def _signature(fn):
    a = fn.args
    return ([x.arg for x in a.posonlyargs + a.args], [x.arg for x in a.kwonlyargs], a.vararg is not None,
            a.kwarg is not None)


@pytest.mark.parametrize("package", sorted(TWINS))
def test_twins_have_equal_signatures(package):
    cpu = _defs(os.path.join(ROOT, package, "_cpu.py"))
    gpu = _defs(os.path.join(ROOT, package, "_gpu.py"))
    for name in TWINS[package]:
        if isinstance(name, tuple) and not isinstance(cpu[name[0]], dict):
            assert _signature(cpu[name[0]]) == _signature(gpu[name[1]]), f"{package}: {name} signatures differ"
        elif isinstance(name, tuple):
            c, g = cpu[name[0]], gpu[name[1]]
            public = sorted(m for m in c if not m.startswith("_"))
            assert public == sorted(m for m in g if not m.startswith("_")), f"{package}: {name} methods differ"
            for m in public:
                assert _signature(c[m]) == _signature(g[m]), f"{package}: {name}.{m} signatures differ"
        else:
            assert _signature(cpu[name]) == _signature(gpu[name]), f"{package}: {name} signatures differ"


def test_every_algorithm_package_with_twins_is_listed():
    found = set()
    for dirpath, _dirs, files in os.walk(ROOT):
        if "_cpu.py" in files and "_gpu.py" in files:
            found.add(os.path.relpath(dirpath, ROOT))
    assert found == set(TWINS), f"twin packages {sorted(found)} vs listed {sorted(TWINS)}"
