"""knnkit's foundation layer: array plumbing, settings, validation, metrics, kernel cache,
parameter objects, the method registry and the one file container.

Nothing here imports an algorithm or a facade (the layers test in ``tests/test_layers.py``).
"""
