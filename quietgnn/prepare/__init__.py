"""``quietgnn prepare``: a graph of any size -> a prepared directory, in bounded memory.

Three sources, one format (:mod:`quietgnn.partition.shards`):

* ``quietgnn prepare --dataset NAME`` - a dataset quietgnn loads (in memory; any partitioner);
* ``quietgnn prepare EDGES.parquet|EDGES.csv --nodes NODES.parquet|NODES.csv`` - a user's
  tables, out of core through DuckDB (:mod:`.tables`);
* ``quietgnn prepare synthetic --edges 1e9`` - the streaming generator (:mod:`.synthetic`),
  never whole in memory.

Out of core the graph is partitioned while streaming: ``ldg`` (the default; restreamed Linear
Deterministic Greedy), ``hash`` or ``given`` (``--partition.file``, one part id per node), or
``metis`` on the adjacency read into memory (the one not streamed; refused over the memory
budget); each gives the parts the in-memory path gives with the same partitioner. A graph
that arrives split across hosts is prepared by one process per host under torchrun
(:mod:`.dist`). Python API: :func:`prepare_tables`,
:func:`quietgnn.prepare.synthetic.prepare_synthetic`; train on the result with
``quietgnn train --data DIR``.

Tables. Edges: integer columns ``src`` and ``dst`` (a table of exactly two columns: those
two; float ids are refused, as the ``.npz`` loader refuses them, not rounded; a null one is
refused), node ids in ``[0, N)``; every edge is taken both ways unless ``--directed``;
self-loops and duplicates are dropped; no rows at all is a graph without edges (as an
``.npz`` without edges). Nodes: one row per node with ``id`` (0 .. N-1), ``y`` (or
``label``: class ids, or names, which become classes in sorted order, kept in the book as
``label_names``) and optionally ``split``: text ``train`` / ``val`` / ``test`` (case and
surrounding spaces ignored), or ``none`` / empty / null for a node in no split; any other
value is refused, and so is a split training would refuse (no train, validation or test
node: :func:`quietgnn.graph.check_trainable_split`); without the column a seeded random
60/20/20 split. Features are a list column ``x``, every
other numeric column in order, or sparse: a list column ``x_indices`` of each node's
non-zero feature ids (from 0), with a list column ``x_values`` of their values (the same
lengths; without it every value is 1, as in
one-hot and multi-hot features; a repeated id adds up). The width is the largest id + 1 (over
every host's table in a per-host prepare), at most :data:`MAX_SPARSE_WIDTH`. The prepared
parts hold the rows dense. A table without features is refused (the in-memory loaders'
degree-bucket features are not derived out of core).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ..partition.book import PartitionBook
from .nodes import NO_FEATURES_FIX, TEST, TRAIN, VAL, NodeBlock, check_split_counts
from .tables import sql_name, sql_str, write_prepared

__all__ = ["prepare_tables", "parse_size", "TableNodes", "MAX_SPARSE_WIDTH"]

_INT = r"(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|U\w*INT)"
#: the widest sparse features taken: a node's dense row is 4 bytes a column, and one row of
#: 2^24 columns (64 MiB) is already past any feature table; a wider id is a stray value (a
#: hash, a global token id) that would need gigabytes a row, not a real column number
MAX_SPARSE_WIDTH = 1 << 24
#: a node block's dense rows at most (wide features are cut into blocks of fewer rows)
_BLOCK_BYTES = 64 << 20
#: split values read as "in no split" (after lower(trim(.)); a null too)
_NO_SPLIT = ("none", "")


def parse_size(text: str) -> int:
    """``"4GiB"``, ``"512MiB"``, ``"2e9"`` (bytes) -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B|[KMGT]|B)?\s*", str(text))
    if not m:
        raise ValueError(f"--memory-budget {text!r}; expected a size like 4GiB, 512MiB or "
                         f"a number of bytes")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    try:
        value = float(m.group(1))
    except ValueError:
        raise ValueError(f"--memory-budget {text!r}; expected a size like 4GiB") from None
    if not math.isfinite(value) or value <= 0 or value > 2 ** 60:
        raise ValueError(f"--memory-budget {text!r}; expected a positive size like 4GiB")
    return int(value * 1024 ** " KMGT".index(unit or " ")) if unit else int(value)


def _reader(path: Path) -> str:
    """The DuckDB table function that reads ``path`` (Parquet or CSV)."""
    if not path.exists():
        raise ValueError(f"{str(path)!r} does not exist; expected a Parquet or CSV table")
    suffix = path.suffix.lower() if path.is_file() else ".parquet"
    if suffix in (".parquet", ".pq"):
        return f"read_parquet({sql_str(path if path.is_file() else path / '*.parquet')})"
    if suffix in (".csv", ".tsv", ".txt"):
        return f"read_csv({sql_str(path)}, header = true)"
    raise ValueError(f"{str(path)!r}: expected a .parquet or .csv file (or a directory of "
                     f".parquet files)")


def _columns(con: Any, reader: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM {reader}").fetchall()]


def _edge_sql(con: Any, path: Path) -> str:
    reader = _reader(path)
    types = dict(_columns(con, reader))
    cols = list(types)
    if {"src", "dst"} <= set(cols):
        ends = ["src", "dst"]
    elif len(cols) != 2:
        # which of several columns are the endpoints is not ours to guess: a weight read as
        # a node id trains on another graph without a word
        raise ValueError(f"edge table {str(path)!r} has columns {cols}; expected src and dst "
                         f"(or exactly two columns, read as source and destination): rename "
                         f"the endpoint columns src and dst")
    else:
        ends = cols
    for col in ends:
        _check_edge_ids(con, reader, path, col, types[col])
    if ends == ["src", "dst"]:
        return f"SELECT src, dst FROM {reader}"
    return f"SELECT {sql_name(cols[0])} AS src, {sql_name(cols[1])} AS dst FROM {reader}"


def _check_edge_ids(con: Any, reader: str, path: Path, col: str, typ: str) -> None:
    """An endpoint column holds integers: a float id was cast (rounded) to another node, or
    past the last one (the ``.npz`` loader refuses float ids alike). A column of another type
    is taken only on a table without rows (a CSV of a header alone reads as text)."""
    if re.match(_INT, typ):
        return
    name = sql_name(col)
    frac = re.match(r"(FLOAT|DOUBLE|REAL|DECIMAL)", typ)
    row = con.sql(f"SELECT {name} FROM {reader} WHERE {name} IS NOT NULL" +
                  (f" ORDER BY {name} <> floor({name}) DESC" if frac else "") + " LIMIT 1"
                  ).fetchall()
    if not row and not con.sql(f"SELECT count(*) FROM {reader}").fetchall()[0][0]:
        return
    value = row[0][0] if row else None
    try:
        whole = value is None or value == int(value)
    except (TypeError, ValueError, OverflowError):      # text, NaN, inf
        whole = False
    what = (f"non-integer node id {value}" if frac and not whole
            else f"{value!r}" if value is not None else "only nulls")
    raise ValueError(f"edge table {str(path)!r}: column {col} has type {typ} and holds "
                     f"{what}; expected integer node ids 0 .. N-1 (ids are not rounded): "
                     f"write the column as integers (e.g. int64), renumbering the nodes if "
                     f"their ids are not whole numbers")


class TableNodes:
    """A node table read through DuckDB in id order (see the module docstring)."""

    def __init__(self, con: Any, path: Path, split_seed: int = 0, whole: bool = True) -> None:
        """``whole=False``: the table is one rank's slice of the nodes (any global ids; the
        caller sets ``num_nodes`` and ``num_classes`` once the ranks agree on them, and reads
        ``count``, ``lo``, ``hi`` and ``ymax`` to check the slices)."""
        self.path, self.reader = path, _reader(path)
        cols = _columns(con, self.reader)
        names = [c for c, _ in cols]
        if "id" not in names:
            raise ValueError(f"node table {str(path)!r} has columns {names}; it needs an id "
                             f"column (0 .. N-1)")
        self.y_col = "y" if "y" in names else "label" if "label" in names else None
        if self.y_col is None:
            raise ValueError(f"node table {str(path)!r} has columns {names}; it needs a label "
                             f"column y (or label)")
        self.split_col = "split" if "split" in names else None
        #: train / val / test / in no split, from the split column (None: a random split)
        self.split_counts: Optional[tuple[int, int, int, int]] = None
        if self.split_col:
            self.split_counts = _split_counts(con, self.reader, path, dict(cols)["split"])
        rest = [(c, t) for c, t in cols if c not in ("id", self.y_col, "split")]
        #: the features' form: "list" (a list column x), "sparse" (x_indices [+ x_values]) or
        #: "columns" (one numeric column each)
        self.x_form = "columns"
        if [c for c, _ in rest] == ["x"] and "[" in rest[0][1]:     # FLOAT[] or FLOAT[128]
            self.x_form, self.x_cols = "list", ["x"]
        elif sorted(c for c, _ in rest) in (["x_indices"], ["x_indices", "x_values"]):
            self.x_form, self.x_cols = "sparse", sorted(c for c, _ in rest)
            _check_sparse_columns(con, self.reader, path, dict(rest))
        else:
            bad = [c for c, t in rest if not re.match(r"(TINYINT|SMALLINT|INTEGER|BIGINT|FLOAT|"
                                                       r"DOUBLE|DECIMAL|HUGEINT|U)", t)]
            if bad:
                raise ValueError(f"node table {str(path)!r}: column(s) {bad} are neither id, "
                                 f"y, split nor numeric features")
            self.x_cols = [c for c, _ in rest]
        types = dict(cols)
        y = sql_name(self.y_col)
        #: label names (a text label column): class k is the k-th name in sorted order
        self.label_names: Optional[list[str]] = None
        if types[self.y_col].startswith("VARCHAR"):
            # a slice's own names (the per-host prepare replaces them with every host's)
            self.label_names = sorted(str(r[0]) for r in con.sql(
                f"SELECT DISTINCT {y} FROM {self.reader} WHERE {y} IS NOT NULL").fetchall())
        for col in ("id",) + (() if self.label_names is not None else (self.y_col,)):
            if not re.match(r"(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|U)", types[col]):
                raise ValueError(f"node table {str(path)!r}: column {col} has type "
                                 f"{types[col]}, expected integers (or, for the labels, names)")
        yv = "0" if self.label_names is not None else y     # names: no numeric range to check
        n, lo, hi, ymin, ymax, nully = con.sql(
            f"SELECT count(*), min(id), max(id), min({yv}), max({yv}), count(*) - count({y}) "
            f"FROM {self.reader}").fetchall()[0]
        if self.label_names is not None:
            ymax = len(self.label_names) - 1
        self.count, self.lo, self.hi, self.ymax = int(n), lo, hi, ymax
        if not whole and n == 0:
            raise ValueError(f"node table {str(path)!r} is empty; every rank's slice needs at "
                             f"least one node (the rank's part)")
        if whole and (n == 0 or lo != 0 or hi != n - 1):
            raise ValueError(f"node table {str(path)!r} has {n} rows with ids {lo} .. {hi}; "
                             f"expected ids 0 .. N-1, one row each")
        if nully or ymin < 0:
            raise ValueError(f"node table {str(path)!r}: labels {self.y_col} hold "
                             f"{'nulls' if nully else f'{ymin}'}; expected class ids >= 0 on "
                             f"every row")
        self.num_nodes, self.num_classes = int(n), int(ymax) + 1
        if self.x_form == "sparse":
            top = con.sql(f"SELECT max(list_max(x_indices)) FROM {self.reader}").fetchall()[0][0]
            self.num_features = 0 if top is None else int(top) + 1
            if self.num_features > MAX_SPARSE_WIDTH:    # before a block of them is allocated
                at = con.sql(f"SELECT id FROM {self.reader} WHERE list_contains(x_indices, "
                             f"{int(top)}) LIMIT 1").fetchall()[0][0]
                raise ValueError(
                    f"node table {str(path)!r}: x_indices holds feature id {top} (node {at}), "
                    f"so the features would be {top + 1} columns wide, {(top + 1) * 4 >> 20} "
                    f"MiB a node once dense (the parts hold them dense); expected feature "
                    f"column numbers 0 .. F-1 with F <= {MAX_SPARSE_WIDTH}: renumber the "
                    f"feature ids densely (0 .. the number of distinct features - 1)")
        elif self.x_form == "list":
            fmin, fmax = con.sql(f"SELECT min(len(x)), max(len(x)) FROM {self.reader}"
                                 ).fetchall()[0]
            if fmin != fmax:
                raise ValueError(f"node table {str(path)!r}: feature lists x have lengths "
                                 f"{fmin} .. {fmax}; expected the same length on every row")
            self.num_features = int(fmin or 0)
        else:
            self.num_features = len(self.x_cols)
        # a host's slice of a sparse table may list no id: the hosts' largest decides
        if self.num_features < 1 and (whole or self.x_form != "sparse"):
            raise ValueError(f"node table {str(path)!r} has no feature columns" +
                             (" (x_indices lists no feature id on any row)"
                              if self.x_form == "sparse" else "") + "; " + NO_FEATURES_FIX)
        if whole and self.split_counts is not None:   # before the edges are sorted
            check_split_counts(str(path), *self.split_counts)
        self.split_seed = split_seed
        # a random split is drawn whole (the in-memory loaders' rule): randperm + codes
        self.held_bytes = 0 if self.split_col else 11 * self.num_nodes

    def blocks(self, con: Any) -> Iterator[NodeBlock]:
        from ..graph import random_split
        codes = None
        if self.split_col is None:     # the in-memory loaders' rule: seeded random 60/20/20
            tr, va, te = random_split(self.num_nodes, seed=self.split_seed)
            codes = (tr.numpy() * TRAIN + va.numpy() * VAL + te.numpy() * TEST).astype(np.uint8)
        xs = ", ".join(sql_name(c) for c in self.x_cols)
        split = ", lower(trim(split)) AS split" if self.split_col else ""
        reader = con.sql(f"SELECT id, {sql_name(self.y_col)} AS y{split}, {xs} FROM "
                         f"{self.reader} ORDER BY id").to_arrow_reader(1 << 16)
        # a block's dense x stays under _BLOCK_BYTES however wide the features
        step = max(1, min(1 << 16, _BLOCK_BYTES // (4 * max(self.num_features, 1))))
        for batch in (b.slice(lo, step) for b in reader for lo in range(0, b.num_rows, step)):
            ids = batch.column("id").to_numpy().astype(np.int64)
            if self.label_names is None:
                y = batch.column("y").to_numpy().astype(np.int64)
            else:
                y = np.searchsorted(np.array(self.label_names),
                                    np.array(batch.column("y").to_pylist(), dtype=str))
                y = y.astype(np.int64)
            if self.x_form == "sparse":
                x = _sparse_block(batch, ids.size, self.num_features)
            elif self.x_form == "list":
                flat = batch.column("x").flatten().to_numpy(zero_copy_only=False)
                x = np.asarray(flat, dtype=np.float32).reshape(ids.size, self.num_features)
            else:
                x = np.stack([batch.column(c).to_numpy(zero_copy_only=False)
                              for c in self.x_cols], axis=1).astype(np.float32)
            if self.split_col:
                s = np.array(batch.column("split").to_pylist(), dtype=object)
                sp = np.zeros(ids.size, dtype=np.uint8)
                sp[s == "train"], sp[s == "val"], sp[s == "test"] = TRAIN, VAL, TEST
            else:
                sp = codes[ids]
            yield NodeBlock(ids=ids, x=x, y=y, split=sp)


def _check_sparse_columns(con: Any, reader: str, path: Path, types: dict[str, str]) -> None:
    """x_indices: a list of integers >= 0 on every row; x_values (if any): a list of numbers
    as long as the row's x_indices."""
    where = f"node table {str(path)!r}"
    if not re.match(r"(TINYINT|SMALLINT|INTEGER|BIGINT|U\w*INT)\S*\[", types["x_indices"]):
        raise ValueError(f"{where}: column x_indices has type {types['x_indices']}; expected a "
                         f"list of integer feature ids (e.g. INTEGER[])")
    lo = con.sql(f"SELECT min(list_min(x_indices)) FROM {reader}").fetchall()[0][0]
    if lo is not None and lo < 0:
        raise ValueError(f"{where}: x_indices holds feature id {lo}; expected ids >= 0")
    if "x_values" in types:
        if not re.match(r"(TINYINT|SMALLINT|INTEGER|BIGINT|FLOAT|DOUBLE|DECIMAL|U)\S*\[",
                        types["x_values"]):
            raise ValueError(f"{where}: column x_values has type {types['x_values']}; expected "
                             f"a list of numbers (e.g. FLOAT[])")
        bad = con.sql(f"SELECT id, len(x_indices), len(x_values) FROM {reader} WHERE "
                      f"len(x_indices) != len(x_values) LIMIT 1").fetchall()
        if bad:
            i, a, b = bad[0]
            raise ValueError(f"{where}: node {i} has {a} x_indices but {b} x_values; expected "
                             f"one value per feature id")
    nulls = con.sql(f"SELECT count(*) FROM {reader} WHERE x_indices IS NULL").fetchall()[0][0]
    if nulls:
        raise ValueError(f"{where}: x_indices is null on {nulls} row(s); write an empty list "
                         f"for a node without features")


def _split_counts(con: Any, reader: str, path: Path, typ: str) -> tuple[int, int, int, int]:
    """(train, val, test, in no split) of a split column; any value but train / val / test
    (any case, spaces around ignored) or none / empty / null is refused: a typo (``training``,
    ``valid``) used to drop its nodes from every split without a word."""
    where = f"node table {str(path)!r}"
    accepted = ("expected train, val or test (any case), or none, empty or null for a node in "
                "no split")
    if not typ.startswith("VARCHAR"):
        raise ValueError(f"{where}: column split has type {typ}; {accepted}: write the split "
                         f"as text")
    s, none = "lower(trim(split))", ", ".join(sql_str(v) for v in _NO_SPLIT)
    known = f"('train', 'val', 'test', {none})"
    # the commonest unknown values, a few: a hash aggregate over the unknown values alone
    bad = con.sql(f"SELECT split, count(*) AS c, sum(count(*)) OVER () FROM {reader} WHERE "
                  f"{s} NOT IN {known} GROUP BY split ORDER BY c DESC, split LIMIT 4"
                  ).fetchall()
    if bad:
        shown = ", ".join(f"{v!r} ({c} row{'s' * (c != 1)})" for v, c, _ in bad[:3])
        raise ValueError(f"{where}: column split holds {int(bad[0][2])} row(s) of unknown "
                         f"value(s) {shown}{', ...' if len(bad) > 3 else ''}; {accepted}: "
                         f"rename those values")
    counts = con.sql(f"SELECT count(*) FILTER ({s} = 'train'), count(*) FILTER ({s} = 'val'), "
                     f"count(*) FILTER ({s} = 'test'), count(*) FILTER ({s} IS NULL OR {s} IN "
                     f"({none})) FROM {reader}").fetchall()[0]
    return tuple(int(c) for c in counts)    # type: ignore[return-value]


def _sparse_block(batch: Any, rows: int, width: int) -> np.ndarray:
    """The dense float32 rows of a record batch's x_indices [+ x_values] (a repeated id adds
    up, as scipy's CSR conversion does)."""
    col = batch.column("x_indices")
    lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    cols = col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    vals = batch.column("x_values").flatten().to_numpy(zero_copy_only=False).astype(
        np.float32) if "x_values" in batch.schema.names else np.ones(cols.size, np.float32)
    import scipy.sparse as sp
    indptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return sp.csr_matrix((vals, cols, indptr), shape=(rows, width)).toarray()


def prepare_tables(edges: str | Path, nodes: str | Path, out: str | Path, *, parts: int,
                   method: str = "ldg", seed: int = 0, directed: bool = False,
                   memory_budget: int = 4 << 30,
                   x_dtype: str = "float32", split_seed: int = 0, name: Optional[str] = None,
                   progress: Callable[[str], None] = lambda s: None,
                   partition_file: Optional[str | Path] = None,
                   overwrite: bool = True) -> PartitionBook:
    """Prepare a user's edge and node tables (Parquet or CSV, any size) into ``out``
    (``method="given"``: the parts are ``partition_file``'s, one part id per node)."""
    import duckdb
    edges, nodes = Path(edges), Path(nodes)
    con = duckdb.connect()      # only to read the tables' schemas and sizes
    node_src = TableNodes(con, nodes, split_seed)
    edge_sql = _edge_sql(con, edges)
    con.close()
    assignment = None
    if method == "given" and partition_file is not None:
        from ..partition.partitioners import read_assignment
        assignment = read_assignment(partition_file)
    return write_prepared(out, edge_sql, node_src, num_parts=parts, method=method, seed=seed,
                          undirected=not directed, memory_budget=memory_budget,
                          x_dtype=x_dtype, name=name or edges.stem, progress=progress,
                          identity={"source": str(edges), "split_seed": split_seed},
                          assignment=assignment, overwrite=overwrite)


def human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}P"


def _positive_int(text: str, what: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r}; expected a number like 1e9") from None
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise ValueError(f"{what} {text!r}; expected a whole number >= 1")
    return int(v)
