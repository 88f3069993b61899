"""Shared test setup: a freshly seeded ``rng`` fixture and skipping of ``@pytest.mark.gpu`` tests
on machines without a usable GPU (the ``gpu`` and ``slow`` markers are declared in pyproject.toml)."""

import os
import secrets

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A numpy Generator with a fresh seed for every test.

    The seed is printed, so pytest shows it with a failing test's captured output; set
    ``KNNKIT_TEST_SEED`` to that number to replay the failure.
    """
    seed = int(os.environ.get("KNNKIT_TEST_SEED") or secrets.randbits(32))
    print(f"rng seed: {seed} (replay with KNNKIT_TEST_SEED={seed})")
    return np.random.default_rng(seed)


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import knnkit

    if knnkit.gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and CuPy (knnkit.gpu_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
