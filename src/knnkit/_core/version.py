"""knnkit's version, in the foundation layer so that any layer may record it (saved indexes, bench
reports) without importing the package face. ``pyproject.toml`` carries the same string (a test
checks)."""

__version__ = "0.2.0"
