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


def run_cfg(strategy: str, parts: int, epochs: int, hidden: int = 8, **options):
    """A small run's config: ``strategy`` with ``options`` at ``parts`` ranks, exact
    evaluation every epoch, no progress line."""
    from quietgnn.config import load_config
    return load_config(None, {"strategy": strategy, "options": options,
                              "partition": {"parts": parts}, "model": {"hidden": hidden},
                              "train": {"epochs": epochs, "eval_every": 1,
                                        "eval_mode": "exact"},
                              "runtime": {"progress": False}})


def train_run(comm, part, cfg, run_dir):
    """One run on this rank: (per epoch (epoch, loss, test acc), the trained parameters,
    the records)."""
    from quietgnn.runtime.trainer import train_on
    t = train_on(comm, part, cfg, run_dir, keep_records=True)
    return ([(r["epoch"], r.get("loss"), r.get("test_acc")) for r in t.records],
            [q.detach().clone() for q in t.strategy.model.parameters()], t.records)


def assert_same_runs(ref, other, rel: float = 1e-6) -> None:
    """Two :func:`train_run` results are one run: epochs, test accuracies and bytes alike,
    losses within ``rel``, parameters within 1e-6."""
    import pytest
    (r_run, r_par, r_rec), (o_run, o_par, o_rec) = ref, other
    assert len(r_run) == len(o_run)
    for a, b in zip(r_run, o_run):
        assert a[0] == b[0] and a[2] == b[2]
        assert (a[1] is None and b[1] is None) or a[1] == pytest.approx(b[1], rel=rel)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(r_par, o_par))
    assert [x["bytes"] for x in r_rec] == [x["bytes"] for x in o_rec]
