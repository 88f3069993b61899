"""Facades: the public functions and classes. Each validates and prepares its inputs once,
dispatches to an engine (``knnkit.exact``, ``knnkit.graph``, ``knnkit.index``) and wraps the
result. Nothing inside the library calls these."""
