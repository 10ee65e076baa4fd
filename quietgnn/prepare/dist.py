"""``quietgnn prepare`` across hosts: one process per host under torchrun, each building its
own part from its own slice of the input, no process ever holding the whole graph.

Input. Rank ``r`` reads the edge table ``EDGES`` and the node table ``NODES`` with ``{rank}``
replaced by ``r`` (``edges-{rank}.parquet``); a path without ``{rank}`` is read as it stands,
which on separate hosts means each host's own file at the same path. The tables have the
columns of the single-process prepare (:mod:`quietgnn.prepare`); node ids are global, in
``[0, N)`` where ``N`` is the total number of rows of all the node tables, each id in exactly
one rank's node table. An edge may sit on any rank (and on several): it is routed to the rank
that owns its destination.

Partition. The data stays where it arrives: rank ``r``'s nodes form part ``r`` (the ``given``
partitioner; the world size is the number of parts). The result is exactly what the
single-process ``quietgnn prepare EDGES --nodes NODES --partitioner given --partition.file
ASSIGNMENT`` writes for the concatenated tables: the same arrays in every part, the same
fingerprint and book id.

How the ranks agree, all over the :class:`~quietgnn.comm.Communicator` (so every byte is
counted, kinds ``prepare_*``), in rounds of at most ``chunk_rows`` rows:

1. the node slices: sizes (``N`` is their sum), feature count, options; every id in range;
2. ownership: rank ``d`` keeps the owner of the ids in its block ``[d N / P, (d+1) N / P)``
   (a directory; a node claimed by two ranks is found here); owners are looked up there;
3. edges: each rank drops self-loops, symmetrises and de-duplicates its slice (DuckDB), looks
   up the owners of both ends and sends each edge to its destination's owner, which sorts and
   de-duplicates what it receives (DuckDB) and counts its nodes' in-degrees (out-degrees of a
   directed graph are counted where the edges are and sent to the sources' owners);
4. halos: each rank asks the owners for the remote sources of its edges; the request is the
   owner's send plan, the answer the halo nodes' degrees;
5. the book: rank 0 receives the degrees, labels and split codes in id order, then every
   edge's source in CSR order, a window at a time, to write ``assignment.npy`` and compute
   :meth:`~quietgnn.graph.Graph.fingerprint` (a hash of the whole graph in id order: one
   process has to see it go by, none has to hold it; :mod:`.dist_gather`); each rank sends
   its files' sizes and checksums, and rank 0 writes ``book.json``.

``--out`` must be a directory every rank sees at the same path (one machine, or a shared
filesystem): each rank writes its ``part-<r>/`` there and rank 0 the manifest. What a rank
holds: its slice's ids, degrees, labels and split codes, its halo, its block of the owner
directory (4 bytes a node over ``P``), one round's rows, and (without a ``split`` column) the
seeded random split of all ``N`` nodes, as the single-process path does; DuckDB spills the
rank's edges to disk beyond its memory limit.

Every input problem found on one rank (a missing slice, an id out of range, a node claimed
twice, ranks started with different options) is raised as the same ``ValueError`` on every
rank; a rank that dies or hangs makes the others fail within the communicator's timeout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..comm.communicator import Communicator
from ..comm.traffic import Traffic
from ..graph import FeaturesDigest
from ..partition.book import PartitionBook, _sha256, finish_book, new_book_dir
from ..partition.shards import PART_ARRAYS
from .dist_gather import _a2a, _rows, gather_fingerprint
from .arrays import BATCH_ROWS, NpyWriter, lookup
from .edges import _check_sorted
from .nodes import TEST, TRAIN, VAL, _check_finite, check_split_counts
from .tables import _connect

__all__ = ["prepare_distributed", "slice_path"]


def slice_path(pattern: str | Path, rank: int) -> Path:
    """Rank ``rank``'s slice: ``{rank}`` in ``pattern`` replaced by the rank."""
    return Path(str(pattern).replace("{rank}", str(rank)))


def _agree(comm: Communicator, problem: Optional[str]) -> None:
    """Raise the same ValueError on every rank when any rank found a problem: a rank that
    raised alone would leave the others waiting in a collective it never joins."""
    found = comm.all_gather_object(problem, "prepare_check", carries=Traffic.CONTROL)
    bad = [f"rank {r}: {p}" for r, p in enumerate(found) if p]
    if bad:
        raise ValueError("; ".join(bad))


def _attempt(fn: Callable[[], Any]) -> tuple[Any, Optional[str]]:
    """``(fn(), None)``, or ``(None, message)`` when ``fn`` found the input wrong."""
    import duckdb
    try:
        return fn(), None
    except (ValueError, duckdb.Error) as exc:
        return None, str(exc).splitlines()[0]


def _by_dest(dest: np.ndarray, P: int, rows: np.ndarray) -> list[np.ndarray]:
    """``rows`` split into one block per destination rank (order kept within a block)."""
    order = np.argsort(dest, kind="stable")
    return np.split(rows[order], np.cumsum(np.bincount(dest, minlength=P))[:-1])


def _more(comm: Communicator, have: bool) -> bool:
    """Whether any rank has rows left: every rank runs the same number of rounds."""
    t = torch.tensor([int(have)], dtype=torch.int64)
    return bool(comm.all_reduce(t, "prepare_rounds", op="max", carries=Traffic.CONTROL)[0])


class _Directory:
    """Who owns each node: rank ``d`` keeps the owners of the ids in its block."""

    def __init__(self, comm: Communicator, n: int, owned: np.ndarray) -> None:
        self.comm, P, r = comm, comm.world_size, comm.rank
        self.bounds = np.array([d * n // P for d in range(P + 1)], dtype=np.int64)
        self.lo = int(self.bounds[r])
        got = _a2a(comm, _by_dest(self.home(owned), P, owned), "prepare_ids")
        self.owner = np.full(int(self.bounds[r + 1]) - self.lo, -1, dtype=np.int32)
        problem = None
        for j, ids in enumerate(got):
            prev = self.owner[ids - self.lo]
            clash = np.flatnonzero(prev >= 0)
            if clash.size and problem is None:
                i = int(clash[0])
                problem = (f"node id {int(ids[i])} is claimed by ranks {int(prev[i])} and {j}; "
                           f"each node belongs to exactly one rank's node table: remove it from "
                           f"one of them")
            self.owner[ids - self.lo] = np.where(prev >= 0, prev, j)
        # ids in range, none claimed twice and N rows in all: every id has its owner
        _agree(comm, problem)

    def home(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds, ids, side="right") - 1

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The owner of every id in ``ids`` (a collective: every rank calls it)."""
        uniq, inv = np.unique(ids, return_inverse=True)
        counts = np.bincount(self.home(uniq), minlength=self.comm.world_size)
        asked = _a2a(self.comm, np.split(uniq, np.cumsum(counts)[:-1]), "prepare_lookup")
        answers = [self.owner[a - self.lo].astype(np.int64) for a in asked]
        got = _a2a(self.comm, answers, "prepare_lookup", recv_counts=counts.tolist())
        return np.concatenate(got)[inv]


def prepare_distributed(edges: str | Path, nodes: str | Path, out: str | Path,
                        comm: Communicator, *, directed: bool = False,
                        memory_budget: int = 4 << 30, x_dtype: str = "float32",
                        split_seed: int = 0, name: Optional[str] = None, threads: int = 1,
                        chunk_rows: int = BATCH_ROWS,
                        progress: Callable[[str], None] = lambda s: None,
                        overwrite: bool = True) -> PartitionBook:
    """This rank's share of preparing the graph whose slices are ``edges`` and ``nodes``
    (``{rank}`` replaced) into ``out`` (see the module docstring); every rank of ``comm``
    calls it and gets the finished book (``overwrite``:
    :func:`~quietgnn.partition.book.finish_book`'s)."""
    r = comm.rank
    out = Path(out)
    name = name or Path(str(edges).replace("{rank}", "")).stem.strip("-_") or "graph"
    if x_dtype not in ("float32", "float16"):
        raise ValueError(f"x_dtype = {x_dtype!r}; expected float32 or float16")
    # the output directory: rank 0 makes it, every rank must see it
    tmp, problem = None, None
    if r == 0:
        if out.exists() and not (out / "book.json").is_file():
            problem = (f"--out {str(out)!r} exists and is not a prepared directory; choose "
                       f"another --out or remove it (a prepared one is replaced)")
        else:
            tmp = str(new_book_dir(out))
    tmp = comm.all_gather_object(tmp, "prepare_control", carries=Traffic.CONTROL)[0]
    _agree(comm, problem)
    tmp = Path(tmp)
    work = tmp / f".work-{r}"
    try:
        if not tmp.is_dir():
            problem = (f"--out {str(out)!r}: rank 0's directory {str(tmp)!r} is not visible "
                       f"here; --out must be a path every rank sees (one machine or a shared "
                       f"filesystem)")
        _agree(comm, problem)
        work.mkdir()
        con = _connect(work, max(memory_budget - (512 << 20), 128 << 20) * 85 // 100, threads)
        book = _prepare(comm, con, tmp, work, slice_path(edges, r), slice_path(nodes, r),
                        directed, x_dtype, split_seed, name, chunk_rows, progress,
                        source=str(edges))
        con.close()
        shutil.rmtree(work)
        files = {f"part-{r}/{f.name}": {"bytes": f.stat().st_size, "sha256": _sha256(f)}
                 for f in sorted((tmp / f"part-{r}").iterdir())}
        every = comm.all_gather_object(files, "prepare_manifest", carries=Traffic.CONTROL)
        problem = None
        if r == 0:
            known = {k: v for f in every for k, v in f.items()}
            known["assignment.npy"] = {"bytes": (tmp / "assignment.npy").stat().st_size,
                                       "sha256": _sha256(tmp / "assignment.npy")}
            # a refusal (another prepare wrote --out meanwhile) is raised on every rank: the
            # others would wait for rank 0 in a collective it never joins
            _, problem = _attempt(lambda: finish_book(tmp, out, book, files=known,
                                                      overwrite=overwrite))
        _agree(comm, problem)
    except BaseException:
        shutil.rmtree(tmp if r == 0 else work, ignore_errors=True)
        raise
    return PartitionBook.open(out)


def _prepare(comm: Communicator, con: Any, tmp: Path, work: Path, edges: Path, nodes: Path,
             directed: bool, x_dtype: str, split_seed: int, name: str, B: int,
             progress: Callable[[str], None], source: str) -> dict[str, Any]:
    from . import TableNodes, _edge_sql
    P, r = comm.world_size, comm.rank

    # 1. the node slices
    progress(f"rank {r}: nodes {nodes}")
    src_nodes, problem = _attempt(lambda: TableNodes(con, nodes, split_seed, whole=False))
    owned = np.zeros(0, dtype=np.int64)
    if src_nodes is not None:
        owned = con.sql(f"SELECT id FROM {src_nodes.reader} ORDER BY id").fetchnumpy()["id"]
        owned = owned.astype(np.int64)
        dup = np.flatnonzero(np.diff(owned) == 0)
        if dup.size:
            problem = (f"node table {str(nodes)!r} lists node id {int(owned[dup[0]])} twice; "
                       f"one row per node")
    edge_sql, eproblem = _attempt(lambda: _edge_sql(con, edges))
    _agree(comm, problem or eproblem)
    mine = {"count": src_nodes.count, "lo": int(src_nodes.lo), "hi": int(src_nodes.hi),
            "ymax": int(src_nodes.ymax), "features": src_nodes.num_features,
            "columns": ["x (list)"] if src_nodes.x_form == "list" else list(src_nodes.x_cols),
            "split": src_nodes.split_col is not None, "directed": directed, "x_dtype": x_dtype,
            "split_seed": split_seed, "world": P,
            "names": src_nodes.label_names is not None, "label_names": src_nodes.label_names}
    every = comm.all_gather_object(mine, "prepare_control", carries=Traffic.CONTROL)
    n = sum(e["count"] for e in every)
    problem = None
    sparse = src_nodes.x_form == "sparse"   # its width: the largest id on any host, + 1
    for key, what in (("world", "the number of parts (world size)"),
                      ("features", "the number of features"),
                      ("columns", "the feature columns"), ("split", "a split column"),
                      ("directed", "--directed"), ("x_dtype", "--x-dtype"),
                      ("split_seed", "--dataset.split_seed"),
                      ("names", "labels given as names (text) rather than class ids")):
        if any(e[key] != every[0][key] for e in every) and not (sparse and key == "features"):
            problem = (f"the ranks disagree on {what}: " + ", ".join(
                f"rank {j} has {e[key]!r}" for j, e in enumerate(every)) +
                "; start every rank with the same options and the same table columns")
    if mine["lo"] < 0 or mine["hi"] >= n:
        bad = mine["lo"] if mine["lo"] < 0 else mine["hi"]
        problem = problem or (
            f"node table {str(nodes)!r} holds node id {bad}"
            f", outside [0, {n}) where {n} is the number of rows of all ranks' node tables; "
            f"node ids must be global, 0 .. N-1 over all the ranks")
    _agree(comm, problem)
    src_nodes.num_nodes = n
    src_nodes.num_classes = max(e["ymax"] for e in every) + 1
    if src_nodes.label_names is not None:
        # every host maps names alike: class k is the k-th of all hosts' names, sorted
        src_nodes.label_names = sorted(set().union(*(e["label_names"] for e in every)))
        src_nodes.num_classes = len(src_nodes.label_names)
    if sparse:
        src_nodes.num_features = max(e["features"] for e in every)
        if src_nodes.num_features < 1:
            raise ValueError(f"node table {str(nodes)!r}: x_indices lists no feature id on "
                             f"any rank's rows; there are no features")
    F = src_nodes.num_features

    # 2. ownership
    progress(f"rank {r}: owners of {n} nodes")
    directory = _Directory(comm, n, owned)

    # 3. edges, routed to their destination's owner
    # a rank's own table may fail here alone (a text column, a bad cast): every rank learns why
    got, problem = _attempt(lambda: con.sql(
        f"SELECT min(least(src::BIGINT, dst::BIGINT)), max(greatest(src::BIGINT, "
        f"dst::BIGINT)), count(*), count(*) FILTER (src IS NULL OR dst IS NULL) "
        f"FROM ({edge_sql})").fetchall()[0])
    lo, hi, raw, nulls = got if got is not None else (0, 0, 0, 0)
    if problem is not None:
        problem = (f"the edge table {str(edges)!r} cannot be read as integer node ids "
                   f"({problem}); give integer columns src and dst")
    elif nulls:     # `src <> dst` below would drop them without a word
        problem = (f"the edge table {str(edges)!r} holds {nulls} row(s) with a null src or "
                   f"dst (of {raw}); expected a node id at both ends of every edge: drop "
                   f"those rows or fill in their ids")
    elif raw and (lo < 0 or hi >= n):
        problem = (f"the edge table {str(edges)!r} holds node id {lo if lo < 0 else hi}, outside "
                   f"[0, {n}) where {n} is the number of rows of all ranks' node tables; "
                   f"renumber the nodes from 0 or add their rows")
    _agree(comm, problem)
    both = (edge_sql if directed else
            f"SELECT src, dst FROM ({edge_sql}) UNION ALL SELECT dst, src FROM ({edge_sql})")
    _, problem = _attempt(lambda: con.execute(
        f"CREATE TABLE mine AS SELECT DISTINCT src::BIGINT AS src, dst::BIGINT AS dst "
        f"FROM ({both}) WHERE src <> dst"))
    _agree(comm, None if problem is None else
           f"the edge table {str(edges)!r}: {problem}; give integer columns src and dst")
    progress(f"rank {r}: routing {raw} edge rows to their owners")
    batches, k = _rows(con, "SELECT src, dst FROM mine", B), 0
    while True:
        b = next(batches, None)
        if not _more(comm, b is not None):
            break
        src, dst = (b["src"], b["dst"]) if b is not None else (np.zeros(0, np.int64),) * 2
        owner = directory.lookup(np.concatenate([src, dst]))
        ps, pd = owner[:src.size], owner[src.size:]
        got = _a2a(comm, _by_dest(pd, P, np.stack([src, dst, ps], 1)), "prepare_edges")
        rows = np.concatenate(got)
        np.save(work / f"recv-{k}.npy", rows)
        k += 1
    con.execute("DROP TABLE mine")
    _load_received(con, work, k)
    m_loc = con.sql("SELECT count(*) FROM e").fetchall()[0][0]
    n_own = owned.size
    in_deg = np.zeros(n_own, dtype=np.int64)
    last = -1
    for b in _rows(con, "SELECT dst FROM e", B):
        last = _check_sorted(b["dst"], last)
        in_deg += np.bincount(_local(owned, b["dst"]), minlength=n_own)
    out_deg = in_deg
    if directed:    # out-degrees of the sources, counted here, summed at their owners
        out_deg = np.zeros(n_own, dtype=np.int64)
        batches = _rows(con, "SELECT src, ps, count(*) AS c FROM e GROUP BY src, ps", B)
        while True:
            b = next(batches, None)
            if not _more(comm, b is not None):
                break
            rows = np.zeros((0, 2), np.int64) if b is None else np.stack([b["src"], b["c"]], 1)
            dest = np.zeros(0, np.int64) if b is None else b["ps"]
            got = np.concatenate(_a2a(comm, _by_dest(dest, P, rows), "prepare_degrees"))
            out_deg += np.bincount(_local(owned, got[:, 0]), weights=got[:, 1],
                                   minlength=n_own).astype(np.int64)

    # 4. halos: the remote sources, ordered by (owner, id); the requests are the send plans
    progress(f"rank {r}: halo")
    h = con.sql(f"SELECT DISTINCT ps, src FROM e WHERE ps <> {r} ORDER BY ps, src").fetchnumpy()
    halo, halo_owner = h["src"].astype(np.int64), h["ps"].astype(np.int64)
    cut = con.sql(f"SELECT count(*) FROM e WHERE ps <> {r}").fetchall()[0][0]
    recv_counts = np.bincount(halo_owner, minlength=P).astype(np.int64)
    plans: list[list[np.ndarray]] = [[] for _ in range(P)]
    hdeg_parts, at = [], 0
    while _more(comm, at < halo.size):      # rounds of B halo nodes, in (owner, id) order
        ask = np.bincount(halo_owner[at:at + B], minlength=P)
        asked = _a2a(comm, np.split(halo[at:at + B], np.cumsum(ask)[:-1]), "prepare_halo")
        sends = [_local(owned, a) for a in asked]
        for j, s in enumerate(sends):
            plans[j].append(s)
        answer = [np.stack([in_deg[s], out_deg[s]], 1) for s in sends]
        hdeg_parts += _a2a(comm, answer, "prepare_halo", ask.tolist())
        at += B
    sends = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in plans]
    hdeg = np.concatenate(hdeg_parts) if hdeg_parts else np.zeros((0, 2), np.int64)

    # the part's files
    d = tmp / f"part-{r}"
    d.mkdir()
    np.save(d / "owned.npy", owned)
    np.save(d / "halo.npy", halo)
    np.save(d / "halo_owner.npy", halo_owner)
    own_y, own_split, digest, problem = _write_nodes(con, d, src_nodes, owned, x_dtype)
    _agree(comm, problem)      # NaN/Inf features on one rank: refused on every rank
    indptr = np.zeros(n_own + 1, dtype=np.int64)
    np.cumsum(in_deg, out=indptr[1:])
    _write_indices(con, d, owned, halo, halo_owner, r, n, int(indptr[-1]), B)
    np.save(d / "indptr.npy", indptr)
    np.save(d / "in_degree.npy", np.concatenate([in_deg, hdeg[:, 0]]).astype(np.int64))
    np.save(d / "out_degree.npy", np.concatenate([out_deg, hdeg[:, 1]]).astype(np.int64))
    np.save(d / "recv_counts.npy", recv_counts)
    np.save(d / "send_idx.npy", np.concatenate(sends).astype(np.int64))
    np.save(d / "send_counts.npy", np.array([s.size for s in sends], dtype=np.int64))

    # 5. totals, then the assignment and the fingerprint at rank 0
    codes = np.bincount(own_split, minlength=4).astype(np.int64)
    tot = torch.from_numpy(np.array([m_loc, codes[TRAIN], codes[VAL], codes[TEST]], np.int64))
    m, n_train, n_val, n_test = (int(v) for v in comm.all_reduce(
        tot, "prepare_control", carries=Traffic.CONTROL))
    # every rank has the same totals: every rank refuses alike what training would refuse
    check_split_counts(name, n_train, n_val, n_test, n - n_train - n_val - n_test,
                       fix="give the node tables a split column with train, val and test "
                           "rows (over all the ranks), or more nodes")
    progress(f"rank {r}: fingerprint (rank 0 hashes the graph in id order)")
    fp = gather_fingerprint(comm, con, tmp, owned, in_deg, own_y, own_split, n, F, B)
    ids = comm.all_gather_object(fp, "prepare_control", carries=Traffic.CONTROL)[0]
    fingerprint, book_id = ids["fingerprint"], ids["book_id"]
    scalars = {"rank": r, "num_parts": P, "num_nodes_global": n, "num_edges_global": m,
               "num_classes": src_nodes.num_classes, "num_train_global": n_train,
               "num_val_global": n_val, "num_test_global": n_test, "graph_name": name,
               "graph_fingerprint": fingerprint, "book_id": book_id,
               "meta": {"evaluator": None}}
    (d / "part.json").write_text(json.dumps(scalars, indent=1))
    missing = set(PART_ARRAYS) - {f.stem for f in d.glob("*.npy")}
    if missing:
        raise RuntimeError(f"part {r} lacks {sorted(missing)} (a bug in the prepare path)")
    per = comm.all_gather_object([n_own, int(m_loc), int(halo.size), int(cut)],
                                 "prepare_control", carries=Traffic.CONTROL)
    nodes_, edges_, halos, cuts = ([p[i] for p in per] for i in range(4))
    whole = FeaturesDigest(F)      # every rank's share of the features' digest, summed
    # a share is a linear function of the rank's feature bits (one node's row comes back
    # from it exactly), so it travels as what it is derived from
    for rows, acc in comm.all_gather_object((digest.rows, digest.acc.tobytes()),
                                            "prepare_control", carries=Traffic.FEATURES):
        whole.merge(rows, acc)
    stats = {"num_parts": P, "nodes": nodes_, "edges": edges_, "halo": halos,
             "edge_cut": sum(cuts),
             "edge_cut_fraction": float(np.float32(sum(cuts) / m)) if m else 0.0,
             "balance": float(np.max(nodes_) / np.mean(nodes_)), "halo_total": sum(halos),
             "replication_factor": float((n + sum(halos)) / n)}
    ident = {"name": name, "num_nodes": n, "num_edges": m, "num_features": F,
             "num_classes": src_nodes.num_classes, "fingerprint": fingerprint,
             "features_digest": whole.hexdigest(), "source": source, "split_seed": split_seed}
    if src_nodes.label_names:
        ident["label_names"] = list(src_nodes.label_names)     # class k is label_names[k]
    return {"book_id": book_id, "num_parts": P, "method": "given", "seed": 0,
            "options": {"streamed": True, "distributed": True}, "graph": ident,
            "stats": stats}


def _local(owned: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Positions of ``ids`` in the sorted ``owned``; every id must be there."""
    pos = np.searchsorted(owned, ids)
    if ids.size and (pos.max() >= owned.size or not (owned[pos] == ids).all()):
        raise RuntimeError("a rank received ids of nodes it does not own (a bug in the "
                           "distributed prepare)")
    return pos


def _load_received(con: Any, work: Path, k: int) -> None:
    """The edges this rank received, de-duplicated (several ranks may hold the same edge) and
    sorted by (dst, src): the CSR order of its part."""
    import pyarrow as pa
    con.execute("CREATE TABLE recv (src BIGINT, dst BIGINT, ps INTEGER)")
    for i in range(k):
        rows = np.load(work / f"recv-{i}.npy", allow_pickle=False)
        chunk = pa.table({"src": rows[:, 0], "dst": rows[:, 1], "ps": rows[:, 2].astype(np.int32)})
        con.register("chunk", chunk)
        con.execute("INSERT INTO recv SELECT * FROM chunk")
        con.unregister("chunk")
        (work / f"recv-{i}.npy").unlink()
    con.execute("CREATE TABLE e AS SELECT DISTINCT src, dst, ps FROM recv ORDER BY dst, src")
    con.execute("DROP TABLE recv")
    con.execute("CHECKPOINT")


def _write_nodes(con: Any, d: Path, src_nodes: Any, owned: np.ndarray, x_dtype: str
                 ) -> tuple[np.ndarray, np.ndarray, FeaturesDigest, Optional[str]]:
    """x, y and the masks of this rank's nodes (its node table in id order); returns y and
    the split codes (kept for the fingerprint), this rank's share of the features' digest
    (the rows as read, before any narrowing to ``x_dtype``) and the first NaN/Inf feature
    found, in the words of the single-process prepare (None: all finite)."""
    problem = None
    c = owned.size
    digest = FeaturesDigest(src_nodes.num_features)
    xw = NpyWriter(d / "x.npy", x_dtype, (c, src_nodes.num_features))
    y = np.zeros(c, dtype=np.int64)
    split = np.zeros(c, dtype=np.uint8)
    at = 0
    for blk in src_nodes.blocks(con):
        k = blk.ids.size
        if not (blk.ids == owned[at:at + k]).all():
            raise RuntimeError("the node table changed while it was read")
        if problem is None:
            try:
                _check_finite(src_nodes, blk.ids, blk.x, x_dtype)
            except ValueError as exc:
                problem = str(exc)
        xw.write(blk.x)
        digest.update(blk.x, blk.ids)
        y[at:at + k], split[at:at + k] = blk.y, blk.split
        at += k
    xw.close()
    np.save(d / "y.npy", y)
    for code, mask in ((TRAIN, "train_mask"), (VAL, "val_mask"), (TEST, "test_mask")):
        np.save(d / f"{mask}.npy", split == code)
    return y, split, digest, problem


def _write_indices(con: Any, d: Path, owned: np.ndarray, halo: np.ndarray,
                   halo_owner: np.ndarray, r: int, n: int, e_loc: int, B: int) -> None:
    """The part's CSR columns as local ids (owned first, then the halo), streamed."""
    n_own = owned.size
    wide = n_own + halo.size >= 2 ** 31
    idx = NpyWriter(d / "indices.npy", np.int64 if wide else np.int32, (e_loc,))
    halo_key = halo_owner * n + halo                    # ascending: ordered by (owner, id)
    last = -1
    for b in _rows(con, "SELECT dst, src, ps FROM e", B):
        last = _check_sorted(b["dst"], last)
        src, ps = b["src"], b["ps"]
        loc = np.empty(src.size, dtype=np.int64)
        mine = ps == r
        loc[mine] = lookup(owned, src[mine])
        loc[~mine] = n_own + lookup(halo_key, ps[~mine] * n + src[~mine])
        idx.write(loc)
    idx.close()
