"""``quietgnn prepare EDGES --nodes NODES``: table values that used to mean something else
without a word (an operator trial). A split value other than train / val / test dropped its
node from every split; a float edge id was rounded to another node (or past the last one);
a null endpoint dropped its edge; a stray sparse feature id asked for 149 GiB. Each is now
refused naming the value, what was expected and the fix, before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is a dependency (pip install -e .)")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is a dependency")
duckdb = pytest.importorskip("duckdb", reason="duckdb is a dependency (pip install -e .)")

from quietgnn.cli import main  # noqa: E402
from quietgnn.prepare import TableNodes, prepare_tables  # noqa: E402

from test_prepare_dist import _ranks, _slices  # noqa: E402
from test_prepare_stream import TINY_BUDGET  # noqa: E402

N = 40
SPLIT = ["train"] * 24 + ["val"] * 8 + ["test"] * 8


def _write(tmp_path, split=SPLIT, src=None, dst=None, **features):
    """A 40-node path graph: node table (id, y, split, features) and edge table."""
    cols = {"id": np.arange(N), "y": np.arange(N) % 3}
    if split is not None:
        cols["split"] = pa.array(split, pa.string()) if isinstance(split, list) else split
    cols.update(features if features else {"f0": np.linspace(0, 1, N)})
    pq.write_table(pa.table(cols), tmp_path / "n.parquet")
    pq.write_table(pa.table({"src": np.arange(N - 1) if src is None else src,
                             "dst": np.arange(1, N) if dst is None else dst}),
                   tmp_path / "e.parquet")


def _prepare(tmp_path):
    return prepare_tables(tmp_path / "e.parquet", tmp_path / "n.parquet", tmp_path / "out",
                          parts=2, memory_budget=TINY_BUDGET)


def _refused(tmp_path, *messages):
    with pytest.raises(ValueError) as ei:
        _prepare(tmp_path)
    for m in messages:
        assert m in str(ei.value), str(ei.value)
    assert "\n" not in str(ei.value)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    # the table's fix, not the in-memory loaders' (check_trainable_split's own)
    assert "--dataset.split" not in str(ei.value)


def _typos():
    s = list(SPLIT)
    s[0] = s[1] = "training"
    s[24], s[30], s[31] = "valid", "dev", "holdout"
    return s


@pytest.mark.parametrize("split, messages", [
    # a typo dropped the node from every split; now named with counts, commonest first
    (_typos(), ["column split holds 5 row(s) of unknown value(s) 'training' (2 rows), 'dev' "
                "(1 row), 'holdout' (1 row), ...", "expected train, val or test (any case), "
                "or none, empty or null for a node in no split"]),
    # split codes as numbers matched no name: every node in no split
    (pa.array([0] * 24 + [1] * 8 + [2] * 8), ["column split has type BIGINT",
                                              "write the split as text"]),
    # what training refuses, refused by its rule (check_trainable_split) at prepare time
    (["train"] * N, ["has no validation and no test nodes (train/val/test = 40/0/0)",
                     "mark some rows train, some val and some test in the split column"]),
    (["val"] * 20 + ["test"] * 19 + [None], ["has no train nodes (train/val/test = 0/20/19)",
                                             "1 node(s) are in no split"]),
    # no split column: a random 60/20/20 of 3 nodes leaves the test set empty
    (None, ["has no test nodes (train/val/test = 2/1/0)", "give the node table a split "
                                                          "column"]),
])
def test_split_values_that_drop_nodes_are_refused_by_name(tmp_path, split, messages):
    if split is None:       # three nodes, an edge
        pq.write_table(pa.table({"id": [0, 1, 2], "y": [0, 1, 0], "f0": [1.0, 2.0, 3.0]}),
                       tmp_path / "n.parquet")
        pq.write_table(pa.table({"src": [0], "dst": [1]}), tmp_path / "e.parquet")
    else:
        _write(tmp_path, split)
    _refused(tmp_path, *messages)


def test_split_case_and_nulls_are_read_and_the_counts_printed(tmp_path, capsys):
    """``Train`` / `` VAL `` are train / val (it dropped every node); null, empty and none
    are "in no split", counted in the summary."""
    split = [s.capitalize() for s in SPLIT]
    split[24], split[0], split[1], split[2] = " VAL ", None, "", "NONE"
    _write(tmp_path, split)
    rc = main(["prepare", str(tmp_path / "e.parquet"), "--nodes", str(tmp_path / "n.parquet"),
               "--out", str(tmp_path / "out"), "--parts", "2", "--memory-budget", "700MiB"])
    out = capsys.readouterr().out
    assert rc == 0 and "split train/val/test 21/8/8, 3 in no split" in out, out


def _float_ids(tmp_path):
    _write(tmp_path, src=np.arange(N - 1) + 0.6)    # rounded, every edge a self-loop


def _float_past_the_end(tmp_path):
    _write(tmp_path, src=np.arange(N - 1) + 0.5, dst=np.arange(1, N) + 0.5)   # 39.5 -> 40


def _whole_floats(tmp_path):
    # as the .npz loader: an id column is integers, whatever its values
    _write(tmp_path, src=np.arange(N - 1, dtype=np.float64))


def _null_src(tmp_path):
    _write(tmp_path, src=pa.array([None, None] + list(range(2, N - 1)), pa.int64()))


def _stray_feature_id(tmp_path):
    _write(tmp_path, x_indices=[[0], [10 ** 9]] + [[1]] * (N - 2))  # 149 GiB dense


def _no_features(tmp_path):
    _write(tmp_path)
    pq.write_table(pa.table({"id": np.arange(N), "y": np.arange(N) % 3,
                             "split": pa.array(SPLIT, pa.string())}), tmp_path / "n.parquet")


@pytest.mark.parametrize("make, messages", [
    (_float_ids, ["edge table", "column src has type DOUBLE and holds non-integer node id "
                  "0.6; expected integer node ids 0 .. N-1 (ids are not rounded)"]),
    (_float_past_the_end, ["column src has type DOUBLE and holds non-integer node id 0.5"]),
    (_whole_floats, ["column src has type DOUBLE and holds 0.0", "write the column as "
                     "integers"]),
    (_null_src, ["the edge table holds 2 row(s) with a null src or dst (of 39)",
                 "drop those rows or fill in their ids"]),
    (_stray_feature_id, ["x_indices holds feature id 1000000000 (node 1), so the features "
                         "would be 1000000001 columns wide", "renumber the feature ids"]),
    (_no_features, ["has no feature columns; add at least one: numeric columns"]),
])
def test_edge_ids_and_features_that_were_rounded_dropped_or_allocated_are_refused(
        tmp_path, make, messages):
    make(tmp_path)
    _refused(tmp_path, *messages)


def test_wide_sparse_features_are_densified_a_few_rows_at_a_time(tmp_path):
    """2^20 feature ids on 20 nodes: 80 MiB dense, read in blocks of at most 64 MiB (one
    block of every row held it all at once: 65536 rows of a 10^5-wide table is 26 GiB)."""
    width = 1 << 20
    rows = [[i, width - 1 - i] for i in range(20)]
    pq.write_table(pa.table({"id": np.arange(20), "y": np.arange(20) % 2,
                             "x_indices": rows}), tmp_path / "n.parquet")
    con = duckdb.connect()
    nodes = TableNodes(con, tmp_path / "n.parquet")
    seen, biggest = [], 0
    for blk in nodes.blocks(con):
        biggest = max(biggest, blk.x.nbytes)
        seen += [np.flatnonzero(r).tolist() for r in blk.x]
    assert nodes.num_features == width and biggest <= 64 << 20, biggest
    assert seen == [sorted(r) for r in rows]


def test_the_per_host_prepare_refuses_null_endpoints_and_an_untrainable_split(tmp_path):
    """Every rank alike: a null endpoint on one rank's edge table, and a split whose
    validation and test nodes are none over all the ranks (each rank's own could be fine)."""
    argv = ["prepare", "edges-{rank}.parquet", "--nodes", "nodes-{rank}.parquet", "--out", "d"]
    _slices(tmp_path, n=60, seed=1)
    e1 = pq.read_table(tmp_path / "edges-1.parquet")
    src = e1.column("src").to_pylist()
    src[0] = None
    pq.write_table(e1.set_column(0, "src", pa.array(src, pa.int64())),
                   tmp_path / "edges-1.parquet")
    for rc, o, e in _ranks(argv, tmp_path):
        assert rc == 2 and "edges-1.parquet' holds 1 row(s) with a null src or dst" in e, e
    _slices(tmp_path, n=60, seed=1)
    for r in range(2):
        t = pq.read_table(tmp_path / f"nodes-{r}.parquet")
        t = t.set_column(t.column_names.index("split"), "split",
                         pa.array(["train"] * t.num_rows))
        pq.write_table(t, tmp_path / f"nodes-{r}.parquet")
    for rc, o, e in _ranks(argv, tmp_path):
        assert rc == 2 and "has no validation and no test nodes (train/val/test = 60/0/0)" \
            in e, e
    assert not (tmp_path / "d").exists()


def test_the_summary_counts_directed_edges_as_stored(tmp_path, capsys):
    """With --directed the summary said '19.5 undirected edges (39 stored)'; --directed
    beside a graph that is undirected anyway was ignored without a word."""
    _write(tmp_path)
    argv = ["prepare", str(tmp_path / "e.parquet"), "--nodes", str(tmp_path / "n.parquet"),
            "--parts", "2", "--out", str(tmp_path / "d")]
    assert main(argv + ["--directed"]) == 0
    assert ", 39 directed edges (stored as given)," in capsys.readouterr().out
    assert main(argv[:1] + ["--dataset", "synthetic", "--synthetic.nodes", "300", "--parts",
                            "2", "--out", str(tmp_path / "s"), "--directed"]) == 2
    assert "--directed takes an edge table's edges one way only" in capsys.readouterr().err
