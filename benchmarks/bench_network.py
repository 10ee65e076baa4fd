"""Measured, not projected: training across emulated hosts on rate-limited links.

    sudo python benchmarks/bench_network.py                       # the default matrix
    python benchmarks/bench_network.py --datasets computers --strategies halo,tma \
        --rates 100mbit --epochs 5                                 # a slice
    python benchmarks/bench_network.py --render                    # tables from network.json
    python benchmarks/bench_network.py --reproject                 # re-derive from run dirs

Every run is ``quietgnn train`` under one ``torchrun`` agent per emulated host
(``quietgnn/runtime/netcluster.py``: network namespaces on a bridge, each host's egress capped by
``htb``, acknowledgements first), the c10d rendezvous and every byte over the bridge. Each
rank loads the dataset and partitions it with its strategy's own partitioner (no shared
prepared directory), as on real hosts. Per run it records the measured wall seconds per
epoch-equivalent (training only: the epoch's wall time less its evaluation) and ``quietgnn report``'s projection for a tier of the
same bandwidth and no latency (``netem`` is absent here, so the link adds only the kernel's
sub-millisecond latency; the projection's latency term for the named tier is reported apart).

The machine has fewer cores than hosts, so a rank's compute waits for a core: the projection
for hosts with a core each (CPU seconds of the slowest rank) is below the measured wall time
even on an uncapped link. The run is therefore projected twice from its records: for hosts
sharing this machine's cores as they did (``projected_*``: a compute phase takes at least the
ranks' total CPU seconds over the cores; the check of the network model) and for hosts with a
core each (``projected_dedicated_*``, what ``quietgnn report`` shows). Each configuration also
runs with the link uncapped, and the table compares the *link's* share (measured capped minus
measured uncapped) with the projected communication seconds. ``--reproject`` recomputes every
record from its run directory after a change to the model.

Writes ``benchmarks/results/network.json`` (one record per run: ``strategy``, ``dataset``,
``parts``, ``tier``, ``bandwidth_bps``, ``measured_epoch_s``, ``projected_epoch_s``,
``measured_seconds_to_98``, ``projected_seconds_to_98``, ``bytes_per_epoch``, ...) and
``benchmarks/results/network/network.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from quietgnn.runtime.netcluster import Cluster, available, rate_bps  # noqa: E402
from quietgnn.analysis.projection import epoch_curve, project, time_to_accuracy  # noqa: E402,E501
from quietgnn.comm.network import TIERS, Tier  # noqa: E402,E501
from quietgnn.runtime.metrics import read_metrics  # noqa: E402

OUT = ROOT / "benchmarks/results/network"
DATA = {"computers": "amazon", "cs": "coauthor", "cora": "planetoid", "citeseer": "planetoid"}
TIER_OF = {"1gbit": "lan", "100mbit": "wan", "10mbit": "edge"}
# per strategy, what makes an epoch comparable (as in benchmarks/headline.yaml)
EXTRA = {"tma": ["--options.period_epochs", "1"]}
# time to target: the headline's budget (benchmarks/headline.yaml) and evaluation cadence
TARGET_EPOCHS, TARGET_EVAL_EVERY, FRACTIONS = 200, 5, (0.90, 0.95, 0.98)


def _train_args(ds: str, data_root: Path, strategy: str, epochs: int, run: str,
                to_target: bool = False) -> list[str]:
    """``quietgnn train`` of one run. ``to_target``: the headline's run (every strategy at its
    defaults, exact evaluation every TARGET_EVAL_EVERY epoch-equivalents, so the epoch where
    the target is reached is known); otherwise a few epochs timed, evaluated once."""
    # "name:key=value+key=value" names a strategy with options (e.g. halo:skip_dropped=false)
    name, _, opts = strategy.partition(":")
    options = [a for kv in filter(None, opts.split("+")) for a in
               (f"--options.{kv.split('=', 1)[0]}", kv.split("=", 1)[1])]
    how = (["--train.eval_every", str(TARGET_EVAL_EVERY), "--train.eval_mode", "exact"]
           if to_target else ["--train.eval_every", str(epochs), *EXTRA.get(name, [])])
    return ["-m", "quietgnn", "train", "--dataset", ds, "--root", str(data_root / DATA[ds]),
            "--strategy", name, *options, "--parts", "4", "--model", "gcn", "--hidden", "64",
            "--layers", "2", "--epochs", str(epochs), *how,
            "--runtime.progress", "false", "--runtime.timeout_s", "600",
            "--runtime.overwrite", "true", "--out", str(OUT / "runs"), "--run-name", run]


def _measured(curve: dict) -> tuple[float, float]:
    """(wall s, work) of the epochs after the first (warm-up), evaluation left out."""
    rows = curve["epochs"][1:] or curve["epochs"]
    return (sum(r["wall_s"] - r["eval_s"] for r in rows),
            sum(float(r.get("work", 1.0)) for r in rows))


def run_one(ds: str, strategy: str, rate: Optional[str], epochs: int, data_root: Path,
            hosts: int = 4, central: Optional[float] = None) -> dict:
    """One run on ``hosts`` emulated hosts. ``central``: ``centralized``'s test accuracy,
    given for a run to target (measured and projected seconds to 90/95/98 % of it)."""
    label = "".join(c if c.isalnum() or c in "._-" else "-" for c in strategy)
    run = f"{ds}-{label}-{rate or 'uncapped'}" + ("-target" if central else "")
    logs = OUT / "logs" / run
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with Cluster(hosts, rate=rate) as c:
        codes = c.wait(c.torchrun(_train_args(ds, data_root, strategy, epochs, run,
                                              to_target=central is not None),
                                  run_id=run, log_dir=logs), timeout=3000)
    rec = {"dataset": ds, "strategy": strategy, "parts": hosts, "rate": rate or "uncapped",
           "bandwidth_bps": rate_bps(rate) if rate else None, "epochs": epochs,
           "kind": "to_target" if central else "epoch_time",
           "elapsed_s": round(time.perf_counter() - t0, 1), "status": "ok"}
    if codes != [0] * hosts:
        tail = (logs / "host-0.log").read_text(errors="replace")[-1500:]
        return {**rec, "status": "failed", "exit_codes": codes, "error": tail}
    curve = epoch_curve(read_metrics(OUT / "runs" / run)).to_json(columns=False)
    return _project(rec, curve, central)


def probe(rate: str, hosts: int = 4) -> dict:
    """``netprobe.py`` on ``hosts`` emulated hosts at ``rate``: one flow, and a balanced
    all-to-all as gloo's collective and split by direction, each host sending the same bytes
    in every case; beside them the bytes over the rate (what the projection charges)."""
    logs = OUT / "logs" / f"probe-{rate}"
    logs.mkdir(parents=True, exist_ok=True)
    with Cluster(hosts, rate=rate) as c:
        codes = c.wait(c.torchrun([str(ROOT / "benchmarks/netprobe.py")], run_id=f"probe-{rate}",
                                  log_dir=logs), timeout=600)
    rec = {"kind": "link_probe", "rate": rate, "bandwidth_bps": rate_bps(rate),
           "parts": hosts, "status": "ok" if codes == [0] * hosts else "failed"}
    lines = [ln for ln in (logs / "host-0.log").read_text(errors="replace").splitlines()
             if ln.startswith("PROBE ")]
    if rec["status"] != "ok" or not lines:
        return {**rec, "status": "failed", "exit_codes": codes}
    got = json.loads(lines[-1][len("PROBE "):])
    return {**rec, **got, "model_s": got["bytes_per_host"] * 8 / rec["bandwidth_bps"]}


def _render_probes(records: list[dict]) -> list[str]:
    lines = ["", "## Link probe", "",
             "Command: `python benchmarks/bench_network.py --probe` (as root; "
             "`benchmarks/netprobe.py` on 4 emulated hosts). Each host sends 3 x 2 MiB: to one "
             "peer as one flow (*one flow*), or 2 MiB to each of the 3 others at once, through "
             "gloo's all-to-all (one TCP connection per pair carries both directions) or split "
             "by direction (`runtime.duplex`, one connection per pair and direction). Best of "
             "2, seconds; *bytes / rate* is what the projection charges.", "",
             "| link | bytes / rate | one flow | all-to-all, gloo's | all-to-all, split |",
             "|---|---|---|---|---|"]
    for r in records:
        if r["status"] != "ok":
            lines.append(f"| {r['rate']} | failed: exit {r.get('exit_codes')} | | | |")
            continue
        m = r["model_s"]
        lines.append(f"| {r['rate']} | {m:.3g} s | " + " | ".join(
            f"{r[k]:.3g} s ({100 * (r[k] / m - 1):+.0f}%)"
            for k in ("single_s", "collective_s", "split_s")) + " |")
    return lines


def _reproject(rec: dict, central_acc: dict) -> dict:
    if rec.get("kind") == "link_probe":
        return rec   # measured only: nothing to project
    run = OUT / "runs" / _run_name(rec)
    if rec["status"] != "ok" or not (run / "metrics").is_dir():
        return rec
    central = central_acc.get(rec["dataset"]) if rec.get("kind") == "to_target" else None
    return _project(rec, epoch_curve(read_metrics(run)).to_json(columns=False), central)


def _run_name(rec: dict) -> str:
    return (f"{rec['dataset']}-{rec['strategy']}-{rec['rate']}"
            + ("-target" if rec.get("kind") == "to_target" else ""))


def _project(rec: dict, curve: dict, central: Optional[float]) -> dict:
    """``rec`` with what was measured and its projections from the run's records: on hosts
    that share this machine's cores (``projected_*``: the run as measured, the check of the
    network model) and on hosts with a core each (``projected_dedicated_*``: what
    ``quietgnn report`` shows)."""
    # the cores the hosts shared when it ran (a re-projection elsewhere keeps them)
    cores = rec.get("cores") or len(os.sched_getaffinity(0))
    wall, work = _measured(curve)
    rows = curve["epochs"][1:] or curve["epochs"]
    rec = dict(rec, cores=cores, measured_epoch_s=wall / work,
               bytes_per_epoch=sum(r["train_bytes"] + r["data_bytes"] for r in rows) / work,
               compute_epoch_s=sum(r["compute_s"] for r in rows) / work,
               test_acc=curve["epochs"][-1].get("test_acc"))
    rate = rec["rate"] if rec["rate"] != "uncapped" else None
    if rate:
        link = Tier(f"{rate}-no-latency", rate_bps(rate), 0.0)
        named = TIERS[TIER_OF[rate]] if rate in TIER_OF else None
        for key, c in (("projected", cores), ("projected_dedicated", None)):
            # training only, as measured: compute and communication, no evaluation
            proj = project({"epochs": rows}, link, c)
            rec[f"{key}_epoch_s"] = sum(p.compute_s + p.comm_s for p in proj) / work
        comm = sum(link.seconds(r["hops"], r["crit_bytes"]) for r in rows)  # cores aside
        rec.update(tier=TIER_OF.get(rate, rate), projected_comm_epoch_s=comm / work,
                   latency_term_epoch_s=(sum(r["hops"] for r in rows) * named.latency / work
                                         if named else None))
    else:
        # no cap: the projection is the compute alone, the check of the shared-core bound
        free = Tier("uncapped", 1e15, 0.0)
        for key, c in (("projected", cores), ("projected_dedicated", None)):
            proj = project({"epochs": rows}, free, c)
            rec[f"{key}_epoch_s"] = sum(p.compute_s for p in proj) / work
    rec.update(measured_seconds_to_98=None, projected_seconds_to_98=None)
    if central and rate:
        rec.update(centralized_test_acc=central, **_to_target(curve, link, central, cores))
    return rec


def _to_target(curve: dict, link: Tier, central: float, cores: int) -> dict:
    """Seconds to each fraction of ``central``'s accuracy: measured (the run's wall seconds
    through the epoch whose evaluation first reached it, evaluations included, as the
    projection counts them) and projected on ``link`` from the same records, with the hosts
    sharing ``cores`` cores and with a core each; None where the run never reached it."""
    out = {}
    for f in FRACTIONS:
        target, cum, measured = f * central, 0.0, None
        for r in curve["epochs"]:
            cum += r["wall_s"]
            if r.get("test_acc") is not None and r["test_acc"] >= target:
                measured = cum
                break
        pct = round(100 * f)
        out[f"measured_seconds_to_{pct}"] = measured
        for key, c in (("projected", cores), ("projected_dedicated", None)):
            proj = time_to_accuracy(curve, link, target, c)
            out[f"{key}_seconds_to_{pct}"] = proj.cum_s if proj else None
    return out


def centralized_accuracy(ds: str, data_root: Path) -> float:
    """``centralized``'s test accuracy at the headline's settings (one local process; no
    network): the reference the fractions are of."""
    import quietgnn
    run = quietgnn.train(ds, strategy="centralized", root=str(data_root / DATA[ds]),
                         epochs=TARGET_EPOCHS, model="gcn", hidden=64, layers=2,
                         out=str(OUT / "runs"), run_name=f"{ds}-centralized", overwrite=True,
                         train={"eval_every": TARGET_EVAL_EVERY}, runtime={"progress": False})
    return float(run.summary.test_acc)


def render(records: list[dict]) -> list[str]:
    targets = [r for r in records if r.get("kind") == "to_target"]
    probes = [r for r in records if r.get("kind") == "link_probe"]
    records = [r for r in records if r.get("kind") in (None, "epoch_time")]
    base = {(r["dataset"], r["strategy"]): r for r in records
            if r["rate"] == "uncapped" and r["status"] == "ok"}
    lines = ["# Measured vs projected epoch time on emulated hosts", "",
             "Command: `python benchmarks/bench_network.py` (as root). P = 4 hosts (network "
             "namespaces, each host's egress capped by an htb class that lets TCP's "
             "acknowledgements pass first, torchrun + c10d over the bridge), GCN 2x64. "
             "Seconds per epoch-equivalent, training only (compute and communication, no "
             "evaluation, on both sides), warm-up epoch left out. *projected* is the model "
             "of `analysis/projection.py` for hosts sharing this machine's cores, as they did "
             "(a compute phase takes at least the ranks' total CPU seconds over the cores); "
             "*a core per host* is the same model for hosts with their own cores, what "
             "`quietgnn report` shows. "
             "*link share* = measured capped − measured uncapped (what the link added), "
             "against the projection's communication term (bytes / bandwidth; the named "
             "tier's latency term is shown apart: the emulated link has none). Link *none*: "
             "the same run uncapped, projected as its compute alone: the check of the "
             "shared-core bound without the network.", "",
             "| dataset | strategy | link | bytes/epoch | measured epoch | projected epoch | "
             "error | a core per host | link share measured | projected comm | error | "
             "latency term (tier) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["status"] == "ok" and r["rate"] == "uncapped":
            if r.get("projected_epoch_s") is not None:
                err = r["projected_epoch_s"] / r["measured_epoch_s"] - 1
                lines.append(
                    f"| {r['dataset']} | {r['strategy']} | none | "
                    f"{r['bytes_per_epoch'] / 1e6:.3g} MB | {r['measured_epoch_s']:.3g} s | "
                    f"{r['projected_epoch_s']:.3g} s | {100 * err:+.0f}% | "
                    f"{_s(r.get('projected_dedicated_epoch_s'))} | — | — | — | — |")
            continue
        if r["status"] != "ok":
            lines.append(f"| {r['dataset']} | {r['strategy']} | {r['rate']} | failed: "
                         f"exit {r.get('exit_codes')} | | | | | | | | |")
            continue
        b = base.get((r["dataset"], r["strategy"]))
        share = r["measured_epoch_s"] - b["measured_epoch_s"] if b else None
        err = r["projected_epoch_s"] / r["measured_epoch_s"] - 1
        cerr = (r["projected_comm_epoch_s"] / share - 1) if share and share > 0 else None
        lat = r["latency_term_epoch_s"]
        lines.append(
            f"| {r['dataset']} | {r['strategy']} | {r['rate']} | "
            f"{r['bytes_per_epoch'] / 1e6:.3g} MB | {r['measured_epoch_s']:.3g} s | "
            f"{r['projected_epoch_s']:.3g} s | {100 * err:+.0f}% | "
            f"{_s(r.get('projected_dedicated_epoch_s'))} | "
            f"{'—' if share is None else f'{share:.3g} s'} | "
            f"{r['projected_comm_epoch_s']:.3g} s | "
            f"{'—' if cerr is None else f'{100 * cerr:+.0f}%'} | "
            f"{'—' if lat is None else f'{lat:.3g} s'} |")
    return (lines + (_render_targets(targets) if targets else [])
            + (_render_probes(probes) if probes else []))


def _s(x: Optional[float]) -> str:
    return "never" if x is None else f"{x:.3g} s"


def _render_targets(records: list[dict]) -> list[str]:
    lines = ["", "## Time to target, measured", "",
             f"Command: `python benchmarks/bench_network.py --to-target ...` (as root; the "
             f"invocations are listed below). Every strategy at its defaults, "
             f"{TARGET_EPOCHS} epoch-equivalents, exact evaluation every {TARGET_EVAL_EVERY}; "
             f"seconds from the first epoch through the evaluation that first reached the "
             f"fraction of `centralized`'s test accuracy (same settings, one process), "
             f"evaluations included on both sides; set-up (loading, partitioning) left out. "
             f"Projected: the same run's records on a link of the same bandwidth, no latency, "
             f"hosts sharing this machine's cores (and, last but one column, with a core each).",
             "", "| dataset | strategy | link | centralized | measured to 90 / 95 / 98 % | "
             "projected to 98 % | error | a core per host | halo / this, measured to 98 % |",
             "|---|---|---|---|---|---|---|---|---|"]
    halo = {(r["dataset"], r["rate"]): r.get("measured_seconds_to_98") for r in records
            if r["strategy"] == "halo" and r["status"] == "ok"}
    for r in records:
        if r["status"] != "ok":
            lines.append(f"| {r['dataset']} | {r['strategy']} | {r['rate']} | failed: exit "
                         f"{r.get('exit_codes')} | | | | | |")
            continue
        m, p = r.get("measured_seconds_to_98"), r.get("projected_seconds_to_98")
        err = f"{100 * (p / m - 1):+.0f}%" if m and p else "—"
        h = halo.get((r["dataset"], r["rate"]))
        ratio = f"{h / m:.2g}x" if h and m else "—"
        lines.append(f"| {r['dataset']} | {r['strategy']} | {r['rate']} | "
                     f"{r['centralized_test_acc']:.4f} | "
                     + " / ".join(_s(r.get(f"measured_seconds_to_{k}")) for k in (90, 95, 98))
                     + f" | {_s(p)} | {err} | {_s(r.get('projected_dedicated_seconds_to_98'))} "
                     f"| {ratio} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="computers,cs")
    ap.add_argument("--strategies", default="halo,adaqp,grappa,tma,retexo,minibatch",
                    help="comma-separated; name:key=value+key=value for options "
                    "(halo:skip_dropped=false)")
    ap.add_argument("--rates", default="1gbit,100mbit,10mbit")
    ap.add_argument("--epochs", type=int, default=8, help="epochs per run (the first is "
                    "warm-up and left out)")
    ap.add_argument("--to-target", action="store_true",
                    help=f"runs of {TARGET_EPOCHS} epoch-equivalents at the defaults, timed to "
                    f"90/95/98 %% of centralized (capped links only)")
    ap.add_argument("--data-root", default=str(ROOT.parent / "shared/data"))
    ap.add_argument("--probe", action="store_true",
                    help="the link probe only: one flow and a balanced all-to-all (gloo's "
                    "and split by direction) of known sizes at each rate")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--reproject", action="store_true",
                    help="recompute every record's measured and projected figures from its "
                    "run directory (after a change to the model), then render")
    args = ap.parse_args()
    jpath = ROOT / "benchmarks/results/network.json"
    saved = json.loads(jpath.read_text()) if jpath.is_file() else {}
    old = saved.get("runs", [])
    commands = saved.get("commands", [saved["command"]] if "command" in saved else [])
    # centralized's accuracy per dataset at the headline settings: measured once, kept
    central_acc: dict[str, float] = saved.get("centralized_test_acc", {})
    if args.reproject:
        old = [_reproject(r, central_acc) for r in old]
        jpath.write_text(json.dumps({"commands": commands, "centralized_test_acc": central_acc,
                                     "runs": old}, indent=1))
    elif not args.render:
        why = available()
        if why:
            print(f"bench_network: cannot emulate hosts here: {why}", file=sys.stderr)
            return 2
        cmd = "python benchmarks/bench_network.py " + " ".join(sys.argv[1:])
        key = lambda r: (r.get("dataset", ""), r.get("strategy", ""), r["rate"],  # noqa: E731
                         r.get("kind", "epoch_time"))
        done = {key(r): r for r in old}
        for rate in (args.rates.split(",") if args.probe else []):
            print(f"probe {rate} ...", file=sys.stderr, flush=True)
            r = probe(rate)
            done[key(r)] = r
            jpath.write_text(json.dumps({
                "commands": commands + ([cmd] if cmd not in commands else []),
                "centralized_test_acc": central_acc, "runs": list(done.values())}, indent=1))
            print(f"  {r['status']} {r.get('collective_s')} {r.get('split_s')}", file=sys.stderr,
                  flush=True)
        for ds in ([] if args.probe else args.datasets.split(",")):
            central = None
            if args.to_target:
                if ds not in central_acc:
                    central_acc[ds] = centralized_accuracy(ds, Path(args.data_root))
                central = central_acc[ds]
            rates = args.rates.split(",") if args.to_target else [None] + args.rates.split(",")
            for s in args.strategies.split(","):
                for rate in rates:
                    print(f"{ds} {s} {rate or 'uncapped'} ...", file=sys.stderr, flush=True)
                    r = run_one(ds, s, rate, TARGET_EPOCHS if args.to_target else args.epochs,
                                Path(args.data_root), central=central)
                    print(f"  {r['status']} {r.get('measured_epoch_s')} "
                          f"{r.get('projected_epoch_s')}", file=sys.stderr, flush=True)
                    done[key(r)] = r
                    jpath.write_text(json.dumps({
                        "commands": commands + ([cmd] if cmd not in commands else []),
                        "centralized_test_acc": central_acc, "runs": list(done.values())},
                        indent=1))
        old = list(done.values())
        commands = commands + ([cmd] if cmd not in commands else [])
    OUT.mkdir(parents=True, exist_ok=True)
    md = "\n".join(render(old) + ["", "Commands (in order):", ""] +
                   [f"    {c}" for c in commands]) + "\n"
    (OUT / "network.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
