"""quietgnn.nn layers against PyG's (same weights: same outputs and gradients) and the
memory contract of SparseAdj's caches."""

from __future__ import annotations

import pytest
import torch

from quietgnn.nn.adj import SparseAdj, spmm, spmm_rows
from quietgnn.nn.layers import GCNConv, SAGEConv

from helpers import small_graph

pyg_nn = pytest.importorskip("torch_geometric.nn")


def _adj(g) -> SparseAdj:
    return SparseAdj(g.indptr, g.indices, g.num_nodes, g.in_degree())


@pytest.mark.parametrize("dims", [(8, 16), (16, 4)])   # widening and narrowing layers
@pytest.mark.parametrize("arch", ["gcn", "sage"])
def test_layer_equals_pyg(arch, dims):
    g = small_graph(n=150, avg_deg=6, features=dims[0], seed=4)
    adj, ei = _adj(g), g.edge_index()
    torch.manual_seed(0)
    if arch == "gcn":
        ours, ref = GCNConv(*dims), pyg_nn.GCNConv(*dims)
        with torch.no_grad():
            ref.lin.weight.copy_(ours.lin.weight)
            ours.bias.normal_()
            ref.bias.copy_(ours.bias)
    else:
        ours, ref = SAGEConv(*dims), pyg_nn.SAGEConv(*dims)
        with torch.no_grad():
            ref.lin_l.weight.copy_(ours.lin_l.weight)
            ref.lin_l.bias.copy_(ours.lin_l.bias)
            ref.lin_r.weight.copy_(ours.lin_r.weight)
    x1 = g.x.clone().requires_grad_(True)
    x2 = g.x.clone().requires_grad_(True)
    out1, out2 = ours(x1, adj), ref(x2, ei)
    torch.testing.assert_close(out1, out2, rtol=1e-5, atol=1e-5)
    w = torch.randn_like(out1)
    (out1 * w).sum().backward()
    (out2 * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
    pairs = [(ours.lin.weight, ref.lin.weight)] if arch == "gcn" else \
        [(ours.lin_l.weight, ref.lin_l.weight), (ours.lin_r.weight, ref.lin_r.weight)]
    for a, b in pairs:
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)


def test_norm_weights_sliced_over_rows(monkeypatch):
    """GCN and mean weights built a slice of rows at a time are the one-piece products."""
    from quietgnn.nn import adj as adj_module
    g = small_graph(n=80, avg_deg=5, seed=1)
    adj = _adj(g)
    row = torch.repeat_interleave(torch.arange(adj.n_dst), adj.row_count)
    dinv_src = (adj.src_degree.float() + 1).rsqrt()
    dinv_dst = (adj.dst_degree.float() + 1).rsqrt()
    real, cuts = adj_module.chunk_bounds, []

    def counted(ptr, budget, max_items=None):
        cuts.append(real(ptr, budget, max_items))
        return cuts[-1]
    monkeypatch.setattr(adj_module, "chunk_bounds", counted)
    monkeypatch.setattr(adj_module, "EDGE_SLICE", 7)
    ew, sw = adj.gcn_norm()
    assert cuts and len(cuts[0]) > 3        # the weights were built in several slices
    assert torch.equal(ew, dinv_src[adj.indices] * dinv_dst[row])
    assert torch.equal(sw, dinv_dst * dinv_dst)
    assert torch.equal(adj.mean_norm(), (1.0 / adj.row_count.clamp(min=1).float())[row])


@pytest.mark.parametrize("budget", [1, 7, 1 << 22])
def test_spmm_rows_equals_one_product(budget):
    """The no-gradient product a slice of rows at a time is the one-piece product, exactly
    (weights, sum, and a block with empty rows and no entries)."""
    g = small_graph(n=80, avg_deg=5, seed=2)
    adj = _adj(g)
    h = torch.randn(adj.n_src, 6, generator=torch.Generator().manual_seed(0))
    ew, _ = adj.gcn_norm()
    assert torch.equal(spmm_rows(adj, ew, h, budget), spmm(adj, ew, h))
    assert torch.equal(spmm_rows(adj, None, h, budget), spmm(adj, None, h))
    empty = SparseAdj(torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 5)
    assert torch.equal(spmm_rows(empty, None, torch.ones(5, 2), budget), torch.zeros(3, 2))


def test_spmm_backward_matches_dense_and_caches_only_what_it_uses():
    """Gradients of A(values) @ h against the dense product; with the block's own fixed
    weights the transpose is cached with its values and no per-edge row index is kept."""
    g = small_graph(n=80, avg_deg=5, seed=1)
    adj = _adj(g)
    ew, _ = adj.gcn_norm()
    dense = torch.zeros(adj.n_dst, adj.n_src)
    dense[torch.repeat_interleave(torch.arange(adj.n_dst), adj.row_count), adj.indices] = ew
    h1 = torch.randn(adj.n_src, 5, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    for _ in range(2):   # the second backward reuses the cached transpose
        h1.grad = h2.grad = None
        spmm(adj, ew, h1).square().sum().backward()
        (dense @ h2).square().sum().backward()
        torch.testing.assert_close(h1.grad, h2.grad)
    assert "row" not in adj._cache and "T" not in adj._cache
    assert sum(k.startswith("T:") for k in adj._cache) == 1
    # values that change (attention) take the permutation path, and need h for their gradient
    vals = torch.rand(adj.nnz, requires_grad=True)
    spmm(adj, vals, h1).sum().backward()
    assert vals.grad is not None and "T" in adj._cache


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_lean_propagate_in_slices_equals_one_product(monkeypatch, idx_dtype):
    """The lean forward's aggregation (slices of rows, weights formed per slice, gradient
    scattered per slice, no transposed copy) is spmm with the stored GCN weights plus the
    self-loop: the same values and the same input gradient; int32 edges (a stored part) too."""
    from quietgnn.nn import lean
    g = small_graph(n=90, avg_deg=5, seed=3)
    ref_adj = _adj(g)
    adj = SparseAdj(g.indptr, g.indices.to(idx_dtype), g.num_nodes, g.in_degree())
    ew, sw = ref_adj.gcn_norm()
    for a, b in [(0, 90), (10, 37)]:
        s, e = int(adj.indptr[a]), int(adj.indptr[b])
        assert torch.equal(adj.gcn_weights(a, b), ew[s:e])
    monkeypatch.setattr(lean, "_SLICE", 24)      # many slices of a few rows
    h1 = torch.randn(adj.n_src, 5, generator=torch.Generator().manual_seed(1),
                     requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    out = lean.propagate(adj, h1)
    ref = spmm(ref_adj, ew, h2) + sw[:, None] * h2[: adj.n_dst]
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-6, atol=1e-6)
    assert not any(k == "T" or k.startswith("gcn:") for k in adj._cache)  # no per-edge cache
    with pytest.raises(ValueError, match="input has 3 rows"):
        lean.propagate(adj, torch.zeros(3, 5))
