"""`grappa`: gradient-only traffic (from the communicator's records), the coverage-weighted
aggregation against a single-process computation of the same estimator, shrinkage, clipping,
determinism and resume. Real gloo processes on 127.0.0.1 for everything distributed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from quietgnn.comm import Communicator
from quietgnn.comm.lowrank import lowrank_floats
from quietgnn.comm.qreduce import quantized_all_reduce_bytes
from quietgnn.nn import ModelConfig, SparseAdj, build_model
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.base import TrainConfig, WorkerContext
from quietgnn.strategies.grappa import Grappa, GrappaOptions
from quietgnn.strategies.halo import Halo
from quietgnn.strategies.grappa.data import LocalGraph, Rows, expand, rotating_chunk

from helpers import small_graph

P = 3
CHUNK_KINDS = {"chunk_structure", "chunk_request", "chunk_features"}


def _ctx(comm, part, arch="gcn", layers=2, dropout=0.0, seed=5):
    return WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                         model_cfg=ModelConfig(arch=arch, hidden=8, layers=layers,
                                               dropout=dropout),
                         train_cfg=TrainConfig(seed=seed, lr=0.01))


def _strategy(comm, part, opts, **ctx_kw):
    torch.manual_seed(1000 + comm.rank)       # what the worker does (dropout masks)
    s = Grappa(_ctx(comm, part, **ctx_kw), GrappaOptions(**opts))
    with comm.phase("setup"):
        s.setup()
    s.setup_records = [(r.phase, r.kind) for r in comm.take_records()]
    return s


@pytest.fixture(scope="module")
def graph():
    g = small_graph(n=120, avg_deg=4, seed=2)
    # two thirds of the features zero: grappa trains on them as SparseFeatures (density <=
    # SPARSE_MAX_DENSITY), so the estimator tests compare that path with dense references
    keep = torch.rand(g.x.shape, generator=torch.Generator().manual_seed(0)) < 1 / 3
    return dataclasses.replace(g, x=g.x * keep)


@pytest.fixture(scope="module")
def parts(graph):
    return partition_nodes(graph, "random", P, seed=0)


# ---------------------------------------------------------------------- 1. traffic
def _traffic(comm, graph, parts, variants, epochs, repart, eval_every):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {}
    for name, opts in variants.items():
        s = _strategy(comm, part, dict(opts, repart_every=repart), dropout=0.5)
        log = [{"setup": s.setup_records}]
        for e in range(epochs):
            comm.epoch = e
            with comm.phase("train"):
                res = s.train_epoch(e)
            if (e + 1) % eval_every == 0:
                with comm.phase("eval"):
                    s.evaluate()
            log.append({"steps": res.steps, "chunk": res.extra["chunk"],
                        "recs": [(r.phase, r.kind, r.op, r.bytes_sent, r.epoch)
                                 for r in comm.take_records()]})
        out[name] = {"log": log, "nparams": sum(p.numel() for p in s.params),
                     "shapes": [tuple(p.shape) for p in s.params],
                     "part": (part.n_own, part.n_halo, int(part.indices.numel()))}
    return out


def test_training_sends_only_gradients(graph, parts):
    epochs, repart, eval_every = 6, 2, 3
    variants = {"full-node": {"mode": "full", "weighting": "node"},
                "mb-batch": {"mode": "minibatch", "weighting": "batch", "batch_size": 12,
                             "fanouts": [4, 3]},
                "full-8bit": {"mode": "full", "grad_bits": 8},
                "full-rank1": {"mode": "full", "grad_rank": 1},
                "full-rank1-8bit": {"mode": "full", "grad_rank": 1, "grad_bits": 8}}
    results = spawn_function(_traffic, P, args=(graph, parts, variants, epochs, repart,
                                                eval_every))
    for rank, res in enumerate(results):
        for name, r in res.items():
            grad_bytes = 2 * (P - 1) * 4 * (r["nparams"] + 1 + P) // P
            bits = variants[name].get("grad_bits", 32)
            low = variants[name].get("grad_rank", 0)
            if bits < 32:   # two all-to-alls of quantized rows (+ the exact loss and flags)
                grad_bytes = quantized_all_reduce_bytes(r["nparams"], P, bits, rank,
                                                        exact_tail=1 + P)
            if low:         # two all-reduces: P factors + exact rest + loss/flags, then Q
                p_f, exact, q_f = lowrank_floats(r["shapes"], low)
                assert p_f > 0 and p_f + exact + q_f < r["nparams"]
                grad_bytes = (2 * (P - 1) * 4 * (p_f + exact + 1 + P) // P
                              + 2 * (P - 1) * 4 * q_f // P)
                if bits < 32:   # each of the two is a quantized all-reduce (two all-to-alls)
                    grad_bytes = (quantized_all_reduce_bytes(p_f + exact, P, bits, rank,
                                                             exact_tail=1 + P)
                                  + quantized_all_reduce_bytes(q_f, P, bits, rank))
            # the first chunk load is start-up placement (phase setup)
            assert {k for _, k in r["log"][0]["setup"]} >= CHUNK_KINDS
            assert {ph for ph, _ in r["log"][0]["setup"]} == {"setup"}
            steps = {e["steps"] for e in r["log"][1:]}
            assert len(steps) == 1
            for e, ep in enumerate(r["log"][1:]):
                assert ep["chunk"] == rotating_chunk(rank, P, e // repart)
                train = [x for x in ep["recs"] if x[0] == "train"]
                data = [x for x in ep["recs"] if x[0] == "data"]
                evals = [x for x in ep["recs"] if x[0] == "eval"]
                assert {x[0] for x in ep["recs"]} <= {"train", "data", "eval"}
                # per step: exactly one gradient all-reduce of the analytic size
                grads = [x for x in train if x[1] == "grad_allreduce"]
                per_step = (1 if bits == 32 else 2) * (2 if low else 1)
                assert len(grads) == per_step * ep["steps"]
                assert sum(x[3] for x in grads) == grad_bytes * ep["steps"]
                other = [x for x in train if x[1] != "grad_allreduce"]
                if name.startswith("mb"):   # the normalisers: one scalar per step, one round
                    assert [(x[1], x[2]) for x in other] == [("grappa_norm", "all_reduce")]
                    assert other[0][3] == 2 * (P - 1) * 8 * ep["steps"] // P
                else:
                    assert other == []
                # chunk reloads: only at super-epoch boundaries, only in the data phase
                if e % repart == 0 and e > 0:
                    assert {x[1] for x in data} >= CHUNK_KINDS
                    # the chunk's structure goes to the one rank that asked for it: node
                    # fields as int64, the part's edges as int32 (padded to whole words)
                    n_o, n_h, nnz = r["part"]
                    askers = sum(rotating_chunk(q, P, e // repart) == rank for q in range(P))
                    want = (askers * (8 * (3 + 3 * n_o + 3 * n_h) + 4 * (nnz + nnz % 2))
                            + 8 * (P - 1))              # + the all-to-all's size handshake
                    assert sum(x[3] for x in data if x[1] == "chunk_structure") == want
                    assert {x[1] for x in data} <= CHUNK_KINDS | {"grappa_norm"}
                else:
                    assert data == []
                assert bool(evals) == ((e + 1) % eval_every == 0)
                assert {x[1] for x in evals} <= {"halo_fwd", "eval_metrics"}


# ---------------------------------------------------------------------- 2./3. estimator
def _one_step(comm, graph, parts, configs):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = []
    for cfg in configs:
        s = _strategy(comm, part, cfg["opts"], arch=cfg["arch"])
        s.train_epoch(0)
        out.append({"grads": {n: p.grad.clone() for n, p in s.model.named_parameters()},
                    "w": s.w_seed.clone()})
    return out


def _reference_grads(graph, parts, arch, opts, world):
    """The same estimator computed in one process from the full graph: for each rank, its two
    chunks with all in-edges (other rows empty: leaves keep their features only), dense
    coverage recursion, then one backward over all ranks' weighted losses."""
    o = GrappaOptions(**opts)
    n, L = graph.num_nodes, 2
    model = build_model(ModelConfig(arch=arch, hidden=8, layers=L, dropout=0.0),
                        graph.num_features, graph.num_classes, seed=5)
    deg = graph.in_degree()
    dst, src = graph.edge_dst(), graph.indices
    parts_t = torch.as_tensor(parts)
    terms, weights_all = [], []
    for k in range(world):
        j = rotating_chunk(k, world, 0)
        internal = parts_t == k if j is None else (parts_t == k) | (parts_t == j)
        keep = internal[dst]
        counts = torch.bincount(dst[keep], minlength=n)
        indptr = torch.zeros(n + 1, dtype=torch.int64)
        indptr[1:] = counts.cumsum(0)
        adj = SparseAdj(indptr, src[keep], n, deg, deg)
        # coverage: a_0 = d_loc/d, a_t = A_loc a_{t-1} / d (dense)
        A = torch.zeros(n, n, dtype=torch.float64)
        A.index_put_((dst[keep], src[keep]), torch.ones(int(keep.sum()), dtype=torch.float64),
                     accumulate=True)
        d = deg.double()
        a = torch.where(d == 0, 1.0, counts.double() / d.clamp(min=1))
        levels = [a]
        for _ in range(L - 1):
            a = torch.where(d == 0, 1.0, (A @ a) / d.clamp(min=1))
            levels.append(a)
        w = (torch.stack(levels).mean(0) if o.coverage == "mean" else levels[-1]).float()
        seeds = torch.nonzero((parts_t == k) & graph.train_mask).flatten()
        w = w[seeds].clamp(o.w_min, 1.0)
        weights_all.append(w)
        ell = F.cross_entropy(model(graph.x, adj)[seeds], graph.y[seeds], reduction="none")
        if o.weighting == "node":
            wt = w.pow(o.lam)
        else:
            wt = torch.full_like(w, 1.0 + o.lam * (float(w.mean()) - 1.0))
        terms.append((wt, ell))
    z = sum(float(wt.sum()) for wt, _ in terms)
    sum((wt * ell).sum() for wt, ell in terms).div(z).backward()
    return {nm: p.grad.clone() for nm, p in model.named_parameters()}, weights_all


CONFIGS = [
    {"arch": "gcn", "opts": {"weighting": "node", "lam": 1.0, "w_min": 0.3}},
    {"arch": "gcn", "opts": {"weighting": "batch", "lam": 0.7, "w_min": 0.1}},
    {"arch": "sage", "opts": {"weighting": "node", "lam": 0.5, "coverage": "path",
                              "w_min": 0.2}},
    {"arch": "gcn", "opts": {"weighting": "node", "lam": 0.0}},
    {"arch": "gcn", "opts": {"weighting": "batch", "lam": 0.0}},
]


@pytest.fixture(scope="module")
def one_step(graph, parts):
    return spawn_function(_one_step, P, args=(graph, parts, CONFIGS))


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_weighted_aggregation_equals_single_process(graph, parts, one_step, i):
    from quietgnn.nn import SparseFeatures, maybe_sparse
    assert isinstance(maybe_sparse(graph.x), SparseFeatures)
    cfg = CONFIGS[i]
    ref, weights = _reference_grads(graph, parts, cfg["arch"], cfg["opts"], P)
    for rank, res in enumerate(one_step):
        assert torch.allclose(res[i]["w"], weights[rank], atol=1e-6)
        for name, g in ref.items():
            assert torch.allclose(res[i]["grads"][name], g, atol=1e-6), (cfg, name)


def test_lambda_zero_is_plain_averaging(graph, parts, one_step):
    """lam = 0: both variants give the plain mean over all training seeds."""
    model = build_model(ModelConfig(arch="gcn", hidden=8, layers=2, dropout=0.0),
                        graph.num_features, graph.num_classes, seed=5)
    deg, dst, src = graph.in_degree(), graph.edge_dst(), graph.indices
    parts_t = torch.as_tensor(parts)
    total = 0.0
    for k in range(P):
        internal = (parts_t == k) | (parts_t == rotating_chunk(k, P, 0))
        keep = internal[dst]
        indptr = torch.zeros(graph.num_nodes + 1, dtype=torch.int64)
        indptr[1:] = torch.bincount(dst[keep], minlength=graph.num_nodes).cumsum(0)
        seeds = torch.nonzero((parts_t == k) & graph.train_mask).flatten()
        logits = model(graph.x, SparseAdj(indptr, src[keep], graph.num_nodes, deg, deg))
        total = total + F.cross_entropy(logits[seeds], graph.y[seeds], reduction="sum")
    (total / int(graph.train_mask.sum())).backward()
    for i in (3, 4):
        for res in one_step:
            for name, p in model.named_parameters():
                assert torch.allclose(res[i]["grads"][name], p.grad, atol=1e-6)
    # ... and the corrected estimator (lam = 1) really differs from it
    assert not torch.allclose(one_step[0][0]["grads"]["convs.0.lin.weight"],
                              one_step[0][3]["grads"]["convs.0.lin.weight"], atol=1e-5)


def test_weights_are_clipped_and_nontrivial(one_step):
    for i, cfg in enumerate(CONFIGS):
        w_min = GrappaOptions(**cfg["opts"]).w_min
        w = torch.cat([res[i]["w"] for res in one_step])
        assert float(w.min()) >= w_min - 1e-7 and float(w.max()) <= 1.0
        assert float(w.std()) > 0.01   # coverage varies per seed: the correction is not constant


def test_single_rank_equals_centralized(graph):
    """P = 1: the local graph is the whole graph, every coverage is 1: exact full-batch."""
    parts1 = np.zeros(graph.num_nodes, dtype=np.int64)
    part = build_partitions(graph, parts1)[0]
    comm = Communicator(0, 1)
    g = _strategy(comm, part, {"weighting": "node"})
    assert torch.all(g.w_seed == 1)
    g.train_epoch(0)
    h = Halo(_ctx(comm, part))
    h.setup()
    h.train_epoch(0)
    for (n, a), b in zip(g.model.named_parameters(), h.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6), n


# ---------------------------------------------------------------------- determinism, resume
def _train(comm, part, opts, epochs, state=None, start=0):
    s = _strategy(comm, part, opts, dropout=0.5)
    if state is not None:
        s.load_state_dict(state)
    for e in range(start, epochs):
        comm.epoch = e
        s.train_epoch(e)
    return s


def _determinism(comm, graph, parts, extra):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    opts = {"mode": "minibatch", "batch_size": 10, "fanouts": [3, 2], "repart_every": 3,
            **extra}
    a = _train(comm, part, opts, 5)
    b = _train(comm, part, opts, 5)
    half = _train(comm, part, opts, 4)
    state = half.state_dict()
    c = _train(comm, part, opts, 5, state=state, start=4)    # resumes in super-epoch 1
    flat = lambda s: torch.cat([p.detach().reshape(-1) for p in s.model.parameters()])
    return {"a": flat(a), "b": flat(b), "c": flat(c), "chunk": state["chunk"],
            "se": state["super_epoch"]}


@pytest.mark.parametrize("extra", [{}, {"grad_rank": 1}], ids=["exact", "grad_rank1"])
def test_deterministic_and_resumable(graph, extra):
    # with grad_rank the error memories and the shared Q are state: a resume must restore them
    parts2 = partition_nodes(graph, "random", 2, seed=1)
    for res in spawn_function(_determinism, 2, args=(graph, parts2, extra)):
        assert torch.equal(res["a"], res["b"])
        assert torch.equal(res["a"], res["c"])
        assert res["se"] == 1


# ---------------------------------------------------------------------- pieces
def test_rotation_visits_every_other_chunk_once_per_sweep():
    for world in (2, 3, 5):
        for s in range(world - 1):
            held = [rotating_chunk(k, world, s) for k in range(world)]
            assert sorted(held) == list(range(world)) and all(h != k for k, h in enumerate(held))
        for k in range(world):
            assert sorted(rotating_chunk(k, world, s) for s in range(world - 1)) == \
                [j for j in range(world) if j != k]
    assert rotating_chunk(0, 1, 4) is None


def test_sampler_blocks_are_valid_and_capped():
    # a local graph: 6 internal nodes with 4..5 in-edges each, 4 leaves
    g = torch.Generator().manual_seed(0)
    n_int, n_loc = 6, 10
    counts = torch.tensor([4, 5, 4, 5, 4, 5] + [0] * 4)
    indptr = torch.zeros(n_loc + 1, dtype=torch.int64)
    indptr[1:] = counts.cumsum(0)
    indices = torch.cat([torch.randperm(n_loc, generator=g)[:int(c)] for c in counts[:n_int]])
    # the two pieces' columns given as local ids: all through the (identity) table
    ident = torch.arange(n_loc, dtype=torch.int32)
    own = Rows(indptr[:4], indices[:int(indptr[3])], 0, 0, ident)
    rot = Rows(indptr[3:7] - indptr[3], indices[int(indptr[3]):], 0, 3, ident)
    x = torch.randn(n_loc, 3)
    lg = LocalGraph(own, rot, x[:3], x[3:], counts.clone(), 3, n_int, 1, 0)
    nodes, blocks = expand(lg, torch.tensor([0, 2]), [2, 3], g)
    assert torch.equal(nodes[:2], torch.tensor([0, 2])) and len(blocks) == 2
    for blk in blocks:
        assert int(blk.row_count.max()) <= 3
    assert int(blocks[1].row_count.max()) <= 2 and blocks[1].n_dst == 2
    # every sampled edge is a local edge
    for blk, dsts in ((blocks[1], nodes[:blocks[1].n_dst]), (blocks[0], nodes[:blocks[0].n_dst])):
        for r in range(blk.n_dst):
            v = int(dsts[r])
            srcs = nodes[blk.indices[blk.indptr[r]:blk.indptr[r + 1]]]
            assert set(srcs.tolist()) <= set(indices[indptr[v]:indptr[v + 1]].tolist())
    full_nodes, full_blocks = expand(lg, torch.tensor([0, 2]), [None, None])
    assert int(full_blocks[1].row_count.sum()) == 8


def test_present_normalises_a_truncated_row_by_the_edges_it_has():
    # internal nodes 0..3 carry all their in-edges; 4 and 5 are leaves: degree 3 in the whole
    # graph, no row here
    indptr = torch.tensor([0, 2, 3, 5, 6])
    cols = torch.tensor([1, 4, 0, 3, 5, 2], dtype=torch.int32)
    ident = torch.arange(6, dtype=torch.int32)
    own = Rows(indptr[:3], cols[:3], 0, 0, ident)
    rot = Rows(indptr[2:] - indptr[2], cols[3:], 0, 2, ident)
    deg = torch.tensor([2, 1, 2, 1, 3, 3])
    x = torch.randn(6, 3)
    lg = LocalGraph(own, rot, x[:2], x[2:], deg, 2, 4, 1, 0)
    nodes, (first, second) = expand(lg, torch.tensor([0, 2]), [None, None])
    _, (pfirst, psecond) = expand(lg, torch.tensor([0, 2]), [None, None], present=True)
    leaves = [i for i, v in enumerate(nodes[:first.n_dst].tolist()) if v >= 4]
    assert leaves                                       # a leaf is a destination of layer 1
    # whole in-degree: the leaf's self-loop weight is 1/(3+1); present: 1 (its own features)
    _, self_w = first.gcn_norm()
    _, pself_w = pfirst.gcn_norm()
    assert torch.allclose(self_w[leaves], torch.full((len(leaves),), 0.25))
    assert torch.allclose(pself_w[leaves], torch.ones(len(leaves)))
    # rows that are whole, and every source's weight, are as before
    whole = [i for i in range(first.n_dst) if i not in leaves]
    assert torch.equal(first.dst_degree[whole], pfirst.dst_degree[whole])
    assert torch.equal(first.src_degree, pfirst.src_degree)
    assert torch.equal(second.dst_degree, psecond.dst_degree)   # the seeds' rows are whole


def test_sampled_rows_are_uniform_subsets_drawn_independently():
    # R rows of the same 5 edges: each row's fanout-3 sample is one of the 10 3-subsets, all
    # about equally often, and rows draw independently (not one subset for every row)
    g = torch.Generator().manual_seed(3)
    R = 20_000
    indptr = torch.arange(R + 1, dtype=torch.int64) * 5
    cols = torch.arange(5, dtype=torch.int32).repeat(R)      # column c: local node R + c
    table = torch.arange(R, R + 5, dtype=torch.int32)
    own = Rows(indptr, cols, 0, 0, table)
    x = torch.zeros(R + 5, 1)
    lg = LocalGraph(own, None, x[:R], x[R:], torch.full((R + 5,), 5), R, R, None, 0)
    ptr, src = lg.gather(torch.arange(R), 3, g)
    assert torch.equal(ptr, torch.arange(R + 1) * 3)
    picked = torch.zeros(R, 5, dtype=torch.int64)
    picked[torch.arange(R).repeat_interleave(3), src - R] = 1
    assert torch.equal(picked.sum(1), torch.full((R,), 3))          # distinct within a row
    codes = (picked * torch.tensor([1, 2, 4, 8, 16])).sum(1)
    freq = torch.bincount(codes, minlength=32)
    freq = freq[freq > 0]
    assert freq.numel() == 10
    assert float((freq.float() / R - 0.1).abs().max()) < 0.012      # ~5 sd of one count


def test_sampled_rows_are_subsets_of_the_gathered_rows():
    g = torch.Generator().manual_seed(5)
    n_int, n_loc = 40, 60
    counts = torch.randint(0, 12, (n_int,), generator=g)
    indptr = torch.zeros(n_int + 1, dtype=torch.int64)
    indptr[1:] = counts.cumsum(0)
    indices = torch.randint(0, n_loc, (int(indptr[-1]),), generator=g)
    ident = torch.arange(n_loc, dtype=torch.int32)
    cut = 25
    own = Rows(indptr[:cut + 1], indices[:int(indptr[cut])], 0, 0, ident)
    rot = Rows(indptr[cut:] - indptr[cut], indices[int(indptr[cut]):], 0, cut, ident)
    x = torch.randn(n_loc, 2)
    lg = LocalGraph(own, rot, x[:cut], x[cut:], torch.ones(n_loc, dtype=torch.int64), cut,
                    n_int, 1, 0)
    nodes = torch.tensor([50, 3, 30, 3, 24, 25, 39, 55, 0])     # leaves, repeats, both pieces
    full_ptr, full_src = lg.gather(nodes)
    ptr, src = lg.gather(nodes, 4, g)
    assert torch.equal(ptr[1:] - ptr[:-1], (full_ptr[1:] - full_ptr[:-1]).clamp(max=4))
    for i in range(nodes.numel()):
        whole = full_src[full_ptr[i]:full_ptr[i + 1]].tolist()
        got = src[ptr[i]:ptr[i + 1]].tolist()
        if len(whole) <= 4:
            assert sorted(got) == sorted(whole)
        else:                 # a sub-multiset of the row (rows may repeat a neighbour)
            for v in set(got):
                assert got.count(v) <= whole.count(v)


@pytest.mark.parametrize("bad", [{"lam": 1.5}, {"w_min": 0.0}, {"mode": "sampled"},
                                 {"weighting": "edge"}, {"repart_every": -1},
                                 {"fanouts": [0, 2]}, {"coverage": "max"}, {"grad_bits": 16},
                                 {"grad_rank": -1}, {"grad_rank": 1.5}, {"leaf_norm": "mean"}])
def test_options_are_validated(bad):
    with pytest.raises(ValueError):
        GrappaOptions(**bad)


def _eval_both(comm, graph, parts, mode):
    """One trained model evaluated sampled (eval_nodes over every node, full fanouts) and
    exactly (halo's forward); the sampled run must not have built the exact forward."""
    from quietgnn.strategies.common import global_evaluate, halo_forward, partition_adj
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    s = _strategy(comm, part, {"mode": mode, "fanouts": "-1,-1", "batch_size": 7,
                               "eval_nodes": 10_000})
    s.train_epoch(0)
    comm.take_records()
    sampled = s.evaluate()
    kinds = sorted({r.kind for r in comm.take_records()})
    exact = global_evaluate(s.model, part, comm, halo_forward(s.model, part, comm,
                                                               partition_adj(part)))
    return {"sampled": sampled, "exact": exact, "kinds": kinds,
            "local": s.evaluate_local(), "has_exact": hasattr(s, "eval_forward")}


def _exact_eval(comm, graph, parts):
    """Grappa's exact evaluation (its input rows taken from the first chunk load) against a
    halo forward that fetches its own, for a run that reloads and one that never does."""
    from quietgnn.strategies.common import global_evaluate, halo_forward, partition_adj
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {}
    for repart in (1, 0):
        s = _strategy(comm, part, {"mode": "full", "repart_every": repart})
        s.train_epoch(0)
        comm.take_records()
        got = s.evaluate()
        fresh = global_evaluate(s.model, part, comm, halo_forward(s.model, part, comm,
                                                                   partition_adj(part)))
        out[repart] = {"got": got, "fresh": fresh, "setup": s.setup_records,
                       "kept": s.loader.halo_rows() is not None}
        s.close()
        comm.take_records()   # the reference forward's fetch: not the next setup's
    return out


def test_exact_evaluation_reuses_the_loaded_halo_rows(graph, parts):
    for res in spawn_function(_exact_eval, P, args=(graph, parts)):
        for repart, r in res.items():
            for split in ("train", "val", "test"):
                assert r["got"][split] == r["fresh"][split]
            # the halo's rows crossed once, for the chunk load: no static-rows fetch
            kinds = [k for _, k in r["setup"]]
            assert "data" not in kinds and "chunk_features" in kinds
            assert r["kept"] == (repart == 1)   # a run that never reloads drops them


@pytest.mark.parametrize("mode", ["minibatch", "full"])
def test_sampled_evaluation_with_full_fanouts_is_exact(graph, parts, mode):
    for res in spawn_function(_eval_both, P, args=(graph, parts, mode)):
        for split in ("train", "val", "test"):
            assert res["sampled"][split] == pytest.approx(res["exact"][split], abs=1e-9)
        assert res["local"] is None and not res["has_exact"]
        assert "halo_fwd" not in res["kinds"] and "eval_metrics" in res["kinds"]


def test_sampled_evaluation_option_is_validated():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="eval_nodes"):
            GrappaOptions(eval_nodes=bad)


def test_steps_per_epoch_caps_a_minibatch_epoch(graph):
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    comm = Communicator(0, 1)
    g = _strategy(comm, part, {"mode": "minibatch", "batch_size": 8, "steps_per_epoch": 3})
    assert g.steps > 3
    res = g.train_epoch(0)
    assert res.steps == 3 and res.work == pytest.approx(3 / g.steps)
    assert res.extra["mean_coverage"] == pytest.approx(1.0)    # one rank: every tree whole
    whole = _strategy(comm, part, {"mode": "minibatch", "batch_size": 8}).train_epoch(0)
    assert whole.steps == g.steps and whole.work == 1.0
    with pytest.raises(ValueError, match="steps_per_epoch"):
        GrappaOptions(steps_per_epoch=-2)
    with pytest.raises(ValueError, match="minibatch"):
        GrappaOptions(steps_per_epoch=5)        # full mode: one step per epoch
