"""``pipegcn`` (PipeGCN): without staleness it is ``halo`` (whole rows); with it, every hidden
layer aggregates the halo rows its peers computed one epoch earlier, their gradients reach
the owners one epoch late, each exchange in flight until the next epoch needs it, and the
run sends the same bytes as ``halo``'s."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quietgnn.comm import Communicator, HaloExchanger
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.pipegcn import PipeGCNOptions, StaleExchange

from helpers import assert_same_runs, run_cfg, small_graph, train_run

EPOCHS, HIDDEN = 3, 8


def _cfg(strategy, parts, **options):
    return run_cfg(strategy, parts, EPOCHS, HIDDEN, **options)


_train = train_run


def _runs(comm, graph, parts, tmp):
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    P = comm.world_size
    halo = _train(comm, part, _cfg("halo", P, skip_dropped=False), f"{tmp}/h")
    off = _train(comm, part, _cfg("pipegcn", P, stale=False), f"{tmp}/o")
    out = {"halo": halo, "off": off}
    if P > 1:
        out["stale"] = _train(comm, part, _cfg("pipegcn", P), f"{tmp}/s")
        out["early"] = _train(comm, part, _cfg("pipegcn", P, wait="epoch"), f"{tmp}/e")
        cfg = _cfg("pipegcn", P)   # the pipeline, its state saved after every epoch
        cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime,
                                                                   checkpoint_every=1))
        out["saved"] = _train(comm, part, cfg, f"{tmp}/c")
        ex = HaloExchanger(Communicator(comm.rank, P), part)
        out["boundary"] = (sum(ex.send_counts), sum(ex.recv_counts))
    return out


@pytest.mark.parametrize("P", [1, 2, 4])
def test_without_staleness_it_is_halo(P, tmp_path):
    graph = small_graph(n=200)
    parts = partition_nodes(graph, "metis", P, seed=0)
    res = [_runs(Communicator(0, 1), graph, parts, tmp_path)] if P == 1 else \
        spawn_function(_runs, P, args=(graph, parts, str(tmp_path)))
    for r in res:
        assert_same_runs(r["halo"], r["off"])
        h_run, _, h_rec = r["halo"]
        if P == 1:
            continue
        # stale: the first forward is halo's (nothing stale yet), then the runs part ways;
        # an epoch's records count the exchanges it waited for (the previous epoch's), and
        # the last epoch sends nothing (no epoch would use it): the run sends halo's bytes
        # but one epoch's hidden exchange
        s_run, _, s_rec = r["stale"]
        train = [e for e in s_run if e[0] >= 0]
        assert train[0][1] == pytest.approx([e for e in h_run if e[0] >= 0][0][1], rel=1e-6)
        assert train[1][1] != pytest.approx([e for e in h_run if e[0] >= 0][1][1], rel=1e-6)
        out_rows, in_rows = r["boundary"]
        fwd, bwd = 4 * HIDDEN * out_rows, 4 * HIDDEN * in_rows

        def total(recs, phase, way):
            return sum(x["bytes"].get(phase, {}).get(way, 0) for x in recs)
        for way in ("sent", "recv"):
            assert total(s_rec, "train", way) == total(h_rec, "train", way) - (fwd + bwd)
            for phase in ("setup", "eval"):
                assert total(s_rec, phase, way) == total(h_rec, phase, way)

        def landed(recs):
            return [(x["bytes_by_kind"].get("train/pipegcn_fwd", 0),
                     x["bytes_by_kind"].get("train/pipegcn_bwd", 0))
                    for x in recs if x["epoch"] >= 0]
        assert landed(s_rec) == [(fwd, 0), (0, bwd)] + [(fwd, bwd)] * (EPOCHS - 2)
        # waited for at each epoch's end instead: the same numbers, each epoch its own bytes
        e_run, e_par, e_rec = r["early"]
        assert [e[0] for e in e_run] == [e[0] for e in s_run]
        assert [e[1] for e in e_run if e[0] >= 0] == pytest.approx([e[1] for e in train],
                                                                   rel=1e-6)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(e_par, r["stale"][1]))
        assert landed(e_rec) == [(fwd, bwd)] * (EPOCHS - 1) + [(0, 0)]
        assert [x["bytes"] for x in e_rec][:-1] == [x["bytes"] for x in h_rec][:-1]
        # an epoch whose state is saved lands what is in flight, in its own record (a resume
        # drops the records after the checkpoint)
        c_run, _, c_rec = r["saved"]
        assert [e[1] for e in c_run] == [e[1] for e in s_run]
        assert landed(c_rec) == landed(e_rec)


def _pipeline(comm, graph, parts):
    """Three epochs of a StaleExchange (gamma 0.5) on rows that name their epoch and owner:
    what each forward aggregates and each backward returns, once with every exchange landed
    where the next epoch needs it and once landed at each epoch's end."""
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    seen = {}
    for early in (False, True):
        ex = HaloExchanger(comm, part, kind=f"probe{int(early)}")
        se = StaleExchange(ex, smoothing=0.5)
        seen[early] = []
        for epoch in range(3):
            h = torch.full((part.n_own, 2), float(10 * epoch + comm.rank), requires_grad=True)
            out = se(h, 1)
            out.backward(torch.ones_like(out))
            if early:
                se.finish()
            seen[early].append((out[part.n_own:].detach().clone(), h.grad.clone()))
        se.finish()
    sent_to = torch.zeros(part.n_own)   # how many peers each own row goes to
    sent_to.index_add_(0, ex.send_all, torch.ones(ex.send_all.numel()))
    return seen, sent_to


def test_the_pipeline_is_one_epoch_stale_and_smoothed():
    graph = small_graph(n=200)
    parts = partition_nodes(graph, "metis", 2, seed=0)
    for rank, (seen, sent_to) in enumerate(spawn_function(_pipeline, 2, args=(graph, parts))):
        peer = 1 - rank
        for (h_late, g_late), (h_early, g_early) in zip(seen[False], seen[True]):
            assert torch.equal(h_late, h_early) and torch.equal(g_late, g_early)
        (halo0, g0), (halo1, g1), (halo2, g2) = seen[False]
        assert torch.all(halo0 == peer)                  # epoch 0: fresh, as halo's
        assert torch.all(halo1 == peer)                  # epoch 1: epoch 0's rows
        assert torch.all(halo2 == 0.5 * peer + 0.5 * (10 + peer))   # gamma 0.5 of 0 and 1
        # gradients: the own rows' 1, plus (from epoch 1 on) what the peer sent back last
        # epoch, one per peer a row goes to (smoothed the same way: all ones stay ones)
        assert torch.all(g0 == 1)
        assert torch.equal(g1[:, 0], 1 + sent_to) and torch.equal(g2[:, 0], 1 + sent_to)


def test_options_are_checked():
    with pytest.raises(ValueError, match="smoothing"):
        PipeGCNOptions(smoothing=1.0)
    with pytest.raises(ValueError, match="stale"):
        PipeGCNOptions(stale="yes")
    with pytest.raises(ValueError, match="options.wait = 'later'"):
        PipeGCNOptions(wait="later")
