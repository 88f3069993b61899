"""Build statistics as a typed object (not a dict that callees mutate).

Engines return their own statistics; the facade assembles one :class:`BuildStats` at the end of
a build. It reads like a mapping too (``g.stats["iterations"]``, ``g.stats.get("hubs")``), so it
serialises to JSON with the graph and stays convenient in notebooks.
"""

import dataclasses

__all__ = ["BuildStats"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildStats:
    """What a graph build did.

    Attributes
    ----------
    method : str
        ``"nndescent"``, ``"brute"``, ``"merge"``, ``"out_of_core"``, ... (a registry name).
    device : str or None
    iterations : int
        NN-Descent iterations (0 for exact methods).
    updates, time_s : list
        List entries changed, and seconds, per iteration.
    phase_s : dict
        Seconds per phase (``total`` included).
    K, sample, update, seed, max_iters, delta :
        The parameters the build ran with (None where they do not apply).
    hubs : dict or None
        Inner-product hub refinement: support size and whether it ran.
    extra : dict
        Method-specific entries (out of core: shards, paths; merges: ...).
    """

    method: str
    device: str | None = None
    iterations: int = 0
    updates: tuple = ()
    time_s: tuple = ()
    phase_s: dict = dataclasses.field(default_factory=dict)
    K: int | None = None
    sample: int | None = None
    update: str | None = None
    seed: int | None = None
    max_iters: int | None = None
    delta: float | None = None
    hubs: dict | None = None
    extra: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d):
        d = dict(d or {})
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: d.pop(k) for k in list(d) if k in names}
        known.setdefault("method", "unknown")
        for key in ("updates", "time_s"):
            if key in known:
                known[key] = tuple(known[key])
        extra = dict(d.pop("extra", {}) or {})
        extra.update(d)
        return cls(**known, extra=extra)

    def as_dict(self):
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra" and getattr(self, f.name) is not None}
        out["updates"], out["time_s"] = list(self.updates), list(self.time_s)
        out.update(self.extra)
        return out

    # mapping-style reading: a field left at None reads as absent (as in a dict without the key)
    def __getitem__(self, key):
        if key != "extra" and key in {f.name for f in dataclasses.fields(self)}:
            value = getattr(self, key)
            if value is None:
                raise KeyError(key)
            return list(value) if key in ("updates", "time_s") else value
        if key in self.extra:
            return self.extra[key]
        raise KeyError(key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key):
        return self.get(key, _MISSING) is not _MISSING


_MISSING = object()
