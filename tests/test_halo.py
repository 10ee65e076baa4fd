"""`halo` equals `centralized` (logits and parameter gradients, dropout on) with its static
inputs fetched once or re-sent every epoch, and its bytes equal the analytic halo size: real
gloo processes on 127.0.0.1."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quietgnn.comm import Communicator
from quietgnn.comm.traffic import Traffic
from quietgnn.nn import ModelConfig
from quietgnn.nn.keyed import mix_key, row_keep_mask
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.base import TrainConfig, WorkerContext
from quietgnn.strategies.common import masked_loss, sync_gradients
from quietgnn.strategies.halo import Halo, HaloOptions

from helpers import small_graph

ARCHS = ("gcn", "sage", "gat", "gin")


def _one_step(comm, graph, parts, arch, layers, cache=True, skip=True, dropout=0.5):
    """Forward + backward + gradient sync of every architecture on this rank's partition
    (training mode: dropout on)."""
    if isinstance(parts, str):      # a prepared directory: this rank's memory-mapped part
        from quietgnn.partition import PartitionBook
        part = PartitionBook.open(parts).load_part(comm.rank, comm.world_size)
    else:
        part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {"owned": part.owned, "send": [int(t.numel()) for t in part.send_idx],
           "send_ids": part.owned[torch.cat(part.send_idx)] if part.send_idx else None,
           "send_nnz": [int((part.x[t] != 0).sum()) for t in part.send_idx]}
    for a in arch:
        ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                            model_cfg=ModelConfig(arch=a, hidden=8, layers=layers,
                                                  dropout=dropout, heads=2, norm="layer"),
                            train_cfg=TrainConfig(seed=7))
        s = Halo(ctx, HaloOptions(cache_inputs=cache, skip_dropped=skip))
        s.setup()
        out.setdefault("setup", [(r.kind, r.op, r.bytes_sent, r.bytes_recv)
                                 for r in comm.take_records()])
        s.model.train()
        logits = s.forward()
        loss = masked_loss(logits, s.y, s.train_mask, part.num_train_global)
        loss.backward()
        gl = sync_gradients(comm, s.params, loss)
        out[a] = {"logits": logits.detach(), "loss": gl,
                  "grads": {n: p.grad.clone() for n, p in s.model.named_parameters()},
                  "records": [(r.kind, r.op, r.bytes_sent, r.bytes_recv) for r in comm.take_records()],
                  "nparams": sum(p.numel() for p in s.params)}
        s.evaluate()
        out[a]["eval"] = [(r.kind, r.op, r.bytes_sent, r.bytes_recv) for r in comm.take_records()]
    return out


@pytest.fixture(scope="module")
def graph():
    return small_graph(n=150, seed=1)


@pytest.fixture(scope="module")
def reference(graph):
    parts = np.zeros(graph.num_nodes, dtype=np.int64)
    return _one_step(Communicator(0, 1), graph, parts, ARCHS, 2)


@pytest.mark.parametrize("P,cache,skip", [(1, True, True), (2, True, True), (4, True, True),
                                          (2, False, False), (4, False, False),
                                          (4, True, False)])
def test_halo_equals_centralized(graph, reference, P, cache, skip):
    parts = partition_nodes(graph, "metis" if P > 1 else "random", P, seed=0)
    results = [_one_step(Communicator(0, 1), graph, parts, ARCHS, 2)] if P == 1 else \
        spawn_function(_one_step, P, args=(graph, parts, ARCHS, 2, cache, skip))
    for a in ARCHS:
        logits = torch.empty_like(reference[a]["logits"])
        for res in results:
            logits[res["owned"]] = res[a]["logits"]
        assert torch.allclose(logits, reference[a]["logits"], atol=1e-5), a
        for res in results:  # every rank holds the same, globally summed gradient
            assert res[a]["loss"] == pytest.approx(reference[a]["loss"], rel=1e-5)
            for name, g in reference[a]["grads"].items():
                assert torch.allclose(res[a]["grads"][name], g, atol=1e-5), (a, name)


@pytest.mark.parametrize("cache,skip", [(True, True), (False, False), (True, False)])
def test_halo_bytes_match_analytic_size(graph, cache, skip):
    P, layers, hidden, p = 4, 3, 8, 0.5
    parts = partition_nodes(graph, "random", P, seed=3)
    results = spawn_function(_one_step, P, args=(graph, parts, ("gcn",), layers, cache, skip))
    F = graph.num_features
    for res in results:
        rows = sum(res["send"])
        recs = res["gcn"]["records"]
        fwd = [r for r in recs if r[0] == "halo_fwd"]
        bwd = [r for r in recs if r[0] == "halo_bwd"]
        ar = [r for r in recs if r[0] == "grad_allreduce"]
        # a hidden layer's rows: only the entries keyed dropout kept (seed 7, epoch 0), or
        # whole rows
        key = mix_key(7, 0)
        hid = [4 * int(row_keep_mask(res["send_ids"], hidden, p, mix_key(key, layer)).sum())
               if skip else rows * 4 * hidden for layer in (1, 2)]
        if skip:
            assert all(0.3 * rows * 4 * hidden < b < 0.7 * rows * 4 * hidden for b in hid)
        # forward: one exchange per layer (layer 0's rows, whole, only when they are not
        # cached); backward: all but layer 0, the same entries as forward
        assert [r[2] for r in fwd] == ([] if cache else [rows * 4 * F]) + hid
        assert [r[3] for r in bwd] == hid[::-1]  # backward runs the layers in reverse
        # evaluation: whole hidden rows (no dropout), and layer 0's unless cached
        ev = [r for r in res["gcn"]["eval"] if r[0] == "halo_fwd"]
        widths = (hidden, hidden) if cache else (F, hidden, hidden)
        assert [r[2] for r in ev] == [rows * 4 * d for d in widths]
        nfloat = res["gcn"]["nparams"] + 1 + P
        assert [r[2] for r in ar] == [2 * (P - 1) * nfloat * 4 // P]
        assert len(recs) == len(fwd) + len(bwd) + len(ar)
        # setup: the input rows, once: nnz counts (8 bytes a peer), then each block dense or
        # sparse, whichever is smaller
        data = [r for r in res["setup"] if r[0] == "data"]
        if cache:
            blocks = [(r, z) for j, (r, z) in enumerate(zip(res["send"], res["send_nnz"]))
                      if r]
            assert [r[2] for r in data] == [8 * (P - 1), sum(min(4 * r * F, 4 * r + 8 * z)
                                                             for r, z in blocks)]
        else:
            assert data == []
    # what one rank sends is what the others receive
    sent = sum(r[2] for res in results for r in res["gcn"]["records"] if r[0] == "halo_fwd")
    recv = sum(r[3] for res in results for r in res["gcn"]["records"] if r[0] == "halo_fwd")
    assert sent == recv > 0


def _fetch(comm, x, parts):
    from quietgnn.comm import fetch_static_rows
    from quietgnn.graph import Graph
    g = Graph.from_edge_index(EDGES, x, torch.zeros(x.shape[0], dtype=torch.int64),
                              num_classes=2, undirected=True)
    from quietgnn.nn import SparseFeatures
    from quietgnn.strategies.common import inputs_with_halo
    part = build_partitions(g, parts, ranks=[comm.rank])[0]
    rows = fetch_static_rows(comm, part, part.x)
    sent = [r.bytes_sent for r in comm.take_records()]
    # the same rows from a sparse matrix, and returned sparse: the same bytes cross
    sparse = fetch_static_rows(comm, part, SparseFeatures.from_dense(part.x), sparse_out=True)
    sent_sparse = [r.bytes_sent for r in comm.take_records()]
    inputs = inputs_with_halo(comm, part, torch.device("cpu"))
    comm.take_records()
    return {"rows": rows, "want": x[part.halo], "sent": sent, "sparse": sparse,
            "sent_sparse": sent_sparse, "inputs": inputs, "own": part.x}


EDGES = torch.stack([torch.arange(60), (torch.arange(60) * 7 + 3) % 60])


@pytest.mark.parametrize("density", [0.02, 0.9])
def test_static_rows_arrive_exactly_sparse_when_smaller(density):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 50, generator=gen) * (torch.rand(60, 50, generator=gen) < density)
    parts = np.arange(60) // 20
    res = spawn_function(_fetch, 3, args=(x, parts))
    for r in res:
        assert r["want"].shape[0] > 0
        assert torch.equal(r["rows"], r["want"])      # bit-exact, whatever the encoding
        assert torch.equal(r["sparse"].to_dense(), r["want"]) and r["sent_sparse"] == r["sent"]
        # [owned ; halo], sparse (never dense) when mostly zero
        from quietgnn.nn import SparseFeatures
        assert isinstance(r["inputs"], SparseFeatures) == (density < 0.5)
        got = r["inputs"].to_dense() if density < 0.5 else r["inputs"]
        assert torch.equal(got, torch.cat([r["own"], r["want"]]))
    sent = sum(r["sent"][1] for r in res)
    dense = sum(4 * r["want"].numel() for r in res)
    if density < 0.5:
        assert sent < dense / 3                        # sparse: 4 r + 8 nnz, not 4 r F
    else:
        assert sent == dense


def _fill(comm, x, parts, round_bytes):
    from quietgnn.comm import halo
    from quietgnn.graph import Graph
    halo.FILL_ROUND_BYTES = round_bytes
    g = Graph.from_edge_index(EDGES, x, torch.zeros(x.shape[0], dtype=torch.int64),
                              num_classes=2, undirected=True)
    part = build_partitions(g, parts, ranks=[comm.rank])[0]
    ex = halo.HaloExchanger(comm, part, kind="embed")
    out = torch.full((part.n_own + part.n_halo, x.shape[1]), float("nan"))
    out[: part.n_own] = part.x
    ex.fill_halo(out, Traffic.EMBEDDINGS)
    recs = [(r.kind, r.bytes_sent, r.bytes_recv) for r in comm.take_records()]
    return {"out": out, "want": torch.cat([part.x, x[part.halo]]), "recs": recs}


@pytest.mark.parametrize("round_bytes", [64 << 20, 3 * 4 * 5])
def test_fill_halo_in_rounds(round_bytes):
    """The exchange into a filled buffer receives every halo row, in one all-to-all or (rounds
    of a few rows) in as many calls on every rank, with the same bytes in all."""
    x = torch.randn(60, 5, generator=torch.Generator().manual_seed(1))
    parts = np.arange(60) // 20
    res = spawn_function(_fill, 3, args=(x, parts, round_bytes))
    calls = {len(r["recs"]) for r in res}
    assert calls == ({1} if round_bytes > 1000 else {60})   # 60 nodes, one row a peer a round
    for r in res:
        assert torch.equal(r["out"], r["want"])
    assert sum(s for r in res for _, s, _ in r["recs"]) == \
        sum(v for r in res for _, _, v in r["recs"]) == sum(4 * 5 * (r["want"].shape[0] - 20)
                                                            for r in res)


# ---------------------------------------------------------------- options.lean (GCN)
LEAN_MODELS = [(4, 2), (16, 2), (16, 3), (4, 3), (8, 1)]   # (hidden, layers): 8 -> hidden -> ... -> 3


def _lean_step(comm, graph, parts, lean, cache=True):
    """Logits, gradients and records of one training step and one evaluation per model of
    LEAN_MODELS, with or without options.lean; ``parts`` a prepared directory: this rank's
    part as stored (mapped int32 edges, as the worker gives a lean run)."""
    if isinstance(parts, str):
        from quietgnn.partition import PartitionBook
        part = PartitionBook.open(parts).load_part(comm.rank, comm.world_size, stored=lean)
    else:
        part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {"owned": part.owned, "send": [int(t.numel()) for t in part.send_idx]}
    for hidden, layers in LEAN_MODELS:
        ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                            model_cfg=ModelConfig(arch="gcn", hidden=hidden, layers=layers,
                                                  dropout=0.5, norm="layer"),
                            train_cfg=TrainConfig(seed=7))
        s = Halo(ctx, HaloOptions(lean=lean, cache_inputs=cache))
        s.setup()
        comm.take_records()
        s.model.train()
        logits = s.forward()
        loss = masked_loss(logits, s.y, s.train_mask, part.num_train_global)
        loss.backward()
        gl = sync_gradients(comm, s.params, loss)
        rec = [(r.kind, r.bytes_sent, r.bytes_recv) for r in comm.take_records()]
        ev = s.evaluate()
        out[(hidden, layers)] = {
            "logits": logits.detach(), "loss": gl, "eval": ev,
            "grads": {n: p.grad.clone() for n, p in s.model.named_parameters()},
            "records": rec, "local": s.evaluate_local()}
    return out


@pytest.fixture(scope="module")
def lean_reference(graph):
    return _lean_step(Communicator(0, 1), graph, np.zeros(graph.num_nodes, dtype=np.int64),
                      False)


@pytest.mark.parametrize("P,cache", [(1, True), (2, True), (4, True), (2, False)])
def test_lean_halo_equals_centralized(graph, lean_reference, P, cache):
    """options.lean gives the default's logits, loss, gradients and accuracies, for widening
    and narrowing first layers, 1-3 layers, dropout and layer norm on; with the input rows
    cached or exchanged (only what dropout kept) at layer 0."""
    parts = partition_nodes(graph, "metis" if P > 1 else "random", P, seed=0)
    results = [_lean_step(Communicator(0, 1), graph, parts, True)] if P == 1 else \
        spawn_function(_lean_step, P, args=(graph, parts, True, cache))
    for m in LEAN_MODELS:
        ref = lean_reference[m]
        logits = torch.empty_like(ref["logits"])
        for res in results:
            logits[res["owned"]] = res[m]["logits"]
        assert torch.allclose(logits, ref["logits"], atol=1e-5), m
        for res in results:
            assert res[m]["loss"] == pytest.approx(ref["loss"], rel=1e-5)
            assert res[m]["eval"] == ref["eval"]
            assert res[m]["local"] is None      # no induced copy of the edges
            for name, g in ref["grads"].items():
                assert torch.allclose(res[m]["grads"][name], g,
                                      atol=1e-5), (m, name)


def _lean_step_small_slices(comm, graph, parts, lean):
    from quietgnn.nn import lean as lean_module
    lean_module._SLICE = 40     # slices of a few rows: every sliced path runs many times
    return _lean_step(comm, graph, parts, lean)


@pytest.mark.parametrize("P", [1, 2])
def test_lean_halo_in_small_slices_equals_centralized(graph, lean_reference, P, monkeypatch):
    from quietgnn.nn import lean as lean_module
    parts = partition_nodes(graph, "metis" if P > 1 else "random", P, seed=0)
    if P == 1:
        monkeypatch.setattr(lean_module, "_SLICE", 40)
        results = [_lean_step(Communicator(0, 1), graph, parts, True)]
    else:
        results = spawn_function(_lean_step_small_slices, P, args=(graph, parts, True))
    for m in LEAN_MODELS:
        logits = torch.empty_like(lean_reference[m]["logits"])
        for res in results:
            logits[res["owned"]] = res[m]["logits"]
            for name, g in lean_reference[m]["grads"].items():
                assert torch.allclose(res[m]["grads"][name], g, atol=1e-5), (m, name)
        assert torch.allclose(logits, lean_reference[m]["logits"], atol=1e-5), m


def test_lean_halo_sends_narrow_rows(graph):
    """The output layer's rows travel out_dim (3) wide, dense, both ways; a widening hidden
    layer's only what dropout kept; the layer-0 inputs not at all (cached)."""
    P = 4
    parts = partition_nodes(graph, "random", P, seed=3)
    lean = spawn_function(_lean_step, P, args=(graph, parts, True))
    full = spawn_function(_lean_step, P, args=(graph, parts, False))
    C = graph.num_classes
    for res, ref in zip(lean, full):
        rows = sum(res["send"])
        for m in LEAN_MODELS:
            fwd = [r[1] for r in res[m]["records"] if r[0] == "halo_fwd"]
            bwd = [r[2] for r in res[m]["records"] if r[0] == "halo_bwd"]
            ref_fwd = [r[1] for r in ref[m]["records"] if r[0] == "halo_fwd"]
            if m[1] == 1:    # one layer, its cached inputs transformed locally: no exchange
                assert fwd == bwd == []
                continue
            # the last layer 3 wide instead of hidden wide; the other layers as the default's
            assert fwd[-1] == bwd[0] == 4 * rows * C
            assert fwd[:-1] == ref_fwd[:-1]
            assert bwd[1:] == [r[2] for r in ref[m]["records"] if r[0] == "halo_bwd"][1:]


def test_lean_halo_refuses_other_archs(graph):
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64), ranks=[0])[0]
    ctx = WorkerContext(rank=0, world_size=1, comm=Communicator(0, 1), part=part,
                        model_cfg=ModelConfig(arch="sage", hidden=8), train_cfg=TrainConfig())
    with pytest.raises(ValueError, match="options.lean = true needs model.arch"):
        Halo(ctx, HaloOptions(lean=True)).setup()


def test_row_keep_mask_is_the_splitmix_formula_in_any_slicing():
    """the in-place, sliced hash gives the bits of the formula written out on whole tensors
    (masks recorded by earlier runs, and every rank's copy of a row's mask, stay the same)"""
    from quietgnn.nn import keyed
    ids = torch.randperm(300000, generator=torch.Generator().manual_seed(0))[:70000]
    for width, p, key in ((64, 0.5, 12345), (7, 0.3, -99), (300, 0.1, mix_key(3, 4, 5))):
        counters = ids.unsqueeze(1) * width + torch.arange(width)
        want = (keyed._mix(counters ^ key) & ((1 << 24) - 1)) >= int(round(p * (1 << 24)))
        assert torch.equal(keyed.row_keep_mask(ids, width, p, key), want)
        assert torch.equal(keyed.keep_mask(counters, p, key), want)
        assert torch.equal(keyed.row_keep_mask(ids, width, p, key, cols=(2, 5)), want[:, 2:5])
