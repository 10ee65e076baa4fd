"""Out-of-core prepare (DuckDB): a user's edge and node tables, at the smallest memory budget,
give bit for bit the parts, assignment and fingerprint the in-memory path gives for the same
graph (`hash` partitioner); the streamed synthetic generator gives a well-formed, seeded graph;
bad tables are refused with the value, what was expected and the fix."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow", reason="pyarrow is a dependency (pip install -e .)")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is a dependency")
pytest.importorskip("duckdb", reason="duckdb is a dependency (pip install -e .)")

from quietgnn.datasets.synthetic import SyntheticSpec  # noqa: E402
from quietgnn.graph import Graph  # noqa: E402
from quietgnn.partition import make_book  # noqa: E402
from quietgnn.prepare import parse_size, prepare_tables  # noqa: E402
from quietgnn.prepare.synthetic import prepare_synthetic  # noqa: E402

from helpers import small_graph  # noqa: E402
from test_prepared import _same_part  # noqa: E402

#: the smallest budget the path accepts for these graphs (DuckDB gets its 128 MiB floor)
TINY_BUDGET = 700 << 20


def _tables(tmp_path, g, fmt="parquet", split=True, x_list=True, dup=True):
    """``g`` as an edge table (each undirected edge once, plus duplicates and a self-loop
    that the loader must drop) and a node table."""
    dst, src = g.edge_dst().numpy(), g.indices.numpy()
    keep = src < dst
    s, d = src[keep], dst[keep]
    if dup:
        s, d = np.concatenate([s, d[:5], [3]]), np.concatenate([d, s[:5], [3]])
    cols = {"id": np.arange(g.num_nodes), "y": g.y.numpy()}
    if split:
        cols["split"] = np.where(g.train_mask.numpy(), "train", np.where(
            g.val_mask.numpy(), "val", np.where(g.test_mask.numpy(), "test", "none")))
    if x_list in ("sparse", "indices"):     # x_indices [+ x_values]: the non-zeros only
        xn = g.x.numpy()
        cols["x_indices"] = [np.flatnonzero(r).astype(np.int32) for r in xn]
        if x_list == "sparse":
            cols["x_values"] = [r[r != 0] for r in xn]
    elif x_list:
        cols["x"] = list(g.x.numpy())
    else:
        cols.update({f"f{i}": g.x[:, i].numpy() for i in range(g.num_features)})
    e, n = tmp_path / f"edges.{fmt}", tmp_path / f"nodes.{fmt}"
    order = np.random.default_rng(0).permutation(g.num_nodes)       # any row order
    nodes = pa.table({k: (np.asarray(v)[order] if not k.startswith("x") else
                          [v[i] for i in order]) for k, v in cols.items()})
    edges = pa.table({"src": s, "dst": d})
    if fmt == "parquet":
        pq.write_table(edges, e)
        pq.write_table(nodes, n)
    else:
        import pyarrow.csv as pcsv
        pcsv.write_csv(edges, e)
        pcsv.write_csv(nodes, n)
    return e, n, np.stack([s, d])


@pytest.mark.parametrize("P,fmt,split,x_list,method", [(2, "parquet", True, True, "hash"),
                                                      (4, "parquet", True, True, "hash"),
                                                      (3, "csv", False, False, "hash"),
                                                      (2, "parquet", True, True, "ldg"),
                                                      (4, "csv", True, False, "ldg"),
                                                      (3, "parquet", True, True, "metis"),
                                                      (2, "parquet", True, "sparse", "hash"),
                                                      (3, "parquet", False, "indices", "ldg")])
def test_tables_equal_the_in_memory_path(tmp_path, P, fmt, split, x_list, method):
    g0 = small_graph(n=200, seed=2)
    if x_list in ("sparse", "indices"):   # mostly zero (multi-hot without values)
        keep = torch.rand(g0.x.shape, generator=torch.Generator().manual_seed(1)) < 0.1
        x = keep.float() if x_list == "indices" else torch.where(keep, g0.x, 0.0)
        x[:, -1] = torch.where(torch.arange(g0.num_nodes) == 7, 1.0, 0.0)   # the width's id
        g0 = dataclasses.replace(g0, x=x)
    e, n, ei = _tables(tmp_path, g0, fmt, split, x_list)
    masks = dict(train_mask=g0.train_mask, val_mask=g0.val_mask, test_mask=g0.test_mask) \
        if split else {}
    g = Graph.from_edge_index(ei, g0.x, g0.y, num_classes=g0.num_classes, name="edges",
                              split_seed=5, **masks)
    book = prepare_tables(e, n, tmp_path / "out", parts=P, memory_budget=TINY_BUDGET,
                          split_seed=5, method=method)
    ref = make_book(tmp_path / "ref", g, method, P)
    assert book.method == method
    assert book.graph["fingerprint"] == ref.graph["fingerprint"] == g.fingerprint()
    # the features' digest too, streamed in blocks as the in-memory path computes it whole
    assert book.graph["features_digest"] == ref.graph["features_digest"] == g.features_digest()
    assert book.graph["num_edges"] == g.num_edges
    assert (book.assignment() == ref.assignment()).all()
    assert book.stats["halo"] == ref.stats["halo"] and book.stats["edge_cut"] == \
        ref.stats["edge_cut"]
    for k in range(P):
        _same_part(book.load_part(k, P), ref.load_part(k, P))


def test_repeated_pairs_across_batches(tmp_path, monkeypatch):
    """The sorted edge table streams in record batches and a repeated pair is dropped when it
    equals the row before it, also when that row ended the previous batch: every pair is
    listed twice, so the sorted rows come in pairs and batches of 5 rows split every other
    one (and the tagged edges' file is written and read in row groups of 5); the parts still
    equal the in-memory path's."""
    from quietgnn.prepare import edges, tables
    monkeypatch.setattr(tables, "BATCH_ROWS", 5)
    monkeypatch.setattr(edges, "BATCH_ROWS", 5)
    g0 = small_graph(n=60, seed=3)
    e, n, ei = _tables(tmp_path, g0, "parquet")
    twice = pq.read_table(e)
    pq.write_table(pa.concat_tables([twice, twice]), e)
    g = Graph.from_edge_index(ei, g0.x, g0.y, num_classes=g0.num_classes, name="edges",
                              split_seed=5, train_mask=g0.train_mask, val_mask=g0.val_mask,
                              test_mask=g0.test_mask)
    for method in ("hash", "ldg"):
        book = prepare_tables(e, n, tmp_path / method, parts=2, memory_budget=TINY_BUDGET,
                              split_seed=5, method=method)
        ref = make_book(tmp_path / f"ref-{method}", g, method, 2)
        assert book.graph["fingerprint"] == g.fingerprint()
        assert book.graph["features_digest"] == g.features_digest()   # blocks of 5 rows
        assert book.graph["num_edges"] == g.num_edges
        assert (book.assignment() == ref.assignment()).all()
        for k in range(2):
            _same_part(book.load_part(k, 2), ref.load_part(k, 2))


def test_duckdb_out_of_memory_names_the_budget(tmp_path, monkeypatch):
    """DuckDB running out of its share of the budget is a clear error naming the budget and
    the fix, and leaves no half-written directory."""
    import duckdb
    from quietgnn.prepare import tables

    def oom(*a, **k):
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate 64.0 MiB")
    monkeypatch.setattr(tables, "_prepare", oom)
    g0 = small_graph(n=40, seed=1)
    e, n, _ = _tables(tmp_path, g0, "parquet")
    with pytest.raises(ValueError, match=r"--memory-budget 700 MiB: DuckDB ran out .*"
                                         r"failed to allocate.*pass a larger --memory-budget"):
        prepare_tables(e, n, tmp_path / "out", parts=2, memory_budget=TINY_BUDGET)
    assert not list(tmp_path.glob(".out*")) and not (tmp_path / "out").exists()


def test_sources_out_of_order_are_an_error_not_a_repeated_pair():
    """Repeats are dropped where they are adjacent, so the stream checks the (dst, src) order:
    sources going back within a destination, in a batch or across a batch boundary, stop the
    prepare instead of leaving a repeated pair in the graph."""
    import duckdb
    from quietgnn.prepare import edges
    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = true")
    for rows, batch in (([(0, 1), (0, 3), (0, 2)], 8), ([(0, 1), (0, 3), (0, 2)], 2)):
        con.execute("CREATE OR REPLACE TABLE t (dst BIGINT, src BIGINT)")
        con.executemany("INSERT INTO t VALUES (?, ?)", rows)
        old, edges.BATCH_ROWS = edges.BATCH_ROWS, batch
        try:
            with pytest.raises(RuntimeError, match=r"out of \(dst, src\) order"):
                list(edges._unique_edges(con, "t"))
        finally:
            edges.BATCH_ROWS = old
    con.execute("CREATE OR REPLACE TABLE t (dst BIGINT, src BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(0, 1), (0, 1), (0, 2), (1, 0), (1, 0)])
    got = [(int(d), int(s_)) for D, S in edges._unique_edges(con, "t") for d, s_ in zip(D, S)]
    assert got == [(0, 1), (0, 2), (1, 0)]


def test_a_full_spill_disk_names_the_disk_not_the_budget(tmp_path, monkeypatch):
    import duckdb
    from quietgnn.prepare import tables

    def full(*a, **k):
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to offload data block "
                                          "of size 256.0 KiB (max_temp_directory_size reached)")
    monkeypatch.setattr(tables, "_prepare", full)
    g0 = small_graph(n=40, seed=1)
    e, n, _ = _tables(tmp_path, g0, "parquet")
    with pytest.raises(ValueError, match=r"could not spill .*the disk under --out is full"):
        prepare_tables(e, n, tmp_path / "out", parts=2, memory_budget=TINY_BUDGET)
    assert not (tmp_path / "out").exists()


def test_directed_tables(tmp_path):
    g0 = small_graph(n=150, seed=4, directed=True)
    e, n, ei = _tables(tmp_path, g0, dup=False)
    g = Graph.from_edge_index(ei, g0.x, g0.y, num_classes=g0.num_classes, undirected=False,
                              name="edges", train_mask=g0.train_mask, val_mask=g0.val_mask,
                              test_mask=g0.test_mask)
    for method in ("hash", "metis"):   # metis: on the symmetrised graph, as in memory
        book = prepare_tables(e, n, tmp_path / method, parts=2, directed=True,
                              memory_budget=TINY_BUDGET, method=method)
        ref = make_book(tmp_path / f"ref-{method}", g, method, 2)
        assert book.graph["fingerprint"] == g.fingerprint()
        assert (book.assignment() == ref.assignment()).all()
        for k in range(2):
            _same_part(book.load_part(k, 2), ref.load_part(k, 2))


def test_metis_over_its_budget_names_the_size(tmp_path, monkeypatch):
    import quietgnn.prepare.edges as edges
    g0 = small_graph(n=120, seed=3)
    e, n, _ = _tables(tmp_path, g0)
    monkeypatch.setattr(edges, "METIS_BYTES_PER_EDGE", 1 << 22)   # as if the graph were huge
    with pytest.raises(ValueError, match=r"--partitioner metis holds the graph's adjacency "
                                         r"in memory: about \d+ MiB .* --partitioner ldg"):
        prepare_tables(e, n, tmp_path / "out", parts=2, memory_budget=TINY_BUDGET,
                       method="metis")
    assert not (tmp_path / "out").exists()


def _bad_nodes(tmp_path):
    pq.write_table(pa.table({"id": [0, 1, 3], "y": [0, 1, 0], "f0": [1.0, 2.0, 3.0]}),
                   tmp_path / "n.parquet")
    pq.write_table(pa.table({"src": [0], "dst": [1]}), tmp_path / "e.parquet")


def _bad_edges(tmp_path):
    pq.write_table(pa.table({"id": [0, 1, 2], "y": [0, 1, 0], "f0": [1.0, 2.0, 3.0]}),
                   tmp_path / "n.parquet")
    pq.write_table(pa.table({"src": [0, 1], "dst": [1, 7]}), tmp_path / "e.parquet")


def _unnamed_endpoints(tmp_path):
    pq.write_table(pa.table({"id": [0, 1, 2], "y": [0, 1, 0], "f0": [1.0, 2.0, 3.0]}),
                   tmp_path / "n.parquet")
    pq.write_table(pa.table({"weight": [1, 1], "from": [0, 1], "to": [1, 2]}),
                   tmp_path / "e.parquet")


def _repeated_id(tmp_path):
    """Ten rows, ids 0 .. 9 but 8 twice and no 3 (the count and the range look right)."""
    ids = [0, 1, 2, 4, 5, 6, 7, 8, 8, 9]
    pq.write_table(pa.table({"id": ids, "y": [0, 1] * 5, "f0": [1.0] * 10}),
                   tmp_path / "n.parquet")
    pq.write_table(pa.table({"src": [0], "dst": [1]}), tmp_path / "e.parquet")


def _non_finite(column, value):
    def make(tmp_path):
        f1 = [0.5, 1.5, 2.5]
        f1[1] = value
        pq.write_table(pa.table({"id": [0, 1, 2], "y": [0, 1, 0], "f0": [1.0, 2.0, 3.0],
                                 column: f1}), tmp_path / "n.parquet")
        pq.write_table(pa.table({"src": [0], "dst": [1]}), tmp_path / "e.parquet")
    return make


def _nan_in_a_list(tmp_path):
    pq.write_table(pa.table({"id": [0, 1, 2], "y": [0, 1, 0],
                             "x": [[1.0, 2.0], [3.0, 4.0], [5.0, float("-inf")]]}),
                   tmp_path / "n.parquet")
    pq.write_table(pa.table({"src": [0], "dst": [1]}), tmp_path / "e.parquet")


def _no_label(tmp_path):
    pq.write_table(pa.table({"id": [0, 1, 2], "f0": [1.0, 2.0, 3.0]}), tmp_path / "n.parquet")
    pq.write_table(pa.table({"src": [0], "dst": [1]}), tmp_path / "e.parquet")


def _sparse_nodes(**cols):
    def make(tmp_path):
        pq.write_table(pa.table({"id": [0, 1, 2], "y": [0, 1, 0], **cols}),
                       tmp_path / "n.parquet")
        pq.write_table(pa.table({"src": [0], "dst": [1]}), tmp_path / "e.parquet")
    return make


@pytest.mark.parametrize("make, message", [
    (_sparse_nodes(x_indices=[[0], [2, 1], [-1]]), "x_indices holds feature id -1"),
    (_sparse_nodes(x_indices=[[0.5], [1.0], []]), "column x_indices has type DOUBLE[]"),
    (_sparse_nodes(x_indices=[[0], [2, 1], []], x_values=[[1.0], [2.0], []]),
     "node 1 has 2 x_indices but 1 x_values"),
    (_sparse_nodes(x_indices=[[0], None, []]), "x_indices is null on 1 row(s)"),
    (_sparse_nodes(x_indices=pa.array([[], [], []], pa.list_(pa.int32()))),
     "x_indices lists no feature id on any row"),
    (_bad_nodes, "has 3 rows with ids 0 .. 3; expected ids 0 .. N-1, one row each"),
    (_repeated_id, "n.parquet': id 8 appears more than once (drop the repeated row); id 3 has "
                   "no row (add it); expected ids 0 .. N-1 (N = 10), one row each"),
    (_non_finite("f1", float("nan")), "n.parquet': x has NaN/Inf value(s), first at node 1, "
                                      "feature 1 (column 'f1') (value nan); clean or impute"),
    (_non_finite("weight", float("inf")), "first at node 1, feature 1 (column 'weight') "
                                          "(value inf)"),
    (_nan_in_a_list, "x has NaN/Inf value(s), first at node 2, feature 1 (value -inf)"),
    (_non_finite("f1", 1e5), "x has value(s) beyond float16's range (|x| <= 65504), first at "
                             "node 1, feature 1 (column 'f1') (value 100000.0); prepare with "
                             "--x-dtype float32"),
    (_bad_edges, "holds node id 7, outside [0, 3)"),
    (_no_label, "it needs a label column y (or label)"),
    (_unnamed_endpoints, "has columns ['weight', 'from', 'to']; expected src and dst"),
])
def test_bad_tables_are_named(tmp_path, make, message):
    make(tmp_path)
    with pytest.raises(ValueError) as ei:
        prepare_tables(tmp_path / "e.parquet", tmp_path / "n.parquet", tmp_path / "out",
                       parts=2, memory_budget=TINY_BUDGET,
                       x_dtype="float16" if "float16" in message else "float32")
    assert message in str(ei.value)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_ids_wrong_across_blocks_are_named_reading_ids_only_as_far_as_needed():
    """The node table streams in blocks: a repeat at a block boundary and a gap in a later
    block are both named; blocks after the one that names the last are not read."""
    from types import SimpleNamespace

    from quietgnn.prepare.nodes import NodeBlock, _id_error
    nodes = SimpleNamespace(num_nodes=12, path="n.parquet")
    read = []

    def later():
        for ids in ([6, 7, 9], [10, 11], [12]):
            read.append(ids)
            yield NodeBlock(np.array(ids), np.zeros((len(ids), 1)), np.zeros(len(ids)),
                            np.zeros(len(ids)))
    # block [0..5] went through: the next starts again at 5
    err = _id_error(nodes, np.array([5]), 6, later())
    assert str(err) == ("node table 'n.parquet': id 5 appears more than once (drop the repeated "
                        "row); id 8 has no row (add it); expected ids 0 .. N-1 (N = 12), one "
                        "row each")
    assert read == [[6, 7, 9]]
    assert "id 3 has no row" in str(_id_error(nodes, np.array([4, 5]), 3, iter([])))


def test_budget_too_small_names_the_size(tmp_path):
    with pytest.raises(ValueError, match=r"--memory-budget 100 MiB is too small .* pass "
                                         r"--memory-budget \d+MiB"):
        prepare_synthetic(tmp_path / "o", edges=1000, parts=2, memory_budget=100 << 20)


def test_parse_size():
    assert parse_size("4GiB") == 4 << 30 and parse_size("512MiB") == 512 << 20
    assert parse_size("2e9") == 2 * 10 ** 9 and parse_size("3G") == 3 << 30
    with pytest.raises(ValueError, match="expected a size like 4GiB"):
        parse_size("lots")


def test_streamed_synthetic_is_seeded_and_well_formed(tmp_path):
    spec = SyntheticSpec(feature_dim=8, avg_degree=8.0, homophily=0.7)
    a = prepare_synthetic(tmp_path / "a", edges=4000, parts=3, spec=spec,
                          memory_budget=TINY_BUDGET)
    b = prepare_synthetic(tmp_path / "b", edges=4000, parts=3, spec=spec,
                          memory_budget=TINY_BUDGET)
    assert a.graph["fingerprint"] == b.graph["fingerprint"]
    n = a.graph["num_nodes"]
    # repeated pairs and self-loops dropped, not topped up (at 10^3 nodes, hubs repeat most)
    assert n == 1000 and 0.85 * 8000 <= a.graph["num_edges"] <= 8000
    # the parts put back together: a symmetric, loop-free, duplicate-free graph with the
    # requested homophily, every node owned once, degrees as stored
    src, dst, owned, y = [], [], [], torch.empty(n, dtype=torch.int64)
    for k in range(3):
        p = a.load_part(k, 3)
        ids = p.local_ids()
        src.append(ids[p.indices])
        dst.append(p.owned[p.edge_dst()])
        owned.append(p.owned)
        y[p.owned] = p.y
        assert torch.equal(p.in_degree[: p.n_own], p.indptr[1:] - p.indptr[:-1])
    src, dst = torch.cat(src), torch.cat(dst)
    assert torch.equal(torch.sort(torch.cat(owned)).values, torch.arange(n))
    key = dst * n + src
    assert torch.unique(key).numel() == key.numel() and not (src == dst).any()
    assert torch.equal(torch.sort(key).values, torch.sort(src * n + dst).values)
    assert abs(float((y[src] == y[dst]).double().mean()) - 0.7) < 0.05


@pytest.mark.slow
def test_cli_prepare_synthetic_then_train(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "quietgnn", *args], capture_output=True,
                              text=True, timeout=300)
    r = cli("prepare", "synthetic", "--edges", "3000", "--parts", "2", "--synthetic."
            "feature_dim", "8", "--memory-budget", "1GiB", "--out", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert "prepared" in r.stdout and "2 parts (ldg)" in r.stdout and "peak memory" in r.stdout
    # the streamed generator's default is the hard preset, the key set beside it kept
    from quietgnn.datasets.synthetic import PRESETS
    from quietgnn.partition.book import PartitionBook
    made = PartitionBook.open(tmp_path / "d").graph["synthetic"]
    assert made["feature_dim"] == 8 and all(made[k] == v for k, v in PRESETS["hard"].items())
    r = cli("train", "--data", str(tmp_path / "d"), "--epochs", "2", "--hidden", "8",
            "--runtime.progress", "false", "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    r = cli("prepare", "synthetic", "--edges", "3000", "--parts", "2", "--partitioner",
            "random", "--out", str(tmp_path / "d2"))
    assert r.returncode == 2 and "out of core, quietgnn partitions with ldg" in r.stderr
    assert "random and supernode need the whole graph in memory" in r.stderr


def test_out_that_is_not_a_prepared_directory_is_left_alone(tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="exists and is not a prepared directory"):
        prepare_synthetic(keep, edges=500, parts=2, memory_budget=TINY_BUDGET)
    assert (keep / "notes.txt").read_text() == "precious"
    # a prepared one is replaced
    a = prepare_synthetic(tmp_path / "p", edges=500, parts=2, memory_budget=TINY_BUDGET)
    b = prepare_synthetic(tmp_path / "p", edges=600, parts=2, memory_budget=TINY_BUDGET)
    assert a.graph["num_edges"] != b.graph["num_edges"] == _book_edges(tmp_path / "p")


def test_a_full_disk_under_out_is_named_as_such(tmp_path, monkeypatch):
    """The tagged edges' file and the part arrays are written by this process, not spilled by
    DuckDB: a full disk there is named too, and nothing is left behind."""
    import errno
    from quietgnn.prepare import tables

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(tables, "_prepare", full)
    with pytest.raises(ValueError, match=r"the disk under --out .* is full.*larger disk"):
        prepare_synthetic(tmp_path / "p", edges=500, parts=2, memory_budget=TINY_BUDGET)
    assert not list(tmp_path.glob(".p*")) and not (tmp_path / "p").exists()


def _book_edges(path):
    from quietgnn.partition import PartitionBook
    return PartitionBook.open(path).graph["num_edges"]


def test_streamed_degree_counts_and_order_guard():
    from quietgnn.prepare.edges import _add_counts, _check_sorted
    deg = np.zeros(6, dtype=np.int32)
    ids = np.array([0, 0, 2, 2, 2, 5])
    _add_counts(deg, ids[:4])       # a run split across two batches still adds up
    _add_counts(deg, ids[4:])
    assert deg.tolist() == np.bincount(ids, minlength=6).tolist()
    assert _check_sorted(ids[:4], -1) == 2 and _check_sorted(ids[4:], 2) == 5
    with pytest.raises(RuntimeError, match="out of order"):
        _check_sorted(np.array([3, 4]), 5)          # a batch that starts below the last one
    with pytest.raises(RuntimeError, match="out of order"):
        _check_sorted(np.array([1, 0]), -1)


def test_given_assignment_equals_the_in_memory_book(tmp_path):
    """``--partitioner given`` out of core (the reference of the distributed prepare): the
    parts, the fingerprint and the book id of the in-memory book with the same assignment."""
    g0 = small_graph(n=160, seed=6)
    e, n, ei = _tables(tmp_path, g0)
    g = Graph.from_edge_index(ei, g0.x, g0.y, num_classes=g0.num_classes, name="edges",
                              train_mask=g0.train_mask, val_mask=g0.val_mask,
                              test_mask=g0.test_mask)
    asg = np.random.default_rng(1).integers(0, 3, g.num_nodes)
    np.save(tmp_path / "asg.npy", asg)
    book = prepare_tables(e, n, tmp_path / "out", parts=3, memory_budget=TINY_BUDGET,
                          method="given", partition_file=tmp_path / "asg.npy")
    ref = make_book(tmp_path / "ref", g, "given", 3, file=str(tmp_path / "asg.npy"))
    assert book.method == "given" and book.book_id == ref.book_id
    assert book.graph["fingerprint"] == ref.graph["fingerprint"]
    assert (book.assignment() == asg).all()
    for k in range(3):
        _same_part(book.load_part(k, 3), ref.load_part(k, 3))
    with pytest.raises(ValueError, match="needs --partition.file"):
        prepare_tables(e, n, tmp_path / "o2", parts=3, memory_budget=TINY_BUDGET, method="given")
    with pytest.raises(ValueError, match="one part id per node"):
        np.save(tmp_path / "short.npy", asg[:-1])
        prepare_tables(e, n, tmp_path / "o3", parts=3, memory_budget=TINY_BUDGET,
                       method="given", partition_file=tmp_path / "short.npy")


def test_duckdb_gets_the_per_node_arrays_share_until_they_exist(tmp_path, monkeypatch):
    """DuckDB's memory limit follows the stage: while it sorts and the tagged edges are
    written back, only the assignment is held beside it; the degrees, halo marks and a part's
    ids come after, and only then is its share cut to leave room for them (a share sized for
    them all along ran the tagging out of memory on 10^8 nodes)."""
    from quietgnn.prepare import tables
    seen = {}

    def limit_mib(con) -> float:
        v = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
        num, unit = v.split()
        return float(num) * {"KiB": 2 ** -10, "MiB": 1, "GiB": 2 ** 10}[unit]

    def spy(name):
        orig = getattr(tables, name)

        def wrapped(con, *a, **k):
            seen.setdefault(name, limit_mib(con))
            return orig(con, *a, **k)
        monkeypatch.setattr(tables, name, wrapped)
    for name in ("_add_parts", "_write_edges"):
        spy(name)
    # the later arrays made large (300 MiB), so that the two shares differ visibly
    monkeypatch.setattr(tables, "_held_late",
                        lambda n, P, node_held: tables._held_early(n, "ldg", node_held) +
                        (300 << 20))
    g0 = small_graph(n=60, seed=2)
    e, nodes, _ = _tables(tmp_path, g0, "parquet")
    budget = 1200 << 20
    prepare_tables(e, nodes, tmp_path / "out", parts=2, memory_budget=budget)
    early = tables._DUCK_SHARE * (budget - tables._held_early(g0.num_nodes, "ldg", 0)
                                  - tables._PYTHON_BASE) / 2 ** 20
    assert abs(seen["_add_parts"] - early) < 2
    assert abs(seen["_write_edges"] - (early - tables._DUCK_SHARE * 300)) < 2


def test_the_progress_log_says_what_duckdb_holds_when_the_edges_are_tagged(tmp_path):
    """The tagging is where the 10^9-edge prepare ran out of DuckDB's share: the progress log
    accounts for DuckDB's memory there, by its own tags (every 256 batches and at the end)."""
    import re
    g0 = small_graph(n=60, seed=2)
    e, nodes, _ = _tables(tmp_path, g0, "parquet")
    lines = []
    prepare_tables(e, nodes, tmp_path / "out", parts=2, memory_budget=TINY_BUDGET,
                   progress=lines.append)
    held = [ln for ln in lines if "DuckDB holds" in ln]
    assert held and re.search(r"^edges tagged; DuckDB holds \d+ MiB \(.*\), \d+ MiB spilled",
                              held[-1]), lines


def test_the_tagged_edges_are_read_back_without_holding_what_was_read(tmp_path, monkeypatch):
    """Arrow's Parquet reader pre-buffers by default and keeps every range it read until the
    file is closed: at 10^9 edges a pass over the tagged edges grew the process by the whole
    file (7.7 GiB). Read back, the Arrow memory held stays near a batch's worth."""
    import pyarrow as pa
    from quietgnn.prepare import edges
    rows, groups = 1 << 18, 32
    rng = np.random.default_rng(0)
    path = tmp_path / "e.parquet"
    with edges._tagged_writer(path) as w:
        for _ in range(groups):         # random ids: a file of ~50 MiB, as dense as it gets
            w.write_table(pa.table({"src": rng.integers(0, 1 << 27, rows),
                                    "dst": np.sort(rng.integers(0, 1 << 27, rows)),
                                    "ps": rng.integers(0, 4, rows).astype(np.uint16),
                                    "pd": rng.integers(0, 4, rows).astype(np.uint16)},
                                   schema=edges._tagged_schema()), row_group_size=rows)
    size = path.stat().st_size
    monkeypatch.setattr(edges, "BATCH_ROWS", rows)
    held, n, base = [], 0, pa.total_allocated_bytes()
    for b in edges.tagged_batches(path, ["dst", "src", "ps", "pd"]):
        held.append(pa.total_allocated_bytes())
        n += b["src"].size
    assert n == rows * groups
    assert max(held) - base < size // 3, (base, max(held), size)


def test_a_label_column_of_names_becomes_classes(tmp_path):
    """Labels given as names in the node table (VARCHAR) map to classes in sorted order, as
    the in-memory loaders map them; the book keeps the mapping."""
    g0 = small_graph(n=120, seed=5)
    e, n, ei = _tables(tmp_path, g0, "parquet")
    names = np.array(["politician", "company", "tvshow"])        # class k -> an arbitrary name
    t = pq.read_table(n)
    t = t.set_column(t.column_names.index("y"), "y", pa.array(names[t.column("y").to_numpy()]))
    pq.write_table(t, n)
    book = prepare_tables(e, n, tmp_path / "out", parts=2, memory_budget=TINY_BUDGET,
                          split_seed=5, method="hash")
    assert book.graph["label_names"] == ["company", "politician", "tvshow"]
    want = {0: 1, 1: 0, 2: 2}                       # old class -> the sorted names' order
    for k in range(2):
        part = book.load_part(k, 2)
        old = g0.y[part.owned]
        assert part.y.tolist() == [want[int(c)] for c in old]


def test_prepare_synthetic_refuses_a_node_count_it_would_ignore(tmp_path, capsys):
    from quietgnn.cli import main
    assert main(["prepare", "synthetic", "--edges", "1e4", "--synthetic.nodes", "500",
                 "--out", str(tmp_path / "d")]) == 2
    assert "leave out --synthetic.nodes" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
