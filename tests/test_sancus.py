"""``sancus`` (SANCUS): at ``bound 0`` it is ``halo`` (whole rows); otherwise a rank re-sends
its boundary rows only after they drifted by ``bound`` or ``max_stale`` epochs passed, its
peers use the rows it last sent, and no gradient goes back for a cached row."""

from __future__ import annotations

import pytest
import torch

from quietgnn.comm import Communicator, HaloExchanger
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.sancus import SancusOptions, SkipExchange

from helpers import assert_same_runs, run_cfg, small_graph, train_run

EPOCHS, HIDDEN = 6, 8


def _cfg(strategy, parts, **options):
    return run_cfg(strategy, parts, EPOCHS, HIDDEN, **options)


_train = train_run


def _runs(comm, graph, parts, tmp):
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    P = comm.world_size
    out = {"halo": _train(comm, part, _cfg("halo", P, skip_dropped=False), f"{tmp}/h"),
           "zero": _train(comm, part, _cfg("sancus", P, bound=0.0), f"{tmp}/z")}
    if P > 1:   # a bound no drift reaches: only the age makes a rank send (epochs 0 and 3)
        out["aged"] = _train(comm, part, _cfg("sancus", P, bound=1e9, max_stale=3), f"{tmp}/a")
        ex = HaloExchanger(Communicator(comm.rank, P), part)
        out["boundary"] = (sum(ex.send_counts), sum(ex.recv_counts))
    return out


@pytest.mark.parametrize("P", [1, 2, 4])
def test_bound_0_is_halo_and_an_old_send_is_renewed(P, tmp_path):
    graph = small_graph(n=200)
    parts = partition_nodes(graph, "metis", P, seed=0)
    res = [_runs(Communicator(0, 1), graph, parts, tmp_path)] if P == 1 else \
        spawn_function(_runs, P, args=(graph, parts, str(tmp_path)))
    for r in res:
        assert_same_runs(r["halo"], r["zero"], rel=1e-5)
        if P == 1:
            continue
        out_rows, in_rows = r["boundary"]
        sends = {e: e % 3 == 0 for e in range(EPOCHS)}    # fresh at 0, then every 3rd epoch
        for x in r["aged"][2]:
            if x["epoch"] < 0:
                continue
            kinds, fresh = x["bytes_by_kind"], sends[x["epoch"]]
            assert kinds.get("train/sancus_fwd", 0) == (4 * HIDDEN * out_rows if fresh else 0)
            assert kinds.get("train/sancus_bwd", 0) == (4 * HIDDEN * in_rows if fresh else 0)
            assert kinds["train/sancus_skip"] == P - 1      # one decision byte per peer
            assert x["extra"]["skipped_sends"] == (0 if fresh else 1)


def _probe(comm, graph, parts):
    """Three epochs of one SkipExchange (bound 0.5): rows grow 10 % (a skip), then double
    (a send). What each forward holds as halo and each backward returns."""
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    ex = HaloExchanger(comm, part, kind="probe")
    se = SkipExchange(ex, part.owned, SancusOptions(bound=0.5, max_stale=100))
    seen = []
    for scale in (1.0, 1.1, 2.0):
        h = torch.full((part.n_own, 2), scale * (1 + comm.rank), requires_grad=True)
        out = se(h, 1)
        out.backward(torch.ones_like(out))
        seen.append((out[part.n_own:].detach().clone(), h.grad.clone()))
    sent_to = torch.zeros(part.n_own)
    sent_to.index_add_(0, ex.send_all, torch.ones(ex.send_all.numel()))
    return seen, sent_to


def test_a_small_drift_is_skipped_and_its_rows_cached():
    graph = small_graph(n=200)
    parts = partition_nodes(graph, "metis", 2, seed=0)
    for rank, (seen, sent_to) in enumerate(spawn_function(_probe, 2, args=(graph, parts))):
        peer = 1 + (1 - rank)
        (h0, g0), (h1, g1), (h2, g2) = seen
        assert torch.all(h0 == peer) and torch.equal(g0[:, 0], 1 + sent_to)   # sent: as halo
        assert torch.all(h1 == peer) and torch.all(g1 == 1)   # skipped: cached, no gradient
        assert torch.all(h2 == 2 * peer) and torch.equal(g2[:, 0], 1 + sent_to)   # drifted


def test_options_are_checked():
    with pytest.raises(ValueError, match="bound"):
        SancusOptions(bound=-0.1)
    with pytest.raises(ValueError, match="max_stale"):
        SancusOptions(max_stale=0)
