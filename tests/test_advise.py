"""``quietgnn advise``: the prior from measured runs, the ranking, and the command end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from quietgnn.analysis.advise import build_prior, rank
from quietgnn.comm.network import TIERS

SYN = ["--set", "synthetic.nodes=300", "--set", "synthetic.feature_dim=8",
       "--set", "model.hidden=8"]


def _run(ds, strategy, accs, work=1.0, final=None):
    """A finished bench result whose test accuracy follows ``accs`` epoch by epoch."""
    return {"status": "ok", "dataset": ds, "model": "gcn", "strategy": strategy,
            "strategy_name": strategy, "parts": 4,
            "summary": {"test_acc": final if final is not None else max(accs)},
            "curve": {"epochs": [{"epoch": i, "work": work, "test_acc": a}
                                 for i, a in enumerate(accs)]}}


def _results():
    out = []
    for ds in ("a", "b"):
        out += [_run(ds, "centralized", [0.5, 0.8, 0.9, 1.0]),
                _run(ds, "halo", [0.5, 0.99, 1.0]),             # target 0.98 after 2 epochs
                _run(ds, "tma", [0.5, 0.99], work=4.0),         # after 8 epoch-equivalents
                _run(ds, "retexo", [0.5, 0.6] if ds == "a" else [0.5, 0.6, 0.7, 0.99])]
    return out


def test_prior_counts_epochs_to_target_reach_and_gap_from_the_curves():
    p = build_prior(_results())
    assert p["reference_epochs_to_target"] == 4.0          # centralized: 0.98 at epoch 4
    assert p["strategies"]["halo"]["epochs_ratio"] == pytest.approx(0.5)
    assert p["strategies"]["tma"]["epochs_ratio"] == pytest.approx(2.0)
    assert p["strategies"]["tma"]["reach"] == 1.0
    r = p["strategies"]["retexo"]
    assert r["reach"] == 0.5 and r["epochs_ratio"] == pytest.approx(1.0)   # only b reached
    assert r["worst_gap_pp"] == pytest.approx(-40.0)
    assert p["cells"] == ["a/gcn", "b/gcn"]
    # the validation holds a dataset out of its own prior
    held = build_prior(_results(), exclude=["a"])
    assert held["cells"] == ["b/gcn"] and held["strategies"]["retexo"]["reach"] == 1.0


def _measured():
    def m(compute, nbytes, hops=2.0):
        return {"compute_s": compute, "hops": hops, "crit_bytes": nbytes / 4, "bytes": nbytes,
                "setup": {"hops": 0.0, "crit_bytes": 0.0}}
    return {"parts": 4, "model": "gcn", "strategies": {
        "halo": m(0.010, 4e6), "tma": m(0.002, 1e4, hops=0.1),
        "retexo": m(0.001, 1e3), "minibatch": {"error": "exit code 1: boom"}}}


def _prior():
    s = {"epochs_ratio": 1.0, "reach": 1.0, "gap_pp": 0.0, "worst_gap_pp": -0.5, "cells": 4}
    return {"reference_epochs_to_target": 10.0, "strategies": {
        "halo": dict(s), "tma": dict(s, epochs_ratio=50.0),
        "retexo": dict(s, reach=0.0, epochs_ratio=None)}}


def test_ranking_follows_the_tier_and_puts_failures_and_never_last():
    fast = rank(_measured(), "datacenter", _prior())
    slow = rank(_measured(), "edge", _prior())
    # on a fast link tma's 50x epochs cost more than halo's bytes; on a slow one the reverse
    assert [r["strategy"] for r in fast["ranking"]][:2] == ["halo", "tma"]
    assert slow["recommendation"] == "tma"
    t = TIERS["edge"]
    halo = next(r for r in slow["ranking"] if r["strategy"] == "halo")
    assert halo["predicted_seconds_to_target"] == pytest.approx(
        10.0 * (0.010 + t.seconds(2.0, 1e6)))
    # never reached in the measured runs, and a failed probe: ranked last, no prediction
    tail = {r["strategy"]: r for r in slow["ranking"][-2:]}
    assert set(tail) == {"retexo", "minibatch"}
    assert tail["retexo"]["predicted_seconds_to_target"] is None
    assert tail["retexo"]["accuracy_risk"] == "high"
    assert "probe failed" in tail["minibatch"]["reason"]


def test_a_custom_tier_and_a_bad_one():
    r = rank(_measured(), "site:1G:1ms", _prior())
    assert r["tier"]["bandwidth"] == 1e9 and math.isclose(r["tier"]["latency"], 1e-3)
    with pytest.raises(ValueError, match="NAME:BANDWIDTH:LATENCY"):
        rank(_measured(), "moon", _prior())


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "quietgnn", "advise", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow   # probes every strategy end to end: the slow tier (pytest -m slow)
def test_advise_json_on_a_dataset_end_to_end():
    r = _cli("--dataset", "synthetic", "--parts", "2", "--strategies", "halo,tma",
             "--tier", "wan", "--json", "--no-extend", *SYN)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert [x["extended_epochs"] for x in res["ranking"]] == [None, None]   # --no-extend
    assert res["recommendation"] in ("halo", "tma")
    assert {x["strategy"] for x in res["ranking"]} == {"halo", "tma"}
    for x in res["ranking"]:
        assert x["bytes_per_epoch"] > 0 and x["predicted_seconds_to_target"] > 0
        assert x["accuracy_risk"] in ("low", "medium", "high") and x["reason"]
    assert res["graph"]["nodes"] == 300 and "metis" in res["partitions"]
    from quietgnn.nn.model import ModelConfig, build_model    # the model it sized: GCN 8 -> 8
    net = build_model(ModelConfig(arch="gcn", hidden=8), 8, res["graph"]["classes"], seed=0)
    assert res["parameters"] == sum(p.numel() for p in net.parameters())


@pytest.mark.slow   # probes every strategy end to end: the slow tier (pytest -m slow)
def test_advise_on_a_prepared_graph(tmp_path):
    d = tmp_path / "prep"
    r = subprocess.run([sys.executable, "-m", "quietgnn", "prepare", "--dataset", "synthetic",
                        "--synthetic.nodes", "300", "--synthetic.feature_dim", "8",
                        "--parts", "2", "--out", str(d)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    r = _cli("--data", str(d), "--strategies", "grappa", "--tier", "lan",
             "--set", "model.hidden=8")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recommendation: grappa" in r.stdout and "| 1 | grappa |" in r.stdout
    # the parts' training nodes are read from the book: a mini-batch pass's updates follow
    from quietgnn.analysis.advise import _graph_and_partitions, updates_per_pass
    from quietgnn.partition import PartitionBook
    _, parts = _graph_and_partitions("synthetic", None, str(d), 2, ["minibatch"], {})
    (st,) = parts.values()
    book = PartitionBook.open(d)
    assert st["train_per_part"] == [int(book.load_part(r).train_mask.sum()) for r in range(2)]
    assert sum(st["train_per_part"]) > 0
    assert updates_per_pass("minibatch", parts) == math.ceil(max(st["train_per_part"]) / 512)
    # other parts than the directory's are refused before any probe, not silently replaced
    from quietgnn import advise
    with pytest.raises(ValueError, match=r"parts = 4 but .* is prepared in 2 parts"):
        advise(prepared=str(d), parts=4, strategies="grappa,halo")
    r = _cli("--data", str(d), "--parts", "4")
    assert r.returncode == 2 and "prepared in 2 parts" in r.stderr


def test_strategies_as_one_comma_separated_string():
    from quietgnn.analysis.advise import _names
    assert _names("halo, tma") == ["halo", "tma"] and _names(("grappa",)) == ["grappa"]


def test_bad_arguments_say_what_is_expected(capsys):
    r = _cli("--parts", "1")
    assert r.returncode == 2 and "parts = 1" in r.stderr and "centralized" in r.stderr
    r = _cli("--strategies", "halo,nope")
    assert r.returncode == 2 and "nope" in r.stderr
    # ran the reference alone, then "every probe failed" (in process: no probe starts)
    from quietgnn.analysis.advise.cli import cli_main
    assert cli_main(["--strategies", ""]) == 2
    assert "--strategies '' names no strategy" in capsys.readouterr().err


def test_traffic_above_the_last_epoch_is_charged_once_not_per_epoch():
    from quietgnn.analysis.advise import _per_work

    def row(compute, nbytes, hops):
        return {"work": 1.0, "compute_s": compute, "hops": hops, "crit_bytes": nbytes / 4,
                "train_bytes": nbytes, "data_bytes": 0}
    # retexo-like: a layer's boundary exchange in its first round, then small rounds
    m = _per_work({"epochs": [row(0.5, 4e6, 3), row(0.1, 1e6, 2), row(0.1, 1e3, 1)]})
    assert m["bytes"] == 1e3 and m["hops"] == 1.0
    assert m["once"]["bytes"] == pytest.approx(4e6 + 1e6 - 2e3)
    assert m["once"]["hops"] == pytest.approx(3.0)
    assert m["compute_s"] == pytest.approx(0.1)          # the warm-up epoch left out
    flat = _per_work({"epochs": [row(0.2, 5e3, 2)] * 3})
    assert flat["once"] == {"hops": 0.0, "crit_bytes": 0.0, "bytes": 0.0}


def test_periodic_work_is_charged_once_per_period_of_the_real_run():
    from quietgnn.analysis.advise import _per_work

    def row(ep, compute, nbytes, hops):
        return {"epoch": ep, "work": 1.0, "compute_s": compute, "hops": hops,
                "crit_bytes": nbytes / 4, "train_bytes": nbytes, "data_bytes": 0}
    row_ = row
    # grappa-like probe at period 2: epoch 2 reloads a chunk (bytes, hops, compute)
    m = _per_work({"epochs": [row(0, 0.5, 1e3, 2), row(1, 0.1, 1e3, 2), row(2, 0.4, 9e6, 11),
                              row(3, 0.1, 1e3, 2)]}, period=2)
    assert m["compute_s"] == pytest.approx(0.1)          # the boundary left out of the mean
    assert m["once"]["bytes"] == 0.0
    per = m["periodic"]
    assert per["bytes"] == pytest.approx(9e6 - 1e3) and per["hops"] == pytest.approx(9.0)
    assert per["compute_s"] == pytest.approx(0.3)
    # ranked: every `every` epochs of the run pays one reload; a run within the first
    # period pays none
    per["every"] = 10
    meas = {"parts": 4, "model": "gcn", "strategies": {"grappa": {
        **m, "setup": {"hops": 0.0, "crit_bytes": 0.0}}}}
    s = {"epochs_ratio": 1.0, "reach": 1.0, "gap_pp": 0.0, "worst_gap_pp": 0.0, "cells": 2}
    t = TIERS["wan"]
    reload_s = 0.3 + t.seconds(9.0, (9e6 - 1e3) / 4)
    epoch_s = 0.1 + t.seconds(2.0, 1e3 / 4)

    def predicted(ref):
        prior = {"reference_epochs_to_target": ref, "strategies": {"grappa": s}}
        return rank(meas, t, prior)["ranking"][0]["predicted_seconds_to_target"]
    assert predicted(10.0) == pytest.approx(10 * epoch_s)                  # epochs 0..9
    assert predicted(11.0) == pytest.approx(11 * epoch_s + reload_s)       # epoch 10 reloads
    assert predicted(35.0) == pytest.approx(35 * epoch_s + 3 * reload_s)   # 10, 20, 30
    row = rank(meas, t, {"reference_epochs_to_target": 35.0,
                         "strategies": {"grappa": s}})["ranking"][0]
    assert row["periodic_bytes"] == pytest.approx(9e6 - 1e3) and row["period_epochs"] == 10
    assert "every 10 epochs" in row["reason"]
    # llcg-like, offset 1: the average ends epochs 1 and 3 of the probe at period 2
    m = _per_work({"epochs": [row_(0, 0.5, 0, 0), row_(1, 0.3, 8e5, 6), row_(2, 0.1, 0, 0),
                              row_(3, 0.3, 8e5, 6), row_(4, 0.1, 0, 0)]}, period=2, offset=1)
    assert m["bytes"] == 0.0 and m["once"]["bytes"] == 0.0 and m["compute_s"] == \
        pytest.approx(0.1)
    assert m["periodic"]["bytes"] == pytest.approx(8e5) and \
        m["periodic"]["compute_s"] == pytest.approx(0.2)


def test_the_work_shape_is_the_one_that_predicts_a_held_out_graph_best():
    from quietgnn.analysis.advise.fit import _choose_fit, _work_needed
    # a few averaging periods whatever the graph's pace (tma-like), with noise: a power law
    # fitted on paces 5..40 would extrapolate; the held-out graphs say constant
    flat = [("a", 5.0, 60.0), ("b", 10.0, 50.0), ("c", 20.0, 75.0), ("d", 40.0, 50.0)]
    f = _choose_fit(flat)
    assert f["kind"] == "constant" and f["b"] == 0.0
    assert _work_needed({"fit": f}, 150.0) == pytest.approx(_work_needed({"fit": f}, 5.0))
    # halo-like: exactly centralized's pace, twice
    twice = [(g, x, 2 * x) for g, x in (("a", 5.0), ("b", 10.0), ("c", 20.0), ("d", 40.0))]
    f = _choose_fit(twice)
    assert f["kind"] == "ratio" and _work_needed({"fit": f}, 150.0) == pytest.approx(300.0)
    # two graphs cannot be held out against each other: the ratio
    assert _choose_fit([("a", 5.0, 10.0), ("b", 8.0, 12.0)])["kind"] == "ratio"


def test_only_a_strategy_paced_by_its_own_schedule_may_need_constant_work():
    from quietgnn.analysis.advise import build_prior
    from quietgnn.analysis.advise.fit import work_shapes
    assert "constant" in work_shapes("tma") and "constant" in work_shapes("retexo")
    assert work_shapes("minibatch") == work_shapes("halo") == ("ratio",)
    assert work_shapes("a-label-of-nothing") == ("ratio",)

    def run(ds, strategy, reach_at):     # test accuracy 0.9 from epoch `reach_at` on
        accs = [0.5] * (reach_at - 1) + [0.9] * (200 - reach_at + 1)
        return {"dataset": ds, "model": "gcn", "strategy": strategy, "parts": 4,
                "status": "ok", "summary": {"test_acc": 0.9},
                "curve": {"epochs": [{"epoch": i, "test_acc": a, "work": 1.0}
                                     for i, a in enumerate(accs)]}}
    # the same few epochs on graphs where centralized needs 5 to 40: a tma or a minibatch
    runs = [r for ds, c in (("a", 5), ("b", 10), ("c", 20), ("d", 40))
            for r in (run(ds, "centralized", c), run(ds, "tma", 12), run(ds, "minibatch", 12))]
    fits = {s: v["fit"] for s, v in build_prior(runs)["strategies"].items()}
    assert fits["tma"]["kind"] == "constant"
    assert fits["minibatch"]["kind"] == "ratio"


def test_updates_per_pass_is_the_steps_the_minibatch_loader_takes():
    import torch

    from quietgnn.analysis.advise import updates_per_pass
    from quietgnn.sampling.loader import plan_epoch
    from quietgnn.strategies import get_strategy
    mb, halo = get_strategy("minibatch"), get_strategy("halo")
    for counts, batch in (([2063, 2070, 2040, 2078], 512), ([140, 0, 0, 0], 512),
                          ([600, 10, 700, 5], 64), ([0, 0], 8)):
        opts = mb.Options(batch_size=batch)
        # what a rank's epoch plan holds (every rank takes the largest group's steps)
        plan = plan_epoch(torch.arange(counts[0]), 0, counts, 1, batch, 0, 0)
        assert mb.updates_per_pass(opts, counts) == plan.steps
        assert halo.updates_per_pass(halo.Options(), counts) == 1   # full batch: one step
    # 1.5d: the c replicas of a group split its minibatches, a step is c of them
    opts = mb.Options(batch_size=100, topology="1.5d", replication=2)
    assert mb.updates_per_pass(opts, [150, 150, 30, 30]) == 2      # ceil(300 / (2 x 100))
    parts = {"metis": {"train_per_part": [2063, 2070, 2040, 2078]}, "random": {}}
    assert updates_per_pass("minibatch", parts) == 5
    assert updates_per_pass("grappa", parts) == 1                  # no counts, full batch


def _mb_results():
    """centralized and minibatch on three graphs; minibatch needs as many *updates* as
    centralized everywhere, which is 1 epoch per update on a and b and 5 on c."""
    out = []
    for ds, ref, steps in (("a", 4, 1), ("b", 6, 1), ("c", 20, 5)):
        ramp = [0.5] * (ref - 1) + [1.0]
        out += [_run(ds, "centralized", ramp),
                _run(ds, "minibatch", [0.5] * (ref // steps - 1) + [1.0, 1.0])]
    return out, {"a": {"minibatch": 1}, "b": {"minibatch": 1}, "c": {"minibatch": 5}}


def test_the_prior_counts_updates_so_a_graph_with_more_steps_per_epoch_is_predicted():
    results, updates = _mb_results()
    p = build_prior(results, updates=updates)["strategies"]["minibatch"]
    assert p["epochs_ratio"] == pytest.approx(1.0)          # per update, the same on all three
    # held out, c is predicted from a and b (one update per epoch there): 20 updates are 4
    # epochs of c's 5; counted in epochs the prior would have said 20
    held = build_prior(results, exclude=["c"], updates=updates)
    probe = {"parts": 4, "model": "gcn", "reference_epochs": 20.0, "strategies": {
        "minibatch": {"compute_s": 0.1, "hops": 0.0, "crit_bytes": 0.0, "bytes": 1.0,
                      "setup": {"hops": 0.0, "crit_bytes": 0.0}, "updates_per_epoch": 5}}}
    r = rank(probe, "datacenter", held)["ranking"][0]
    assert r["predicted_seconds_to_target"] == pytest.approx(4 * 0.1)
    assert "of 5 updates each" in r["reason"]
    probe["strategies"]["minibatch"]["updates_per_epoch"] = 1
    r = rank(probe, "datacenter", held)["ranking"][0]
    assert r["predicted_seconds_to_target"] == pytest.approx(20 * 0.1)
    # without the updates the epochs ratio on c (1/5) would pull the shared ratio down
    assert build_prior(results)["strategies"]["minibatch"]["epochs_ratio"] < 0.6


def test_a_probe_that_reached_the_target_bounds_the_work_it_needs():
    m = _measured()
    prior = _prior()
    prior["strategies"]["tma"]["reach"] = 0.5
    base = rank(m, "edge", prior)
    tma = next(r for r in base["ranking"] if r["strategy"] == "tma")
    t = TIERS["edge"]
    epoch = 0.002 + t.seconds(0.1, 1e4 / 4)
    assert tma["predicted_seconds_to_target"] == pytest.approx(500.0 * epoch / 0.5)
    m["strategies"]["tma"]["reached_at"] = 8.0     # its probe got there in 8 epoch-equivalents
    tma = next(r for r in rank(m, "edge", prior)["ranking"] if r["strategy"] == "tma")
    assert tma["predicted_seconds_to_target"] == pytest.approx(8.0 * epoch)
    assert "within the probe's 8" in tma["reason"]
    m["strategies"]["tma"]["reached_at"] = 900.0   # a bound above the prior changes nothing
    tma = next(r for r in rank(m, "edge", prior)["ranking"] if r["strategy"] == "tma")
    assert tma["predicted_seconds_to_target"] == pytest.approx(500.0 * epoch)


def test_a_phased_strategy_is_charged_each_layers_cost_for_the_epochs_it_spends_there():
    from quietgnn.analysis.advise.phases import phase_costs, phased_seconds
    from quietgnn.analysis.advise import _per_work

    def row(ep, compute, hops, crit):
        return {"epoch": ep, "work": 1.0, "compute_s": compute, "hops": hops,
                "crit_bytes": crit, "train_bytes": 4 * crit, "data_bytes": 0}
    # a probe at 3 rounds per layer: layer 1 on raw features (dear), layer 2 on a hidden
    # embedding (cheap); a layer's first round starts it (layer 1's: the warm-up), its last
    # computes its output and exchanges its boundary rows
    curve = {"epochs": [row(0, 0.5, 6.0, 9e3), row(1, 0.03, 4.0, 1e3),
                        row(2, 0.1, 9.0, 4.1e4),
                        row(3, 0.005, 4.0, 1e3), row(4, 0.003, 4.0, 1e3),
                        row(5, 0.003, 4.0, 1e3)]}
    ph = phase_costs(curve, 2, [100, 100])
    assert [p["epochs"] for p in ph] == [100, 100]
    assert ph[0]["compute_s"] == pytest.approx(0.03) and ph[1]["compute_s"] == pytest.approx(0.003)
    assert ph[0]["start"]["compute_s"] == 0.0                # warm-up, not work
    assert ph[0]["start"]["crit_bytes"] == pytest.approx(8e3)
    end = ph[0]["end"]
    assert end["crit_bytes"] == pytest.approx(4e4) and end["hops"] == 5.0
    assert end["compute_s"] == pytest.approx(0.07)
    assert ph[1]["start"]["compute_s"] == pytest.approx(0.002)
    assert phase_costs({"epochs": curve["epochs"][:5]}, 2, [100, 100]) is None
    t = TIERS["wan"]
    e0, e1 = 0.03 + t.seconds(4.0, 1e3), 0.003 + t.seconds(4.0, 1e3)
    layer_end = 0.07 + t.seconds(5.0, 4e4)
    assert phased_seconds(ph, 76.0, t.seconds) == pytest.approx(76 * e0)   # all in layer 1
    assert phased_seconds(ph, 150.0, t.seconds) == pytest.approx(
        100 * e0 + layer_end + 0.002 + 50 * e1)
    # past the schedule: the last layer's epochs
    assert phased_seconds(ph, 250.0, t.seconds) == pytest.approx(
        100 * e0 + layer_end + 0.002 + 150 * e1)
    # the ranking uses them: 76 epochs of layer 1 (not a mix of the two layers' costs)
    m = {"parts": 4, "model": "gcn", "reference_epochs": 10.0, "strategies": {"retexo": {
        **_per_work(curve), "setup": {"hops": 0.0, "crit_bytes": 0.0}, "phases": ph}}}
    prior = {"strategies": {"retexo": {"epochs_ratio": 7.6, "reach": 1.0, "gap_pp": 0.0,
                                       "worst_gap_pp": 0.0, "cells": 4}}}
    r = rank(m, "wan", prior)["ranking"][0]
    assert r["epoch_seconds"] == pytest.approx(e0)
    assert r["predicted_seconds_to_target"] == pytest.approx(
        t.seconds(2.0, 8e3) + 76 * e0)                      # + layer 1's first-round excess


def test_the_extension_runs_on_what_centralized_needed_within_its_cost():
    from quietgnn.analysis.advise.probe import plan_extension
    # compute_s per epoch-equivalent, one rank; the budget counts all 4 ranks
    m = {"cheap": {"compute_s": 0.01, "updates_per_epoch": 1},      # 40 epochs: 1.6 s
         "batches": {"compute_s": 0.01, "updates_per_epoch": 5},    # 40 updates: 8 epochs
         "periods": {"compute_s": 0.01, "epoch_work": 25.0},        # 40 passes: 2 epochs of 25
         "slow": {"compute_s": 0.5, "updates_per_epoch": 1},        # what is left: 2 epochs
         "done": {"compute_s": 0.01, "reached_at": 3.0},            # its probe got there
         "failed": {"error": "boom"},
         "phased": {"compute_s": 0.01}}                             # skipped by the caller
    # train.epochs counts passes: the periodic strategy's probe was one epoch of 25 passes
    probe = {"cheap": 3, "batches": 3, "periods": 25, "slow": 1}
    plan = plan_extension(m, ref_work=40.0, ref_cost_s=6.0, parts=4, probe_epochs=probe,
                          skip={"phased"})
    # cheapest first: batches (0.32 s), cheap (1.6 s), periods (two whole epochs: 2 s), then
    # slow gets (6 - 3.92) / 2 = 1.04 -> 1 epoch: no longer than its probe, not extended
    assert plan == {"batches": 8, "cheap": 40, "periods": 50}     # periods: 2 epochs, in passes
    assert plan_extension(m, ref_work=40.0, ref_cost_s=10.0, parts=4, probe_epochs=probe,
                          skip={"phased"})["slow"] == 3
    # no longer than its probe: nothing to learn
    assert plan_extension(m, ref_work=3.0, ref_cost_s=8.0, parts=4,
                          probe_epochs={"cheap": 3, "batches": 3, "periods": 50, "slow": 3},
                          skip={"phased"}) == {}


@pytest.mark.slow   # probes every strategy end to end: the slow tier (pytest -m slow)
def test_the_probe_extends_a_strategy_and_reads_where_it_reached_the_target(tmp_path,
                                                                           monkeypatch):
    from quietgnn.analysis import advise as advisor
    from quietgnn.analysis.advise.fit import TARGET_FRAC, _work_to_target
    from quietgnn.analysis.projection import Curve
    seen = {}

    def plan(measured, ref_work, ref_cost, parts, probe_epochs, skip):
        # the plan's arithmetic is tested above; here a fixed plan, as the budget follows
        # the machine's load
        seen.update(ref_work=ref_work, ref_cost=ref_cost, skip=skip, probe=probe_epochs)
        return {"minibatch": 5}

    monkeypatch.setattr(advisor, "plan_extension", plan)
    set_ = {"synthetic.nodes": 300, "synthetic.feature_dim": 8, "model.hidden": 8}
    m = advisor.probe("synthetic", parts=2, model="gcn", strategies=["halo", "minibatch"],
                      out=tmp_path, set_=set_, reference_epochs=30)
    assert seen["ref_work"] == m["reference_epochs"] and seen["ref_cost"] > 0
    assert {"halo", "grappa"} <= seen["skip"]                 # exact, periodic
    assert "retexo" not in seen["skip"]         # phased: extended at the real schedule
    assert seen["probe"] == {"halo": 3, "minibatch": 3}
    mb = m["strategies"]["minibatch"]
    assert mb["extended_to"] == 5 and "extended_to" not in m["strategies"]["halo"]
    runs = [json.loads(f.read_text()) for f in (tmp_path / "results").glob("*.json")]
    ext = [r for r in runs if r["strategy"] == "minibatch" and
           r["overrides"].get("train.epochs") == 5]
    assert len(ext) == 1 and ext[0]["overrides"]["train.eval_every"] == 1
    assert len(Curve.from_json(ext[0]["curve"]).epochs) == 5
    # where the extension got to 98 % of centralized's accuracy (None: not within its epochs)
    (ref,) = [r for r in runs if r["strategy"] == "centralized"]
    assert mb["reached_at"] == _work_to_target(ext[0]["curve"],
                                               TARGET_FRAC * ref["summary"]["test_acc"])
    # without the extension: nothing run on
    monkeypatch.setattr(advisor, "plan_extension", lambda *a, **k: pytest.fail("extended"))
    m = advisor.probe("synthetic", parts=2, model="gcn", strategies=["minibatch"],
                      out=tmp_path, set_=set_, reference_epochs=30, extend=False)
    assert "extended_to" not in m["strategies"]["minibatch"]
    # ... and its figure is the one the extended probe kept beside its own
    assert "probe_reached_at" in mb
    assert m["strategies"]["minibatch"].get("reached_at") == mb["probe_reached_at"]


def test_the_prior_keeps_how_near_late_runs_were_and_what_became_of_them():
    from quietgnn.analysis.advise.fit import near_target
    results = [_run("a", "centralized", [0.5, 0.8, 0.9, 1.0]),        # target 0.98: 4 epochs
               _run("a", "halo", [0.5, 0.99]),                       # on time: no late row
               _run("a", "tma", [0.2, 0.4, 0.6, 0.9, 0.95, 0.99]),   # late, got there at 6
               _run("a", "retexo", [0.1, 0.2, 0.3, 0.49, 0.5])]      # late, never
    late = build_prior(results)["late"]
    assert late == [[0.5, 0, None, "retexo", "a"],
                    [round(0.9 / 0.98, 4), 1, 1.5, "tma", "a"]]
    # the first evaluation at or after centralized's work counts (runs evaluated every few)
    sparse = {"epochs": [{"epoch": 0, "work": 1.0, "test_acc": None},
                         {"epoch": 1, "work": 1.0, "test_acc": None},
                         {"epoch": 2, "work": 1.0, "test_acc": 0.49}]}
    assert near_target(sparse, 0.98, 1.0) == pytest.approx(0.5)
    assert near_target(sparse, 0.98, 2.0, updates_per_epoch=2.0) == pytest.approx(0.5)
    assert near_target({"epochs": [{"epoch": 0, "test_acc": None}]}, 0.98, 1.0) is None


def test_late_odds_fall_with_how_far_short_a_run_was():
    from quietgnn.analysis.advise.fit import late_odds
    rows = ([[0.3 + 0.02 * i, 0, None, "s", "g"] for i in range(10)]
            + [[0.8 + 0.02 * i, 1, 2.0 if i % 2 else 8.0, "s", "g"] for i in range(10)]
            + [[0.6, 1, 2.0, "s", "g"], [0.9, 0, None, "s", "g"]])   # not a clean split
    far, ratio = late_odds({"late": rows}, 0.35)
    near, _ = late_odds({"late": rows}, 0.95)
    assert far < 0.1 < 0.9 < near
    # the geometric mean of the work ratios of those that got there (five 8s, six 2s)
    assert ratio == pytest.approx(math.exp((5 * math.log(8) + 6 * math.log(2)) / 11))
    assert late_odds({}, 0.5) == (0.5, None)                 # nothing borrowed: even odds
    assert late_odds({"late": [[0.9, 1, 3.0, "s", "g"]]}, 0.2) == pytest.approx((1.0, 3.0))


def test_a_strategy_run_for_centralizeds_work_and_far_short_is_ranked_by_what_late_runs_did():
    m = _measured()
    m["reference_epochs"] = 10.0
    prior = _prior()
    prior["strategies"]["retexo"] = dict(prior["strategies"]["halo"])    # as cheap as it looks
    prior["late"] = ([[0.3 + 0.02 * i, 0, None, "s", "g"] for i in range(10)]
                     + [[0.8 + 0.02 * i, 1, 3.0, "s", "g"] for i in range(10)]
                     + [[0.6, 1, 3.0, "s", "g"], [0.9, 0, None, "s", "g"]])
    first = rank(m, "wan", prior)["ranking"][0]
    assert first["strategy"] == "retexo"
    # run on for centralized's 10 epochs, it was at 40 % of the target
    m["strategies"]["retexo"].update(near=0.4, near_at=10.0)
    rows = {r["strategy"]: r for r in rank(m, "wan", prior)["ranking"]}
    t = TIERS["wan"]
    epoch = 0.001 + t.seconds(2.0, 1e3 / 4)
    from quietgnn.analysis.advise.fit import late_odds
    odds, ratio = late_odds(prior, 0.4)
    assert ratio == pytest.approx(3.0)
    assert rows["retexo"]["predicted_seconds_to_target"] == pytest.approx(30.0 * epoch / odds)
    assert "at 40% of the target" in rows["retexo"]["reason"]
    assert rank(m, "wan", prior)["ranking"][0]["strategy"] == "halo"
    # a probe that reached the target says more than how near it was before
    m["strategies"]["retexo"]["reached_at"] = 5.0
    assert rank(m, "wan", prior)["ranking"][0]["strategy"] == "retexo"


def test_near_is_kept_only_where_the_run_did_centralizeds_work_and_fell_short():
    from quietgnn.analysis.advise import _near, _real_schedule
    curve = {"epochs": [{"epoch": i, "work": 1.0, "test_acc": a}
                        for i, a in enumerate([0.2, 0.4, 0.5])]}
    m = {"updates_per_epoch": 1}
    _near(m, curve, 0.98, ref_work=4.0)               # 3 epochs: less than centralized did
    assert "near" not in m
    _near(m, curve, 0.98, ref_work=3.0)
    assert m["near"] == pytest.approx(0.5 / 0.98) and m["near_at"] == 3.0
    m = {"updates_per_epoch": 2}                      # 6 updates: covers 5
    _near(m, curve, 0.98, ref_work=5.0)
    assert m["near_at"] == 3.0
    m = {"updates_per_epoch": 1, "reached_at": 2.0}
    _near(m, curve, 0.4, ref_work=3.0)
    assert "near" not in m
    # a phased strategy's extension runs the real run's schedule; the others as probed
    assert _real_schedule("retexo", {"rounds_per_layer": 3}, 2, 200) == {
        "rounds_per_layer": [100, 100]}
    assert _real_schedule("tma", {"x": 1}, 2, 200) == {"x": 1}


def test_an_exchange_hidden_behind_compute_is_charged_as_the_report_projects_it():
    """A pipelined probe (its exchange waited for after 0.3 s of compute): the advisor's epoch
    on a tier is the projection's steady epoch, the hidden part left out, on a fast tier (all
    of it hidden) and a slow one (only the window's worth); a probe without the record is
    charged in full, as before."""
    from quietgnn.analysis.advise import _per_work
    from quietgnn.analysis.projection import Curve, project
    from quietgnn.comm.network import parse_tier

    def row(e, late=True):
        return {"epoch": e, "work": 1.0, "compute_s": 0.5, "hops": 3, "crit_bytes": 2e6,
                "train_bytes": 8e6, "data_bytes": 0,
                **({"overlap_hops": 1, "overlap_crit_bytes": 1.5e6, "overlap_s": 0.3}
                   if late else {})}

    for late in (True, False):
        curve = Curve.of({"epochs": [row(e, late) for e in range(3)]})
        m = {**_per_work(curve), "setup": {"hops": 0.0, "crit_bytes": 0.0}}
        assert ("overlap" in m) is late
        for tier in ("fast:1G:1ms", "slow:10M:20ms"):
            got = rank({"parts": 2, "model": "gcn", "strategies": {"pipegcn": m}},
                       tier)["ranking"][0]["epoch_seconds"]
            assert got == pytest.approx(project(curve, parse_tier(tier))[-1].time_s)
    slow = parse_tier("slow:10M:20ms")
    full = 0.5 + slow.seconds(3, 2e6)
    assert project(curve, slow)[-1].time_s == pytest.approx(full)            # no record
    hidden = Curve.of({"epochs": [row(e) for e in range(3)]})
    assert project(hidden, slow)[-1].time_s == pytest.approx(full - 0.3)     # the window


def test_probes_evaluate_exactly_whatever_the_run_default(monkeypatch, tmp_path):
    """Probes ran at the default train.eval_mode local: their curves, measured on each rank's
    own graph, stayed below centralized's exact target where cut edges matter, so an exact
    strategy looked short of it (the advice flipped on a dense graph)."""
    from quietgnn.analysis import advise as advisor
    got = []

    class Stop(Exception):
        pass

    def run_matrix(specs, *a, **k):
        got.extend(specs)
        raise Stop

    monkeypatch.setattr("quietgnn.analysis.runner.run_matrix", run_matrix)
    with pytest.raises(Stop):
        advisor.probe("synthetic", parts=2, model="gcn", strategies=["halo", "minibatch"],
                      out=tmp_path, set_={"synthetic.nodes": 300, "train.eval_mode": "local"})
    assert {s.strategy for s in got} == {"halo", "minibatch", "centralized"}
    assert all(s.overrides["train.eval_mode"] == "exact" for s in got)


def test_the_table_says_the_target_and_when_centralized_is_near_chance():
    """The advice named no accuracy: on a 5-class graph where centralized reached 0.178 it
    ranked strategies as confidently as anywhere."""
    from quietgnn.analysis.advise.cli import format_table
    res = {"tier": {"name": "wan", "bandwidth": 1e8, "latency": 0.02}, "parts": 4,
           "model": "gcn", "ranking": [], "recommendation": None,
           "reference_acc": 0.178, "target_acc": 0.98 * 0.178, "graph": {"classes": 5}}
    text = format_table(res)
    assert "target: test accuracy 0.1744 (98% of centralized's 0.1780" in text
    assert "centralized is near chance here (5 classes" in text
    res.update(reference_acc=0.9, target_acc=0.882)
    assert "near chance" not in format_table(res) and "0.8820" in format_table(res)
    res.update(graph={"classes": 2}, reference_acc=0.72, target_acc=0.7056)
    assert "near chance" not in format_table(res)       # a binary task well above chance
    res.update(reference_acc=0.52, target_acc=0.5096)
    assert "near chance here (2 classes" in format_table(res)
