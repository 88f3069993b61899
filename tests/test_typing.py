"""The public API is annotated (the package ships ``py.typed``): every function and class in
``knnkit.__all__`` (and in ``knnkit.io.__all__`` / ``knnkit.evaluate.__all__``) has annotations on
all parameters and a return annotation on each public callable (functions, ``__init__``, public
methods, class/static methods and properties). When mypy is installed, a short user script
type-checks cleanly against the package."""

import inspect
import os
import subprocess
import sys
import textwrap
import types

import pytest

import knnkit

#: (qualified name, parameter) pairs allowed without an annotation; empty: none today
ALLOWED_UNANNOTATED = set()


def _public_objects():
    for name in knnkit.__all__:
        obj = getattr(knnkit, name)
        if isinstance(obj, types.ModuleType):
            if name in ("io", "evaluate"):
                for sub in obj.__all__:
                    o = getattr(obj, sub)
                    if inspect.isfunction(o) or inspect.isclass(o):
                        yield f"{name}.{sub}", o
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield name, obj


def _callables(name, obj):
    if inspect.isfunction(obj):
        yield name, obj
        return
    for attr, v in vars(obj).items():
        if attr.startswith("_") and attr != "__init__":
            continue
        if isinstance(v, (staticmethod, classmethod)):
            v = v.__func__
        elif isinstance(v, property):
            v = v.fget
        if inspect.isfunction(v):
            yield f"{name}.{attr}", v


CALLABLES = [c for n, o in _public_objects() for c in _callables(n, o)]


def test_the_public_surface_is_found():
    names = {n for n, _f in CALLABLES}
    for expected in ("knn", "knn_graph", "GraphIndex.build", "GraphIndex.search", "KnnGraph.recall",
                     "io.read", "evaluate.recall", "set_progress"):
        assert expected in names
    assert len(CALLABLES) > 60


@pytest.mark.parametrize("qualname,func", CALLABLES, ids=[n for n, _f in CALLABLES])
def test_public_callable_is_annotated(qualname, func):
    sig = inspect.signature(func)
    params = list(sig.parameters.values())
    missing = [p.name for i, p in enumerate(params)
               if p.annotation is inspect.Parameter.empty
               and not (i == 0 and p.name in ("self", "cls"))
               and (qualname, p.name) not in ALLOWED_UNANNOTATED]
    assert not missing, f"{qualname}: parameters without annotations: {missing}"
    assert sig.return_annotation is not inspect.Signature.empty, f"{qualname}: no return annotation"


def test_annotations_resolve():
    """String annotations (``from __future__ import annotations``) name things that exist."""
    import typing

    # names a module imports only for the checker (``if TYPE_CHECKING:``)
    late = {"KnnGraph": knnkit.KnnGraph, "GraphIndex": knnkit.GraphIndex}
    for qualname, func in CALLABLES:
        typing.get_type_hints(func, localns=late)


_USER_SNIPPET = """
import numpy as np
import knnkit

X = np.random.default_rng(0).random((500, 8), dtype=np.float32)
dist, ids = knnkit.knn(X, k=5, metric="sqeuclidean", device="cpu")
qd, qi = knnkit.knn(X, X[:10], k=3, metric="cosine", device="cpu")
graph: knnkit.KnnGraph = knnkit.knn_graph(X, k=5, method="nndescent", random_state=0)
score: float = graph.recall(ids)
index = knnkit.GraphIndex.build(X, graph_degree=16, device="cpu", random_state=0)
d2, i2 = index.search(X[:10], k=5, beam=32)
n: int = index.n + graph.n
knnkit.set_progress(False, delay=0.5)
"""


def _mypy(tmp_path, code):
    api = pytest.importorskip("mypy.api")
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(code))
    src = os.path.dirname(os.path.dirname(os.path.abspath(knnkit.__file__)))
    env_path = os.environ.get("MYPYPATH")
    os.environ["MYPYPATH"] = src
    try:
        # errors inside knnkit's own (partly unannotated) internals are not the user's: silent follow
        out, err, status = api.run([str(script), "--ignore-missing-imports", "--follow-imports=silent",
                                    "--no-incremental", "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}"])
    finally:
        if env_path is None:
            os.environ.pop("MYPYPATH", None)
        else:
            os.environ["MYPYPATH"] = env_path
    return status, out + err


def test_mypy_accepts_a_user_script(tmp_path):
    status, out = _mypy(tmp_path, _USER_SNIPPET)
    assert status == 0, out


def test_mypy_sees_the_signatures(tmp_path):
    """Not vacuous: the lazy package face still gives the checker real signatures (no ``Any``)."""
    status, out = _mypy(tmp_path, _USER_SNIPPET + 'knnkit.knn_graph(X, k="5")\nwrong: str = index.n\n')
    assert status == 1 and "knn_graph" in out and "incompatible type" in out.lower(), out


def test_the_user_script_runs():
    """The snippet mypy checks is real code."""
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(knnkit.__file__)))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_USER_SNIPPET)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
