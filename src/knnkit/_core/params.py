"""Parameter objects: keyword-only frozen dataclasses validated at construction.

Every algorithm declares one (``NNDescentParams``, ``IndexParams``, ``SearchParams``, ...). A
public function accepts ``params=`` plus its common keywords as shortcuts; the shortcuts are
merged with :func:`merge_params` so that the validation (type and range, the parameter named in
the message) happens in one place.
"""

import dataclasses
import math
import numbers

__all__ = ["Params", "check_int", "check_float", "check_choice", "check_bool", "merge_params"]


def check_int(value, name, *, minimum=None, maximum=None, allow_none=False):
    """``value`` as an int; ``TypeError`` for non-integers (bool, float 2.5, str), ``ValueError`` out of range."""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be an integer, got None")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            value = int(value)
        else:
            raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_float(value, name, *, minimum=None, maximum=None, allow_none=False, allow_inf=False,
                open_min=False):
    """``value`` as a finite float (``inf`` only with ``allow_inf``) in range."""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be a number, got None")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and (value < minimum or (open_min and value == minimum)):
        raise ValueError(f"{name} must be {'>' if open_min else '>='} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_bool(value, name, *, allow_none=False):
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool,)) and not (hasattr(value, "dtype") and value.dtype == bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Params:
    """Base of every parameter object: subclasses add fields and a ``_validate`` method that
    returns a dict of normalised values (or raises)."""

    def __post_init__(self):
        fixed = self._validate() or {}
        for k, v in fixed.items():
            object.__setattr__(self, k, v)

    def _validate(self):
        return {}

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self):
        return dataclasses.asdict(self)

    def __repr__(self):
        # only what differs from the defaults, so that a repr stays readable
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            default = f.default if f.default is not dataclasses.MISSING else None
            if v != default:
                parts.append(f"{f.name}={v!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


def merge_params(cls, params, name="params", **shortcuts):
    """``params`` (an instance of ``cls`` or None) updated with the shortcut keywords that are not
    None. A shortcut that contradicts an explicit ``params`` field is an error."""
    if params is None:
        params = cls()
    elif not isinstance(params, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {type(params).__name__}")
    given = {k: v for k, v in shortcuts.items() if v is not None}
    if not given:
        return params
    defaults = cls()
    for k, v in given.items():
        current = getattr(params, k)
        if current != getattr(defaults, k) and current != v:
            raise ValueError(f"{k}={v!r} contradicts {name}.{k}={current!r}; give it in one place")
    return dataclasses.replace(params, **given)
