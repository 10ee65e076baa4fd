"""Out of core: an edge table of any size + a node source -> a prepared directory.

The work that needs the whole edge list at once (drop self-loops, symmetrise, sort by
destination) is SQL run by DuckDB, which spills to its own temporary directory when the data
outgrows its memory limit. Python streams DuckDB's sorted output in record batches: it drops
repeated pairs (adjacent once sorted), partitions, tags each edge with its ends' parts (one
ordered pass written to a Parquet file, not a join that would need a second sort), and from
that file counts degrees, marks halos and writes each part's ``.npy`` arrays
(:mod:`quietgnn.partition.shards` layout); the streams are in :mod:`.edges`.
What Python holds: two int32 degree vectors and the assignment (10 bytes a node), what the
node source needs (e.g. a random split, 11 bytes a node), one part's owned and halo ids, and
a batch.

The parts are exactly what :func:`quietgnn.partition.build_partitions` builds from the same
graph in memory with the same partitioner (``ldg`` or ``hash``), and the graph fingerprint is
the one :meth:`quietgnn.graph.Graph.fingerprint` computes, so the two paths can be compared bit
for bit. Everything relies on DuckDB returning the sorted table's rows in insertion order (set,
and checked while streaming: rows out of order are an error, not a wrong graph).
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ..partition.book import PartitionBook, book_id_of, finish_book, new_book_dir
from ..partition.partitioners import hash_part_of
from ..partition.shards import PART_ARRAYS
from .arrays import BATCH_ROWS, NpyWriter, lookup, npy_chunks
from .edges import (_add_counts, _add_parts, _check_sorted, _duck_memory, _stream_ldg,
                    _stream_metis, tagged_batches)
from .nodes import TEST, TRAIN, VAL, NodeSource, _write_nodes, check_split_counts

__all__ = ["write_prepared", "BATCH_ROWS"]

#: what the Python process needs besides DuckDB and the degree vectors (interpreter, numpy,
#: torch's import, one batch's temporaries, Arrow's Parquet reader or writer)
_PYTHON_BASE = 512 << 20
#: DuckDB's memory_limit bounds its buffer manager, not every allocation it makes: it gets
#: this fraction of what is left of the budget (at 3e8 edges the whole share put the process
#: 1 % over a 4 GiB budget)
_DUCK_SHARE = 0.85
def sql_str(text: str | Path) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + str(text).replace("'", "''") + "'"


def sql_name(name: str) -> str:
    """A SQL identifier (double quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _connect(work: Path, duck_bytes: int, threads: int):
    import duckdb
    con = duckdb.connect(str(work / "prepare.duckdb"))
    con.execute(f"SET memory_limit = '{max(duck_bytes >> 20, 128)}MiB'")
    con.execute(f"SET temp_directory = {sql_str(work / 'spill')}")
    con.execute(f"SET threads = {threads}")
    # scans of the sorted edge table come back in its order (the CSR order)
    con.execute("SET preserve_insertion_order = true")
    return con


def write_prepared(out: str | Path, edges_sql: str, nodes: NodeSource, *, num_parts: int,
                   method: str = "ldg", seed: int = 0, undirected: bool = True,
                   memory_budget: int = 4 << 30,
                   x_dtype: str = "float32", name: str = "graph",
                   identity: Optional[dict[str, Any]] = None, threads: int = 2,
                   progress: Callable[[str], None] = lambda s: None,
                   con_hook: Optional[Callable[[Any], None]] = None,
                   hook_held: int = 0, drop: tuple[str, ...] = (),
                   assignment: Optional[np.ndarray] = None,
                   overwrite: bool = True) -> PartitionBook:
    """Prepare ``edges_sql`` (a DuckDB query with integer columns ``src``, ``dst``; ids in
    ``[0, N)``) and ``nodes`` into ``out``, ``num_parts`` parts by the ``method`` partitioner
    (``ldg``: streamed LDG, some passes over the sorted edges; ``hash``: from the id alone;
    ``given``: ``assignment``, one part id per node, checked; ``metis``: METIS on the
    adjacency read into memory, DuckDB held at its floor meanwhile).
    ``con_hook(con)`` runs first (e.g. to load generated edges into a table the query reads),
    holding ``hook_held`` bytes of its own meanwhile (DuckDB's share is smaller while it runs);
    the tables in ``drop`` are dropped once the edges are sorted; ``overwrite``:
    :func:`~quietgnn.partition.book.finish_book`'s."""
    out = Path(out)
    n, P = nodes.num_nodes, num_parts
    if not 1 <= P <= n:
        raise ValueError(f"--parts {P}: expected between 1 and the {n} nodes")
    if n >= 1 << 32:
        raise ValueError(f"{n} nodes: the streaming path takes node ids below 2^32")
    if not 1 <= P <= 65535:
        raise ValueError(f"--parts {P}: the prepared format stores part ids in 16 bits; expected "
                         f"1 .. 65535")
    if x_dtype not in ("float32", "float16"):
        raise ValueError(f"x_dtype = {x_dtype!r}; expected float32 or float16")
    if out.exists() and not (out / "book.json").is_file():
        raise ValueError(f"--out {str(out)!r} exists and is not a prepared directory; choose "
                         f"another --out or remove it (a prepared one is replaced)")
    if method not in ("ldg", "hash", "given", "metis"):
        raise ValueError(f"--partitioner {method}: out of core, quietgnn partitions with ldg "
                         f"(streamed, min edge cut; the default), hash, given (with "
                         f"--partition.file) or metis (the adjacency in memory); random and "
                         f"supernode need the whole graph in memory (`quietgnn prepare "
                         f"--dataset`)")
    if method == "given":
        from ..partition.partitioners import check_assignment
        if assignment is None:
            raise ValueError("--partitioner given needs --partition.file PATH (.npy, .pt or "
                             "text, one part id per node)")
        assignment = check_assignment(assignment, n, P)
    # the most this process holds beside DuckDB: after the edges are tagged (while the hook
    # runs: the hook's own)
    held = max(_held_late(n, P, getattr(nodes, "held_bytes", 0)), hook_held)
    duck = memory_budget - held - _PYTHON_BASE
    if duck < 128 << 20:
        raise ValueError(
            f"--memory-budget {memory_budget >> 20} MiB is too small for {n} nodes: this "
            f"prepare holds {held >> 20} MiB of its own arrays plus ~{_PYTHON_BASE >> 20} MiB "
            f"for Python, and DuckDB needs at least 128 MiB; pass --memory-budget "
            f"{(held + _PYTHON_BASE + (256 << 20)) >> 20}MiB or more")
    import duckdb
    tmp = new_book_dir(out)
    work = tmp / ".work"
    work.mkdir()
    con = None
    try:
        con = _connect(work, int(_DUCK_SHARE * (memory_budget - hook_held - _PYTHON_BASE)),
                       threads)
        # DuckDB's share follows what this process holds beside it, which grows stage by
        # stage: only the assignment (and the node source's arrays) while DuckDB sorts and
        # streams the sorted edges out (LDG, tagging), its largest work; the degrees, halo
        # marks and a part's ids only afterwards (a share sized for those all along ran the
        # tagging out of memory at 10^8 nodes)
        early = max(memory_budget - _held_early(n, method, getattr(nodes, "held_bytes", 0))
                    - _PYTHON_BASE, duck)
        limit = [0]

        def share(free: int) -> None:
            limit[0] = int(_DUCK_SHARE * free)
            con.execute(f"SET memory_limit = '{limit[0] >> 20}MiB'")
        try:
            if con_hook is not None:
                con_hook(con)
            share(early)

            def metis_room() -> int:
                # METIS' adjacency is this process's own: DuckDB at its floor meanwhile
                share(int((128 << 20) / _DUCK_SHARE))
                return memory_budget - _PYTHON_BASE - (128 << 20) \
                    - _held_early(n, method, getattr(nodes, "held_bytes", 0))
            book = _prepare(con, tmp, out, edges_sql, nodes, P, method, seed, undirected,
                            x_dtype, name, identity or {}, progress, drop, assignment,
                            late=lambda: share(duck), metis_room=metis_room,
                            early=lambda: share(early))
        except duckdb.OutOfMemoryException as e:
            first = str(e).splitlines()[0]
            if "offload" in first or "temp" in first:    # the spill directory is full
                raise ValueError(
                    f"DuckDB could not spill to {work / 'spill'} ({first}): the disk under "
                    f"--out is full; free space there or choose an --out on a larger disk"
                ) from None
            raise ValueError(
                f"--memory-budget {memory_budget >> 20} MiB: DuckDB ran out of its share "
                f"({limit[0] >> 20} MiB then; the rest, at most: {held >> 20} MiB of per-node "
                f"arrays, ~{_PYTHON_BASE >> 20} MiB for Python) on {n} nodes ({first}); pass "
                f"a larger --memory-budget (e.g. {2 * memory_budget >> 20}MiB)") from None
        except OSError as e:    # Arrow's writer or the part arrays' (not DuckDB's spill)
            if e.errno != errno.ENOSPC and "No space left" not in str(e):
                raise
            raise ValueError(f"the disk under --out ({out.parent}) is full ({e}); free space "
                             f"there or choose an --out on a larger disk") from None
        con.close()
        con = None
        shutil.rmtree(work)
        finish_book(tmp, out, book, overwrite=overwrite)
    except BaseException:
        if con is not None:         # closed before its files are removed
            con.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PartitionBook.open(out)


def _held_early(n: int, method: str, node_held: int) -> int:
    """Bytes this process holds beside DuckDB while it sorts and tags the edges: the
    assignment (LDG's int16 parts; a given one as int64) and the node source's arrays."""
    return (8 if method == "given" else 2) * n + node_held


def _held_late(n: int, P: int, node_held: int) -> int:
    """... and afterwards, at most: degrees, the assignment, the node source's, the halo
    marks (P bytes a node), one part's ids and keys (a halo taken as twice the part: an
    estimate; the benchmark measures the real peak)."""
    return (10 + P) * n + node_held + 56 * ((n + P - 1) // P)


def _prepare(con, tmp: Path, out: Path, edges_sql: str, nodes: NodeSource, P: int,
             method: str, seed: int, undirected: bool, x_dtype: str, name: str,
             identity: dict[str, Any],
             progress: Callable[[str], None], drop: tuple[str, ...],
             given: Optional[np.ndarray] = None,
             late: Callable[[], None] = lambda: None,
             metis_room: Callable[[], int] = lambda: 0,
             early: Callable[[], None] = lambda: None) -> dict[str, Any]:
    n = nodes.num_nodes
    lo, hi, raw, nulls = con.sql(
        f"SELECT min(least(src, dst)), max(greatest(src, dst)), count(*), count(*) FILTER "
        f"(src IS NULL OR dst IS NULL) FROM ({edges_sql})").fetchall()[0]
    if nulls:   # dropped by `src <> dst` below, without a word
        raise ValueError(f"the edge table holds {nulls} row(s) with a null src or dst (of "
                         f"{raw}); expected a node id at both ends of every edge: drop those "
                         f"rows or fill in their ids")
    if raw and (lo < 0 or hi >= n):
        raise ValueError(f"the edge table holds node id {lo if lo < 0 else hi}, outside [0, {n}) "
                         f"where {n} is the number of nodes in the node table; renumber nodes "
                         f"from 0 or add their rows")
    progress(f"edges: {raw} rows read; symmetrising and sorting (DuckDB)")
    both = (f"SELECT src, dst FROM ({edges_sql}) UNION ALL SELECT dst, src FROM ({edges_sql})"
            if undirected else edges_sql)
    # sorted, not DISTINCT: repeated pairs end up adjacent and the streams below drop them
    # (:func:`_unique_edges`); DuckDB's DISTINCT is a hash table that needs more memory and
    # spills more than the sort alone
    con.execute(f"CREATE TABLE e0 AS SELECT src::BIGINT AS src, dst::BIGINT AS dst "
                f"FROM ({both}) WHERE src <> dst ORDER BY dst, src")
    for table in drop:
        con.execute(f"DROP TABLE {table}")
    if method == "hash":
        def part_of(ids: np.ndarray) -> np.ndarray:
            return hash_part_of(ids, P, seed)
    else:
        if method == "metis":
            assignment = _stream_metis(con, n, P, seed, undirected, metis_room(), progress)
            early()     # the adjacency freed: DuckDB's share back for the tagging
        else:
            assignment = given if method == "given" else _stream_ldg(con, n, P, progress)

        def part_of(ids: np.ndarray) -> np.ndarray:
            return assignment[ids].astype(np.int64)
    progress("edges: each pair once, with the parts of its ends")
    edges = tmp / ".work" / "e.parquet"
    m = _add_parts(con, part_of, edges, progress)
    progress(f"edges tagged; {_duck_memory(con)}; dropping the untagged table")
    con.execute("DROP TABLE e0")
    con.execute("CHECKPOINT")       # hand the dropped tables' disk space back
    late()                          # DuckDB's smaller share, before the per-node arrays
    # degrees by streaming, not by GROUP BY: a hash aggregate over N groups is what runs
    # DuckDB out of memory first (10^7+ nodes in a few GiB); the tagged file is sorted by dst
    progress("degrees")
    in_deg = np.zeros(n, dtype=np.int32)
    last = -1
    for b in tagged_batches(edges, ["dst"]):
        last = _check_sorted(b["dst"], last)
        _add_counts(in_deg, b["dst"])
    if undirected:          # every edge is stored both ways
        out_deg = in_deg
    else:
        out_deg = np.zeros(n, dtype=np.int32)
        for b in tagged_batches(edges, ["src"]):
            _add_counts(out_deg, np.sort(b["src"]))

    # the nodes, one pass in id order, into every part's arrays at once
    progress(f"nodes: {n} rows into {P} parts")
    part_dirs = [tmp / f"part-{k}" for k in range(P)]
    owned_n = np.zeros(P, dtype=np.int64)
    for lo_ in range(0, n, BATCH_ROWS):
        owned_n += np.bincount(part_of(np.arange(lo_, min(lo_ + BATCH_ROWS, n))), minlength=P)
    if (owned_n == 0).any():
        raise ValueError(f"the {method} partitioner leaves part(s) "
                         f"{np.nonzero(owned_n == 0)[0].tolist()} of {P} empty on {n} nodes; "
                         f"use fewer parts")
    counts, features_digest = _write_nodes(con, tmp, part_dirs, nodes, owned_n, P, part_of,
                                           x_dtype)
    # a split column was checked before the edges were sorted; a random split of a few
    # nodes can still leave a set empty, which training refuses
    check_split_counts(name, counts[TRAIN], counts[VAL], counts[TEST],
                       n - sum(counts.values()), fix=f"give the node table a split column "
                       f"with train, val and test rows, or more than {n} nodes")
    fingerprint = _fingerprint(edges, tmp, in_deg, nodes)

    # halos: remote in-neighbours of each part's nodes, ordered by (owner, id); one streamed
    # pass marking them (P x N bits' worth of bools), no DISTINCT in DuckDB
    progress("halos")
    marks = np.zeros((P, n), dtype=bool)
    cut = 0
    for b in tagged_batches(edges, ["src", "ps", "pd"]):
        sel = b["ps"] != b["pd"]
        marks[b["pd"][sel].astype(np.int64), b["src"][sel]] = True
        cut += int(sel.sum())
    halos = []
    for k in range(P):
        halo = np.flatnonzero(marks[k])
        owner = part_of(halo)
        order = np.argsort(owner, kind="stable")        # ids ascend within an owner
        np.save(part_dirs[k] / "halo.npy", halo[order].astype(np.int64))
        np.save(part_dirs[k] / "halo_owner.npy", owner[order].astype(np.int64))
        halos.append(int(halo.size))
    del marks
    if method == "given":   # the in-memory book's id: the graph and the assignment
        book_id = book_id_of(fingerprint, npy_chunks(tmp / "assignment.npy"))
    else:
        book_id = hashlib.sha256(f"{fingerprint}:{method}:{P}:{seed}".encode()).hexdigest()[:16]
    edges_per_part = []
    for k in range(P):
        progress(f"part {k}: edges")
        edges_per_part.append(_write_edges(con, edges, part_dirs, k, P, in_deg, out_deg))
        scalars = {"rank": k, "num_parts": P, "num_nodes_global": n, "num_edges_global": m,
                   "num_classes": nodes.num_classes, "num_train_global": counts[TRAIN],
                   "num_val_global": counts[VAL], "num_test_global": counts[TEST],
                   "graph_name": name, "graph_fingerprint": fingerprint, "book_id": book_id,
                   "meta": {"evaluator": None}}
        (part_dirs[k] / "part.json").write_text(json.dumps(scalars, indent=1))
    progress("parts written")
    for k in range(P):
        missing = set(PART_ARRAYS) - {f.stem for f in part_dirs[k].glob("*.npy")}
        if missing:
            raise RuntimeError(f"part {k} lacks {sorted(missing)} (a bug in the prepare path)")
    stats = {"num_parts": P, "nodes": owned_n.tolist(), "edges": edges_per_part,
             "halo": halos, "edge_cut": int(cut),
             "edge_cut_fraction": float(np.float32(cut / m)) if m else 0.0,
             "balance": float(owned_n.max() / owned_n.mean()), "halo_total": int(sum(halos)),
             "replication_factor": float((n + sum(halos)) / n)}
    ident = {"name": name, "num_nodes": n, "num_edges": int(m),
             "num_features": nodes.num_features, "num_classes": nodes.num_classes,
             "fingerprint": fingerprint, "features_digest": features_digest, **identity}
    if getattr(nodes, "label_names", None):
        ident["label_names"] = list(nodes.label_names)     # class k is label_names[k]
    return {"book_id": book_id, "num_parts": P, "method": method, "seed": seed,
            "options": {"streamed": True}, "graph": ident, "stats": stats}


def _fingerprint(edges: Path, tmp: Path, in_deg: np.ndarray, nodes: NodeSource) -> str:
    """:meth:`Graph.fingerprint` of the whole graph, streamed: indptr from the degrees, the
    sources in CSR order from the tagged edges' file, then labels and masks."""
    h = hashlib.sha256()
    n = in_deg.size
    h.update(np.zeros(1, dtype=np.int64).tobytes())
    total = 0
    for lo in range(0, n, BATCH_ROWS):
        c = np.cumsum(in_deg[lo:lo + BATCH_ROWS], dtype=np.int64) + total
        h.update(c.tobytes())
        total = int(c[-1])
    for b in tagged_batches(edges, ["src"]):
        h.update(np.ascontiguousarray(b["src"], dtype=np.int64).tobytes())
    for chunk in npy_chunks(tmp / ".work" / "y.npy"):
        h.update(chunk.tobytes())
    for code in (TRAIN, VAL, TEST):
        for chunk in npy_chunks(tmp / ".work" / "split.npy"):
            h.update((chunk == code).tobytes())
    h.update(str((n, nodes.num_features)).encode())
    return h.hexdigest()[:16]


def _write_edges(con, edges: Path, part_dirs: list[Path], k: int, P: int, in_deg: np.ndarray,
                 out_deg: np.ndarray) -> int:
    """Part ``k``'s CSR (local ids), degrees and send plans, from the tagged ``edges``;
    returns its edge count. (``con``: DuckDB, at its share for this stage.)

    Beside the degree vectors it holds the part's owned and halo ids and its ``indptr`` (the
    lookups need them in memory), and nothing else of the part's size: the halo is looked up
    one owner's (ascending) block at a time instead of through an (owner, id) key array, the
    degrees are written a slice at a time, and the other parts' halos are read mapped (a
    slice of each)."""
    d = part_dirs[k]
    owned = np.load(d / "owned.npy")
    halo = np.load(d / "halo.npy")
    # the halo is ordered by (owner, id): owner j's block is halo[at[j]:at[j + 1]]
    counts = np.bincount(np.load(d / "halo_owner.npy"), minlength=P).astype(np.int64)
    at_owner = np.concatenate([[0], np.cumsum(counts)])
    n_own, n_halo = owned.size, halo.size
    indptr = np.zeros(n_own + 1, dtype=np.int64)
    np.cumsum(in_deg[owned], dtype=np.int64, out=indptr[1:])
    e_loc = int(indptr[-1])
    wide = n_own + n_halo >= 2 ** 31
    idx = NpyWriter(d / "indices.npy", np.int64 if wide else np.int32, (e_loc,))
    at, last = 0, -1
    for b in tagged_batches(edges, ["dst", "src", "ps", "pd"]):
        sel = b["pd"] == k
        last = _check_sorted(b["dst"][sel], last)
        src, ps = b["src"][sel].astype(np.int64), b["ps"][sel]
        loc = np.empty(src.size, dtype=np.int64)
        for j in range(P):
            from_j = ps == j
            if j == k:
                loc[from_j] = lookup(owned, src[from_j])
            elif from_j.any():
                block = halo[at_owner[j]:at_owner[j + 1]]
                loc[from_j] = n_own + at_owner[j] + lookup(block, src[from_j])
        idx.write(loc)
        at += src.size
    if at != e_loc:
        raise RuntimeError(f"part {k}: streamed {at} edges, the degrees say {e_loc}")
    idx.close()
    np.save(d / "indptr.npy", indptr)
    del indptr
    for name, deg in (("in_degree", in_deg), ("out_degree", out_deg)):
        w = NpyWriter(d / f"{name}.npy", np.int64, (n_own + n_halo,))
        for ids in (owned, halo):      # the local rows' order: [owned | halo]
            for lo in range(0, ids.size, BATCH_ROWS):
                w.write(deg[ids[lo:lo + BATCH_ROWS]])
        w.close()
    np.save(d / "recv_counts.npy", counts)
    sends = []
    for j in range(P):
        if j == k:
            sends.append(np.zeros(0, dtype=np.int64))
            continue
        oj = np.load(part_dirs[j] / "halo_owner.npy", mmap_mode="r")
        lo, hi = np.searchsorted(oj, k), np.searchsorted(oj, k, side="right")
        del oj
        hj = np.load(part_dirs[j] / "halo.npy", mmap_mode="r")
        sends.append(np.searchsorted(owned, np.asarray(hj[lo:hi])))
        del hj
    np.save(d / "send_idx.npy", np.concatenate(sends).astype(np.int64))
    np.save(d / "send_counts.npy", np.array([s.size for s in sends], dtype=np.int64))
    return e_loc
