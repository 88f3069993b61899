"""The layers contract (README, "Architecture"): core <- algorithms <- facades, no import cycles,
and no public function called from inside the library. Read from the source with ``ast`` (an
equivalent of import-linter's layers contract that needs no extra tool in CI)."""

import ast
import os

import pytest

import knnkit

ROOT = os.path.dirname(knnkit.__file__)
LAYERS = {"_core": 0, "exact": 1, "graph": 1, "index": 1, "api": 2, "io": 2, "datasets": 2, "cli": 2,
          "bench": 2, "evaluate": 2, "sklearn": 2, "dask": 2, "__init__": 3, "__main__": 3}
# within the algorithm layer: exact <- graph <- index (an index builds on graphs, graphs on exact search)
ALGO_ORDER = {"exact": 0, "graph": 1, "index": 2}
PUBLIC = {"knn", "knn_graph", "merge_graphs", "knn_graph_out_of_core", "load", "GraphIndex"}


def _modules():
    for dirpath, _dirs, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)
                parts = rel[:-3].split(os.sep)
                if parts[-1] == "__init__" and len(parts) > 1:
                    parts = parts[:-1]
                yield path, ["knnkit"] + parts


def _imports(path, modname):
    """(imported module, names) pairs of a file, relative imports resolved."""
    tree = ast.parse(open(path).read())
    is_pkg = path.endswith("__init__.py")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = modname if is_pkg else modname[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = base + (node.module.split(".") if node.module else [])
            else:
                target = (node.module or "").split(".")
            out.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.name.split("."), []))
    return out


def _layer(mod):
    if len(mod) < 2 or mod[0] != "knnkit":
        return None
    return LAYERS.get(mod[1])


MODULES = list(_modules())


def test_every_module_has_a_layer():
    missing = [".".join(m) for _p, m in MODULES if _layer(m) is None]
    assert not missing, f"modules outside the layers table: {missing}"


@pytest.mark.parametrize("path,mod", MODULES, ids=[".".join(m) for _p, m in MODULES])
def test_imports_follow_the_layers(path, mod):
    mine = _layer(mod)
    for target, names in _imports(path, mod):
        if target[:1] != ["knnkit"]:
            continue
        if len(target) == 1:  # "from knnkit import x" / "from .. import x": x names a subpackage
            for n in names:
                t = _layer(["knnkit", n])
                assert t is not None and t <= mine, f"{'.'.join(mod)} imports knnkit.{n}"
            continue
        theirs = _layer(target)
        assert theirs is not None, f"{'.'.join(mod)} imports unknown {'.'.join(target)}"
        assert theirs <= mine, f"{'.'.join(mod)} (layer {mine}) imports {'.'.join(target)} (layer {theirs})"
        if mine == 1 and theirs == 1:
            assert ALGO_ORDER[target[1]] <= ALGO_ORDER[mod[1]], \
                f"{'.'.join(mod)} imports {'.'.join(target)}: algorithms build on exact <- graph <- index only"


def test_no_public_function_called_inside():
    """Nothing below the package face imports the public functions (facades use internal helpers)."""
    for path, mod in MODULES:
        if mod[1] in ("__init__", "__main__", "cli", "bench"):
            continue  # the package face re-exports them; the CLI and its bench command are users of the public API
        for target, names in _imports(path, mod):
            if target == ["knnkit"] or target[:2] == ["knnkit", "api"]:
                used = PUBLIC & set(names)
                own = target[:3] == mod[:3]  # a facade module may import its own sibling names
                assert not used or own or (target[:2] == ["knnkit", "api"] and mod[1] in ("api", "dask") and
                                           used <= {"KnnGraph", "GraphIndex"}), \
                    f"{'.'.join(mod)} imports public {sorted(used)} from {'.'.join(target)}"


def test_no_import_cycles():
    graph = {}
    for path, mod in MODULES:
        key = ".".join(mod)
        deps = set()
        for target, names in _imports(path, mod):
            if target[:1] == ["knnkit"]:
                deps.add(".".join(target))
        graph[key] = deps
    known = set(graph)

    def resolve(name):
        while name and name not in known:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name

    # top-level (module-level) imports only would be stricter; every import counts here except the
    # package face's re-exports
    edges = {k: {resolve(d) for d in v if resolve(d) and resolve(d) != k} for k, v in graph.items()
             if k != "knnkit"}
    state = {}

    def visit(u, stack):
        state[u] = 1
        for v in edges.get(u, ()):
            if v == "knnkit":
                continue
            if state.get(v) == 1:
                cyc = stack[stack.index(v):] + [v] if v in stack else [u, v]
                raise AssertionError(f"import cycle: {' -> '.join(cyc)}")
            if not state.get(v):
                visit(v, stack + [v])
        state[u] = 2

    for u in edges:
        if not state.get(u):
            visit(u, [u])


def test_version_matches_pyproject():
    """One version string: the package's (``_core.version``) and pyproject.toml's."""
    import pathlib
    import re

    import knnkit

    text = (pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    assert m and m.group(1) == knnkit.__version__
