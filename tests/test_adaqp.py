"""`adaqp`: equals `halo` with quantization off (dropout included), overlap on and off give the
same result (quantized too), wire bytes follow the codec formula (fixed and mixed widths), the
adaptive assignment is consistent on both ends of every channel, the fast solver matches the
MILP, and a checkpoint resumes the quantizer exactly. Real gloo processes on 127.0.0.1."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
import torch

from quietgnn.comm import Communicator
from quietgnn.comm.bitassign import AssignProblem, evaluate, solve_fast, solve_milp
from quietgnn.comm.codecs import payload_bytes, row_bytes
from quietgnn.nn import ModelConfig
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.adaqp import AdaQP, AdaQPOptions
from quietgnn.strategies.base import TrainConfig, WorkerContext
from quietgnn.strategies.common import masked_loss, sync_gradients
from quietgnn.strategies.halo import Halo, HaloOptions

from helpers import small_graph

ARCHS = ("gcn", "sage", "gat")


def _ctx(comm, part, arch, layers=2, hidden=8, dropout=0.0):
    return WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                         model_cfg=ModelConfig(arch=arch, hidden=hidden, layers=layers,
                                               dropout=dropout, heads=2, norm="layer"),
                         train_cfg=TrainConfig(seed=7))


def _grads(strategy, forward, part, comm):
    strategy.model.train()
    torch.manual_seed(11)          # the same dropout masks for every strategy compared
    logits = forward()
    loss = masked_loss(logits, part.y, part.train_mask, part.num_train_global)
    loss.backward()
    sync_gradients(comm, strategy.params, loss)
    return logits.detach(), {n: p.grad.clone() for n, p in strategy.model.named_parameters()}


def _vs_halo(comm, graph, parts):
    """Per architecture, training mode with dropout: bits=32 adaqp (overlap on and off)
    against halo, and 4-bit adaqp with overlap on against off (same quantization draws).
    Hidden 4 and 16 on 8 features: narrowing (split) and widening first layers."""
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {}
    for a, hid in (("gcn", 4), ("gcn", 16), ("sage", 4), ("sage", 16), ("gat", 8)):
        h = Halo(_ctx(comm, part, a, hidden=hid, dropout=0.5))
        h.setup()
        ref = _grads(h, h.forward, part, comm)
        for overlap, cache in ((True, True), (False, True), (True, False)):
            s = AdaQP(_ctx(comm, part, a, hidden=hid, dropout=0.5),
                      AdaQPOptions(bits=32, overlap=overlap, cache_inputs=cache))
            s.setup()
            # the central block owns its columns: not a view keeping every edge's alive
            ind = s.adj_c.indices
            assert ind.untyped_storage().nbytes() == ind.numel() * ind.element_size()
            got = _grads(s, lambda: s.forward(train=True), part, comm)
            out[(a, hid, overlap, cache)] = (ref, got)
        q = []
        for overlap in (True, False):
            s = AdaQP(_ctx(comm, part, a, hidden=hid, dropout=0.5),
                      AdaQPOptions(bits=4, overlap=overlap))
            s.setup()
            q.append(_grads(s, lambda: s.forward(train=True), part, comm))
        out[(a, hid, "4-bit overlap on vs off")] = tuple(q)
        # quantization really changed something (else the comparison above proves nothing)
        assert not torch.allclose(q[0][0], ref[0], atol=1e-5)
    return out


def _async_cpu(comm):
    """An async exchange's CPU seconds exclude what the caller computes while it flies."""
    pending = comm.all_to_all_async([torch.zeros(4, dtype=torch.uint8)] * comm.world_size,
                                    "async")
    c0 = time.thread_time()
    x = 0
    while time.thread_time() - c0 < 0.3:
        x += 1
    pending.wait()
    return comm.take_records()[-1].cpu_seconds


@pytest.fixture(scope="module")
def graph():
    return small_graph(n=150, seed=1)


def _bytes_run(comm, graph, parts):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {"send": [int(t.numel()) for t in part.send_idx], "halo": part.n_halo}
    for bits, cache in ((2, True), (4, True), (8, True), (4, False)):
        s = AdaQP(_ctx(comm, part, "gcn", layers=3, hidden=20),
                  AdaQPOptions(bits=bits, cache_inputs=cache))
        s.setup()
        comm.take_records()
        res = s.train_epoch(0)
        recs = [(r.kind, r.bytes_sent, r.bytes_recv) for r in comm.take_records()]
        out[(bits, cache)] = {"recs": recs, "extra": res.extra}
    return out


def _lean(comm, graph, parts):
    """options.lean (GCN): at 32 bits, halo's lean forward exactly (keyed dropout; narrowing
    and widening first layers, 2 and 3 layers); at 8 bits, every exchange as wide as the lean
    forward sends it; adaptive widths assigned, the halo rows' aggregation weights those of
    the split blocks."""
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {"send": sum(int(t.numel()) for t in part.send_idx), "halo": part.n_halo, "eq": {}}
    for hid, layers in ((4, 2), (16, 2), (16, 3)):
        h = Halo(_ctx(comm, part, "gcn", layers=layers, hidden=hid, dropout=0.5),
                 HaloOptions(lean=True))
        h.setup()
        ref = _grads(h, h.forward, part, comm)
        s = AdaQP(_ctx(comm, part, "gcn", layers=layers, hidden=hid, dropout=0.5),
                  AdaQPOptions(bits=32, lean=True))
        s.setup()
        out["eq"][(hid, layers)] = (ref, _grads(s, lambda: s.forward(train=True), part, comm))
    s = AdaQP(_ctx(comm, part, "gcn", layers=3, hidden=20), AdaQPOptions(bits=8, lean=True))
    s.setup()
    comm.take_records()
    res = s.train_epoch(0)
    out["bytes"] = {"recs": [(r.kind, r.bytes_sent, r.bytes_recv) for r in comm.take_records()],
                    "extra": res.extra, "eval": s.evaluate(), "local": s.evaluate_local()}
    opts = dict(bits="adaptive", assign_cycle=2, group_size=5, time_model="lan")
    s = AdaQP(_ctx(comm, part, "gcn", layers=3, hidden=16), AdaQPOptions(lean=True, **opts))
    s.setup()
    split = AdaQP(_ctx(comm, part, "gcn", layers=3, hidden=16), AdaQPOptions(**opts))
    split.setup()
    losses = [s.train_epoch(e).loss for e in range(5)]
    out["adaptive"] = {"losses": losses, "assignments": s.assignments,
                       "hist": s.train_epoch(5).extra["bits_hist"],
                       "beta": (getattr(s, "_beta_fwd", []), getattr(split, "_beta_fwd", []))}
    return out


def _p4(comm, graph, parts_metis, parts_random):
    """Everything that needs 4 ranks, in one spawn (process start-up dominates the test)."""
    return {"halo": _vs_halo(comm, graph, parts_metis),
            "bytes": _bytes_run(comm, graph, parts_random),
            "adaptive": _adaptive_run(comm, graph, parts_metis, 5),
            "lean": _lean(comm, graph, parts_random)}


@pytest.fixture(scope="module")
def p4(graph):
    return spawn_function(_p4, 4, args=(graph, partition_nodes(graph, "metis", 4, seed=0),
                                        partition_nodes(graph, "random", 4, seed=3)))


def _check_vs_halo(results):
    for res in results:
        for key, ((l0, g0), (l1, g1)) in res.items():
            assert torch.allclose(l0, l1, atol=1e-5), key
            for name in g0:
                assert torch.allclose(g0[name], g1[name], atol=1e-5), (key, name)


def _p2(comm, graph, parts):
    return {"halo": _vs_halo(comm, graph, parts), "async_cpu": _async_cpu(comm),
            "lean": _lean(comm, graph, parts)}


@pytest.fixture(scope="module")
def p2(graph):
    return spawn_function(_p2, 2, args=(graph, partition_nodes(graph, "metis", 2, seed=0)))


def test_adaqp_without_quantization_equals_halo_p2(p2):
    _check_vs_halo([r["halo"] for r in p2])


def test_async_exchange_cpu_excludes_overlapped_compute(p2):
    # 0.3 s of CPU ran while the exchange was in flight: that is compute, not communication
    assert all(r["async_cpu"] < 0.1 for r in p2), [r["async_cpu"] for r in p2]


def test_adaqp_without_quantization_equals_halo_p4(p4):
    _check_vs_halo([r["halo"] for r in p4])


@pytest.mark.parametrize("bits,cache", [(2, True), (4, True), (8, True), (4, False)])
def test_wire_bytes_match_formula(graph, p4, bits, cache):
    results = [r["bytes"] for r in p4]
    F = graph.num_features
    key = (bits, cache)
    for res in results:
        rows, recs = sum(res["send"]), res[key]["recs"]
        fwd = [r for r in recs if r[0] == "adaqp_fwd"]
        bwd = [r for r in recs if r[0] == "adaqp_bwd"]
        # forward: layer inputs of width F (unless cached: fetched once at setup), 20, 20;
        # backward: layers 1 and 2 (width 20)
        widths = (20, 20) if cache else (F, 20, 20)
        assert [r[1] for r in fwd] == [rows * ((bits * d + 7) // 8 + 4) for d in widths]
        assert [r[2] for r in bwd] == [rows * row_bytes(bits, 20)] * 2
        assert [r[1] for r in bwd] == [res["halo"] * row_bytes(bits, 20)] * 2
        assert res[key]["extra"]["bits_hist"] == {str(bits): len(widths) * rows +
                                                  2 * res["halo"]}
        assert res[key]["extra"]["halo_bytes"] == sum(r[1] for r in fwd + bwd)
        assert {r[0] for r in recs} == {"adaqp_fwd", "adaqp_bwd", "grad_allreduce"}
    assert sum(r[1] for res in results for r in res[key]["recs"] if r[0] == "adaqp_bwd") == \
        sum(r[2] for res in results for r in res[key]["recs"] if r[0] == "adaqp_bwd") > 0


def _adaptive_run(comm, graph, parts, epochs):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    s = AdaQP(_ctx(comm, part, "sage", layers=3, hidden=16),
              AdaQPOptions(bits="adaptive", assign_cycle=2, group_size=5, solver="fast",
                           time_model="lan"))
    s.setup()
    comm.take_records()
    hist, losses = [], []
    with comm.phase("train"):
        for e in range(epochs):
            res = s.train_epoch(e)
            hist.append(res.extra["bits_hist"])
            losses.append(res.loss)
        state = copy.deepcopy(s.state_dict())   # what a checkpoint file holds
        recs = comm.take_records()
        after = s.train_epoch(epochs)
    last = comm.take_records()
    kinds = sorted({(r.kind, r.phase) for r in recs + last})
    carried = sorted({(r.kind, r.carries) for r in recs + last})
    # mixed widths on the wire: every exchange of that epoch sends what the formula says
    # the cached input rows (layer 0 forward) are never sent, so have no width on the wire
    keys = [k for k in s.ex.keys(s.L) if not (k == ("f", 0) and s.halo_x is not None)]
    wire = {"sent": [r.bytes_sent for r in last if r.kind in ("adaqp_fwd", "adaqp_bwd")],
            "recv": [r.bytes_recv for r in last if r.kind in ("adaqp_fwd", "adaqp_bwd")],
            "formula_sent": [sum(payload_bytes(w, s.model.dims[k[1]])
                                 for j, w in enumerate(s.ex.widths[k]["send"]) if j != comm.rank)
                             for k in keys],
            "formula_recv": [sum(payload_bytes(w, s.model.dims[k[1]])
                                 for j, w in enumerate(s.ex.widths[k]["recv"]) if j != comm.rank)
                             for k in keys],
            "order": [r.kind for r in last if r.kind in ("adaqp_fwd", "adaqp_bwd")]}
    s2 = AdaQP(_ctx(comm, part, "sage", layers=3, hidden=16),
               AdaQPOptions(bits="adaptive", assign_cycle=2, group_size=5, solver="fast",
                            time_model="lan"))
    s2.setup()
    s2.load_state_dict(state)
    comm.take_records()
    with comm.phase("train"):
        again = s2.train_epoch(epochs)
    widths = {k: {side: [t.tolist() for t in v] for side, v in d.items()}
              for k, d in s.ex.widths.items()}
    return {"hist": hist, "widths": widths, "kinds": kinds, "carried": carried, "losses": losses,
            "resume": (after.loss, again.loss), "wire": wire}


def test_adaptive_assignment_is_consistent_and_resumable(p4):
    res = [r["adaptive"] for r in p4]
    for i, r in enumerate(res):
        assert r["hist"][0].keys() == {"8"}              # 8 bits until the first assignment
        assert len(r["hist"][-1]) > 1                    # the solver mixed widths
        # what rank i sends to j is what j expects from i, for every exchange
        for key, d in r["widths"].items():
            for j, other in enumerate(res):
                if j != i:
                    assert d["send"][j] == other["widths"][key]["recv"][i], (key, i, j)
        # the assignment is training traffic; nothing else is sent
        assert r["kinds"] == [("adaqp_assign", "train"), ("adaqp_bwd", "train"),
                              ("adaqp_fwd", "train"), ("grad_allreduce", "train")]
        # the assignment's sums and widths come from the rows' own values (raw features at
        # layer 0): they travel as features, not as control or structure
        assert [c for k, c in r["carried"] if k == "adaqp_assign"] == ["features"]
        # bytes per exchange = sum over rows of ceil(b D / 8) + 4 at each row's own width;
        # forward exchanges in layer order, then backward from the last layer down
        w = r["wire"]
        n_f = w["order"].count("adaqp_fwd")
        expect_sent = w["formula_sent"][:n_f] + w["formula_sent"][n_f:][::-1]
        expect_recv = w["formula_recv"][:n_f] + w["formula_recv"][n_f:][::-1]
        assert w["order"] == ["adaqp_fwd"] * n_f + ["adaqp_bwd"] * (len(w["order"]) - n_f)
        assert w["sent"] == expect_sent and w["recv"] == expect_recv
        # resuming from the state dict repeats the next epoch exactly (weights, widths, RNG)
        assert r["resume"][0] == pytest.approx(r["resume"][1], rel=1e-6)
        assert r["losses"][-1] < r["losses"][0]


def test_lean_at_32_bits_equals_lean_halo(p2, p4):
    one = _lean(Communicator(0, 1), small_graph(n=150, seed=1), np.zeros(150, dtype=np.int64))
    for results in ([one], [r["lean"] for r in p2], [r["lean"] for r in p4]):
        _check_vs_halo([r["eq"] for r in results])


def test_lean_sends_narrow_quantized_rows(p4):
    """3 layers 8 -> 20 -> 20 -> 3 at 8 bits: layer 0's rows never cross (cached), layer 1's
    cross 20 wide, the output layer's 3 wide after its transform; their gradients likewise."""
    results = [r["lean"] for r in p4]
    for res in results:
        rows, recs = res["send"], res["bytes"]["recs"]
        fwd = [r for r in recs if r[0] == "adaqp_fwd"]
        bwd = [r for r in recs if r[0] == "adaqp_bwd"]
        assert [r[1] for r in fwd] == [rows * row_bytes(8, d) for d in (20, 3)]
        assert [r[1] for r in bwd] == [res["halo"] * row_bytes(8, d) for d in (3, 20)]
        assert res["bytes"]["extra"]["halo_bytes"] == sum(r[1] for r in fwd + bwd)
        assert {r[0] for r in recs} == {"adaqp_fwd", "adaqp_bwd", "grad_allreduce"}
        assert res["bytes"]["local"] is None and 0 <= res["bytes"]["eval"]["test"] <= 1
    assert sum(r[1] for res in results for r in res["bytes"]["recs"] if r[0] != "grad_allreduce") \
        == sum(r[2] for res in results for r in res["bytes"]["recs"]
               if r[0] != "grad_allreduce") > 0


def test_lean_adaptive_assigns_widths(p4):
    for r in [x["lean"]["adaptive"] for x in p4]:
        assert r["assignments"] == 2 and len(r["hist"]) > 1      # cycles at epochs 2 and 4
        assert all(np.isfinite(r["losses"])) and r["losses"][-1] < r["losses"][0]
        for lean, split in zip(*r["beta"]):
            assert torch.allclose(lean, split)


def test_lean_options_are_checked():
    with pytest.raises(ValueError, match="options.lean = true needs options.cache_inputs"):
        AdaQPOptions(lean=True, cache_inputs=False)
    with pytest.raises(ValueError, match="needs model.arch in \\['gcn'\\]; got model.arch = "
                                         "'sage'"):
        AdaQP.check_model(AdaQPOptions(lean=True), ModelConfig(arch="sage"))


def test_fast_solver_reaches_milp_objective():
    worst = 0.0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        C, G = int(rng.integers(2, 5)), int(rng.integers(4, 14))
        p = AssignProblem(sigma=rng.lognormal(0, 2, G), size=rng.integers(5, 50, G),
                          channel=rng.integers(0, C, G), alpha=rng.uniform(0.5, 5, C),
                          gamma=rng.uniform(0, 0.01, C), width=int(rng.choice([16, 64, 256])),
                          lam=float(rng.uniform(0.2, 0.8)))
        exact = evaluate(p, solve_milp(p))[0]
        fast = evaluate(p, solve_fast(p))[0]
        assert fast >= exact - 1e-6               # the MILP really is optimal
        worst = max(worst, (fast - exact) / max(exact, 1e-9))
    assert worst <= 0.01


def test_options_are_checked():
    with pytest.raises(ValueError, match="options.bits"):
        AdaQPOptions(bits=3)
    with pytest.raises(ValueError, match="time_model"):
        AdaQPOptions(time_model="moon")
    assert AdaQPOptions(bits="4").bits == 4


def test_fast_solver_reaches_milp_objective_on_adaqp_shaped_instances():
    """What ``AdaQP._solve`` builds: per channel, rows sorted by sigma and cut into groups of
    equal size (the last one partial), more groups per channel than the fast solver
    enumerates (its sweep path), channels of unequal speed, the default lam and others."""
    worst = 0.0
    for seed in range(10):
        rng = np.random.default_rng(100 + seed)
        C = int(rng.integers(2, 5))
        gs = int(rng.choice([20, 100]))
        sig, size, chan = [], [], []
        for c in range(C):
            n = int(rng.integers(9 * gs, 15 * gs))          # 9..15 groups on this channel
            row_sig = np.sort(rng.lognormal(0, 1.5, n))[::-1]
            g = np.arange(n) // gs
            sig.append(np.bincount(g, weights=row_sig))
            size.append(np.bincount(g).astype(float))
            chan.append(np.full(g.max() + 1, c))
        p = AssignProblem(sigma=np.concatenate(sig), size=np.concatenate(size),
                          channel=np.concatenate(chan), alpha=rng.uniform(2e-3, 2e-2, C),
                          gamma=rng.uniform(1e-4, 1e-3, C), width=int(rng.choice([64, 256, 1433])),
                          lam=[0.5, 0.5, 0.2, 0.8, 0.5][seed % 5])
        exact = evaluate(p, solve_milp(p))[0]
        fast = evaluate(p, solve_fast(p))[0]
        assert fast >= exact * (1 - 1e-3) - 1e-9   # CBC stops within its default gap
        worst = max(worst, (fast - exact) / max(exact, 1e-9))
    assert worst <= 0.01, worst


def test_milp_uses_pulps_current_api_without_deprecation_warnings():
    """PuLP 3.3 warns on every ``LpVariable(...)`` and on ``PULP_CBC_CMD`` (both go in 4.0):
    the MILP path must use ``prob.add_variable`` and ``COIN_CMD`` and warn about nothing."""
    import warnings
    rng = np.random.default_rng(0)
    p = AssignProblem(sigma=rng.lognormal(0, 2, 8), size=rng.integers(5, 50, 8),
                      channel=rng.integers(0, 2, 8), alpha=rng.uniform(0.5, 5, 2),
                      gamma=rng.uniform(0, 0.01, 2), width=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        bits = solve_milp(p)
    assert sorted(set(bits.tolist())) <= [2, 4, 8] and len(bits) == 8
