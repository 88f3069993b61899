"""Root pytest configuration: the doctests of optional-dependency modules are collected only
where their dependencies are installed (``--doctest-modules`` imports every module under
``src/knnkit``)."""

import importlib.util


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


collect_ignore_glob = []
if not (_installed("distributed") and _installed("dask")):
    collect_ignore_glob.append("src/knnkit/dask/*.py")  # the knnkit[dask] extra is absent
