"""Distributed sampling on real gloo processes: the 1.5D sampler (c = 1, 2) and the
topology-replicated mode give exactly the single-rank sampler's bulks (hence the same law),
the fetched topology is the graph's CSR, features arrive right, and the feature-fetch bytes
are the analytic count."""

from __future__ import annotations

import dataclasses
import numpy as np
import pytest
import torch
from scipy import stats

from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.sampling import NeighborSampler
from quietgnn.sampling.dist import FeatureFetcher, Sampler15D, fetch_topology

from helpers import small_graph

FANOUTS = [4, 3]
SEED = 5
P = 4


def _request(group: int):
    """Group-specific targets (replicas of a group must ask for the same bulk)."""
    g = torch.Generator().manual_seed(group)
    targets = torch.randperm(150, generator=g)[:30]
    off = torch.tensor([0, 9, 9, 22, 30])
    ids = torch.arange(4) + 1000 * group
    return targets, off, ids


def _law_request():
    """Many one-target minibatches on node 0 (for the distributed law test)."""
    k = 3000
    return torch.zeros(k, dtype=torch.int64), torch.arange(k + 1), torch.arange(k) + 77


def _work(comm, graph, parts):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {}
    comm.take_records()
    for c in (1, 2):
        s = Sampler15D(comm, part, FANOUTS, c, seed=SEED)
        out[c] = s.sample(*_request(comm.rank // c))
        out[f"law{c}"] = s.sample(*_law_request()) if c == 2 else None
    owner, ip, ix = fetch_topology(comm, part, list(range(comm.world_size)))
    comm.take_records()
    ff = FeatureFetcher(comm, part, owner)
    want = torch.tensor([3, 140, 3, 77, 12, 99], dtype=torch.int64)
    x = ff.fetch(want)
    recs = [(r.kind, r.bytes_sent, r.bytes_recv) for r in comm.take_records()]
    remote = torch.unique(want)
    remote = remote[owner[remote] != comm.rank]
    # the cache: the 40 highest-degree of the first 100 nodes that this rank does not own,
    # fetched once; then the same request served partly from it
    cached = FeatureFetcher(comm, part, owner)
    comm.take_records()     # the construction's agreement on the features' form
    cand = torch.arange(100)
    cached.fill_cache(cand, graph.in_degree()[cand], 40)
    fill = [(r.kind, r.bytes_sent, r.bytes_recv) for r in comm.take_records()]
    # the same cache fetched in rounds of 7 rows, and every node as candidate given as None
    import quietgnn.sampling.dist as dist_mod
    dist_mod.FILL_ROUND_BYTES = 7 * graph.x.shape[1] * graph.x.element_size()
    rounds = FeatureFetcher(comm, part, owner)
    comm.take_records()
    rounds.fill_cache(cand, graph.in_degree()[cand], 40)
    n_round_records = len(comm.take_records())
    every, every_none = FeatureFetcher(comm, part, owner), FeatureFetcher(comm, part, owner)
    every.fill_cache(torch.arange(graph.num_nodes), graph.in_degree(), 40)
    every_none.fill_cache(None, graph.in_degree(), 40)
    comm.take_records()
    cache_forms = (rounds.cache_ids, rounds.cache_x, n_round_records, every.cache_ids,
                   every_none.cache_ids, every.cache_x, every_none.cache_x)
    many = torch.randint(0, 150, (300,), generator=torch.Generator().manual_seed(comm.rank))
    plain, with_cache = ff.fetch(many), cached.fetch(many)
    comm.take_records()
    return {"bulks": out, "topology": (owner, ip, ix), "x": x, "want": want, "records": recs,
            "remote": int(remote.numel()), "cache": (plain, with_cache, cached.cache_ids, fill,
                                                     cached.hits, cached.requests, many, owner),
            "cache_forms": cache_forms, "cache_x": cached.cache_x}


@pytest.fixture(scope="module")
def graph():
    return small_graph(n=150, avg_deg=6, seed=1)


@pytest.fixture(scope="module")
def results(graph):
    parts = partition_nodes(graph, "metis", P, seed=0)
    return spawn_function(_work, P, args=(graph, parts))


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.nodes, b.nodes)) and all(
        torch.equal(x.indptr, y.indptr) and torch.equal(x.indices, y.indices)
        for x, y in zip(a.blocks, b.blocks))


@pytest.mark.parametrize("c", [1, 2])
def test_15d_sampler_equals_single_rank(graph, results, c):
    ref = NeighborSampler(graph.indptr, graph.indices, FANOUTS, seed=SEED)
    for rank, res in enumerate(results):
        assert _same(res["bulks"][c], ref.sample(*_request(rank // c))), (c, rank)


def test_15d_sampler_law(graph, results):
    """Same law as the single-rank sampler: subset frequencies of node 0's hop-0 row agree
    with independent single-rank draws (other minibatch ids) by a chi-square 2-sample test."""
    ref = NeighborSampler(graph.indptr, graph.indices, FANOUTS, seed=SEED)
    dist_bulk = results[0]["bulks"]["law2"]
    t, off, ids = _law_request()
    single = ref.sample(t, off, ids + 10_000)

    def subsets(b):
        ptr, nodes = b.blocks[0].indptr.tolist(), b.nodes[1]
        return [tuple(sorted(nodes[b.blocks[0].indices[ptr[r]:ptr[r + 1]]].tolist()))
                for r in range(b.k)]

    a, s = subsets(dist_bulk), subsets(single)
    keys = sorted(set(a) | set(s))
    table = np.array([[a.count(k) for k in keys], [s.count(k) for k in keys]])
    assert stats.chi2_contingency(table).pvalue > 1e-3


def test_replicated_topology_and_features(graph, results):
    for res in results:
        owner, ip, ix = res["topology"]
        assert torch.equal(ip, graph.indptr) and torch.equal(ix.long(), graph.indices)
        assert torch.equal(res["x"], graph.x[res["want"]])


def test_feature_cache_returns_exactly_the_fetched_rows(graph, results):
    F = graph.num_features
    deg = graph.in_degree()
    for rank, res in enumerate(results):
        plain, cached, ids, fill, hits, requests, many, owner = res["cache"]
        assert torch.equal(plain, cached) and torch.equal(cached, graph.x[many])
        # the cache holds the 40 remote candidates of highest degree, once, counted as data
        remote = torch.arange(100)[owner[:100] != rank]
        assert ids.numel() == min(40, remote.numel())
        left = remote[~torch.isin(remote, ids)]
        assert left.numel() == 0 or deg[ids].min() >= deg[left].max()
        assert [k for k, _, _ in fill] == ["data", "data"]
        # ids out (8 bytes each + the size handshake), rows back (known sizes)
        assert fill[0][1] == 8 * ids.numel() + 8 * (P - 1)
        assert fill[1][2] == 4 * F * ids.numel()
        # hit rate: the remote unique rows asked for that the cache holds
        u = torch.unique(many)
        u = u[owner[u] != rank]
        assert requests == u.numel() and hits == int(torch.isin(u, ids).sum()) > 0


def test_feature_fetch_bytes_are_analytic(graph, results):
    F = graph.num_features
    for res in results:
        recs = dict((k, (s, r)) for k, s, r in res["records"])
        n = res["remote"]
        # ids: 8 bytes per remote unique id + the size handshake (P-1 int64)
        assert recs["feature_fetch_ids"][0] == 8 * n + 8 * (P - 1)
        # rows come back with known sizes: 4 F bytes per remote unique id, no handshake
        assert recs["feature_fetch"][1] == 4 * F * n


def test_cache_in_rounds_and_with_every_node_as_candidate_is_the_same_cache(graph, results):
    for res in results:
        ids_r, x_r, n_rec, ids_all, ids_none, x_all, x_none = res["cache_forms"]
        ids = res["cache"][2]
        assert torch.equal(ids_r, ids) and torch.equal(x_r, res["cache_x"])
        assert n_rec == 2 * -(-40 // 7)               # ids out and rows back, per round
        assert torch.equal(ids_all, ids_none) and torch.equal(x_all, x_none)
        assert torch.equal(x_none, graph.x[ids_none])


def _sparse_work(comm, graph, parts):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    owner = fetch_topology(comm, part, list(range(comm.world_size)))[0]
    comm.take_records()
    ff = FeatureFetcher(comm, part, owner)
    form = [(r.kind, r.bytes_sent) for r in comm.take_records()]
    many = torch.randint(0, graph.num_nodes, (200,), generator=torch.Generator().manual_seed(9))
    x = ff.fetch(many)
    recs = {r.kind: (r.bytes_sent, r.bytes_recv) for r in comm.take_records()}
    cached = FeatureFetcher(comm, part, owner)
    cached.fill_cache(torch.arange(graph.num_nodes), graph.in_degree(), 30)
    comm.take_records()
    return {"x": x, "many": many, "recs": recs, "form": form, "cached": cached.fetch(many),
            "cache_x": cached.cache_x, "cache_ids": cached.cache_ids, "owner": owner,
            "xs": ff.xs is not None}


def test_mostly_zero_features_are_fetched_and_cached_sparse(graph):
    """Bag-of-words-like rows (2 of 64 columns non-zero) travel as (column, value) pairs:
    12 bytes a row for its 2 non-zeros + 4 for its count, instead of 4 x 64; what arrives
    equals the dense rows, from the network and from the cache."""
    from quietgnn.nn.sparse import SparseFeatures
    g = small_graph(n=150, avg_deg=6, features=64, seed=1)
    cols = torch.stack([g.y, (g.y + 7) % 64], 1)          # two non-zeros per row
    g = dataclasses.replace(g, x=torch.zeros_like(g.x).scatter_(1, cols, torch.rand(150, 2) + 0.5))
    parts = partition_nodes(g, "metis", 2, seed=0)
    for rank, r in enumerate(spawn_function(_sparse_work, 2, args=(g, parts))):
        assert r["xs"] and r["form"] == [("feature_form", 4)]   # agreed once, 4 bytes
        assert isinstance(r["x"], SparseFeatures)
        assert torch.equal(r["x"].to_dense(), g.x[r["many"]])
        assert torch.equal(r["cached"].to_dense(), g.x[r["many"]])
        assert torch.equal(r["cache_x"].to_dense(), g.x[r["cache_ids"]])
        u = torch.unique(r["many"])
        n = int((r["owner"][u] != rank).sum())
        # rows back: a count and two (column, value) pairs each, size learnt by the
        # handshake (8 bytes to the one peer)
        assert r["recs"]["feature_fetch"][1] == 4 * (n + 2 * 2 * n) + 8

