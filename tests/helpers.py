"""Shared test fixtures: small graphs and in-process strategy runs."""

from __future__ import annotations

from pathlib import Path

import torch

from quietgnn.graph import Graph

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def small_graph(n: int = 120, avg_deg: int = 6, features: int = 8, classes: int = 3,
                seed: int = 0, directed: bool = False) -> Graph:
    """A random graph with label-correlated features (learnable, tiny)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    src = torch.randint(0, n, (n * avg_deg // 2,), generator=g)
    # homophilous edges: half of the destinations share the source's class
    dst = torch.randint(0, n, (src.numel(),), generator=g)
    x = torch.randn(n, features, generator=g) + torch.nn.functional.one_hot(y, features).float()
    return Graph.from_edge_index(torch.stack([src, dst]), x, y, num_classes=classes,
                                 undirected=not directed, name=f"small{n}")
