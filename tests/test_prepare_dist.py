"""``quietgnn prepare`` as one process per host (issue #23, item 6): 2 ranks on this machine,
each reading only its own slice of the tables, write byte for byte what the single-process
prepare writes for the whole tables with the same (``given``) assignment; the bytes they
exchange are counted; a bad slice fails on every rank with the reason; the result trains."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
import traceback

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is a dependency (pip install -e .)")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is a dependency")
pytest.importorskip("duckdb", reason="duckdb is a dependency (pip install -e .)")

import quietgnn  # noqa: E402
from quietgnn.cli import main  # noqa: E402
from quietgnn.comm.communicator import Communicator  # noqa: E402
from quietgnn.prepare import prepare_tables  # noqa: E402
from quietgnn.prepare.dist import prepare_distributed  # noqa: E402

from helpers import small_graph  # noqa: E402

P = 2


def _slices(tmp_path, n=150, seed=3, directed=False, split=True, hub=False, names=False,
            sparse=False):
    """A graph's tables split over ``P`` ranks: node ``i`` in rank ``asg[i]``'s node table,
    each edge in a random rank's edge table (a fifth of them in both, a self-loop in one),
    plus the whole tables and the assignment for the single-process reference."""
    g = small_graph(n=n, seed=seed, directed=directed)
    rng = np.random.default_rng(seed)
    asg = rng.integers(0, P, n)
    dst, src = g.edge_dst().numpy(), g.indices.numpy()
    keep = slice(None) if directed else src < dst
    s, d = src[keep], dst[keep]
    if hub:     # node 7 gets an edge from every other node: more edges than a round holds
        other = np.setdiff1d(np.arange(n), np.concatenate([[7], s[d == 7], d[s == 7]]))
        s, d = np.append(s, other), np.append(d, np.full(other.size, 7))
    where = rng.integers(0, P, s.size)
    nodes = {"id": np.arange(n), "y": g.y.numpy(), "x": list(g.x.numpy())}
    if sparse:   # multi-hot ids; the widest id only on a node of rank 0's table
        ids = [np.flatnonzero(rng.random(g.num_features - 1) < 0.2) for _ in range(n)]
        ids[int(np.flatnonzero(asg == 0)[0])] = np.array([g.num_features - 1])
        nodes = {"id": nodes["id"], "y": nodes["y"], "x_indices": ids}
    if names:   # labels as names; class 0's nodes all on rank 0, so rank 1 lacks that name
        nodes["y"] = np.array([f"class-{c}" for c in g.y.numpy()])
        asg[g.y.numpy() == 0] = 0
    if split:
        nodes["split"] = np.where(g.train_mask.numpy(), "train", np.where(
            g.val_mask.numpy(), "val", np.where(g.test_mask.numpy(), "test", "none")))
    for r in range(P):
        mine = np.flatnonzero(asg == r)[::-1]                   # any row order
        pq.write_table(pa.table({k: [v[i] for i in mine] if k.startswith("x") else
                                 np.asarray(v)[mine]
                                 for k, v in nodes.items()}), tmp_path / f"nodes-{r}.parquet")
        e = (where == r) | (np.arange(s.size) % 5 == 0)       # some edges on both ranks
        es, ed = s[e], d[e]
        if r == 1:
            es, ed = np.append(es, 4), np.append(ed, 4)
        pq.write_table(pa.table({"src": es, "dst": ed}), tmp_path / f"edges-{r}.parquet")
    pq.write_table(pa.table(nodes), tmp_path / "nodes.parquet")
    pq.write_table(pa.table({"src": np.append(s, 4), "dst": np.append(d, 4)}),
                   tmp_path / "edges.parquet")
    np.save(tmp_path / "asg.npy", asg)
    return asg, s, d, where


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ranks(argv, tmp_path, timeout=120):
    """``quietgnn ARGV`` as P ranks with torchrun's environment (what the CLI detects), each
    a fork of this process (no interpreter start and imports per rank: seconds each on a busy
    machine); [(exit code, stdout, stderr)] in rank order."""
    return _fork(lambda: main(argv), tmp_path, timeout)


def _fork(fn, tmp_path, timeout=120):
    port = _free_port()
    kids = []
    # a rank's garbage collector must not finalise this process's objects (a pyarrow table a
    # test read: its finaliser reaches Arrow's thread pool, which the fork left behind, and
    # the rank segfaulted): collected here, the rest frozen out of the ranks' collections
    gc.collect()
    gc.freeze()
    for r in range(P):
        pid = os.fork()
        if pid == 0:        # the rank: fn's result is its exit code, its output in files
            code = 1
            try:
                os.chdir(tmp_path)
                os.environ.update(RANK=str(r), WORLD_SIZE=str(P), LOCAL_RANK=str(r),
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                for fd, name in ((1, "out"), (2, "err")):
                    f = os.open(f"rank-{r}.{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    os.dup2(f, fd)
                sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
                code = int(fn() or 0)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        kids.append(pid)
    gc.unfreeze()
    deadline = time.monotonic() + timeout
    codes = {}
    while len(codes) < P:
        for pid in kids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in kids:
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            raise AssertionError(f"the ranks did not finish in {timeout}s (a hang)")
        time.sleep(0.05)
    return [(codes[pid], (tmp_path / f"rank-{r}.out").read_text(),
             (tmp_path / f"rank-{r}.err").read_text()) for r, pid in enumerate(kids)]


def _same_books(a, b):
    """Every file of every part byte-equal, the same assignment, fingerprint, book id, stats
    and manifest checksums."""
    ma, mb = (json.loads((p / "book.json").read_text()) for p in (a, b))
    for key in ("book_id", "num_parts", "method", "stats", "files"):
        assert ma[key] == mb[key], key
    ga, gb = dict(ma["graph"]), dict(mb["graph"])
    ga.pop("source"), gb.pop("source")
    assert ga == gb
    for name in ma["files"]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_two_ranks_write_what_one_process_writes_then_train(tmp_path):
    asg, s, d, where = _slices(tmp_path)
    ref = prepare_tables(tmp_path / "edges.parquet", tmp_path / "nodes.parquet",
                         tmp_path / "ref", parts=P, method="given",
                         partition_file=tmp_path / "asg.npy", memory_budget=700 << 20,
                         name="edges")
    res = _ranks(["prepare", "edges-{rank}.parquet", "--nodes", "nodes-{rank}.parquet",
                  "--memory-budget", "700MiB", "--out", "dist"], tmp_path)
    for rc, o, e in res:
        assert rc == 0, e
    assert "prepared" in res[0][1] and "2 parts (one per rank)" in res[0][1]
    _same_books(tmp_path / "dist", ref.path)
    assert json.loads((tmp_path / "dist" / "book.json").read_text())["graph"]["fingerprint"] \
        == ref.graph["fingerprint"]
    # the bytes are counted: each rank sent its edges owned elsewhere as (src, dst, owner of
    # src) int64 rows in one round (+ the all-to-all's size handshake)
    for r, (rc, o, e) in enumerate(res):
        mine = np.stack([s, d])[:, (where == r) | (np.arange(s.size) % 5 == 0)]
        both = np.unique(np.concatenate([mine, mine[::-1]], 1), axis=1)
        away = int((asg[both[1]] != r).sum())
        sent = dict(re.findall(r"(prepare_\w+)=(\d+)", e))
        assert int(sent["prepare_edges"]) == 24 * away + 8 * (P - 1), e
        assert int(sent["prepare_halo"]) > 0
        if r == 1:      # rank 0 hashes the graph: rank 1 sends it its degrees, labels, edges
            assert int(sent["prepare_gather"]) >= 8 * (4 * (asg == 1).sum() + away)
    # the result trains
    run = quietgnn.train(str(tmp_path / "dist"), strategy="halo", epochs=1, hidden=8,
                         out=str(tmp_path / "runs"), **{"runtime.progress": False})
    assert run.summary.parts == P and 0 <= run.summary.test_acc <= 1


def _one_process_and_two_hosts(tmp_path):
    """The tables of :func:`_slices` prepared by one process (the reference, returned) and
    by two hosts through the API; the two books must be the same."""
    ref = prepare_tables(tmp_path / "edges.parquet", tmp_path / "nodes.parquet",
                         tmp_path / "ref", parts=P, method="given",
                         partition_file=tmp_path / "asg.npy", memory_budget=700 << 20,
                         name="edges")

    def rank():
        comm = Communicator.init(int(os.environ["RANK"]), P, timeout_s=60)
        prepare_distributed("edges-{rank}.parquet", "nodes-{rank}.parquet", "dist", comm,
                            memory_budget=700 << 20)
        comm.close()

    for rc, o, e in _fork(rank, tmp_path):
        assert rc == 0, e
    _same_books(tmp_path / "dist", ref.path)
    return ref


def test_label_names_map_alike_on_every_host(tmp_path):
    """Labels given as names, one of them on one host only: every host maps them by the
    sorted names of all hosts, as one process does (the same book, names kept)."""
    _slices(tmp_path, n=90, seed=6, names=True)
    ref = _one_process_and_two_hosts(tmp_path)
    book = json.loads((tmp_path / "dist" / "book.json").read_text())["graph"]
    assert book["label_names"] == ref.graph["label_names"] == sorted(set(
        pq.read_table(tmp_path / "nodes.parquet").column("y").to_pylist()))
    assert "class-0" not in pq.read_table(tmp_path / "nodes-1.parquet").column("y").to_pylist()


def test_sparse_features_take_the_widest_host(tmp_path):
    """Features as x_indices lists, the largest id on one host only: every host writes rows
    of the same width, the one process's (the same book)."""
    _slices(tmp_path, n=90, seed=4, sparse=True)
    ref = _one_process_and_two_hosts(tmp_path)
    widest = max(max(r, default=-1) for r in pq.read_table(tmp_path / "nodes-1.parquet")
                 .column("x_indices").to_pylist())
    assert ref.graph["num_features"] == small_graph(n=90, seed=4).num_features > widest + 1


def test_small_rounds_and_directed_edges(tmp_path):
    """Rounds of 16 rows (every exchange in many rounds, ranks with different numbers of
    them, a node with more in-edges than a round), a directed graph without a split column:
    still the single-process result."""
    _slices(tmp_path, n=120, seed=5, directed=True, split=False, hub=True)
    ref = prepare_tables(tmp_path / "edges.parquet", tmp_path / "nodes.parquet",
                         tmp_path / "ref", parts=P, method="given", directed=True,
                         partition_file=tmp_path / "asg.npy", memory_budget=700 << 20,
                         name="edges", split_seed=4)

    def rank():
        comm = Communicator.init(int(os.environ["RANK"]), P, timeout_s=60)
        prepare_distributed("edges-{rank}.parquet", "nodes-{rank}.parquet", "dist", comm,
                            directed=True, split_seed=4, chunk_rows=16,
                            memory_budget=700 << 20)
        comm.close()

    for rc, o, e in _fork(rank, tmp_path):
        assert rc == 0, e
    _same_books(tmp_path / "dist", ref.path)


def test_a_graph_another_prepare_wrote_meanwhile_is_kept_on_every_rank(tmp_path, monkeypatch):
    """Rank 0 moved the finished directory onto a prepared graph that another prepare wrote
    to --out after its check, replacing it. Now every rank is refused (exit 2, the reason),
    the other graph kept whole and the temporary directory removed; --overwrite replaces."""
    from quietgnn.partition import PartitionBook
    from quietgnn.prepare import dist
    _slices(tmp_path, n=60, seed=1)
    first = prepare_tables(tmp_path / "edges.parquet", tmp_path / "nodes.parquet",
                           tmp_path / "first", parts=P, memory_budget=700 << 20)
    finish = dist.finish_book

    def other_prepare_finishes_first(tmp, path, *args, **kw):
        shutil.copytree(first.path, path, dirs_exist_ok=True)
        return finish(tmp, path, *args, **kw)
    monkeypatch.setattr(dist, "finish_book", other_prepare_finishes_first)   # (forked too)
    argv = ["prepare", "edges-{rank}.parquet", "--nodes", "nodes-{rank}.parquet",
            "--memory-budget", "700MiB", "--out", "dist"]
    for rc, o, e in _ranks(argv, tmp_path):
        assert rc == 2 and "rank 0: --out 'dist': another prepare wrote" in e, e
        assert "pass --overwrite" in e and "Traceback" not in e, e
    assert (tmp_path / "dist" / "book.json").read_text() == \
        (first.path / "book.json").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dist")]
    for rc, o, e in _ranks(argv + ["--overwrite"], tmp_path):
        assert rc == 0, e
    assert PartitionBook.open(tmp_path / "dist").method == "given"


def test_a_node_claimed_by_two_ranks_fails_on_every_rank(tmp_path):
    _slices(tmp_path, n=60, seed=1)
    # rank 1's node table also lists one of rank 0's nodes
    t0 = pq.read_table(tmp_path / "nodes-0.parquet")
    t1 = pq.read_table(tmp_path / "nodes-1.parquet")
    pq.write_table(pa.concat_tables([t1, t0.slice(0, 1)]), tmp_path / "nodes-1.parquet")
    res = _ranks(["prepare", "edges-{rank}.parquet", "--nodes", "nodes-{rank}.parquet",
                  "--out", "dist"], tmp_path)
    for rc, o, e in res:
        assert rc == 2, e
        assert "is claimed by ranks 0 and 1" in e and "exactly one rank's node table" in e
    assert not (tmp_path / "dist").exists()
    # a missing slice: named, on every rank
    (tmp_path / "edges-1.parquet").unlink()
    for rc, o, e in _ranks(["prepare", "edges-{rank}.parquet", "--nodes",
                            "nodes-{rank}.parquet", "--out", "dist"], tmp_path):
        assert rc == 2 and "rank 1:" in e and "edges-1.parquet' does not exist" in e, e


def test_ids_out_of_range_and_ranks_that_disagree_fail_on_every_rank(tmp_path):
    _slices(tmp_path, n=60, seed=1)
    argv = ["prepare", "edges-{rank}.parquet", "--nodes", "nodes-{rank}.parquet", "--out", "d"]
    # ranks started with different options
    res = _fork(lambda: main(argv + ["--directed"] * (os.environ["RANK"] == "1")), tmp_path)
    for rc, o, e in res:
        assert rc == 2 and "the ranks disagree on --directed: rank 0 has False, rank 1 has " \
            "True" in e, e
    # a node id beyond the N rows of all the node tables
    t1 = pq.read_table(tmp_path / "nodes-1.parquet")
    ids = t1.column("id").to_numpy().copy()
    ids[0] = 65
    pq.write_table(t1.set_column(0, "id", pa.array(ids)), tmp_path / "nodes-1.parquet")
    for rc, o, e in _ranks(argv, tmp_path):
        assert rc == 2 and "holds node id 65, outside [0, 60)" in e and "global" in e, e
    # the options of the single-process prepare that do not apply
    for rc, o, e in _ranks(argv + ["--partitioner", "ldg"], tmp_path):
        assert rc == 2 and "under torchrun the parts are the ranks' slices" in e, e
    # the same number of features from other columns: named, on every rank
    _slices(tmp_path, n=60, seed=1)
    t1 = pq.read_table(tmp_path / "nodes-1.parquet")
    x = np.array(t1.column("x").to_pylist())
    cols = {c: t1.column(c) for c in t1.column_names if c != "x"}
    cols.update({f"f{i}": pa.array(x[:, i]) for i in range(x.shape[1])})
    pq.write_table(pa.table(cols), tmp_path / "nodes-1.parquet")
    for rc, o, e in _ranks(argv, tmp_path):
        assert rc == 2 and "the ranks disagree on the feature columns" in e, e
    # one rank's edge table that is not integer ids: its reason, on every rank
    _slices(tmp_path, n=60, seed=1)
    e1 = pq.read_table(tmp_path / "edges-1.parquet")
    pq.write_table(pa.table({"src": [f"n{v}" for v in e1.column(0).to_pylist()],
                             "dst": e1.column(1)}), tmp_path / "edges-1.parquet")
    for rc, o, e in _ranks(argv, tmp_path):
        assert rc == 2 and "rank 1:" in e and "edges-1.parquet" in e and "integer" in e, e
    # a residency level: the gather to rank 0 would break it, so it is refused up front, by
    # the prepare's own rule (not the default training strategy's), and never advising to
    # leave the level out for the prepare (which would send the labels all the same)
    for rc, o, e in _ranks(argv + ["--runtime.residency", "features"], tmp_path):
        assert rc == 2 and "--runtime.residency features" in e and "rank 0" in e, e
        assert "prepare the graph in one process" in e and "leave residency" not in e, e
    # a NaN feature in one rank's node table: refused on every rank, as one process refuses it
    _slices(tmp_path, n=60, seed=1)
    t1 = pq.read_table(tmp_path / "nodes-1.parquet")
    x = t1.column("x").to_pylist()
    x[2] = [float("nan")] + x[2][1:]
    pq.write_table(t1.set_column(t1.column_names.index("x"), "x", pa.array(x)),
                   tmp_path / "nodes-1.parquet")
    bad = int(t1.column("id")[2].as_py())
    for rc, o, e in _ranks(argv, tmp_path):
        assert rc == 2 and f"x has NaN/Inf value(s), first at node {bad}, feature 0" in e, e
    assert not (tmp_path / "d").exists()
