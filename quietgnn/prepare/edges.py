"""The edge streams of the out-of-core prepare (:mod:`quietgnn.prepare.tables`): DuckDB's
sorted edge table read back in record batches, each pair once; LDG over that stream; the
pairs tagged with their ends' parts and written to a Parquet file, and read back from it.
Everything relies on the streams coming in (dst, src) order, and checks it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..partition.partitioners import LDG, LDG_PASSES
from .arrays import BATCH_ROWS

__all__ = ["tagged_batches", "METIS_BYTES_PER_EDGE"]


def _tagged_schema():
    import pyarrow as pa
    return pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("ps", pa.uint16()),
                      ("pd", pa.uint16())])


def _batches(con, sql: str) -> Iterator[dict[str, np.ndarray]]:
    reader = con.sql(sql).to_arrow_reader(BATCH_ROWS)
    try:
        for batch in reader:
            yield {name: batch.column(i).to_numpy(zero_copy_only=False)
                   for i, name in enumerate(batch.schema.names)}
    finally:
        reader.close()      # hand the query's buffers back now, not when collected


def _stream_ldg(con, n: int, P: int, progress: Callable[[str], None]) -> np.ndarray:
    """:class:`~quietgnn.partition.partitioners.LDG` over the sorted edge table ``e0``, streamed
    in record batches, ``LDG_PASSES`` times: the same assignment as ``ldg_parts`` in memory
    (the same node batches see the same edges)."""
    ldg = LDG(n, P)
    for p in range(LDG_PASSES):
        progress(f"ldg partitioning: pass {p + 1} of {LDG_PASSES}")
        lo, D, S = 0, np.zeros(0, np.int64), np.zeros(0, np.int64)
        for dst, src in _unique_edges(con, "e0"):
            D, S = np.concatenate([D, dst]), np.concatenate([S, src])
            done = int(D[-1])            # rows are sorted by dst: nodes below it are complete
            while lo + ldg.batch <= done:
                hi = lo + ldg.batch
                cut = int(np.searchsorted(D, hi))
                ldg.place(lo, hi, D[:cut], S[:cut])
                D, S, lo = D[cut:], S[cut:], hi
        while lo < n:
            hi = min(lo + ldg.batch, n)
            cut = int(np.searchsorted(D, hi))
            ldg.place(lo, hi, D[:cut], S[:cut])
            D, S, lo = D[cut:], S[cut:], hi
    return ldg.parts


#: bytes a METIS partition is budgeted per stored (directed) edge: the CSR's int64 column
#: ids here (8), pymetis' copy of them and METIS' coarsened graphs (taken as twice that again)
METIS_BYTES_PER_EDGE = 24


def _stream_metis(con, n: int, P: int, seed: int, undirected: bool, budget: int,
                  progress: Callable[[str], None]) -> np.ndarray:
    """METIS (:func:`~quietgnn.partition.partitioners.metis_parts`' call) on the sorted edge
    table ``e0``, read into an in-memory CSR: the same assignment as in memory, for a graph
    whose adjacency fits ``budget`` bytes (METIS has no streaming form; ``ldg`` has)."""
    from ..partition.partitioners import _fill_empty
    rows = int(con.sql("SELECT count(*) FROM e0").fetchall()[0][0])
    need = METIS_BYTES_PER_EDGE * rows * (1 if undirected else 2) + 16 * n
    if need > budget:
        raise ValueError(f"--partitioner metis holds the graph's adjacency in memory: about "
                         f"{need >> 20} MiB for {rows} stored edges, over the --memory-budget "
                         f"of {budget >> 20} MiB; pass --memory-budget {(need >> 20) + 512}MiB "
                         f"or more, or use --partitioner ldg (streamed)")
    progress(f"metis partitioning: {rows} edges into memory")
    dst, src = np.empty(rows, np.int64), np.empty(rows, np.int64)
    k = 0
    for d, s_ in _unique_edges(con, "e0"):
        dst[k:k + d.size], src[k:k + d.size] = d, s_
        k += d.size
    dst, src = dst[:k], src[:k]
    if not undirected:   # METIS needs both directions: each pair once, sorted by (dst, src)
        key = np.unique(np.concatenate([dst * n + src, src * n + dst]))
        dst, src = key // n, key % n
        del key
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    del dst
    if P == 1:
        return np.zeros(n, np.int16)
    import pymetis
    _, membership = pymetis.part_graph(
        P, adjacency=pymetis.CSRAdjacency(adj_starts=indptr, adjacent=src),
        options=pymetis.Options(seed=seed))
    return _fill_empty(np.asarray(membership, dtype=np.int64), P).astype(np.int16)


def _unique_edges(con, table: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(dst, src)`` batches of ``table`` (sorted by dst, src), each pair once: sorting left
    repeated pairs adjacent, so a row equal to the one before it (in its batch or at the end
    of the previous one) is dropped."""
    last, prev = -1, (-1, -1)
    for b in _batches(con, f"SELECT dst, src FROM {table}"):
        dst, src = b["dst"], b["src"]
        last = _check_sorted(dst, last)
        if not dst.size:
            continue
        same = dst[1:] == dst[:-1]
        first = (int(dst[0]), int(src[0]))
        # repeats are dropped only where they are adjacent: sources out of order within a
        # destination would leave some, an error rather than a wrong graph
        back = first[0] == prev[0] and first[1] < prev[1]
        if back or bool((same & (src[1:] < src[:-1])).any()):
            raise RuntimeError("DuckDB returned the sorted edge table out of (dst, src) order "
                               "(is preserve_insertion_order off?); the prepared graph would "
                               "keep repeated pairs")
        keep = np.empty(dst.size, dtype=bool)
        keep[0] = first != prev
        np.logical_or(~same, src[1:] != src[:-1], out=keep[1:])
        prev = (int(dst[-1]), int(src[-1]))
        if keep.all():
            yield dst, src
        elif keep.any():
            yield dst[keep], src[keep]


def _duck_memory(con) -> str:
    """What DuckDB holds now, by its own tags (the progress log's account of where its share
    goes: a run that runs out of it says which part grew)."""
    cur = con.cursor()      # ``con`` may be streaming a result
    try:
        rows = cur.sql("SELECT tag, memory_usage_bytes, temporary_storage_bytes "
                       "FROM duckdb_memory() WHERE memory_usage_bytes > 0 "
                       "OR temporary_storage_bytes > 0").fetchall()
    finally:
        cur.close()
    held = ", ".join(f"{t} {m >> 20}" for t, m, _ in rows if m >> 20)
    spilled = sum(int(x) for _, _, x in rows) >> 20
    return f"DuckDB holds {sum(int(m) for _, m, _ in rows) >> 20} MiB ({held or 'nothing'}), " \
           f"{spilled} MiB spilled"


def _add_parts(con, part_of: Callable[[np.ndarray], np.ndarray], path: Path,
               progress: Callable[[str], None] = lambda s: None) -> int:
    """The unique rows of ``e0`` in its order, with the parts of their source (``ps``) and
    destination (``pd``), written to the Parquet file ``path`` (read back by
    :func:`tagged_batches`); returns the number of rows. Computed in a stream and appended in
    order rather than joined in SQL: a join's output has no order, and sorting it again was the
    prepare's largest spill to disk. Written by Arrow's Parquet writer, not inserted into a
    DuckDB table: the 10^9-edge prepare ran out of DuckDB's memory share twice while
    inserting them (cause not found), the writer holds one row group, and a file read back
    front to back keeps its order without relying on DuckDB's insertion order."""
    import pyarrow as pa
    schema = _tagged_schema()
    writer = _tagged_writer(path)
    done = 0
    try:
        for k, (dst, src) in enumerate(_unique_edges(con, "e0")):
            writer.write_table(pa.table({"src": src, "dst": dst,
                                         "ps": part_of(src).astype(np.uint16),
                                         "pd": part_of(dst).astype(np.uint16)}, schema=schema),
                               row_group_size=BATCH_ROWS)
            done += dst.size
            if k % 256 == 255:
                progress(f"edges: {done:,} rows tagged; {_duck_memory(con)}")
    finally:
        writer.close()
    return done


def _tagged_writer(path: Path):
    import pyarrow.parquet as pq
    # sorted destinations and per-destination ascending sources: delta encoding stores them
    # in a few bits a row; part ids compress well without a dictionary
    return pq.ParquetWriter(str(path), _tagged_schema(), compression="zstd",
                            use_dictionary=False,
                            column_encoding={"src": "DELTA_BINARY_PACKED",
                                             "dst": "DELTA_BINARY_PACKED"})


def tagged_batches(path: Path, columns: list[str]) -> Iterator[dict[str, np.ndarray]]:
    """``columns`` of the tagged edges (:func:`_add_parts`) in their order, ``BATCH_ROWS``
    rows at a time."""
    import pyarrow.parquet as pq
    # not pre-buffered (Arrow's default): the pre-buffer cache keeps every range read until
    # the file is closed, so each pass over 10^9 edges grew the process by the whole file
    with pq.ParquetFile(str(path), pre_buffer=False) as f:
        for batch in f.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            yield {name: batch.column(i).to_numpy(zero_copy_only=False)
                   for i, name in enumerate(batch.schema.names)}


def _add_counts(deg: np.ndarray, ids_sorted: np.ndarray) -> None:
    """``deg[i] += occurrences of i`` for a sorted batch of ids (runs, no scatter-add)."""
    if ids_sorted.size:
        starts = np.flatnonzero(np.diff(ids_sorted)) + 1
        first = np.concatenate([[0], starts])
        deg[ids_sorted[first]] += np.diff(np.concatenate([first, [ids_sorted.size]])).astype(
            deg.dtype)


def _check_sorted(dst: np.ndarray, last: int) -> int:
    """Rows must come in destination order (DuckDB's insertion order of the sorted table, and
    the tagged edges' file written from it); returns the batch's last destination."""
    if dst.size and (int(dst[0]) < last or (dst.size > 1 and bool((np.diff(dst) < 0).any()))):
        raise RuntimeError("the sorted edges came back out of order (DuckDB's sorted table with "
                           "preserve_insertion_order off, or a damaged work file); the "
                           "prepared graph would be wrong")
    return int(dst[-1]) if dst.size else last


