"""``random_state`` handling shared by every algorithm: one integer seed per call."""

import numbers

import numpy as np

__all__ = ["seed_from"]


def seed_from(random_state):
    """A 63-bit integer seed from None / int / numpy Generator / RandomState.

    ``TypeError`` names the parameter for anything else (a string, a float)."""
    if random_state is None:
        return int(np.random.default_rng().integers(2 ** 62))
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if int(random_state) < 0:
            raise ValueError(f"random_state must be >= 0, got {int(random_state)}")
        return int(random_state) & 0x7FFFFFFFFFFFFFFF
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2 ** 62))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(2 ** 31))
    raise TypeError(f"random_state must be None, an int or a numpy Generator/RandomState, "
                    f"got {type(random_state).__name__} {random_state!r}")
