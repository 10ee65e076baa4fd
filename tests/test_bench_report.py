"""``quietgnn bench`` (matrix expansion, isolation, failure recording, resume) and
``quietgnn report`` (table, numbers, PNGs) on a tiny synthetic graph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quietgnn.analysis import bench, report, runner, tables
from quietgnn.analysis.projection import Curve
from quietgnn.analysis.matrix import build_matrix


def test_matrix_expansion():
    specs = build_matrix({"datasets": "cora,citeseer", "strategies": [
        "centralized", "halo", {"name": "halo", "label": "halo-rand", "set": {
            "partition.method": "random"}}, {"name": "future_strategy", "options": {"bits": 2}}],
        "parts": [2, 4], "models": "gcn", "seeds": [0, 1], "epochs": 5})
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids))
    # centralized has fixed_parts = 1: once per dataset x model x seed, whatever `parts`
    cen = [s for s in specs if s.strategy == "centralized"]
    assert len(cen) == 4 and {s.parts for s in cen} == {1}
    assert len([s for s in specs if s.strategy == "halo"]) == 16
    fut = [s for s in specs if s.strategy == "future_strategy"]   # unknown names are data
    assert len(fut) == 8 and fut[0].options == {"bits": 2}
    cmd = fut[0].command(Path("/o/runs/x"), Path("/o/s.json"))
    assert cmd[cmd.index("--options.bits") + 1] == "2" and "--threads" in cmd
    assert cmd[cmd.index("--train.epochs") + 1] == "5"
    rand = [s for s in specs if s.label == "halo-rand"][0]
    assert rand.overrides["partition.method"] == "random"
    assert rand.as_dict()["strategy"] == "halo-rand"
    only = build_matrix({"datasets": "cora,citeseer", "strategies": [
        "halo", {"name": "minibatch", "datasets": ["citeseer"]}], "models": "gcn"})
    assert [(s.dataset, s.strategy) for s in only] == [
        ("cora", "halo"), ("citeseer", "halo"), ("citeseer", "minibatch")]
    with pytest.raises(ValueError, match="unknown matrix key"):
        build_matrix({"datasets": "cora", "strategies": "halo", "epoch": 3})
    # --strategies on top of a YAML list: a name is a label first, else every entry of it
    yaml = ["halo", {"name": "halo", "label": "halo-rand"}, {"name": "grappa", "label": "g1"},
            {"name": "grappa", "label": "g2"}]
    labels = lambda names: [e if isinstance(e, str) else e.get("label", e["name"])  # noqa: E731
                            for e in bench._select(yaml, names, "strategies")]
    assert labels("halo") == ["halo"] and labels("halo-rand") == ["halo-rand"]
    assert labels("grappa") == ["g1", "g2"] and labels("tma") == ["tma"]
    # links: every multi-rank run once per link on emulated hosts; centralized stays local
    linked = build_matrix({"datasets": "cora", "strategies": "centralized,halo",
                           "parts": [2], "links": "uncapped,100mbit"})
    assert [(s.strategy, s.link) for s in linked] == [
        ("centralized", None), ("halo", "uncapped"), ("halo", "100mbit")]
    plain = build_matrix({"datasets": "cora", "strategies": "halo", "parts": [2]})[0]
    # a link names the run (its id ends with it); a local run's id is what it always was
    assert linked[2].id == plain.id.rsplit("-", 1)[0] + "-100mbit-" + plain.id.rsplit("-", 1)[1]
    assert linked[2].as_dict()["link"] == "100mbit" and "link" not in plain.as_dict()
    assert linked[2].train_args(Path("r/x"), Path("s.json"))[:3] == ["-m", "quietgnn", "train"]
    with pytest.raises(ValueError, match="'100mbps'.*10mbit.*'uncapped'"):
        build_matrix({"datasets": "cora", "strategies": "halo", "links": ["100mbps"]})
    for bad in ("0mbit", "-5mbit", "mbit"):     # no rate tc could cap a link at
        with pytest.raises(ValueError, match=f"'{bad}'.*positive"):
            build_matrix({"datasets": "cora", "strategies": "halo", "links": [bad]})
    assert build_matrix({"datasets": "cora", "strategies": "halo",
                         "links": "100Mbit"})[0].link == "100mbit"   # one id per rate
    with pytest.raises(ValueError, match="no strategies"):
        build_matrix({"datasets": "cora"})


MATRIX = """
datasets:
  - {name: synthetic, label: tiny, set: {synthetic.nodes: 300}}
strategies:
  - centralized
  - halo
  - {name: halo, label: halo-broken, set: {dataset.prepared: no-such-dir}}   # fails running
parts: [2]
models: [gcn]
seeds: [0]
set: {train.epochs: 4, model.dropout: 0.0}   # no dropout: halo == centralized exactly
"""


@pytest.mark.slow   # a bench matrix through the CLI: the slow tier (pytest -m slow)
def test_bench_resume_failures_and_report(tmp_path, capsys):
    mfile = tmp_path / "m.yaml"
    mfile.write_text(MATRIX)
    out = tmp_path / "bench"
    rc = bench.cli_main(["--matrix", str(mfile), "--out", str(out)])
    assert rc == 1                                   # one run failed; the matrix went on
    lines = (out / "results.jsonl").read_text().splitlines()
    res = {r["strategy"]: r for r in map(json.loads, lines)}
    assert set(res) == {"centralized", "halo", "halo-broken"}
    assert res["centralized"]["status"] == res["halo"]["status"] == "ok"
    bad = res["halo-broken"]
    assert bad["status"] == "failed" and "no partition book at 'no-such-dir'" in bad["error"]
    assert res["halo"]["summary"]["parts"] == 2 and res["centralized"]["parts"] == 1
    # the curve is stored a list per field
    assert len(res["halo"]["curve"]["epochs"]["hops"]) == 4
    halo_curve = Curve.from_json(res["halo"]["curve"]).epochs
    # per epoch: one hidden-layer exchange each way (inputs cached) + a 2-rank all-reduce
    assert len(halo_curve) == 4 and all(e.hops == 4 and e.crit_bytes > 0 for e in halo_curve)
    assert all(e.hops == 0 for e in Curve.from_json(res["centralized"]["curve"]).epochs)
    assert res["halo"]["summary"]["train_bytes_per_epoch"] == pytest.approx(
        sum(e.train_bytes for e in halo_curve) / 4)

    # resume: nothing reruns; --retry-failed reruns the failed run only
    stamps = {r["id"]: r["finished_at"] for r in res.values()}
    capsys.readouterr()
    assert bench.cli_main(["--matrix", str(mfile), "--out", str(out)]) == 1
    assert capsys.readouterr().err.count("skipped") == 3
    bench.cli_main(["--matrix", str(mfile), "--out", str(out), "--retry-failed"])
    err = capsys.readouterr().err
    assert err.count("skipped") == 2 and "halo-broken" in err
    again = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {r["id"]: r["finished_at"] for r in again if r["status"] == "ok"} == \
        {k: v for k, v in stamps.items() if not k.startswith("tiny-gcn-halo-broken")}

    # report: table with the reference, ratios vs halo, failed runs listed, three PNGs
    rdir = tmp_path / "report"
    assert report.cli_main([str(out), "--out", str(rdir), "--tier", "slow:1M:0.1"]) == 0
    md = (rdir / "report.md").read_text()
    assert "| strategy | P | test acc | Δ vs centralized | train bytes/epoch" in md
    # evaluation bytes beside training's: halo evaluated once, locally then exactly (4 epochs
    # < train.eval_every), all in the last epoch's record; per epoch-equivalent and as a ratio
    assert "| eval bytes/epoch | eval/train |" in md
    ev = [e.eval_bytes for e in halo_curve]
    assert ev[:3] == [0, 0, 0] and ev[3] == res["halo"]["summary"]["eval_bytes"] > 0
    assert "time to acc (lan)" in md and "time to acc (wan)" in md
    assert "| centralized | 1 |" in md and "| halo | 2 |" in md and "halo-broken" in md
    rep = json.loads((rdir / "report.json").read_text())
    (g,) = rep["groups"]
    rows = {r["strategy"]: r for r in g["rows"]}
    assert rows["halo"]["eval_bytes_per_epoch"] == pytest.approx(ev[3] / 4)
    assert rows["halo"]["eval_train_ratio"] == pytest.approx(
        ev[3] / sum(e.train_bytes for e in halo_curve))
    assert f"| {tables.human_bytes(ev[3] / 4)} | " \
        f"{100 * rows['halo']['eval_train_ratio']:.1f} % |" in md
    assert g["reference_acc"] == pytest.approx(res["centralized"]["summary"]["test_acc"])
    # where the training bytes went, by message kind: they add up to the training bytes
    kinds = rows["halo"]["bytes_by_kind"]
    assert {"halo_fwd", "halo_bwd"} <= set(kinds) and any("allreduce" in k for k in kinds)
    assert sum(kinds.values()) == pytest.approx(sum(e.train_bytes for e in halo_curve) / 4)
    assert "by message kind" in md and "| halo | 2 | " in md
    assert rows["halo"]["bytes_ratio"] == pytest.approx(1.0) and rows["centralized"][
        "train_bytes_per_epoch"] == 0
    # halo is exact (no dropout here): same accuracy as the reference
    assert rows["halo"]["test_acc"] == pytest.approx(rows["centralized"]["test_acc"], abs=1e-6)
    lan, slow = rows["halo"]["epoch_s"]["lan"], rows["halo"]["epoch_s"]["slow"]
    assert slow > lan > rows["halo"]["compute_s_per_epoch"]
    pngs = sorted(p.name for p in rdir.glob("*.png"))
    assert pngs == ["tiny-gcn-acc_vs_bytes.png", "tiny-gcn-acc_vs_time.png",
                    "tiny-gcn-time_breakdown.png"]
    assert all((rdir / p).stat().st_size > 10_000 for p in pngs)


def _fake(strategy: str, work: float, epochs: int, acc: float) -> dict:
    rows = [{"epoch": e, "work": work, "compute_s": 0.5, "hops": 2, "crit_bytes": 1e6,
             "rounds": 1, "train_bytes": 4e6, "data_bytes": 0, "eval_bytes": 0, "wall_s": 1.0,
             "comm_s": 0.1, "eval_s": 0.0, "test_acc": acc, "val_acc": acc, "train_acc": acc,
             "peak_rss_mb": 100.0} for e in range(epochs)]
    return {"id": strategy, "dataset": "d", "model": "gcn", "strategy": strategy,
            "strategy_name": strategy, "parts": 4, "status": "ok",
            "curve": {"setup": {}, "epochs": rows},
            "summary": {"test_acc": acc, "train_bytes_per_epoch": 4e6 / work,
                        "peak_rss_mb": 100.0, "epochs": epochs}}


def test_report_divides_per_epoch_figures_by_the_work_done():
    """A strategy whose trainer epoch is 10 epoch-equivalents (tma) is compared per unit of
    work: its compute and projected seconds per epoch are a tenth of a same-cost halo epoch's."""
    from quietgnn.comm.network import Tier
    lan = Tier(name="lan", bandwidth=1e9, latency=5e-4)
    rep = report.build_report([_fake("centralized", 1.0, 6, 0.8), _fake("halo", 1.0, 6, 0.8),
                               _fake("tma", 10.0, 3, 0.8)], {"lan": lan})
    rows = {r.strategy: r for r in rep.groups[0].rows}
    assert rows["halo"].compute_s_per_epoch == pytest.approx(0.5)
    assert rows["tma"].compute_s_per_epoch == pytest.approx(0.05)
    per_epoch = 0.5 + 2 * 5e-4 + 1e6 * 8 / 1e9            # compute + hops x latency + bytes/bw
    assert rows["halo"].epoch_s["lan"] == pytest.approx(per_epoch)
    assert rows["tma"].epoch_s["lan"] == pytest.approx(per_epoch / 10)
    assert rows["tma"].bytes_ratio == pytest.approx(0.1)
    # time to accuracy is cumulative wall of the curve, not divided: first epoch reaches it
    assert rows["tma"].tta["lan"].seconds == pytest.approx(per_epoch)
    # report.json: the same numbers under the same keys
    assert rep.to_json()["groups"][0]["rows"][1]["tta"]["lan"]["seconds"] == \
        pytest.approx(per_epoch)
    # the what-if of compute 10x faster: compute shrinks, the link's seconds stay
    fast = report.build_report([_fake("centralized", 1.0, 6, 0.8), _fake("halo", 1.0, 6, 0.8)],
                               {"lan": lan}, compute_speedup=10)
    halo = {r.strategy: r for r in fast.groups[0].rows}["halo"]
    assert halo.epoch_s["lan"] == pytest.approx(per_epoch - 0.45)
    assert halo.tta["lan"].seconds == pytest.approx(per_epoch - 0.45)
    assert "What-if, not a measurement" in tables.markdown(fast, ["lan"], {})
    assert "What-if" not in tables.markdown(rep, ["lan"], {})

    # the set-up's communication counted, the evaluations left out: epoch 0 of this halo
    # evaluated at a cost (0.2 s of compute, 1 hop, 1 MB), its set-up sent 2 MB in 3 hops
    ev, su = _fake("halo", 1.0, 6, 0.8), {"hops": 3, "crit_bytes": 2e6, "rounds": 3, "bytes": 8e6}
    ev["curve"]["setup"] = su
    ev["curve"]["epochs"][0].update(eval_compute_s=0.2, eval_hops=1, eval_crit_bytes=1e6)
    setup_s = 3 * 5e-4 + 2e6 * 8 / 1e9
    eval_s = 0.2 + 5e-4 + 1e6 * 8 / 1e9
    for kw, want in (({}, per_epoch + eval_s), ({"without_eval": True}, per_epoch),
                     ({"with_setup": True}, per_epoch + eval_s + setup_s),
                     ({"with_setup": True, "without_eval": True}, per_epoch + setup_s)):
        got = report.build_report([_fake("centralized", 1.0, 6, 0.8), ev], {"lan": lan}, **kw)
        assert {r.strategy: r for r in got.groups[0].rows}["halo"].tta["lan"].seconds == \
            pytest.approx(want), kw


def test_runs_on_emulated_hosts_are_rows_of_their_link_measured_beside_the_projection():
    from quietgnn.comm.network import Tier
    lan = Tier(name="lan", bandwidth=1e9, latency=5e-4)
    runs = [_fake("centralized", 1.0, 6, 0.8), _fake("halo", 1.0, 6, 0.8)]
    for link, wall in (("uncapped", 0.6), ("8mbit", 1.7)):
        r = _fake("halo", 1.0, 6, 0.8)
        r.update(id=f"halo-{link}", link=link, host_cores=2)
        for e in r["curve"]["epochs"]:
            e.update(wall_s=wall, eval_s=0.1, compute_sum_s=1.0)
        runs.append(r)
    runs[1]["curve"]["train_bytes_by_kind"] = {"halo_fwd": 3e6, "allreduce": 1e6}
    rep = report.build_report(runs, {"lan": lan})
    rows = {r.strategy: r for r in rep.groups[0].rows}
    assert set(rows) == {"centralized", "halo", "halo @ uncapped", "halo @ 8mbit"}
    slow = rows["halo @ 8mbit"]
    assert slow.link == "8mbit" and rows["halo"].link is None
    assert slow.measured_epoch_s == pytest.approx(1.6)          # wall less evaluation
    # projected on the link, no latency: compute (0.5 s; 4 ranks' 1.0 s on 2 cores: 0.5 s)
    # plus 1 MB at 8 Mbit/s
    assert slow.link_epoch_s == pytest.approx(0.5 + 1.0)
    assert slow.measured_tta_s == pytest.approx(1.7)            # reached at the first epoch
    assert slow.link_tta_s == pytest.approx(1.5)
    assert rows["halo @ uncapped"].link_epoch_s == pytest.approx(0.5, rel=1e-6)
    # each link's halo is its own row's baseline
    assert slow.bytes_ratio == pytest.approx(1.0)
    # centralized (P = 1) against the local halo, whatever ran on emulated hosts beside it
    runs[0]["parts"] = 1
    cen = {r.strategy: r for r in report.build_report(runs, {"lan": lan}).groups[0].rows}
    assert cen["centralized"].bytes_ratio == pytest.approx(1.0)   # the fake's equal bytes
    md = tables.markdown(rep, ["lan"], {})
    assert "Measured on emulated hosts" in md and "| halo | 4 | 8mbit | 1.60 s | 1.50 s |" in md
    # the kinds of the run that recorded them, largest first
    assert "| strategy | P | halo_fwd | allreduce |" in md and "| halo | 4 | 3.00 MB | 1.00 MB |" \
        in md


def test_bytes_by_class_are_the_seeds_mean_and_a_class_never_sent_is_a_dash():
    from quietgnn.comm.network import Tier
    lan = Tier(name="lan", bandwidth=1e9, latency=5e-4)
    runs = []
    for seed, feats in ((0, 2e6), (1, 4e6)):
        r = _fake("retexo-none", 1.0, 3, 0.8)
        r.update(id=f"none-{seed}", seed=seed)
        r["summary"]["bytes_sent_by_class"] = {"features": feats, "gradients": 1e6}
        runs.append(r)
    kept = _fake("retexo-features", 1.0, 3, 0.7)
    kept["summary"]["bytes_sent_by_class"] = {"gradients": 1e6}
    rep = report.build_report(runs + [kept], {"lan": lan})
    rows = {r.strategy: r for r in rep.groups[0].rows}
    assert rows["retexo-none"].bytes_by_class == {"features": 3e6, "gradients": 1e6}
    assert "by traffic class" not in tables.markdown(rep, ["lan"], {})
    rep.by_class = True
    md = tables.markdown(rep, ["lan"], {})
    assert "| strategy | P | features | gradients |" in md
    assert "| retexo-features | 4 | — | 1.00 MB |" in md
    assert "| retexo-none | 4 | 3.00 MB | 1.00 MB |" in md


def test_summary_tables_across_groups():
    """With several dataset x model groups the report opens with one row per strategy:
    accuracy and its difference to centralized, bytes and WAN time-to-accuracy vs halo."""
    from quietgnn.comm.network import resolve_tiers
    res = []
    for ds, tma_acc in (("d1", 0.8), ("d2", 0.5)):
        for r in (_fake("centralized", 1.0, 6, 0.8), _fake("halo", 1.0, 6, 0.8),
                  _fake("tma", 200.0, 1, tma_acc)):
            r["dataset"] = ds
            res.append(r)
    tiers = resolve_tiers([])
    rep = report.build_report(res, tiers)
    md = tables.markdown(rep, ["lan", "wan"], {})
    assert "## Summary" in md
    assert "| strategy | d1 gcn | d2 gcn |" in md
    assert "| centralized | 80.0 | 80.0 |" in md
    assert "| tma | 80.0 (+0.0) | 50.0 (-30.0) |" in md
    # bytes: 4 MB per 200 passes vs 4 MB per epoch; d2 never reaches 98% of 80%
    assert "| tma | 1/200 / " in md and md.rstrip().count("never") >= 1
    assert "| halo | 1.00 / 1.00 | 1.00 / 1.00 |" in md


def test_a_set_value_of_seed_is_the_run_s_seed():
    specs = build_matrix({"datasets": "cora", "strategies": "halo", "seeds": [0, 3],
                          "set": {"dataset.split_seed": "{seed}", "train.epochs": 5}})
    assert [(s.seed, s.overrides["dataset.split_seed"]) for s in specs] == [(0, 0), (3, 3)]
    assert "--dataset.split_seed 3" in " ".join(specs[1].train_args(Path("r/x"), Path("s")))
    # the same from the command line: --set reads values as YAML, "{seed}" a mapping there
    flag = bench._kv(["dataset.split_seed={seed}"], "--set")
    cli = build_matrix({"datasets": "cora", "strategies": "halo", "seeds": [2], "set": flag})
    assert cli[0].overrides["dataset.split_seed"] == 2


def test_a_later_study_replaces_the_earlier_ones_runs_of_the_same_cell(tmp_path, capsys):
    """Two studies passed in order: the rerun's cell (other settings, so another id) replaces
    the first study's, a cell only the first has stays; within one study two seeds of a cell
    are both kept, and two settings of one seed (a second matrix written into the same
    folder) are not averaged as seeds: the later is kept, the earlier named."""
    def study(name, runs):
        d = tmp_path / name
        d.mkdir()
        (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
        return d
    old_tma, halo = _fake("tma", 10.0, 3, 0.5), _fake("halo", 1.0, 6, 0.8)
    old_tma.update(id="d-tma-old", seed=0)
    seed1 = dict(_fake("tma", 10.0, 3, 0.6), id="d-tma-old-s1", seed=1)
    halo.update(seed=0)
    new_tma = dict(_fake("tma", 10.0, 3, 0.7), id="d-tma-new", seed=0)
    a = study("a", [old_tma, seed1, halo])
    b = study("b", [new_tma])
    got = {r.id: r.summary.test_acc for r in report.load_results([a, b])}
    assert got == {"d-tma-old-s1": 0.6, "halo": 0.8, "d-tma-new": 0.7}
    # the other order: the first study's run wins back its cell
    assert {r.id for r in report.load_results([b, a])} == {"d-tma-old", "d-tma-old-s1", "halo"}
    # a failed rerun (e.g. stopped by the memory floor) erases nothing
    failed = dict(_fake("tma", 10.0, 3, 0.7), id="d-tma-died", seed=0, status="failed")
    got = {r.id for r in report.load_results([a, study("c", [failed])])}
    assert {"d-tma-old", "d-tma-died"} <= got
    capsys.readouterr()
    both = study("d", [old_tma, seed1, new_tma])
    assert {r.id for r in report.load_results([both])} == {"d-tma-old-s1", "d-tma-new"}
    assert "1 run(s) left out" in capsys.readouterr().err
    # the later to finish, not the later in the file (a rerun keeps its run's place there)
    late_old = dict(old_tma, finished_at="2026-11-29T02:00:00Z")
    early_new = dict(new_tma, finished_at="2026-11-29T01:00:00Z")
    got = {r.id for r in report.load_results([study("e", [late_old, seed1, early_new])])}
    assert got == {"d-tma-old", "d-tma-old-s1"}


def test_a_partial_matrix_adds_to_the_study_instead_of_replacing_it(tmp_path):
    path = tmp_path / "results.jsonl"
    runner._write_jsonl(path, [(k, {"id": k, "status": "ok", "v": 1}) for k in ("a", "b", "c")])
    # a later run of part of the matrix: b rerun, d new (as `--strategies d` would add)
    runner._write_jsonl(path, [("b", {"id": "b", "status": "ok", "v": 2}),
                              ("d", {"id": "d", "v": 1})])
    got = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["id"], r["v"]) for r in got] == [("a", 1), ("b", 2), ("c", 1), ("d", 1)]
    assert not path.with_suffix(".tmp").exists()


def test_a_stopped_study_keeps_the_results_of_its_finished_runs(tmp_path, monkeypatch):
    """Stopped (Ctrl-C) during its second run, a study's ``results.jsonl`` already holds the
    first run's result: the report reads what was measured, not an older file."""
    specs = build_matrix({"datasets": ["cora"], "strategies": ["halo", "adaqp"]})

    def fake(spec, out, timeout_s, log, floor_mb=None):
        if spec.strategy == "adaqp":
            raise KeyboardInterrupt
        return {**spec.as_dict(), "status": "failed", "error": "x", "run_dir": None}
    monkeypatch.setattr(runner, "_run_one", fake)
    with pytest.raises(KeyboardInterrupt):
        runner.run_matrix(specs, tmp_path, log=lambda m: None)
    got = [json.loads(x)["id"] for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert got == [specs[0].id]


def test_report_names_a_file_that_holds_no_results(tmp_path, capsys):
    """A metrics file (or any JSON without a run's names) is refused with the file named, not
    read as an empty result."""
    bad = tmp_path / "rank-0.jsonl"
    bad.write_text(json.dumps({"epoch": 0, "rank": 0, "loss": 1.0}) + "\n")
    assert report.cli_main([str(bad), "--out", str(tmp_path / "r"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "rank-0.jsonl" in err and "not a bench result" in err and "dataset" in err
    assert report.cli_main([str(bad), "--target-frac", "1.5", "--no-plots"]) == 2
    assert "--target-frac 1.5; expected a fraction of centralized's" in capsys.readouterr().err


def test_a_host_that_fails_ends_the_wait_for_the_others_after_a_grace():
    """One emulated host crashes while another waits for it: the wait ends ``grace_s`` after
    the crash (not at the run's timeout), and the run's status is the crash's exit code, not
    a timeout. Plain subprocesses stand in for the hosts' agents (no namespaces needed)."""
    import subprocess
    import sys
    import time

    from quietgnn.runtime.netcluster import Cluster, exit_status
    def py(code, **kw):
        return subprocess.Popen([sys.executable, "-c", code], **kw)
    # host 2 crashes first; host 0 fails later (its reaction); host 1 hangs. The reaction
    # starts once the crash is over, so the order does not hang on two interpreters' start-up
    # times on a loaded machine; the grace leaves it room to start and exit.
    hang = py("import time; time.sleep(60)", start_new_session=True)
    crash = py("import sys; sys.exit(3)")
    crash.wait()
    reacts = py("import sys, time; time.sleep(0.3); sys.exit(1)")
    t0 = time.monotonic()
    failures: list[int] = []
    codes = Cluster.wait([reacts, hang, crash], timeout=50, grace_s=2.5, failures=failures)
    assert codes == [1, None, 3] and time.monotonic() - t0 < 20
    assert hang.poll() is not None                      # killed, not left behind
    assert failures == [2, 0] and exit_status(codes, failures) == 3   # the first failure
    assert exit_status([0, None]) is None               # a hang alone: timed out
    assert exit_status([0, 0]) == 0 and exit_status([0, -9, 1]) == -9
    # without a failure, a clean exit beside a hang waits the whole timeout
    done, hang = py("pass"), py("import time; time.sleep(60)", start_new_session=True)
    t0 = time.monotonic()
    assert Cluster.wait([done, hang], timeout=1.0) == [0, None]
    assert time.monotonic() - t0 >= 1.0 and hang.poll() is not None


def test_the_memory_floor_kills_the_run_s_whole_group_and_says_why():
    """A run (here a sleeping launcher and its child) is killed, group and all, once available
    memory is below the floor (a floor above what any machine has), with the reason and the
    largest resident set seen; under a floor of 1 MiB the same run ends by itself."""
    import subprocess
    import sys
    import time
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    t0 = time.monotonic()
    rc, why, peak = runner._wait(proc, 60.0, runner.mem_available_mb() + 1e9)
    assert rc is None and time.monotonic() - t0 < 10
    assert "below --mem-floor" in why and peak > 1.0
    time.sleep(0.2)
    assert runner._group_rss_mb(proc.pid) == []        # the child went with the launcher
    quick = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    assert runner._wait(quick, 60.0, 1.0)[:2] == (0, None)


@pytest.mark.parametrize("extra, says", [(["--mem-floor", "-5"], "expected MiB >= 0"),
                                          (["--mem-floor", "1000", "--links", "10mbit"],
                                           "watches local runs")])
def test_a_bad_memory_floor_is_refused_before_any_run(tmp_path, capsys, extra, says):
    rc = bench.cli_main(["--datasets", "cora", "--strategies", "halo", "--parts", "2",
                         "--out", str(tmp_path / "o"), *extra])
    assert rc == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("matrix, message", [
    ({"strategies": ["halo", "hallo"]}, "unknown strategy 'hallo'"),
    ({"set": {"train.epoch": 1}}, "unknown key(s) ['train.epoch']"),
    ({"strategies": [{"name": "halo", "options": {"bogus": 1}}]}, "unknown option(s) ['bogus']"),
    ({"parts": ["two"]}, "parts: 'two' is not an integer"),
    ({"set": {"model.hidden": "wide"}}, "model.hidden"),
])
def test_a_matrix_is_checked_before_any_run_starts(matrix, message):
    """What every run of the matrix would be refused for is refused once, before the first
    run, naming the key."""
    from quietgnn.analysis.matrix import check_settings
    with pytest.raises(ValueError) as ei:
        check_settings(build_matrix({"datasets": "cora", "strategies": "halo", **matrix}))
    assert message in str(ei.value)


def test_a_matrix_on_a_prepared_graph_is_checked_with_its_partitioner(tmp_path):
    """tma's random variant on a graph prepared in random parts is valid (the directory's
    partitioner, not the strategy's default); on one not prepared yet it is left to the run."""
    from helpers import small_graph
    from quietgnn.analysis.matrix import check_settings
    from quietgnn.partition import make_book
    make_book(tmp_path / "rand", small_graph(), "random", 2)
    for where in ("rand", "not-yet"):
        check_settings(build_matrix({
            "datasets": [{"name": "synthetic", "label": "p",
                          "set": {"dataset.prepared": str(tmp_path / where)}}],
            "strategies": [{"name": "tma", "options": {"variant": "random"}}], "parts": [2]}))
    with pytest.raises(ValueError, match="needs partition method 'random'"):
        check_settings(build_matrix({"datasets": "cora", "parts": [2], "strategies": [
            {"name": "tma", "options": {"variant": "random"}}]}))


def test_two_variants_of_a_strategy_need_labels():
    with pytest.raises(ValueError, match="two entries run as 'halo' on cora .* own label"):
        build_matrix({"datasets": "cora", "strategies": [
            "halo", {"name": "halo", "options": {"lean": True}}]})
    assert len(build_matrix({"datasets": "cora", "strategies": [
        "halo", {"name": "halo", "label": "halo-lean", "options": {"lean": True}}]})) == 2


def test_two_datasets_run_alike_need_labels():
    """Two graph files labelled alike: the second was dropped as a duplicate (2 runs of 4);
    one file under two splits was refused as two *strategy* entries."""
    for datasets in ([{"name": "a/graph.npz", "label": "graph"},
                      {"name": "b/graph.npz", "label": "graph"}],
                     [{"name": "g.csv", "set": {"dataset.split_seed": 1}},
                      {"name": "g.csv", "set": {"dataset.split_seed": 2}}]):
        with pytest.raises(ValueError, match=r"^datasets: two entries run as .* give each its "
                                             r"own label"):
            build_matrix({"datasets": datasets, "strategies": ["centralized", "halo"]})
    # a '/' is a '_' in a run id: two names one id
    with pytest.raises(ValueError, match="two entries run as"):
        build_matrix({"datasets": ["a/g.npz", "a_g.npz"], "strategies": ["halo"]})
    twice = build_matrix({"datasets": ["cora", "cora"], "strategies": ["halo"]})
    assert len(twice) == 1                     # the same graph named twice: one run
    # the same settings, one given by the matrix's set and one by the entry's: one graph
    assert len(build_matrix({"datasets": ["cora", {"name": "cora", "set": {
        "dataset.split_seed": 1}}], "set": {"dataset.split_seed": 1},
        "strategies": ["halo"]})) == 1
    assert len(build_matrix({"datasets": [{"name": "a/graph.npz", "label": "ga"},
                                          {"name": "b/graph.npz", "label": "gb"}],
                             "strategies": ["centralized", "halo"]})) == 4


def test_rows_whose_runs_evaluated_locally_are_marked_beside_their_time_to_accuracy():
    """A run at the default train.eval_mode local stores each rank's own-graph accuracy in
    its curve: halo (exact) read 'not reached' on a graph with a 20 % cut, unmarked."""
    from quietgnn.comm.network import Tier
    lan = Tier(name="lan", bandwidth=1e9, latency=5e-4)
    halo = _fake("halo", 1.0, 6, 0.8)
    halo["summary"]["selected_by"] = "local"
    ref = _fake("centralized", 1.0, 6, 0.8)
    ref["parts"], ref["summary"]["selected_by"] = 1, "local"      # one part: local is exact
    rep = report.build_report([ref, halo, _fake("grappa", 1.0, 6, 0.8)], {"lan": lan})
    marked = {r.strategy: r.local_curve for r in rep.groups[0].rows}
    assert marked == {"centralized": False, "halo": True, "grappa": False}
    md = tables.markdown(rep, ["lan"], {})
    assert "| halo ‡ |" in md and "| grappa |" in md and "`train.eval_mode local`" in md
    assert "‡" not in tables.markdown(rep, [], {})      # no time-to-accuracy column: no mark
