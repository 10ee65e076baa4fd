"""quietgnn.nn.sparse: sparse input features give the dense model's outputs and gradients,
and their dropout is inverted dropout of the non-zeros."""

from __future__ import annotations

import pytest
import torch

from quietgnn.nn import GNN, SparseAdj, SparseFeatures, maybe_sparse

from helpers import small_graph


def _sparse_graph(seed: int = 0, density: float = 0.05):
    g = small_graph(n=160, avg_deg=6, features=40, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(g.x.shape, generator=gen) < density).float() * torch.rand(g.x.shape,
                                                                             generator=gen)
    return g, x


def test_maybe_sparse_by_density():
    g, x = _sparse_graph()
    assert isinstance(maybe_sparse(x), SparseFeatures)
    assert maybe_sparse(g.x) is g.x                    # dense features stay dense
    s = SparseFeatures.from_dense(x)
    assert torch.equal(s.to_dense(), x) and s.shape == x.shape and s.nnz == int((x != 0).sum())
    assert torch.equal(s.head(10).to_dense(), x[:10])


def test_from_dense_in_blocks_and_cat(monkeypatch):
    """Built a few rows at a time (the blocks bound its temporaries) it is the matrix torch's
    own CSR conversion makes; ``cat`` stacks matrices row-wise."""
    from quietgnn.nn import sparse
    _, x = _sparse_graph(seed=2)
    monkeypatch.setattr(sparse, "_block_rows", lambda width: 7)   # 160 rows: 23 blocks
    s = SparseFeatures.from_dense(x)
    ref = x.to_sparse_csr()
    assert torch.equal(s.indptr, ref.crow_indices()) and torch.equal(s.indices, ref.col_indices())
    assert torch.equal(s.values, ref.values()) and sparse.count_nonzero(x) == s.nnz
    assert SparseFeatures.from_dense(x[:0]).shape == (0, x.shape[1])
    both = SparseFeatures.cat([s.head(50), SparseFeatures.from_dense(x[50:])])
    assert torch.equal(both.to_dense(), x) and torch.equal(both.indptr, s.indptr)
    with pytest.raises(ValueError, match="widths"):
        SparseFeatures.cat([s, SparseFeatures.from_dense(x[:, :3])])


def test_rows_gathers_rows_in_order():
    _, x = _sparse_graph(seed=1)
    s = SparseFeatures.from_dense(x)
    idx = torch.tensor([5, 0, 159, 5, 77, 3])      # any order, repeats allowed
    assert torch.equal(s.rows(idx).to_dense(), x[idx])
    assert s.rows(torch.empty(0, dtype=torch.int64)).shape == (0, x.shape[1])


@pytest.mark.parametrize("arch", ["gcn", "sage"])
def test_sparse_minibatch_rows_equal_dense(arch):
    """tma's mini-batch path: the sampled input rows gathered from the sparse matrix give the
    dense rows' logits and gradients through sampled blocks."""
    from quietgnn.strategies.tma import LocalSampler
    g, x = _sparse_graph(seed=2)
    sampler = LocalSampler(g.indptr, g.indices, [3, 4], seed=0)
    nodes, blocks = sampler.sample(torch.arange(0, 160, 7))
    torch.manual_seed(0)
    model = GNN(arch, x.shape[1], 16, g.num_classes, layers=2, dropout=0.0)
    outs = []
    for inp in (x[nodes], SparseFeatures.from_dense(x).rows(nodes)):
        model.zero_grad()
        out = model(inp, blocks)
        out.square().sum().backward()
        outs.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["gcn", "sage", "gin", "gat"])
def test_sparse_input_equals_dense(arch):
    """Same weights, dropout off: identical logits and parameter gradients (GIN and GAT
    densify the input, GCN and SAGE transform it with the sparse product)."""
    g, x = _sparse_graph(seed=3)
    adj = SparseAdj(g.indptr, g.indices, g.num_nodes, g.in_degree())
    torch.manual_seed(0)
    model = GNN(arch, x.shape[1], 16, g.num_classes, layers=2, dropout=0.0, heads=2)
    grads = []
    for inp in (x, SparseFeatures.from_dense(x)):
        model.zero_grad()
        out = model(inp, adj)
        (out.square().sum()).backward()
        grads.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (o1, g1), (o2, g2) = grads
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_sparse_dropout_is_inverted_dropout_of_the_nonzeros():
    _, x = _sparse_graph(density=0.3)
    s = SparseFeatures.from_dense(x)
    torch.manual_seed(1)
    d = s.dropout(0.5)
    kept = d.values != 0
    assert torch.allclose(d.values[kept], 2 * s.values[kept])      # scaled by 1 / (1 - p)
    assert 0.4 < kept.float().mean() < 0.6
    assert d.dropout(0.5, training=False) is d and s.dropout(0.0) is s
    # the transposed values the weight gradient reads are the same numbers, reordered
    perm = s._structure()["perm"]
    assert torch.equal(d.transposed_values(), d.values[perm])
    dense_t = d.transposed().to_dense()
    assert torch.equal(dense_t, d.to_dense().t())


def test_centralized_keeps_sparse_features_and_halo_refuses_them():
    from quietgnn.comm import Communicator
    from quietgnn.nn import ModelConfig
    from quietgnn.partition import build_partitions
    from quietgnn.strategies.base import TrainConfig, WorkerContext
    from quietgnn.strategies.halo import Halo
    import numpy as np
    g, x = _sparse_graph()
    g = type(g)(**{**{f: getattr(g, f) for f in g.__dataclass_fields__}, "x": x}).validate()
    part = build_partitions(g, np.zeros(g.num_nodes, dtype=np.int64))[0]
    ctx = WorkerContext(rank=0, world_size=1, comm=Communicator(0, 1), part=part,
                        model_cfg=ModelConfig(arch="gcn", hidden=8), train_cfg=TrainConfig())
    s = Halo(ctx)
    s.setup()
    assert isinstance(s.x, SparseFeatures)
    assert s.train_epoch(0).loss > 0 and 0 <= s.evaluate()["test"] <= 1
    with pytest.raises(TypeError, match="sparse input features need the whole graph"):
        s.model(s.x, s.adj, exchange=lambda h, i: h)


def test_scaled_rows_are_the_dense_rows_scaled_and_keep_their_own_dropout():
    _, x = _sparse_graph()
    s = SparseFeatures.from_dense(x)
    f = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(1))
    scaled = s.scale_rows(f)
    assert torch.allclose(scaled.to_dense(), x * f.unsqueeze(1))
    w = torch.randn(7, x.shape[1], requires_grad=True)
    (scaled.linear(w) ** 2).sum().backward()        # the weight gradient reads the transpose
    ref = w.detach().clone().requires_grad_(True)
    ((x * f.unsqueeze(1)) @ ref.t()).pow(2).sum().backward()
    assert torch.allclose(w.grad, ref.grad, atol=1e-5)
    # the copy's dropout does not leave its values in the original's cache, nor see its own
    before = {k for k in s._structure() if not isinstance(k, str)}
    scaled.dropout(0.5, key=3, ids=torch.arange(x.shape[0]))
    assert {k for k in s._structure() if not isinstance(k, str)} == before
