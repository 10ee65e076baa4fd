"""Sampled evaluation from a prepared directory (quietgnn.sampling.book): with every
neighbour it is the exact accuracy, its sample is the collective evaluator's, and its draws are
fixed and within the fanout. tma's rank 0 uses it (options.eval_nodes) instead of holding the
whole graph."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from quietgnn.comm.store import HEADER_BYTES
from quietgnn.nn import ModelConfig, SparseAdj, build_model
from quietgnn.partition import PartitionBook, build_partitions
from quietgnn.partition.book import make_book
from quietgnn.sampling.book import BookEvaluator

from helpers import small_graph


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    g = small_graph(n=150, avg_deg=5, seed=3)
    return g, make_book(tmp_path_factory.mktemp("b") / "book", g, "random", 3, seed=1)


def _exact(model, g):
    part = build_partitions(g, np.zeros(g.num_nodes, dtype=np.int64))[0]
    deg = part.in_degree[: part.n_own]
    adj = SparseAdj(part.indptr, part.indices, part.n_own, deg, deg)
    model.eval()
    with torch.no_grad():
        pred = model(part.x, [adj, adj]).argmax(-1)
    gid = part.owned
    y = part.y
    return {s: float((pred[m] == y[m]).float().mean())
            for s, m in (("train", part.train_mask), ("val", part.val_mask),
                         ("test", part.test_mask))}, gid


@pytest.mark.parametrize("arch", ["gcn", "sage"])
def test_every_neighbour_gives_the_exact_accuracy(book, arch):
    g, pb = book
    model = build_model(ModelConfig(arch=arch, hidden=16, layers=2, dropout=0.0),
                        g.num_features, g.num_classes, seed=4)
    exact, _ = _exact(model, g)
    ev = BookEvaluator(PartitionBook.open(pb.path), [-1, -1], 10_000, batch_size=17, seed=0)
    assert ev.targets.size == g.num_nodes - int((~(g.train_mask | g.val_mask |
                                                    g.test_mask)).sum())
    got = ev.evaluate(model)
    for s in exact:
        assert got[s] == pytest.approx(exact[s], abs=1e-6), s


def _collective_sample(comm, book_path, eval_nodes, seed):
    """This rank's share of the collective evaluator's sample (global ids, split, label)."""
    from quietgnn.sampling.evaluate import SampledEvaluator
    part = PartitionBook.open(book_path).load_part(comm.rank, comm.world_size)
    ev = SampledEvaluator(comm, part, [3, 2], eval_nodes, batch_size=5, seed=seed)
    return ev.targets.clone(), ev.split.clone(), ev.y.clone()


def test_sample_is_the_collective_evaluators(book):
    """The book's sample is the node set the collective SampledEvaluator picks in a real
    P-rank run (rank order, same splits and labels), and it has the rule's properties on the
    original graph: ceil(k / P) of each part's nodes per split (all when fewer), each in its
    split's mask, no repeats, fixed per seed and another for another seed."""
    from quietgnn.runtime.spawn import spawn_function
    g, pb = book
    P, k, seed = pb.num_parts, 12, 7
    ev = BookEvaluator(PartitionBook.open(pb.path), [3, 2], k, batch_size=5, seed=seed)
    got = spawn_function(_collective_sample, P, args=(str(pb.path), k, seed))
    assert np.array_equal(ev.targets, torch.cat([t for t, _, _ in got]).numpy())
    assert torch.equal(ev.split, torch.cat([s for _, s, _ in got]))
    assert torch.equal(ev.y, torch.cat([y for _, _, y in got]))
    # independent of how either evaluator picks: checked against the graph and the assignment
    assign = np.asarray(pb.assignment())
    share = -(-k // P)
    t = torch.from_numpy(ev.targets)
    assert np.unique(ev.targets).size == ev.targets.size
    assert torch.equal(ev.y, g.y[t])
    for s, mask in enumerate((g.train_mask, g.val_mask, g.test_mask)):
        mine = t[ev.split == s]
        assert bool(mask[mine].all()), s
        for j in range(P):
            have = int((mask & torch.from_numpy(assign == j)).sum())
            assert int((assign[mine.numpy()] == j).sum()) == min(share, have), (s, j)
    again = BookEvaluator(PartitionBook.open(pb.path), [3, 2], k, batch_size=5, seed=seed)
    assert np.array_equal(again.targets, ev.targets)
    other = BookEvaluator(PartitionBook.open(pb.path), [3, 2], k, batch_size=5, seed=seed + 1)
    assert set(other.targets.tolist()) != set(ev.targets.tolist())


def test_draws_are_fixed_and_within_the_fanout(book):
    g, pb = book
    ev = BookEvaluator(PartitionBook.open(pb.path), [3, 2], 60, batch_size=8, seed=0)
    seeds = ev.targets[:8]
    n1, b1 = ev.sample(seeds, 0)
    n2, b2 = ev.sample(seeds, 0)
    assert np.array_equal(n1, n2)
    assert all(torch.equal(a.indices, b.indices) for a, b in zip(b1, b2))
    assert np.array_equal(n1[: seeds.size], seeds)        # destinations first
    nbrs = {v: set(g.indices[g.indptr[v]:g.indptr[v + 1]].tolist())
            for v in range(g.num_nodes)}
    inner = b1[1]                                          # the seeds' block (fanout 2)
    assert int(inner.row_count.max()) <= 2
    level1 = n1[: inner.n_src]
    for r, v in enumerate(seeds.tolist()):
        got = level1[inner.indices[inner.indptr[r]:inner.indptr[r + 1]].numpy()]
        assert len(set(got.tolist())) == got.size and set(got.tolist()) <= nbrs[v]
        if len(nbrs[v]) <= 2:
            assert set(got.tolist()) == nbrs[v]       # every neighbour of a small row
        else:
            assert 1 <= got.size <= 2


@pytest.mark.slow
def test_tma_rank0_evaluates_from_the_book_without_the_whole_graph(book, tmp_path):
    """options.eval_nodes: rank 0 builds no whole graph; with full mode (every neighbour) and
    a sample covering every node the result is the exact evaluation's."""
    import quietgnn
    g, pb = book
    common = dict(epochs=2, out=str(tmp_path), options={"mode": "full", "period_epochs": 1.0},
                  runtime={"threads": 1})
    exact = quietgnn.train(pb.path, "tma", **common, run_name="exact")
    common["options"] = {**common["options"], "eval_nodes": 10_000}
    sampled = quietgnn.train(pb.path, "tma", **common, run_name="sampled")
    for k in ("test_acc", "val_acc", "train_acc"):
        assert getattr(sampled.summary, k) == pytest.approx(getattr(exact.summary, k), abs=1e-6)
    # the summary says the evaluation was on a sample, and how large
    assert sampled.summary.eval_sample_nodes == 10_000
    assert exact.summary.eval_sample_nodes is None
    # rank 0 told every rank at setup that it has its evaluator: one message from the hub,
    # a 20-byte header + b"Jnull" (None) per spoke, control traffic; the exact run sends none
    P, msg = pb.num_parts, HEADER_BYTES + 5
    for run, want in ((sampled, 1), (exact, 0)):
        for r in range(P):
            first = json.loads((run.run_dir / "metrics" / f"rank-{r}.jsonl").read_text()
                               .splitlines()[0])
            assert first["phase"] == "setup"
            got = [(x[3], x[4]) for x in first["rounds"] if x[1] == "eval_setup"]
            assert got == [((P - 1) * msg, 0) if r == 0 else (0, msg)] * want, (r, got)
    with pytest.raises(ValueError, match="eval_nodes"):
        quietgnn.train(pb.path, "tma", epochs=1, out=str(tmp_path), run_name="bad",
                       options={"eval_nodes": 5, "eval_graph": "gather"})


def test_tma_stops_every_rank_when_rank0_cannot_read_the_evaluation_sample(tmp_path):
    """Only rank 0's evaluator reads ``assignment.npy`` (a trainer maps its own part only).
    Altered in place (same size: the launcher's size check passes), every rank stops at setup,
    each naming the file (the trainers with rank 0's reason), long before the 2 x 30 + 5 s a
    trainer would wait for a silent hub, and nobody trains an epoch."""
    import time

    import quietgnn
    from quietgnn.runtime.launcher import LaunchError
    g = small_graph(n=150, avg_deg=5, seed=3)
    pb = make_book(tmp_path / "book", g, "random", 3, seed=1)
    f = pb.path / "assignment.npy"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 1
    f.write_bytes(bytes(raw))
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as ei:
        quietgnn.train(pb.path, "tma", epochs=2, out=str(tmp_path / "runs"), run_name="bad",
                       options={"mode": "full", "period_epochs": 1.0, "eval_nodes": 30},
                       runtime={"threads": 1, "timeout_s": 30, "progress": False})
    assert time.monotonic() - t0 < 30
    text = str(ei.value)
    assert ei.value.input_error and "stopped responding" not in text, text
    for r in range(pb.num_parts):
        line = next(x for x in text.splitlines() if x.startswith(f"rank {r} exited with code"))
        assert "ValueError" in line and f"{f}" in line and "does not match the checksum" in line
        if r:
            assert "rank 0 could not open the evaluation sample" in line, line
    for m in (tmp_path / "runs").rglob("metrics/rank-*.jsonl"):
        assert all(json.loads(x)["epoch"] < 0 for x in m.read_text().splitlines()), m


def test_a_trainer_that_waits_too_long_for_the_evaluation_sample_says_so():
    """A trainer waits for rank 0's eval_setup message as long as for any reply of the hub;
    when that runs out (rank 0 still hashing a large book, or gone), its error says what rank 0
    was doing and which timeouts to raise. Rank 0's own failures pass through unchanged."""
    from types import SimpleNamespace

    from quietgnn.comm.communicator import CommError
    from quietgnn.strategies.tma import TMAOptions
    from quietgnn.strategies.tma.data import open_book_eval

    class _SilentHub:
        def broadcast_object(self, obj, kind, *, carries=None):
            assert kind == "eval_setup"
            raise CommError("rank 1: lost the averaging hub (rank 0) in round 2")

    opts = TMAOptions(eval_nodes=8)
    with pytest.raises(CommError, match=r"lost the averaging hub .*while rank 0 was opening the "
                                        r"evaluation sample \(options.eval_nodes = 8\) from the "
                                        r"partition book '/b'.*raise options.fail_timeout_s"):
        open_book_eval(SimpleNamespace(rank=1, seed=0), _SilentHub(), "/b", [2, 2], opts)
    with pytest.raises(ValueError, match="no partition book at '/b'"):
        open_book_eval(SimpleNamespace(rank=0, seed=0), _SilentHub(), "/b", [2, 2], opts)
