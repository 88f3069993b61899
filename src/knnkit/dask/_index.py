"""The sharded search index on a Dask cluster (GGNN section 5.5: sharding and replication)."""

import json
import os

import numpy as np

from .._core.validation import METRICS, check_k, check_metric
from .._core.backend import as_host
from .._core.config import logger
from ._tasks import build_shard, load_shard, merge_topk, save_shard, search_shard, shard_info
from ._api import _check_device, _host_queries, _output, _send_blocks
from ._common import check_parts, get_client, live_workers, partitions, tree_reduce, worker_addresses

__all__ = ["ShardedIndex"]

MANIFEST = "manifest.json"
FORMAT = "knnkit-sharded-index"
VERSION = 1


#: a query block is searched on its own worker (no transfer) while that worker has at most this
#: many more blocks than the least loaded replica of the shard; beyond it the block moves there
RESIDENT_SLACK = 1


class ShardedIndex:
    """A search index split into shards (one ``GraphIndex`` each, built on and kept by a Dask
    worker), each shard held by ``replicas`` workers.

    Sharding (GGNN 5.5) holds more points than one device; replication serves more queries: a
    query batch goes to every shard once, to one of its replicas, chosen round-robin; the
    per-shard top-k lists are merged. Build with :meth:`build`, or :meth:`load` a saved one.

    Attributes
    ----------
    n, dim, metric : int, int, str
    shards : list of dict
        ``offset`` (first global id) and ``n`` of every shard.
    replicas : int
    last_placement : list of dict or None
        After a search: per query block, ``block_on`` (the worker holding it, None when unknown)
        and ``searched_on`` (the worker each shard's task was asked of; the scheduler may still
        move a task). For diagnosing uneven placement.
    """

    def __init__(self, client, futures, shards, metric, dim, replicas, device):
        self._client = client
        self._futures = futures
        self.shards = shards
        self.metric = metric
        self.dim = int(dim)
        self.replicas = int(replicas)
        self.device = device
        self._turn = 0
        self.last_placement = None  # set by search(): see there

    @property
    def n(self):
        return int(sum(s["n"] for s in self.shards))

    def __len__(self):
        return self.n

    def __repr__(self):
        return (f"ShardedIndex(n={self.n}, dim={self.dim}, metric={self.metric!r}, shards={len(self.shards)}, "
                f"replicas={self.replicas})")

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, data, *, shards=None, replicas=1, metric="sqeuclidean", device="auto", client=None,
              random_state=0, **build_params):
        """Build one ``GraphIndex`` per shard, each on a worker, then replicate.

        Parameters
        ----------
        data : dask.array or array-like, shape (n, d)
            A dask array's row chunks are the shards (``shards`` must then be None); an in-memory
            array is split into ``shards`` equal row blocks.
        shards : int, optional
            Default: workers // replicas (at least 1).
        replicas : int, default 1
            Workers holding each shard (at most the number of workers). A query batch is served
            by one replica per shard; when a worker is lost, its shards' other replicas serve.
        metric, device, random_state :
            As :meth:`knnkit.GraphIndex.build` (``device``: where each worker builds, "auto": its GPU).
        **build_params :
            Other keywords of :meth:`knnkit.GraphIndex.build` (``graph_degree``, ``entry``...).

        Examples
        --------
        >>> import numpy as np, knnkit.dask
        >>> from distributed import Client, LocalCluster
        >>> with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster, Client(cluster) as c:
        ...     X = np.random.default_rng(0).random((2000, 8), dtype=np.float32)
        ...     index = knnkit.dask.ShardedIndex.build(X, shards=2, client=c, device="cpu")
        ...     d, i = index.search(X[:3], k=1)
        >>> i.ravel().tolist()
        [0, 1, 2]
        """
        client = get_client(client)
        metric = check_metric(metric, METRICS)
        device = _check_device(device)
        workers = worker_addresses(client)
        replicas = check_parts(replicas, "replicas", len(workers))
        from ._common import _is_dask_array

        if _is_dask_array(data) and shards is not None:
            raise ValueError("shards: a dask array is sharded by its row chunks; rechunk it instead")
        shards = check_parts(shards, "shards", 1 << 31) or max(1, len(workers) // replicas)
        parts, shape, _dtype, _kind = partitions(client, data, shards)
        if min(r for _o, r, _f in parts) < 2:
            raise ValueError("every shard needs at least 2 points; use fewer shards")
        futures = []
        for s, (_o, _r, f) in enumerate(parts):
            futures.append(client.submit(build_shard, f, metric, device, build_params,
                                         int(random_state) + 7919 * s, pure=False,
                                         workers=[workers[s % len(workers)]], allow_other_workers=True))
        client.gather(futures)  # raise build errors here, not at the first search
        if replicas > 1:
            client.replicate(futures, n=replicas)
        info = [{"offset": o, "n": r} for o, r, _f in parts]
        return cls(client, futures, info, metric, shape[1], replicas, device)

    # ------------------------------------------------------------------ search
    def _holders(self):
        """Workers holding each shard now; a clear error names a shard no worker holds."""
        lost = [s for s, f in enumerate(self._futures) if f.status in ("lost", "error", "cancelled")]
        who = {} if lost else self._client.who_has(self._futures)
        out = []
        for s, f in enumerate(self._futures):
            held = sorted(who.get(f.key, ()))
            if s in lost or not held:
                sh = self.shards[s]
                raise RuntimeError(f"ShardedIndex: shard {s} (points {sh['offset']}..{sh['offset'] + sh['n'] - 1}) "
                                   f"was lost with its worker(s) and has no replica left; rebuild it or load the "
                                   f"index again (replicas > 1 survives the loss of a worker)")
            out.append(held)
        short = [s for s, held in enumerate(out) if len(held) < self.replicas]
        if short and not lost:
            # a replica gone (its worker restarted, or the scheduler dropped the copy): the search
            # would send every block to the remaining holder and run at one worker's speed; copy
            # the shard again (a 2 x H100 run that searched all 20 blocks on one worker suggested
            # it, but there both workers still held the shard: that cause is still open)
            n_workers = len(live_workers(self._client))
            if any(len(out[s]) < min(self.replicas, n_workers) for s in short):
                logger.warning("ShardedIndex: shard(s) %s held by fewer than %d workers (%s): replicating again",
                               short, self.replicas, [out[s] for s in short])
                self._client.replicate([self._futures[s] for s in short], n=min(self.replicas, n_workers))
                who = self._client.who_has(self._futures)
                out = [sorted(who.get(f.key, ())) or out[s] for s, f in enumerate(self._futures)]
        return out

    def _resident_blocks(self, queries):
        """A dask array's row blocks as futures where the cluster computes (or already holds)
        them, with the worker holding each: ``[(offset, rows, future, worker)]``. A persisted
        array's blocks are used as they are (no task); any other array is computed (again at
        every call: persist queries that are searched more than once)."""
        from distributed import futures_of, wait

        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must be 2-D with dimension {self.dim}, got shape {queries.shape}")
        if any(c != c for c in queries.chunks[0]):
            raise ValueError("queries has unknown chunk sizes: call compute_chunk_sizes() first")
        if queries.shape[0] == 0:
            raise ValueError("queries is empty")
        arr = queries.rechunk({1: -1})  # one block per row chunk; rows stay where they are
        keys = [key for (key,) in arr.__dask_keys__()] if arr.numblocks[1] == 1 else []
        held = {f.key: f for f in futures_of(arr)}
        if keys and all(key in held for key in keys):
            futures = [held[key] for key in keys]  # persisted: its blocks are futures already, no task
        else:
            futures = self._client.compute(arr.to_delayed().ravel().tolist())
        wait(futures)
        who = self._client.who_has(futures)
        offsets = np.concatenate([[0], np.cumsum(arr.chunks[0])[:-1]]).astype(np.int64)
        return [(int(o), int(r), f, (sorted(who.get(f.key, ())) or [None])[0])
                for o, r, f in zip(offsets, arr.chunks[0], futures) if r > 0]

    def _check_search_params(self, params):
        """``search_params`` checked here, before any task (an unknown keyword or a bad filter
        failed on a worker, as a RuntimeError). ``filter``: a boolean mask of the index's ``n``
        points (global ids), cut into one mask per shard; the other forms of GraphIndex's filter
        (bitsets, per-query masks, id lists) are in each shard's own ids and are refused.
        Returns ``(params without filter, per-shard masks or None)``."""
        import inspect

        from ..api.index import GraphIndex

        sig = inspect.signature(GraphIndex.search)
        allowed = [p for p in sig.parameters if p not in ("self", "queries", "k")]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise TypeError(f"ShardedIndex.search got unexpected keyword(s) {', '.join(unknown)}; the keywords of "
                            f"GraphIndex.search are {', '.join(allowed)}")
        params = dict(params)
        filt = params.pop("filter", None)
        if filt is None:
            return params, None
        mask = np.asarray(as_host(filt))
        if mask.dtype != np.bool_ or mask.shape != (self.n,):
            raise ValueError(f"filter: ShardedIndex.search takes a boolean mask of its {self.n} points (global ids), "
                             f"got dtype {mask.dtype} shape {mask.shape}; bitsets, per-query masks and id lists "
                             f"are not supported across shards")
        return params, [np.ascontiguousarray(mask[sh["offset"]:sh["offset"] + sh["n"]]) for sh in self.shards]

    def search(self, queries, k=10, *, query_block=65536, compute=None, **search_params):
        """k nearest neighbours of each query over all shards.

        Parameters
        ----------
        queries : dask.array or array-like, shape (m, d)
            A dask array stays on the workers: each of its row blocks is computed (or taken as it
            is, when persisted with ``client.persist``: no task at all) on a worker and searched
            there, by the replicas that worker holds (another worker's replica, the least loaded,
            for the shards it does not hold); only the results move. An in-memory array is split
            into blocks of ``query_block`` rows, sent from the client straight to the replicas
            serving them (round-robin; one message per worker).
        k : int, default 10
        query_block : int, default 65536
            Queries per task for an in-memory ``queries`` (a dask array keeps its row chunks).
        compute : bool, optional
            True: gather the results to the client (numpy, or cupy for cupy queries). False:
            return lazy ``dask.array`` results whose blocks are futures on the workers (e.g.
            ``client.persist`` them, or feed them to the next step of a dask pipeline); errors of
            a worker then surface when they are computed. Default: False for dask-array
            queries (dask arrays in, dask arrays out), True otherwise.
        **search_params :
            Keywords of :meth:`knnkit.GraphIndex.search` (``beam``, ``target_recall``...), given
            to every shard (checked here: an unknown one is a TypeError). ``filter``: only a
            boolean mask of the index's ``n`` points (global ids), cut per shard; GraphIndex's
            other filter forms (bitsets, per-query masks, id lists) are refused.

        Returns
        -------
        distances, indices : (m, k) arrays, best first, global ids (float32, int64): numpy / cupy
            arrays, or dask arrays with the queries' row chunks (blocks of the queries' kind:
            cupy blocks on GPU workers stay cupy).

        Examples
        --------
        >>> import numpy as np, dask.array as da, knnkit.dask
        >>> from distributed import Client, LocalCluster
        >>> with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster, Client(cluster) as c:
        ...     X = np.random.default_rng(0).random((2000, 8), dtype=np.float32)
        ...     index = knnkit.dask.ShardedIndex.build(X, replicas=2, client=c, device="cpu")
        ...     Q = c.persist(da.from_array(X[:6], chunks=(3, 8)))
        ...     d, i = index.search(Q, k=1)
        ...     ids = i.compute().ravel().tolist()
        >>> ids
        [0, 1, 2, 3, 4, 5]
        """
        from ._common import _is_dask_array, check_compute, result_arrays

        k = check_k(k, self.n, max_k=1024)
        query_block = check_parts(query_block, "query_block", 1 << 40)
        search_params, masks = self._check_search_params(search_params)
        dask_queries = _is_dask_array(queries)
        compute = check_compute(compute, dask_queries)
        holders = self._holders()
        like = None
        if dask_queries:
            blocks, kind, like = self._resident_blocks(queries), "numpy", queries._meta
        else:
            # block b is sent to shard 0's replica (turn + b), round-robin
            Q, kind = _host_queries(queries, self.dim)
            turn = self._turn % len(holders[0])
            targets = holders[0][turn:] + holders[0][:turn]
            sent = _send_blocks(self._client, Q, query_block, lambda b: [targets[b % len(targets)]])
            blocks = [(o, r, copies[targets[b % len(targets)]], targets[b % len(targets)])
                      for b, (o, r, copies) in enumerate(sent)]
            del Q
        load = {}  # blocks given to each worker so far
        results = []
        placement = []  # per block: the worker holding it, and the worker each shard's task asked for
        for _qo, _qr, qf, where in blocks:
            lists, asked = [], []
            for s, f in enumerate(self._futures):
                reps = holders[s]
                least = min(reps, key=lambda x, i=len(reps): (load.get(x, 0), (reps.index(x) - self._turn) % i))
                if where in reps and load.get(where, 0) <= load.get(least, 0) + RESIDENT_SLACK:
                    w = where  # the block's own worker holds a replica and is not far ahead: no transfer
                else:
                    # blocks persisted unevenly (2 x H100, 20 blocks on one worker: all 20 searched
                    # there while the other replica idled) move to the least loaded replica
                    w = least
                load[w] = load.get(w, 0) + 1
                kw = search_params if masks is None else dict(search_params, filter=masks[s])
                # float64 distances rank the merge (shards of data at a scale); float32 returned
                lists.append(self._client.submit(search_shard, f, qf, k, kw, self.shards[s]["offset"],
                                                 len(self._futures) == 1, pure=False, workers=[w],
                                                 allow_other_workers=True))
                asked.append(w)
            placement.append({"block_on": where, "searched_on": asked})
            results.append(tree_reduce(self._client, lists, merge_topk, k, self.metric, last=(True,)))
        self._turn += len(blocks)
        # where the last call asked each block to be searched (the scheduler may still move a task:
        # allow_other_workers), for diagnosing uneven placement (2 x H100: one run searched all 20
        # blocks on one worker)
        self.last_placement = placement
        if not compute:
            return result_arrays(results, [r for _o, r, _f, _w in blocks], k, (np.float32, np.int64), like,
                                 prefix="knnkit-search")
        try:
            out = self._client.gather(results)
        except Exception as e:
            self._holders()  # a lost shard: say which
            raise RuntimeError(f"ShardedIndex.search failed on a worker: {type(e).__name__}: {e}") from e
        D = np.concatenate([as_host(o[0]) for o in out])
        I = np.concatenate([as_host(o[1]) for o in out])
        return _output(D, kind), _output(I, kind)

    # ------------------------------------------------------------------ persistence
    def save(self, path):
        """Write the index to the directory ``path``: one container file per shard (written by the
        worker holding it: ``path`` must be visible to the workers, e.g. a shared file system) and
        ``manifest.json`` (written last, atomically) with the shards' id ranges and SHA-256 sums,
        and a checksum of its own content: :meth:`load` refuses a manifest edited since, or one
        whose shards do not make a whole index (a shard dropped, offsets moved, a file missing)."""
        path = os.fspath(path)
        os.makedirs(path, exist_ok=True)
        holders = self._holders()
        files = [f"shard_{s:05d}.knnkit" for s in range(len(self._futures))]
        sums = self._client.gather([
            self._client.submit(save_shard, f, os.path.join(os.path.abspath(path), name), pure=False,
                                workers=[holders[s][0]], allow_other_workers=True)
            for s, (f, name) in enumerate(zip(self._futures, files))])
        manifest = {"format": FORMAT, "version": VERSION, "metric": self.metric, "dim": self.dim, "n": self.n,
                    "replicas": self.replicas,
                    "shards": [dict(sh, file=name, sha256=h) for sh, name, h in zip(self.shards, files, sums)]}
        manifest["checksum"] = _manifest_checksum(manifest)
        tmp = os.path.join(path, MANIFEST + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(path, MANIFEST))

    @classmethod
    def load(cls, path, *, client=None, device="auto", replicas=None):
        """Read an index written by :meth:`save`; each shard is read by a worker (``path`` visible
        to them). ``replicas`` defaults to the saved one (capped at the number of workers)."""
        client = get_client(client)
        device = _check_device(device)
        path = os.path.abspath(os.fspath(path))
        try:
            with open(os.path.join(path, MANIFEST)) as fh:
                man = json.load(fh)
        except FileNotFoundError:
            raise ValueError(f"{path}: no {MANIFEST} (not a saved ShardedIndex, or an interrupted save)") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: {MANIFEST} is not valid JSON ({e})") from None
        if not isinstance(man, dict) or man.get("format") != FORMAT or man.get("version") != VERSION:
            raise ValueError(f"{path}: not a knnkit sharded index of version {VERSION}")
        shards = _check_manifest(man, path)
        workers = worker_addresses(client)
        missing = [s["file"] for s in shards if not os.path.isfile(os.path.join(path, s["file"]))]
        if missing:  # (seen from the client; the workers read the same path)
            raise ValueError(f"{path}: shard file(s) {', '.join(missing)} named by the manifest are missing "
                             f"(an incomplete copy of the index?)")
        futures = [client.submit(load_shard, os.path.join(path, s["file"]), s["sha256"], device, pure=False,
                                 workers=[workers[i % len(workers)]], allow_other_workers=True)
                   for i, s in enumerate(shards)]
        infos = client.gather([client.submit(shard_info, f, pure=False) for f in futures])
        for s, inf in zip(shards, infos):
            if inf["n"] != s["n"] or inf["dim"] != man["dim"] or inf["metric"] != man["metric"]:
                raise ValueError(f"{path}: shard {s['file']} disagrees with the manifest")
        reps = min(man["replicas"] if replicas is None else check_parts(replicas, "replicas", len(workers)),
                   len(workers))
        if reps > 1:
            client.replicate(futures, n=reps)
        return cls(client, futures, [{"offset": s["offset"], "n": s["n"]} for s in shards], man["metric"],
                   man["dim"], reps, device)


def _manifest_checksum(man):
    """SHA-256 of a manifest's content (every key but ``checksum``, canonical JSON): a manifest
    edited by hand (shards dropped or swapped, offsets moved) is refused instead of loading a
    partial or shifted index."""
    import hashlib

    body = {key: v for key, v in man.items() if key != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _check_manifest(man, path):
    """The manifest's shards, after checking that they describe a whole index: every field
    present and typed, file names inside ``path`` and distinct, offsets from 0 tiling ``n``, the
    replicas an int >= 1, and the checksum (manifests written since it was added). A ValueError
    names what is wrong: a partial or shifted index is never loaded."""
    def bad(why):
        return ValueError(f"{path}: {MANIFEST} {why}; the index cannot be loaded as saved (save it again)")

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if "checksum" in man and man["checksum"] != _manifest_checksum(man):
        raise bad("was changed after it was written (its checksum differs)")
    for key, ok in (("n", is_int), ("dim", is_int), ("metric", lambda v: isinstance(v, str)),
                    ("shards", lambda v: isinstance(v, list) and len(v) > 0)):
        if not ok(man.get(key)):
            raise bad(f"has no valid {key!r} ({man.get(key)!r})")
    reps = man.setdefault("replicas", 1)
    if not is_int(reps) or reps < 1:
        raise bad(f"has replicas={reps!r}; expected an int >= 1")
    shards, files, expect = man["shards"], set(), 0
    for j, sh in enumerate(shards):
        if not isinstance(sh, dict) or not all(key in sh for key in ("offset", "n", "file", "sha256")):
            raise bad(f"shard {j} lacks one of offset, n, file, sha256")
        if not (is_int(sh["offset"]) and is_int(sh["n"]) and sh["n"] >= 1 and isinstance(sh["file"], str)
                and isinstance(sh["sha256"], str)):
            raise bad(f"shard {j} has invalid fields {sh!r}")
        name = sh["file"]
        if os.path.basename(name) != name or name in ("", ".", "..") or name in files:
            raise bad(f"shard {j} names the file {name!r} (not a distinct file of the index directory)")
        files.add(name)
        if sh["offset"] != expect:
            raise bad(f"shard {j} starts at id {sh['offset']}, expected {expect}: the shards do not tile the "
                      f"id range 0..n-1")
        expect += sh["n"]
    if expect != man["n"]:
        raise bad(f"says n={man['n']} but its shards hold {expect} points (a shard missing?)")
    return shards
