"""`retexo`: the layers against quietgnn.nn, aggregation once per layer, P ranks == a
single-process layer-wise reference, the whole run's traffic against the analytic count,
`given` partitions, resume across a layer boundary, options. Real gloo processes on 127.0.0.1
for everything distributed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from quietgnn.comm import Communicator
from quietgnn.nn import ModelConfig, SparseAdj
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.retexo import layers as _retexo_layers
from quietgnn.strategies.retexo.layers import RetexoLayer, build_layers
from quietgnn.strategies.base import TrainConfig, WorkerContext
from quietgnn.strategies.common import partition_adj
from quietgnn.strategies.retexo import Retexo, RetexoOptions

from helpers import small_graph

ARCHS = ("gcn", "sage", "gat", "gin")
HIDDEN, LR = 8, 0.01


@pytest.fixture(scope="module")
def graph():
    return small_graph(n=150, seed=1)


def _ctx(comm, part, arch="gcn", layers=2, dropout=0.0, epochs=100, seed=7, log=None):
    return WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                         model_cfg=ModelConfig(arch=arch, hidden=HIDDEN, layers=layers,
                                               dropout=dropout, heads=2),
                         train_cfg=TrainConfig(seed=seed, lr=LR, epochs=epochs),
                         log=log or (lambda m: None))


def _drive(s, comm, eval_every=0, start=0):
    """What the trainer does: setup, then train (phase train) / evaluate (phase eval) until the
    strategy is finished. Returns per-epoch (loss, records)."""
    out = []
    e = start
    while not s.finished():
        comm.epoch = e
        with comm.phase("train"):
            res = s.train_epoch(e)
        if s.finished() or (eval_every and (e + 1) % eval_every == 0):
            with comm.phase("eval"):
                s.evaluate()
        out.append({"loss": res.loss, "extra": res.extra,
                    "recs": [(r.phase, r.kind, r.op, r.bytes_sent, r.bytes_recv)
                             for r in comm.take_records()]})
        e += 1
    return out


# ---------------------------------------------------------------------- the layers
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("last", [False, True])
def test_layer_equals_quietgnn_conv(graph, arch, last):
    """The cached-aggregate forward is the quietgnn.nn layer's forward on the same block."""
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    adj = partition_adj(part)
    out = 3 if last else 6
    layer = RetexoLayer(arch, graph.num_features, out, 3, last=last, heads=2, dropout=0.5).eval()
    pre = layer.precompute(part.x, adj)
    ref = layer.conv(part.x, adj)
    assert torch.allclose(layer.conv_out(pre), ref, atol=1e-5)
    rows = torch.tensor([3, 0, 17])
    assert torch.allclose(layer.conv_out(pre, rows), ref[rows], atol=1e-5)
    assert layer(pre).shape == (graph.num_nodes, 3)
    want = ref if last else F.relu(layer.norm(ref))
    assert torch.allclose(layer.next_input(pre, "hidden"), want, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["hidden", "logits"])
def test_sliced_maps_equal_one_piece(graph, arch, mode, monkeypatch):
    """Slices of a few rows give what one piece gives: the GCN self-loop term exactly,
    next_input written into a buffer up to float rounding (a GEMM over fewer rows may take
    another kernel)."""
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    adj = partition_adj(part)
    layer = RetexoLayer(arch, graph.num_features, 6, 3, last=False, heads=2).eval()
    pre = layer.precompute(part.x, adj)
    want = layer.next_input(pre, mode)
    monkeypatch.setattr(_retexo_layers, "SLICE_VALUES", 7 * graph.num_features)
    sliced = layer.precompute(part.x, adj)
    for a, b in zip(sliced.t, pre.t):
        assert torch.equal(a, b)
    out = torch.full((part.n_own + 5, want.shape[1]), float("nan"))
    assert layer.next_input(sliced, mode, out=out[: part.n_own]) is not None
    torch.testing.assert_close(out[: part.n_own], want, rtol=1e-6, atol=1e-6)
    assert torch.isnan(out[part.n_own:]).all()


@pytest.mark.parametrize("arch", ["gcn", "sage", "gin"])
def test_dropout_over_picked_rows_leaves_the_cache(graph, arch):
    """Training rows picked by index go through dropout in place: the forward and gradients
    of out-of-place dropout, and the cached aggregates unchanged."""
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    layer = RetexoLayer(arch, graph.num_features, 6, 3, last=False, dropout=0.5).train()
    pre = layer.precompute(part.x, partition_adj(part))
    before = [t.clone() for t in pre.t]
    rows = torch.tensor([5, 1, 9, 40, 41])
    torch.manual_seed(3)
    got = layer(pre, rows)
    got.square().sum().backward()
    g_got = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    torch.manual_seed(3)
    picked = _retexo_layers.Pre(tuple(t[rows] for t in pre.t))
    want = layer(picked)             # no indices: dropout out of place on the copies
    want.square().sum().backward()
    assert torch.equal(got, want)
    assert all(torch.equal(a, p.grad) for a, p in zip(g_got, layer.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(pre.t, before))


def test_hidden_layer_head_reads_through_dropout(graph):
    """Training a hidden layer, the head sees dropout(ReLU(conv)) -- entries either 0 or scaled
    by 1/(1-p), about a fraction p of them dropped -- while next_input (and eval) get no
    dropout."""
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    p = 0.5
    layer = RetexoLayer("gcn", graph.num_features, 32, 3, last=False, dropout=p,
                        layer_norm=False).train()
    pre = layer.precompute(part.x, partition_adj(part))
    seen = []
    layer.head.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
    torch.manual_seed(0)
    layer(pre)
    torch.manual_seed(0)
    z = layer.hidden(pre)          # the same aggregate dropout masks, drawn first
    got, on = seen[0], z > 0
    assert torch.all((got == 0) | torch.isclose(got, z / (1 - p)))
    assert abs(float((got[on] == 0).float().mean()) - p) < 0.05
    layer.eval()
    layer(pre)
    assert torch.equal(seen[-1], layer.next_input(pre, "hidden"))


def test_aggregation_once_per_layer(graph, monkeypatch):
    """GCN/SAGE/GIN: the sparse product runs once per layer (at its start), never per round;
    GAT: every step (attention depends on the parameters)."""
    calls = {"n": 0}
    real = _retexo_layers.spmm_rows

    def counting(*a, **kw):
        calls["n"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(_retexo_layers, "spmm_rows", counting)
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    for arch, per_layer in (("gcn", 1), ("sage", 1), ("gin", 1)):
        calls["n"] = 0
        s = Retexo(_ctx(Communicator(0, 1), part, arch, layers=3),
                   RetexoOptions(rounds_per_layer=[4, 5, 6]))
        s.setup()
        _drive(s, s.ctx.comm, eval_every=2)
        assert calls["n"] == 3 * per_layer, arch
    calls["n"] = 0
    s = Retexo(_ctx(Communicator(0, 1), part, "gat"), RetexoOptions(rounds_per_layer=4))
    s.setup()
    _drive(s, s.ctx.comm)
    assert calls["n"] == 0    # GAT's conv does its own per-step products, not precompute's


# ---------------------------------------------------------------------- equivalence
def _reference(graph, arch, layers, R, embed, layer_norm, seed=7):
    """Layer-wise RETEXO on the whole graph in one process, written out independently of the
    strategy: per layer, R rounds of (validate, full-batch Adam step), keep the best, validate
    the last step, restore the best, compute the next input."""
    n = graph.num_nodes
    deg = graph.in_degree()
    adj = SparseAdj(graph.indptr, graph.indices, n, deg, deg)
    mods = build_layers(arch, graph.num_features, HIDDEN, graph.num_classes, layers, 2, 0.0,
                        bool(layer_norm), embed, seed)
    tr, va = graph.train_mask, graph.val_mask
    h, best_vals = graph.x, []
    for k, layer in enumerate(mods):
        pre = layer.precompute(h, adj)
        opt = torch.optim.Adam(layer.parameters(), lr=LR, weight_decay=5e-4)
        best, best_state = -1.0, None

        def consider():
            nonlocal best, best_state
            with torch.no_grad():
                layer.eval()
                acc = float((layer(pre).argmax(-1)[va] == graph.y[va]).float().mean())
                layer.train()
            if acc > best:
                best, best_state = acc, {a: b.clone() for a, b in layer.state_dict().items()}

        for _ in range(R[k]):
            consider()
            opt.zero_grad()
            F.cross_entropy(layer(pre)[tr], graph.y[tr]).backward()
            opt.step()
        consider()
        layer.load_state_dict(best_state)
        best_vals.append(best)
        if k < layers - 1:
            h = layer.next_input(pre, embed)
    with torch.no_grad():
        mods[-1].eval()
        logits = mods[-1](pre)
    return logits, best_vals, mods


# (arch, layers, embed, options.layer_norm): None = as model.norm ('none' here: no LayerNorm)
CASES = [("gcn", 2, "hidden", None), ("sage", 2, "hidden", None), ("gat", 2, "hidden", True),
         ("gin", 2, "hidden", None), ("gcn", 3, "logits", True)]
R_EQ = [3, 4, 2]


def _final(comm, graph, parts, cases):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {"owned": part.owned}
    for arch, layers, embed, ln in cases:
        s = Retexo(_ctx(comm, part, arch, layers),
                   RetexoOptions(rounds_per_layer=R_EQ[:layers], embed=embed, layer_norm=ln))
        s.setup()
        log = _drive(s, comm)
        with torch.no_grad():
            s.layers[-1].eval()
            logits = s.layers[-1](s.pre)
        out[(arch, layers, embed, ln)] = {
            "logits": logits, "val_best": s.val_best, "epochs": len(log),
            "params": {k: v.clone() for k, v in s.layers.state_dict().items()}}
    return out


def _jobs(comm, graph, parts, jobs):
    """Several checks in one process group (process start-up dominates on a small machine)."""
    fns = {"final": _final, "traffic": _traffic, "resume": _resume, "lean": _lean}
    return {name: fns[name](comm, graph, parts, *args) for name, args in jobs.items()}


R_TRAFFIC = [3, 2, 4]
RUNS = {"gcn-hidden": ("gcn", 3, R_TRAFFIC, "hidden"),
        "sage-logits": ("sage", 3, R_TRAFFIC, "logits"),
        "gat-hidden": ("gat", 3, R_TRAFFIC, "hidden")}


@pytest.fixture(scope="module")
def spawned(graph):
    """Per P: random partitions (many boundary rows), the equivalence and traffic runs; P=2
    also the resume runs."""
    out = {}
    narrow = _narrow_graph()
    for P in (2, 4):
        parts = partition_nodes(graph, "random", P, seed=3)
        # the lean path on narrow features (they widen at layer 0); at P = 2 in slices of a
        # few rows, so every sliced loop runs many times
        jobs = {"final": (CASES,), "traffic": (RUNS,),
                "lean": (narrow, partition_nodes(narrow, "random", P, seed=3), P == 2)}
        if P == 2:
            jobs["resume"] = ()
        by_rank = spawn_function(_jobs, P, args=(graph, parts, jobs))
        out[P] = {name: [r[name] for r in by_rank] for name in jobs}
    return out


@pytest.mark.parametrize("P", [1, 2, 4])
def test_equals_single_process_layerwise_reference(graph, spawned, P):
    results = [_final(Communicator(0, 1), graph, np.zeros(graph.num_nodes, dtype=np.int64),
                      CASES)] if P == 1 else spawned[P]["final"]
    for case in CASES:
        arch, layers, embed, ln = case
        ref_logits, ref_best, ref_mods = _reference(graph, arch, layers, R_EQ[:layers], embed,
                                                    ln)
        logits = torch.empty_like(ref_logits)
        for res in results:
            logits[res["owned"]] = res[case]["logits"]
            assert res[case]["epochs"] == sum(R_EQ[:layers])
            assert res[case]["val_best"] == pytest.approx(ref_best), case
            for name, v in ref_mods.state_dict().items():
                assert torch.allclose(res[case]["params"][name], v, atol=1e-5), (case, name)
        assert torch.allclose(logits, ref_logits, atol=1e-4), case


# ---------------------------------------------------------------------- traffic
def _traffic(comm, graph, parts, runs):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {"rows": sum(int(t.numel()) for t in part.send_idx)}
    for name, (arch, layers, R, embed) in runs.items():
        s = Retexo(_ctx(comm, part, arch, layers, dropout=0.5),
                   RetexoOptions(rounds_per_layer=R, embed=embed))
        comm.take_records()
        with comm.phase("setup"):
            s.setup()
        setup = comm.take_records()
        log = _drive(s, comm, eval_every=2)
        out[name] = {"setup": setup, "log": log, "widths": [m.in_dim for m in s.layers],
                     "nparams": [sum(p.numel() for p in m.parameters()) for m in s.layers]}
    return out


def _check_traffic(results, P, R):
    """Across the whole run, phase train carries exactly: one embed_fwd per layer of
    4 d_k sum|B| bytes (h_0 in the first round, h_{k+1} at the end of layer k's last round),
    one grad_allreduce per round of the analytic size, one val_counts per layer (its last
    round); phase eval only eval_metrics."""
    L = len(R)
    starts = [sum(R[:k]) for k in range(L)]
    for name in [k for k in results[0] if k != "rows"]:
        sent_total = recv_total = 0
        for res in results:
            r = res[name]
            assert r["setup"] == []
            assert len(r["log"]) == sum(R)
            epoch_layer = [k for k in range(L) for _ in range(R[k])]
            for e, ep in enumerate(r["log"]):
                k = epoch_layer[e]
                train = [x for x in ep["recs"] if x[0] == "train"]
                evals = [x for x in ep["recs"] if x[0] == "eval"]
                assert {x[0] for x in ep["recs"]} <= {"train", "eval"}
                want = []
                if e == 0:           # h_0, before the first step
                    want.append(("embed_fwd", "all_to_all", 4 * r["widths"][0] * res["rows"]))
                nfloat = r["nparams"][k] + 1 + P + 1
                want.append(("grad_allreduce", "all_reduce", 2 * (P - 1) * 4 * nfloat // P))
                if e == starts[k] + R[k] - 1:
                    want.append(("val_counts", "all_reduce", 2 * (P - 1) * 8 // P))
                    if k < L - 1:    # h_{k+1}, as soon as layer k is done
                        want.append(("embed_fwd", "all_to_all",
                                     4 * r["widths"][k + 1] * res["rows"]))
                assert [(x[1], x[2], x[3]) for x in train] == want, (name, e)
                assert {x[1] for x in evals} <= {"eval_metrics"}
                assert bool(evals) == ((e + 1) % 2 == 0 or e == len(r["log"]) - 1)
                assert ep["extra"]["layer"] == k
                sent_total += sum(x[3] for x in train if x[1] == "embed_fwd")
                recv_total += sum(x[4] for x in train if x[1] == "embed_fwd")
        assert sent_total == recv_total > 0      # what one rank sends the others receive


@pytest.mark.parametrize("P", [2, 4])
def test_only_one_exchange_per_layer_and_gradients(graph, spawned, P):
    results = spawned[P]["traffic"]
    _check_traffic(results, P, R_TRAFFIC)
    # the logit-passing variant sends C columns instead of hidden after layer 0
    r = results[0]
    assert r["sage-logits"]["widths"] == [graph.num_features, graph.num_classes,
                                          graph.num_classes]
    assert r["gcn-hidden"]["widths"] == [graph.num_features, HIDDEN, HIDDEN]


def test_given_partition_uneven_with_empty_train_rank(graph):
    """`given`: an arbitrary assignment (uneven sizes; rank 2 owns no training node) trains,
    sends exactly the analytic traffic and still equals the single-process reference."""
    P = 3
    parts = np.zeros(graph.num_nodes, dtype=np.int64)
    train = graph.train_mask.numpy()
    idx = np.arange(graph.num_nodes)
    parts[idx % 5 == 1] = 1
    parts[(~train) & (idx % 3 == 0)] = 2
    assert not train[parts == 2].any() and (parts == 2).sum() > 10
    parts = partition_nodes(graph, "given", P, assignment=parts)
    R = [2, 3]
    by_rank = spawn_function(_jobs, P, args=(graph, parts, {
        "traffic": ({"gcn": ("gcn", 2, R, "hidden")},), "final": ([("gcn", 2, "hidden", None)],)}))
    _check_traffic([r["traffic"] for r in by_rank], P, R)
    eq = [r["final"] for r in by_rank]
    ref_logits, _, _ = _reference(graph, "gcn", 2, R_EQ[:2], "hidden", None)
    logits = torch.empty_like(ref_logits)
    for res in eq:
        logits[res["owned"]] = res[("gcn", 2, "hidden", None)]["logits"]
    assert torch.allclose(logits, ref_logits, atol=1e-4)


# ---------------------------------------------------------------------- resume
def _resume(comm, graph, parts):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    opts = RetexoOptions(rounds_per_layer=[3, 3])

    def fresh():
        s = Retexo(_ctx(comm, part, "sage", 2, dropout=0.5), opts)
        s.setup()
        return s

    torch.manual_seed(11 + comm.rank)
    unbroken = [x["loss"] for x in _drive(fresh(), comm)]
    out = {"unbroken": unbroken, "cuts": {}}
    for cut in (2, 3, 4):          # inside layer 0, right at the boundary, inside layer 1
        torch.manual_seed(11 + comm.rank)
        s = fresh()
        losses = []
        for e in range(cut):
            losses.append(s.train_epoch(e).loss)
        state, rng = s.state_dict(), torch.random.get_rng_state()
        s2 = fresh()
        s2.load_state_dict(state)
        torch.random.set_rng_state(rng)
        losses += [x["loss"] for x in _drive(s2, comm, start=cut)]
        out["cuts"][cut] = (losses, s2.evaluate())
    torch.manual_seed(11 + comm.rank)
    s = fresh()
    _drive(s, comm)
    out["final"] = s.evaluate()
    return out


def test_resume_across_layer_boundary(spawned):
    for res in spawned[2]["resume"]:
        for cut, (losses, accs) in res["cuts"].items():
            assert losses == res["unbroken"], cut
            assert accs == res["final"], cut


# ---------------------------------------------------------------------- lean (GCN)
def _narrow_graph():
    return small_graph(n=150, seed=1, features=4)     # 4 features < HIDDEN: layer 0 widens


# (layers, embed, options.layer_norm): 2 layers: h_1 travels as layer 0's aggregates; 3
# layers: then h_2 as itself (8 -> 8 does not widen); logits: nothing widens into C = 3
LEAN_CASES = [(2, "hidden", None), (3, "hidden", True), (3, "logits", True)]


def _lean(comm, graph, parts, narrow, nparts, small_slices=False):
    """options.lean on ``narrow``: final logits and parameters per case, the bytes of every
    embedding exchange, a resume at and after the layer boundary (the checkpoint through the
    safe serializer), and a run under residency."""
    from quietgnn import serial
    from quietgnn.nn import lean as lean_module
    if small_slices:
        lean_module._SLICE = 8
    part = build_partitions(narrow, nparts, ranks=[comm.rank])[0]
    out = {"owned": part.owned, "rows": sum(int(t.numel()) for t in part.send_idx)}

    def run(layers, embed, ln, dropout=0.0, R=None):
        s = Retexo(_ctx(comm, part, "gcn", layers, dropout=dropout),
                   RetexoOptions(rounds_per_layer=R or R_EQ[:layers], embed=embed,
                                 layer_norm=ln, lean=True))
        s.setup()
        return s

    for case in LEAN_CASES:
        s = run(*case)
        log = _drive(s, comm)
        with torch.no_grad():
            s.layers[-1].eval()
            logits = s.layers[-1](s.pre)
        out[case] = {"logits": logits, "val_best": s.val_best,
                     "params": {k: v.clone() for k, v in s.layers.state_dict().items()},
                     "embed": [x[3] for ep in log for x in ep["recs"] if x[1] == "embed_fwd"],
                     "widths": s.run_report()["exchange_widths"]}
    torch.manual_seed(11 + comm.rank)
    out["unbroken"] = [x["loss"] for x in _drive(run(2, "hidden", None, 0.5, [3, 3]), comm)]
    out["cuts"] = {}
    for cut in (3, 4):          # h_next is the aggregates / layer 1 trains on them
        torch.manual_seed(11 + comm.rank)
        s = run(2, "hidden", None, 0.5, [3, 3])
        losses = [s.train_epoch(e).loss for e in range(cut)]
        state = serial.loads(serial.dumps(s.state_dict()))
        s2 = run(2, "hidden", None, 0.5, [3, 3])
        s2.load_state_dict(state)
        losses += [x["loss"] for x in _drive(s2, comm, start=cut)]
        out["cuts"][cut] = losses
    comm.residency = "features"
    try:
        s = run(2, "hidden", None)
        out["residency"] = [x[3] for ep in _drive(s, comm) for x in ep["recs"]
                            if x[1] == "embed_fwd"]
    finally:
        comm.residency = "none"
    return out


@pytest.mark.parametrize("P", [1, 2, 4])
def test_lean_equals_single_process_layerwise_reference(spawned, P):
    """options.lean trains the same layers as the single-process reference: the aggregation
    in slices, and h_1 exchanged and held as layer 0's aggregates (4 wide, not 8), mapped to
    h_1 per edge where layer 1 aggregates it."""
    narrow = _narrow_graph()
    results = [_lean(Communicator(0, 1), None, None, narrow,
                     np.zeros(narrow.num_nodes, dtype=np.int64))] if P == 1 \
        else spawned[P]["lean"]
    F_, C = narrow.num_features, narrow.num_classes
    for case in LEAN_CASES:
        layers, embed, ln = case
        ref_logits, ref_best, ref_mods = _reference(narrow, "gcn", layers, R_EQ[:layers],
                                                    embed, ln)
        logits = torch.empty_like(ref_logits)
        for res in results:
            logits[res["owned"]] = res[case]["logits"]
            assert res[case]["val_best"] == pytest.approx(ref_best), case
            for name, v in ref_mods.state_dict().items():
                assert torch.allclose(res[case]["params"][name], v, atol=1e-5), (case, name)
            widths = {(2, "hidden"): [F_, F_], (3, "hidden"): [F_, F_, HIDDEN],
                      (3, "logits"): [F_, C, C]}[(layers, embed)]
            assert res[case]["widths"] == widths
            if P > 1:                # one exchange per layer, of those widths, fp32
                assert res[case]["embed"] == [4 * w * res["rows"] for w in widths], case
        assert torch.allclose(logits, ref_logits, atol=1e-4), case


@pytest.mark.parametrize("P", [2, 4])
def test_lean_resumes_and_keeps_raw_aggregates_home_under_residency(spawned, P):
    for res in spawned[P]["lean"]:
        for cut, losses in res["cuts"].items():
            assert losses == res["unbroken"], cut
        # residency: no layer-0 exchange, and h_1 crosses as itself (HIDDEN wide), never as
        # the aggregates of raw features
        assert res["residency"] == [4 * HIDDEN * res["rows"]]


def test_lean_refuses_other_archs():
    with pytest.raises(ValueError, match=r"retexo: options.lean = true needs model.arch in \['gcn'\]; got "
                                         r"model.arch = 'sage'"):
        Retexo.check_model(RetexoOptions(lean=True), ModelConfig(arch="sage"))
    Retexo.check_model(RetexoOptions(lean=False), ModelConfig(arch="sage"))


# ---------------------------------------------------------------------- options
def test_schedule_and_options():
    # default: the run's epochs split over the layers (the same work as other strategies)
    assert RetexoOptions().schedule(2, 200) == [100, 100]
    assert RetexoOptions().schedule(3, 100) == [34, 33, 33]
    assert RetexoOptions().schedule(3, 2) == [1, 1, 1]
    assert RetexoOptions(rounds_per_layer=7).schedule(2, 100) == [7, 7]
    assert RetexoOptions(rounds_per_layer="5, 9").schedule(2, 100) == [5, 9]
    assert RetexoOptions(rounds_per_layer=[5, 9, 2]).schedule(3, 100) == [5, 9, 2]
    with pytest.raises(ValueError, match=r"gives 2 values but the model has 3 layers"):
        RetexoOptions(rounds_per_layer=[5, 9]).schedule(3, 100)


def test_layer_norm_default_and_override(graph):
    """Default: LayerNorm (the paper's); options.layer_norm None follows model.norm, true/false
    override it."""
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    for norm, opt, want in [("none", "default", True), ("none", None, False),
                            ("layer", None, True), ("none", True, True), ("layer", False, False)]:
        ctx = _ctx(Communicator(0, 1), part)
        ctx.model_cfg.norm = norm
        s = Retexo(ctx, RetexoOptions() if opt == "default" else RetexoOptions(layer_norm=opt))
        s.setup()
        assert s.run_report()["layer_norm"] is want
        assert isinstance(s.layers[0].norm, torch.nn.LayerNorm) is want, (norm, opt)


@pytest.mark.parametrize("bad, match", [({"rounds_per_layer": 0}, "rounds_per_layer = 0"),
                                        ({"rounds_per_layer": "3,x"}, "'3,x'"),
                                        ({"rounds_per_layer": 2.5}, "2.5"),
                                        ({"embed": "probs"}, "options.embed = 'probs'"),
                                        ({"layer_norm": "yes"}, "layer_norm"),
                                        ({"grad_bits": 16}, "grad_bits = 16")])
def test_options_are_validated(bad, match):
    with pytest.raises(ValueError, match=match):
        RetexoOptions(**bad)


def test_short_epochs_warn_and_stop_inside_a_layer(graph):
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    msgs = []
    s = Retexo(_ctx(Communicator(0, 1), part, epochs=5, log=msgs.append),
               RetexoOptions(rounds_per_layer=4))
    s.setup()
    assert msgs and "--epochs 8" in msgs[0]
    for e in range(5):
        s.train_epoch(e)
    assert not s.finished() and s.k == 1 and s.round == 1
    assert s.evaluate()["val"] >= 0
    with pytest.raises(ValueError, match="schedule is"):
        other = Retexo(_ctx(Communicator(0, 1), part), RetexoOptions(rounds_per_layer=3))
        other.setup()
        other.load_state_dict(s.state_dict())


# ---------------------------------------------------------------------- command line
def test_cli_train_stops_after_the_schedule(tmp_path):
    """`quietgnn train --strategy retexo`: the run ends after sum(R_k) rounds even with more
    epochs allowed, prints accuracy and bytes, reports the schedule; bad options exit 2."""
    import json
    import subprocess
    import sys
    tiny = ["--synthetic.nodes", "300", "--synthetic.feature_dim", "8", "--hidden", "16",
            "--runtime.progress", "false", "--out", str(tmp_path / "runs")]

    def run(*args):
        return subprocess.run([sys.executable, "-m", "quietgnn", "train", "--strategy", "retexo",
                               *args, *tiny], capture_output=True, text=True, timeout=240)

    out = tmp_path / "s.json"
    # (gradients quantized to 8 bits: the same traffic kinds, end to end through the CLI)
    r = run("--parts", "2", "--epochs", "20", "--options.rounds_per_layer", "3,4",
            "--options.grad_bits", "8", "--summary-json", str(out))
    assert r.returncode == 0, r.stderr
    assert "test accuracy" in r.stdout and "training bytes" in r.stdout
    s = json.loads(out.read_text())
    assert s["epochs"] == 7 and s["best_epoch"] <= 6
    assert s["strategy_report"]["schedule"] == [3, 4]
    assert s["strategy_report"]["layers_done"] == 2
    kinds = set()
    for f in sorted((tmp_path / "runs").glob("*/metrics/rank-*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            kinds |= {k for k in rec.get("bytes_by_kind", {}) if k.startswith("train/")}
    assert kinds == {"train/embed_fwd", "train/grad_allreduce", "train/val_counts"}
    r = run("--parts", "2", "--options.embed", "probs")
    assert r.returncode == 2 and "options.embed = 'probs'" in r.stderr
