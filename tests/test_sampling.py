"""Bulk samplers: structure, exact laws (chi-square against enumerated targets), independence,
bulk == k single calls, determinism, and the whole-bulk forward == per-minibatch forward.

Statistical tests use fixed seeds and reject at p < 1e-3; each law test is paired with a
"power" check that the same statistic rejects a plausible wrong law, so the test can fail.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from quietgnn.graph import Graph
from quietgnn.nn import GNN
from quietgnn.sampling import NeighborSampler
from quietgnn.sampling.ladies import LadiesSampler, ladies_matrix

from helpers import small_graph

ALPHA = 1e-3


def _csr(n: int, rows: dict[int, list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Destination-indexed CSR with the given in-neighbour lists (sorted)."""
    indptr, indices = [0], []
    for v in range(n):
        nb = sorted(rows.get(v, []))
        indices += nb
        indptr.append(len(indices))
    return torch.tensor(indptr), torch.tensor(indices, dtype=torch.int64)


def _repeat(targets: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k minibatches, each with the same targets; batch ids 0..k-1."""
    t = torch.tensor(targets * k, dtype=torch.int64)
    off = torch.arange(k + 1, dtype=torch.int64) * len(targets)
    return t, off, torch.arange(k)


def _row_subsets(bulk, row_in_mb: int, per_mb: int) -> list[tuple[int, ...]]:
    """Sampled source sets of one target row in every minibatch of a 1-hop bulk."""
    b, nodes = bulk.blocks[0], bulk.nodes[1]
    rows = torch.arange(bulk.k) * per_mb + row_in_mb
    out = []
    ptr = b.indptr.tolist()
    for r in rows.tolist():
        out.append(tuple(sorted(nodes[b.indices[ptr[r]:ptr[r + 1]]].tolist())))
    return out


def _chi2(observed: dict, expected_p: dict, n: int) -> float:
    keys = sorted(expected_p)
    obs = np.array([observed.get(k, 0) for k in keys], dtype=float)
    exp = np.array([expected_p[k] * n for k in keys])
    assert sum(observed.get(k, 0) for k in observed if k not in expected_p) == 0
    return float(stats.chisquare(obs, exp).pvalue)


def _successive_law(weights: dict[int, float], s: int) -> dict[tuple[int, ...], float]:
    """Exact probability of each s-subset under successive sampling (enumerate orderings)."""
    W = sum(weights.values())
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.permutations(weights, s):
        p, rest = 1.0, W
        for v in seq:
            p *= weights[v] / rest
            rest -= weights[v]
        key = tuple(sorted(seq))
        out[key] = out.get(key, 0.0) + p
    return out


def _count(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


# ---------------------------------------------------------------------- structure
@pytest.fixture(scope="module")
def graph() -> Graph:
    return small_graph(n=300, avg_deg=8, seed=4)


def _samplers(graph):
    w = torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(0)) + 0.05
    return {"uniform": NeighborSampler(graph.indptr, graph.indices, [5, 3, 2], seed=1),
            "weighted": NeighborSampler(graph.indptr, graph.indices, [5, 3, 2], seed=1,
                                        edge_weight=w),
            "ladies": LadiesSampler(graph.indptr, graph.indices, [20, 20, 20], seed=1)}


def _bulk_request(graph, k=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, 9, (k,), generator=g)
    sizes[1] = 0                                            # an empty minibatch too
    targets = torch.cat([torch.randperm(graph.num_nodes, generator=g)[:int(s)] for s in sizes])
    off = torch.zeros(k + 1, dtype=torch.int64)
    off[1:] = sizes.cumsum(0)
    return targets, off, torch.arange(100, 100 + k)


@pytest.mark.parametrize("kind", ["uniform", "weighted", "ladies"])
def test_bulk_structure(graph, kind):
    sampler = _samplers(graph)[kind]
    targets, off, ids = _bulk_request(graph)
    bulk = sampler.sample(targets, off, ids)
    n = graph.num_nodes
    if kind == "ladies":
        lp, li, _ = ladies_matrix(graph.indptr, graph.indices)
    else:
        lp, li = graph.indptr, graph.indices
    edges = set((torch.repeat_interleave(torch.arange(n), lp[1:] - lp[:-1]) * n + li).tolist())
    assert torch.equal(bulk.nodes[0], targets)
    for h in range(bulk.num_hops):
        nodes, nxt, b = bulk.nodes[h], bulk.nodes[h + 1], bulk.blocks[h]
        o, o2 = bulk.offsets[h], bulk.offsets[h + 1]
        row = torch.repeat_interleave(torch.arange(nodes.numel()), b.indptr[1:] - b.indptr[:-1])
        for i in range(bulk.k):
            cur, new = nodes[o[i]:o[i + 1]], nxt[o2[i]:o2[i + 1]]
            assert torch.equal(new[:cur.numel()], cur)                  # targets first
            assert torch.unique(new).numel() == new.numel()             # duplicate-free
            mine = (row >= o[i]) & (row < o[i + 1])
            cols = b.indices[mine]
            assert bool(((cols >= o2[i]) & (cols < o2[i + 1])).all())  # block-diagonal
        dst, src = nodes[row], nxt[b.indices]
        assert set((dst * n + src).tolist()) <= edges                 # sampled edges exist
        pairs = row * n + src
        assert torch.unique(pairs).numel() == pairs.numel()             # no repeated edge
        cnt = b.indptr[1:] - b.indptr[:-1]
        if kind == "ladies":
            rsum = torch.zeros(nodes.numel()).index_add_(0, row, b.values)
            assert torch.allclose(rsum, torch.ones_like(rsum), atol=1e-5)
            per_mb = torch.tensor([int(o2[i + 1] - o2[i] - (o[i + 1] - o[i]))
                                   for i in range(bulk.k)])
            assert bool((per_mb <= sampler.fanouts[h]).all())            # |S_i \ F_i| <= s
        else:
            deg = graph.indptr[nodes + 1] - graph.indptr[nodes]
            assert torch.equal(cnt, deg.clamp(max=sampler.fanouts[h]))   # min(s, deg)


@pytest.mark.parametrize("kind", ["uniform", "weighted", "ladies"])
def test_bulk_equals_single_calls_and_seed_determinism(graph, kind):
    sampler = _samplers(graph)[kind]
    targets, off, ids = _bulk_request(graph, k=5, seed=1)
    bulk = sampler.sample(targets, off, ids)
    for i in range(bulk.k):
        single = sampler.sample(targets[off[i]:off[i + 1]], off[i:i + 2] - off[i], ids[i:i + 1])
        a, b = bulk.minibatch(i), single.minibatch(0)
        assert all(torch.equal(x, y) for x, y in zip(a.nodes, b.nodes))
        for x, y in zip(a.blocks, b.blocks):
            assert torch.equal(x.indptr, y.indptr) and torch.equal(x.indices, y.indices)
            assert (x.values is None) == (y.values is None)
            if x.values is not None:
                assert torch.allclose(x.values, y.values)
    again = sampler.sample(targets, off, ids)
    assert all(torch.equal(x, y) for x, y in zip(bulk.nodes, again.nodes))
    other = type(sampler)(graph.indptr, graph.indices, sampler.fanouts, seed=2)
    assert not all(torch.equal(x, y) for x, y in
                   zip(bulk.nodes, other.sample(targets, off, ids).nodes))


@pytest.mark.parametrize("kind", ["uniform", "ladies"])
def test_whole_bulk_forward_equals_per_minibatch(graph, kind):
    sampler = _samplers(graph)[kind]
    targets, off, ids = _bulk_request(graph, k=6, seed=2)
    bulk = sampler.sample(targets, off, ids)
    model = GNN("sage", graph.num_features, 16, 3, layers=3, dropout=0.0).eval()
    whole = bulk.whole()
    assert torch.equal(whole.targets, targets)
    out = model(graph.x[whole.input_nodes], whole.adjs())
    per = [model(graph.x[m.input_nodes], m.adjs()) for m in map(bulk.minibatch, range(bulk.k))]
    assert torch.allclose(out, torch.cat(per), atol=1e-5)


def test_fanout_all_gives_full_neighbourhood(graph):
    sampler = NeighborSampler(graph.indptr, graph.indices, [-1], seed=0)
    targets, off, ids = _bulk_request(graph, k=3, seed=3)
    b = sampler.sample(targets, off, ids).blocks[0]
    deg = graph.indptr[targets + 1] - graph.indptr[targets]
    assert torch.equal(b.indptr[1:] - b.indptr[:-1], deg)


def test_bad_requests_are_rejected(graph):
    s = NeighborSampler(graph.indptr, graph.indices, [3], seed=0)
    with pytest.raises(ValueError, match="twice"):
        s.sample(torch.tensor([1, 1]), torch.tensor([0, 2]), torch.tensor([0]))
    with pytest.raises(ValueError, match="one batch id"):
        s.sample(torch.tensor([1, 2]), torch.tensor([0, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="fanouts"):
        NeighborSampler(graph.indptr, graph.indices, [0])


# ---------------------------------------------------------------------- exact laws
N_DRAWS = 12000


def test_uniform_rows_follow_one_over_binomial():
    d, s = 6, 3
    indptr, indices = _csr(d + 1, {0: list(range(1, d + 1))})
    bulk = NeighborSampler(indptr, indices, [s], seed=11).sample(*_repeat([0], N_DRAWS))
    subsets = _count(_row_subsets(bulk, 0, 1))
    law = {c: 1 / math.comb(d, s) for c in itertools.combinations(range(1, d + 1), s)}
    assert len(law) == 20
    assert _chi2(subsets, law, N_DRAWS) > ALPHA
    # power: the same statistic rejects a mildly tilted law
    tilted = {c: (1.3 if 1 in c else 1.0) for c in law}
    z = sum(tilted.values())
    assert _chi2(subsets, {c: v / z for c, v in tilted.items()}, N_DRAWS) < ALPHA


def test_weighted_rows_follow_successive_sampling():
    w = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 10.0}
    s = 3
    indptr, indices = _csr(6, {0: list(w)})
    weights = torch.tensor([w[v] for v in indices.tolist()])
    bulk = NeighborSampler(indptr, indices, [s], seed=12, edge_weight=weights).sample(
        *_repeat([0], N_DRAWS))
    subsets = _count(_row_subsets(bulk, 0, 1))
    law = _successive_law(w, s)
    assert abs(sum(law.values()) - 1) < 1e-12
    assert _chi2(subsets, law, N_DRAWS) > ALPHA
    # power: inclusion frequencies are NOT the naive s * w / W
    incl = np.array([sum(c for sub, c in subsets.items() if v in sub) for v in w], float)
    naive = np.array([min(1.0, s * wv / sum(w.values())) for wv in w.values()]) * N_DRAWS
    z = (incl - naive) / np.sqrt(naive * (1 - naive / N_DRAWS) + 1e-9)
    assert np.abs(z).max() > 5


def test_rows_within_a_bulk_are_independent():
    # two targets in every minibatch: a row's subset must not depend on the other row's
    indptr, indices = _csr(10, {0: [1, 2, 3, 4], 5: [6, 7, 8, 9]})
    bulk = NeighborSampler(indptr, indices, [2], seed=13).sample(*_repeat([0, 5], N_DRAWS))
    a, b = _row_subsets(bulk, 0, 2), _row_subsets(bulk, 1, 2)
    ka, kb = sorted(set(a)), sorted(set(b))
    table = np.zeros((len(ka), len(kb)))
    for x, y in zip(a, b):
        table[ka.index(x), kb.index(y)] += 1
    assert table.shape == (6, 6)
    assert stats.chi2_contingency(table).pvalue > ALPHA
    # power: a dependent pairing (b copies a's pattern) is rejected by the same test
    dep = np.zeros_like(table)
    for x in a:
        dep[ka.index(x), ka.index(x)] += 1
    assert stats.chi2_contingency(dep + 1).pvalue < ALPHA


def test_same_target_in_consecutive_minibatches_is_independent():
    indptr, indices = _csr(5, {0: [1, 2, 3, 4]})
    bulk = NeighborSampler(indptr, indices, [2], seed=14).sample(*_repeat([0], 2 * 6000))
    subs = _row_subsets(bulk, 0, 1)
    a, b = subs[0::2], subs[1::2]
    keys = sorted(set(subs))
    table = np.zeros((6, 6))
    for x, y in zip(a, b):
        table[keys.index(x), keys.index(y)] += 1
    assert stats.chi2_contingency(table).pvalue > ALPHA


def test_bulk_has_the_law_of_single_calls():
    """Different minibatch ids: bulk draws and single-call draws are two samples of one law."""
    d, s = 5, 2
    indptr, indices = _csr(d + 1, {0: list(range(1, d + 1))})
    sampler = NeighborSampler(indptr, indices, [s], seed=15)
    bulk = _count(_row_subsets(sampler.sample(*_repeat([0], 4000)), 0, 1))
    single = {}
    for i in range(400):   # 400 single calls of 10 minibatches each, ids disjoint from the bulk
        t, off, _ = _repeat([0], 10)
        for x in _row_subsets(sampler.sample(t, off, torch.arange(10) + 10_000 + 10 * i), 0, 1):
            single[x] = single.get(x, 0) + 1
    keys = sorted(set(bulk) | set(single))
    table = np.array([[bulk.get(k, 0) for k in keys], [single.get(k, 0) for k in keys]])
    assert stats.chi2_contingency(table).pvalue > ALPHA


def test_ladies_probabilities_equal_dense_formula(graph):
    sampler = LadiesSampler(graph.indptr, graph.indices, [10], seed=0)
    targets, off, _ = _bulk_request(graph, k=4, seed=5)
    mb_u, v_u, p_u, _, _ = sampler.probabilities(targets, off)
    ip, ix, val = ladies_matrix(graph.indptr, graph.indices)
    n = graph.num_nodes
    dense = torch.zeros(n, n, dtype=torch.float64)
    dense[torch.repeat_interleave(torch.arange(n), ip[1:] - ip[:-1]), ix] = val
    assert torch.allclose(dense.sum(1), torch.ones(n, dtype=torch.float64))   # row-normalised
    Q = torch.zeros(4, n, dtype=torch.float64)
    for i in range(4):
        Q[i, targets[off[i]:off[i + 1]]] = 1.0
    P = Q @ (dense * dense)
    P = P / P.sum(1, keepdim=True).clamp(min=1e-300)
    got = torch.zeros(4, n, dtype=torch.float64)
    got[mb_u, v_u] = p_u
    assert torch.allclose(got, P, atol=1e-12)


def test_ladies_columns_follow_successive_sampling():
    # one target whose A_hat row has 5 entries with unequal values: P[v] ~ value^2
    indptr, indices = _csr(5, {0: [1, 2, 3, 4]})
    lp, li, _ = ladies_matrix(indptr, indices)
    vals = torch.ones(li.numel(), dtype=torch.float64)
    vals[:5] = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.5])  # row 0: columns 0..4
    s = 2
    bulk = LadiesSampler(lp, li, [s], seed=16, values=vals).sample(*_repeat([0], N_DRAWS))
    o = bulk.offsets[1]
    picks = _count(tuple(sorted(bulk.nodes[1][int(o[i]):int(o[i + 1])].tolist()))
                   for i in range(bulk.k))
    p = {v: float(vals[v]) ** 2 for v in range(5)}
    law_sets = _successive_law(p, s)
    # next level = {0} u S: map each sampled S to its frontier
    law: dict[tuple[int, ...], float] = {}
    for sub, q in law_sets.items():
        key = tuple(sorted(set(sub) | {0}))
        law[key] = law.get(key, 0.0) + q
    assert _chi2(picks, law, N_DRAWS) > ALPHA


@pytest.mark.parametrize("kind", ["uniform", "ladies"])
def test_dense_and_sorted_renumbering_agree(graph, kind):
    from quietgnn.sampling.renumber import Renumberer
    dense, sort, slab = _samplers(graph)[kind], _samplers(graph)[kind], _samplers(graph)[kind]
    sort.renumber = Renumberer(cap=0)               # force the sort-unique fallback
    slab.renumber = Renumberer(cap=2 * graph.num_nodes)   # slabs of 2 minibatches
    targets, off, ids = _bulk_request(graph, k=6, seed=7)
    a = dense.sample(targets, off, ids)
    for other in (sort, slab):
        b = other.sample(targets, off, ids)
        assert all(torch.equal(x, y) for x, y in zip(a.nodes, b.nodes))
        assert all(torch.equal(x.indices, y.indices) for x, y in zip(a.blocks, b.blocks))
    assert slab.renumber._mark.numel() == 2 * graph.num_nodes
    from quietgnn.sampling.renumber import _FREE
    assert dense.renumber._mark is not None and bool((dense.renumber._mark == _FREE).all())


@pytest.mark.parametrize("kind", ["uniform", "weighted"])
def test_chunk_budget_does_not_change_the_bulk(graph, kind):
    """Tiny budgets force many row chunks and renumbering slabs: same bulk, bit for bit."""
    ref = _samplers(graph)[kind]
    targets, off, ids = _bulk_request(graph, k=6, seed=8)
    a = ref.sample(targets, off, ids)
    for budget in (1, 7, 50):
        s = NeighborSampler(graph.indptr, graph.indices, ref.fanouts, seed=ref.seed,
                            edge_weight=ref.edge_weight, budget=budget)
        b = s.sample(targets, off, ids)
        assert all(torch.equal(x, y) for x, y in zip(a.nodes, b.nodes))
        assert all(torch.equal(x, y) for x, y in zip(a.offsets, b.offsets))
        assert all(torch.equal(x, y) for x, y in zip(a.depth, b.depth))
        assert all(torch.equal(x.indptr, y.indptr) and torch.equal(x.indices, y.indices)
                   for x, y in zip(a.blocks, b.blocks))
