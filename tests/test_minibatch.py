"""`minibatch` strategy: with full fanouts and one minibatch per epoch it *is* full-batch
training (same parameters as `centralized` after Adam steps, any P, both topologies); equal
step counts with unbalanced seeds; traffic kinds; option errors."""

from __future__ import annotations

import dataclasses
import numpy as np
import pytest
import torch

from quietgnn.comm import Communicator
from quietgnn.nn import ModelConfig
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.base import TrainConfig, WorkerContext
from quietgnn.strategies.halo import Halo
from quietgnn.strategies.minibatch import MiniBatch

from helpers import small_graph


def _ctx(comm, part, arch, layers=2, dropout=0.0):
    return WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                         model_cfg=ModelConfig(arch=arch, hidden=8, layers=layers,
                                               dropout=dropout),
                         train_cfg=TrainConfig(seed=7, lr=0.01))


def _train(comm, graph, parts, arch, opts, epochs=2):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    s = MiniBatch(_ctx(comm, part, arch), MiniBatch.Options(**opts)) if opts is not None else \
        Halo(_ctx(comm, part, arch))
    s.setup()
    comm.take_records()
    out = []
    for e in range(epochs):
        comm.epoch = e
        r = s.train_epoch(e)
        out.append((r.loss, r.steps))
    kinds = sorted({r.kind for r in comm.take_records()})
    return {"losses": out, "params": {n: p.detach().clone() for n, p in
                                      s.model.named_parameters()}, "kinds": kinds}


FULL = {"fanouts": "-1,-1", "batch_size": 100_000, "bulk": 1}


@pytest.fixture(scope="module")
def graph():
    return small_graph(n=160, seed=3)


@pytest.mark.parametrize("arch", ["sage", "gcn"])
def test_full_fanout_single_batch_equals_centralized_p1(graph, arch):
    parts = np.zeros(graph.num_nodes, dtype=np.int64)
    ref = _train(Communicator(0, 1), graph, parts, arch, None)
    got = _train(Communicator(0, 1), graph, parts, arch, FULL)
    for (a, _), (b, steps) in zip(ref["losses"], got["losses"]):
        assert steps == 1 and b == pytest.approx(a, rel=1e-5)
    for name, p in ref["params"].items():
        assert torch.allclose(got["params"][name], p, atol=1e-5), name


def _many(comm, graph, parts):
    return {"halo": _train(comm, graph, parts, "sage", None),
            "replicated": _train(comm, graph, parts, "sage", FULL),
            "15d": _train(comm, graph, parts, "sage", dict(FULL, topology="1.5d",
                                                           replication=2)),
            "small": _train(comm, graph, parts, "sage", {"fanouts": "3,2", "batch_size": 7,
                                                         "bulk": 3}, epochs=1)}


def test_full_fanout_single_batch_equals_centralized_p2(graph):
    parts = partition_nodes(graph, "metis", 2, seed=0)
    ref = _train(Communicator(0, 1), graph, np.zeros(graph.num_nodes, dtype=np.int64), "sage",
                 None)
    res = spawn_function(_many, 2, args=(graph, parts))
    for r in res:
        for mode in ("replicated", "15d"):
            for name, p in ref["params"].items():
                assert torch.allclose(r[mode]["params"][name], p, atol=1e-5), (mode, name)
            assert [s for _, s in r[mode]["losses"]] == [1, 1]
    assert "feature_fetch" in res[0]["replicated"]["kinds"]
    assert "sample_rows" not in res[0]["replicated"]["kinds"]        # replicated: no sampling
    assert {"sample_rows", "sample_allreduce"} <= set(res[0]["15d"]["kinds"])
    # small batches: every rank takes the same number of steps and sees the same global loss
    small = [r["small"]["losses"][0] for r in res]
    n_train = int(graph.train_mask.sum())
    own = [int(graph.train_mask[torch.as_tensor(parts) == i].sum()) for i in range(2)]
    assert small[0][1] == small[1][1] == -(-max(own) // 7) and small[0][1] >= n_train // 14
    assert small[0][0] == pytest.approx(small[1][0], rel=1e-6)


def _sparse_graph():
    """The graph with bag-of-words-like features: two non-zeros in each 64-wide row."""
    g = small_graph(n=160, features=64, seed=3)
    cols = torch.stack([g.y, (g.y + 5) % 64], 1)
    g = dataclasses.replace(g, x=torch.zeros_like(g.x).scatter_(1, cols, torch.rand(160, 2) + 0.5))
    return g


def _sparse_work(comm, graph, parts):
    return {"replicated": _train(comm, graph, parts, "sage", FULL),
            "15d": _train(comm, graph, parts, "sage", dict(FULL, topology="1.5d",
                                                           replication=2)),
            "eval": _evaluate_both(comm, graph, parts)}


def test_mostly_zero_features_train_and_evaluate_as_the_dense_ones():
    """Fetched, cached and fed to the model sparse (never dense), the single full-fanout
    minibatch still takes centralized's steps, on both topologies, and the sampled evaluation
    with full fanouts is the exact one (one process group for both)."""
    g = _sparse_graph()
    parts = partition_nodes(g, "metis", 2, seed=0)
    ref = _train(Communicator(0, 1), g, np.zeros(g.num_nodes, dtype=np.int64), "sage", None)
    for r in spawn_function(_sparse_work, 2, args=(g, parts)):
        for mode in ("replicated", "15d"):
            for name, p in ref["params"].items():
                assert torch.allclose(r[mode]["params"][name], p, atol=1e-5), (mode, name)
        for split in ("train", "val", "test"):
            assert r["eval"]["sampled"][split] == pytest.approx(r["eval"]["exact"][split],
                                                                abs=1e-12), split


def test_option_errors():
    with pytest.raises(ValueError, match="sampler"):
        MiniBatch.Options(sampler="fastgcn")
    with pytest.raises(ValueError, match="uniform 'sage'"):
        MiniBatch.Options(sampler="ladies", topology="1.5d", replication=2)
    with pytest.raises(ValueError, match="fanouts"):
        MiniBatch.Options(fanouts="15,x")
    g = small_graph(n=40, seed=0)
    part = build_partitions(g, np.zeros(g.num_nodes, dtype=np.int64))[0]
    s = MiniBatch(_ctx(Communicator(0, 1), part, "sage", layers=3),
                  MiniBatch.Options(fanouts="10,5"))
    with pytest.raises(ValueError, match="one fanout per layer"):
        s.setup()


def _evaluate_both(comm, graph, parts, topo=None):
    """One trained model evaluated two ways: sampled, with full fanouts over every node (small
    batches, so ranks run different numbers of real minibatches), and exactly (full graph
    through the halo)."""
    from quietgnn.strategies.common import global_evaluate, halo_forward, partition_adj
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    s = MiniBatch(_ctx(comm, part, "sage"), MiniBatch.Options(
        fanouts="-1,-1", batch_size=13, eval_nodes=10_000, **(topo or {})))
    s.setup()
    s.train_epoch(0)
    comm.take_records()
    out = {"sampled": s.evaluate(), "sampled_kinds": sorted({r.kind for r in
                                                             comm.take_records()})}
    fwd = halo_forward(s.model, part, comm, partition_adj(part))
    out["exact"] = global_evaluate(s.model, part, comm, fwd)
    out["exact_kinds"] = sorted({r.kind for r in comm.take_records()})
    return out


@pytest.mark.parametrize("P,topo", [(1, None), (3, None),
                                    (4, {"topology": "1.5d", "replication": 2}),
                                    (2, {"topology": "1.5d", "replication": 1})])
def test_sampled_evaluation_with_full_fanouts_is_exact(graph, P, topo):
    parts = partition_nodes(graph, "metis", P, seed=0) if P > 1 else \
        np.zeros(graph.num_nodes, dtype=np.int64)
    res = [_evaluate_both(Communicator(0, 1), graph, parts)] if P == 1 else \
        spawn_function(_evaluate_both, P, args=(graph, parts, topo))
    for r in res:
        for split in ("train", "val", "test"):
            assert r["sampled"][split] == pytest.approx(r["exact"][split], abs=1e-12), split
        if P > 1:   # no halo exchange: only the sample's feature rows and the counts
            extra = {"sample_rows", "sample_rows_ids"} if topo else set()
            if topo and topo["replication"] > 1:   # the replicas' partial samples
                extra.add("sample_allreduce")
            assert set(r["sampled_kinds"]) - {"control"} == \
                {"eval_metrics", "feature_fetch", "feature_fetch_ids"} | extra
            assert "halo_fwd" in r["exact_kinds"]


def _capped(comm, graph, parts, cap):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    s = MiniBatch(_ctx(comm, part, "sage"), MiniBatch.Options(
        fanouts="5,5", batch_size=16, steps_per_epoch=cap, cache_mb=0))
    s.setup()
    comm.take_records()
    r = s.train_epoch(0)
    fetched = sum(x.bytes_recv for x in comm.take_records() if x.kind == "feature_fetch")
    return r.steps, r.work, fetched


def test_steps_per_epoch_cuts_the_pass_short_on_every_rank(graph):
    parts = partition_nodes(graph, "metis", 2, seed=0)
    full = spawn_function(_capped, 2, args=(graph, parts, 0))
    cut = spawn_function(_capped, 2, args=(graph, parts, 3))
    T = full[0][0]
    assert T > 3 and all(f[0] == T and f[1] == 1.0 for f in full)
    # what the advisor counts an epoch's updates as, from the parts' training nodes alone
    train = np.bincount(np.asarray(parts)[graph.train_mask.numpy()], minlength=2).tolist()
    assert MiniBatch.updates_per_pass(MiniBatch.Options(batch_size=16), train) == T
    assert all(c[0] == 3 and c[1] == pytest.approx(3 / T) for c in cut)
    assert 0 < cut[0][2] < full[0][2]   # fewer bulks fetched
    with pytest.raises(ValueError, match="steps_per_epoch"):
        MiniBatch.Options(steps_per_epoch=-1)


def test_sampled_evaluation_options():
    with pytest.raises(ValueError, match="eval_nodes"):
        MiniBatch.Options(eval_nodes=-1)
    with pytest.raises(ValueError, match="cache_mb"):
        MiniBatch.Options(cache_mb=-1)


def _grad_bytes(comm, graph, parts, bits):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    s = MiniBatch(_ctx(comm, part, "sage"), MiniBatch.Options(
        fanouts="5,5", batch_size=32, grad_bits=bits))
    s.setup()
    comm.take_records()
    r = s.train_epoch(0)
    recs = comm.take_records()
    sent = [x.bytes_sent for x in recs if x.kind.startswith("grad")]
    n = sum(p.numel() for p in s.model.parameters())
    return r.steps, sent, n, float(r.loss)


@pytest.mark.parametrize("bits", [32, 4])
def test_gradient_bits_send_what_the_quantized_all_reduce_costs(graph, bits):
    from quietgnn.comm.qreduce import quantized_all_reduce_bytes
    P = 2
    parts = partition_nodes(graph, "metis", P, seed=0)
    for rank, (steps, sent, n, loss) in enumerate(spawn_function(_grad_bytes, P,
                                                                   args=(graph, parts, bits))):
        per_step = 2 * (P - 1) * 4 * (n + 1 + P) // P if bits == 32 else \
            quantized_all_reduce_bytes(n, P, bits, rank, exact_tail=1 + P)
        assert sum(sent) == steps * per_step and np.isfinite(loss)
    with pytest.raises(ValueError, match="grad_bits"):
        MiniBatch.Options(grad_bits=16)
