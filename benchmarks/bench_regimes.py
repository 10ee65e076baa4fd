"""Where communication dominates (#47): seconds to 90/95/98 % of `centralized` for every
strategy on a prepared synthetic graph, given partitions and slow links - the map of which
strategy wins where.

    python benchmarks/bench_regimes.py --graph 1e6:hash=benchmarks/out/regimes/syn-1e6-hash \
        --reference benchmarks/out/regimes/syn-1e6-one          # run, then render
    python benchmarks/bench_regimes.py --render                 # the map from regimes.json
    python benchmarks/bench_regimes.py --reproject              # projections anew, from the runs

The graphs come from ``quietgnn prepare synthetic`` (its ``hard`` preset) at P = 4: ``hash``
stands for partitions nobody chose (data residency: a node's part is given, not optimised;
three quarters of the edges cross), ``ldg`` for the best a streamed partitioner does. The
reference is ``centralized`` on the same graph prepared whole (``--parts 1``, the same
fingerprint). Each strategy trains once on this machine (``quietgnn train --data``, loopback,
a core per rank's thread budget) for ``--epochs`` epoch-equivalents or ``--budget-s`` wall
seconds, whichever ends first, with an exact evaluation every ``--eval-every``; its records
(per-epoch compute seconds and the communicator's rounds) are then projected onto each link
with :mod:`quietgnn.analysis.projection` for hosts with a core each.

Seconds to a target = the one-off set-up communication (e.g. ``halo``'s static inputs) + the
training epochs (compute + communication) through the first evaluation that reached it + that
one evaluation. The other evaluations are the study's instrument, not the user's cost, so they
are left out (on every strategy alike). A strategy that did not reach the target within its
budget is *not reached*, with the best accuracy it got. ``--measure`` runs the deciding cell on
emulated hosts (:mod:`quietgnn.runtime.netcluster`); this study's numbers are projections
from measured compute, marked as such in ``regimes.json`` (``how: projected``). A what-if
beside them: the same runs with every rank's compute 10 and 100 times faster (an
accelerator's), the bytes and epochs as counted.

Writes ``benchmarks/results/regimes.json`` and ``benchmarks/results/regimes/regimes.md`` (+
``regimes.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quietgnn.analysis.projection import epoch_curve, project  # noqa: E402
from quietgnn.comm.network import TIERS, Tier  # noqa: E402
from quietgnn.runtime.metrics import read_metrics  # noqa: E402

OUT = ROOT / "benchmarks/results/regimes"
JSON = ROOT / "benchmarks/results/regimes.json"
RUNS = ROOT / "benchmarks/out/regimes/runs"   # run directories: not kept in git
#: each run's configuration, summary and curve, kept in git (what the advisor's validation and
#: its prior read where the run directory is not on this machine)
KEPT = OUT / "kept"
LINKS = {"1gbit": TIERS["lan"], "100mbit": TIERS["wan"], "10mbit": TIERS["edge"]}
FRACTIONS = (0.90, 0.95, 0.98)
#: what-ifs: compute that many times faster than measured here (an accelerator), the same
#: bytes, rounds and epochs
SPEEDUPS = (10, 100)
STRATEGIES = "halo,adaqp,grappa,tma,retexo,minibatch,bns,pipegcn,sancus,llcg"


def _train_args(data: str, strategy: str, run: str, args: argparse.Namespace) -> list[str]:
    return ["-m", "quietgnn", "train", "--data", data, "--strategy", strategy,
            "--model", "gcn", "--hidden", "64", "--layers", str(args.layers),
            "--epochs", str(args.epochs), "--train.eval_every", str(args.eval_every),
            "--train.eval_mode", "exact", "--runtime.progress", "false",
            "--runtime.timeout_s", "1200", "--runtime.overwrite", "true", "--out", str(RUNS),
            "--run-name", run, *[a for kv in args.option for a in _option_args(kv)]]


def _option_args(kv: str) -> list[str]:
    """``KEY=VALUE`` (``--option``) -> the trainer's ``--options.KEY VALUE``."""
    key, sep, value = kv.partition("=")
    if not sep or not key:
        raise SystemExit(f"bench_regimes: --option {kv!r}; expected KEY=VALUE, e.g. "
                         f"repart_every=10")
    return [f"--options.{key}", value]


def _train(data: str, strategy: str, run: str, args: argparse.Namespace) -> dict:
    """One ``quietgnn train`` from the prepared ``data``, stopped at ``--budget-s``."""
    cmd = [sys.executable, *_train_args(data, strategy, run, args)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=ROOT)
    try:
        _, err = proc.communicate(timeout=args.budget_s)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)   # the launcher and its workers
        _, err = proc.communicate()
        status = "budget"
    rec = {"strategy": strategy, "run": run, "status": status,
           "elapsed_s": round(time.perf_counter() - t0, 1)}
    if status.startswith("failed"):
        rec["error"] = err[-1500:]
    return rec


def _reach(curve: dict, tier: Tier, target: float, cores: Optional[int] = None,
           setup: bool = True, speedup: float = 1.0) -> Optional[dict]:
    """Projected seconds to ``target`` on ``tier`` (see the module doc): a core per host, or
    ``cores`` shared by the hosts; ``setup``: the set-up's communication counted;
    ``speedup``: the what-if of compute that many times faster."""
    cum = tier.seconds(curve["setup"]["hops"], curve["setup"]["crit_bytes"]) if setup else 0.0
    for p in project(curve, tier, cores, compute_speedup=speedup):
        cum += p.compute_s + p.comm_s
        if p.test_acc is not None and p.test_acc >= target:
            return {"seconds": cum + p.eval_s, "epoch": p.epoch}
    return None


def _records(base: dict, curve: dict, central: float) -> list[dict]:
    """One record per link: the interface of ``regimes.json``."""
    rows = curve["epochs"]
    work = sum(float(r.get("work", 1.0)) for r in rows) or 1.0
    accs = [r["test_acc"] for r in rows if r.get("test_acc") is not None]
    out = []
    for link, tier in LINKS.items():
        rec = dict(base, link=link, bandwidth_bps=tier.bandwidth, latency_s=tier.latency,
                   how="projected", centralized_test_acc=central,
                   best_test_acc=max(accs) if accs else None, epochs_run=work,
                   bytes_per_epoch=sum(r["train_bytes"] + r["data_bytes"] for r in rows) / work,
                   setup_bytes=curve["setup"]["bytes"],
                   compute_s_per_epoch=sum(r["compute_s"] for r in rows) / work,
                   measured_seconds_to_98=None)
        for f in FRACTIONS:
            hit = _reach(curve, tier, f * central)
            rec[f"projected_seconds_to_{round(100 * f)}"] = hit["seconds"] if hit else None
            rec[f"epoch_to_{round(100 * f)}"] = hit["epoch"] if hit else None
        for k in SPEEDUPS:   # the what-if: the same run with faster compute
            hit = _reach(curve, tier, 0.98 * central, speedup=k)
            rec[f"projected_seconds_to_98_compute_x{k}"] = hit["seconds"] if hit else None
        out.append(rec)
    return out


def keep(name: str) -> None:
    """The run directory ``name``'s configuration, summary (none where the budget stopped it)
    and curve, as one file in git (:data:`KEPT`)."""
    run = RUNS / name
    summary = run / "summary.json"
    if not (run / "config.json").is_file():
        return   # nothing ran (its record says why)
    KEPT.mkdir(parents=True, exist_ok=True)
    (KEPT / f"{name}.json").write_text(json.dumps({
        "config": json.loads((run / "config.json").read_text()),
        "summary": json.loads(summary.read_text()) if summary.is_file() else None,
        "curve": epoch_curve(read_metrics(run)).to_json()}))


def reproject(saved: dict) -> dict:
    """``--reproject``: every record's projection again from its run directory (the model
    changed, or a what-if was added); what was measured on emulated hosts is kept."""
    for key in saved.get("centralized", {}):
        keep(f"central-{key}")
    for rec in saved.get("runs", []):
        if "centralized_test_acc" not in rec:
            continue    # a run that recorded nothing
        name = "-".join([f"{rec['edges']:.0e}".replace("e+0", "e"), rec["partition"],
                         f"L{rec['layers']}", rec["strategy"],
                         *([rec["variant"]] if rec.get("variant") else [])])
        try:
            curve = epoch_curve(read_metrics(RUNS / name)).to_json(columns=False)
        except (ValueError, FileNotFoundError):
            continue    # its run directory is gone (not kept in git): the record stays
        keep(name)
        new = next(r for r in _records({}, curve, rec["centralized_test_acc"])
                   if r["link"] == rec["link"])
        rec.update({k: v for k, v in new.items() if not k.startswith("measured_")})
    return saved


def _measured_to(curve: dict, target: float) -> Optional[float]:
    """Wall seconds on the emulated hosts, counted as the projection counts: training epochs
    through the first evaluation that reached ``target`` + that evaluation (the others left
    out); set-up excluded (it loads the part too, which the projection does not charge)."""
    cum = 0.0
    for r in curve["epochs"]:
        cum += r["wall_s"] - r["eval_s"]
        if r.get("test_acc") is not None and r["test_acc"] >= target:
            return cum + r["eval_s"]
    return None


def measure(args: argparse.Namespace, saved: dict) -> dict:
    """``--measure LINK``: the ``--strategies`` on the ``--graph`` on 4 emulated hosts
    (``quietgnn/runtime/netcluster.py``, as root) whose egress is capped at LINK; the measured
    seconds to 90/95/98 % go into the cell's record of that link, beside the projection for
    hosts sharing this machine's cores as they did (the check of the projection). A later
    projected run of the same cell replaces the record, check and all: the check was of
    the code that ran then."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from quietgnn.runtime.netcluster import Cluster, available
    why = available()
    if why:
        raise SystemExit(f"bench_regimes --measure: cannot emulate hosts here: {why}")
    rate = {"1gbit": "1gbit", "100mbit": "100mbit", "10mbit": "10mbit"}[args.measure]
    cores = len(os.sched_getaffinity(0))
    for spec in args.graph:
        label, _, data = spec.partition("=")
        edges, _, part = label.partition(":")
        for s in args.strategies.split(","):
            rec = next(r for r in saved["runs"] if (r["strategy"], r["edges"], r["partition"],
                       r["layers"], r["link"], r.get("variant")) == (
                           s, float(edges), part, args.layers, args.measure, args.variant))
            name = "-".join([edges, part, f"L{args.layers}", s, *([args.variant] if
                                                                 args.variant else []), rate])
            print(f"{name} on emulated hosts ...", file=sys.stderr, flush=True)
            logs = RUNS.parent / "logs" / name
            logs.mkdir(parents=True, exist_ok=True)
            with Cluster(4, rate=rate) as c:
                codes = c.wait(c.torchrun(_train_args(str(ROOT / data), s, name, args),
                                          run_id=name, log_dir=logs), timeout=args.budget_s)
            curve = epoch_curve(read_metrics(RUNS / name)).to_json(columns=False)
            c_acc = rec["centralized_test_acc"]
            tier = LINKS[args.measure]
            for f in FRACTIONS:
                pct = round(100 * f)
                rec[f"measured_seconds_to_{pct}"] = _measured_to(curve, f * c_acc)
                # the emulated link has no latency; the hosts share this machine's cores
                hit = _reach(curve, Tier("shared", tier.bandwidth, 0.0), f * c_acc, cores,
                             setup=False)
                rec[f"projected_shared_seconds_to_{pct}"] = hit["seconds"] if hit else None
            rec.update(measured_exit_codes=codes, measured_epochs=len(curve["epochs"]),
                       measured_cores=cores)
            JSON.write_text(json.dumps(saved, indent=1))
            print(f"  exit {codes}: measured to 98 % {rec['measured_seconds_to_98']}, "
                  f"projected (shared cores) {rec['projected_shared_seconds_to_98']}",
                  file=sys.stderr, flush=True)
    return saved


def run(args: argparse.Namespace, saved: dict) -> dict:
    OUT.mkdir(parents=True, exist_ok=True)
    central = saved.setdefault("centralized", {})
    ref = Path(args.reference)
    key = f"{ref.name}-L{args.layers}"
    if key not in central:
        r = _train(str(ref), "centralized", f"central-{key}", args)
        summary = json.loads((RUNS / f"central-{key}" / "summary.json").read_text())
        central[key] = {"test_acc": summary["test_acc"], **r}
        keep(f"central-{key}")
    c_acc = central[key]["test_acc"]
    records = saved.setdefault("runs", [])
    for spec in args.graph:
        label, _, data = spec.partition("=")
        edges, _, part = label.partition(":")
        for s in args.strategies.split(","):
            name = f"{edges}-{part}-L{args.layers}-{s}" + (f"-{args.variant}" if args.variant
                                                           else "")
            print(f"{name} ...", file=sys.stderr, flush=True)
            r = _train(data, s, name, args)
            base = {"strategy": s, "edges": float(edges), "partition": part,
                    "layers": args.layers, "parts": 4, "status": r["status"],
                    "elapsed_s": r["elapsed_s"], "budget_s": args.budget_s,
                    "epochs_asked": args.epochs}
            if args.variant:   # a changed option: beside the default, not in the map
                base.update(variant=args.variant, options=dict(
                    kv.partition("=")[::2] for kv in args.option))
            try:
                curve = epoch_curve(read_metrics(RUNS / name)).to_json(columns=False)
                new = _records(base, curve, c_acc)
            except (ValueError, FileNotFoundError) as exc:   # nothing recorded
                new = [dict(base, link=k, error=str(exc)[:300] + r.get("error", ""))
                       for k in LINKS]
            else:
                keep(name)
            records[:] = [x for x in records if (x["strategy"], x["edges"], x["partition"],
                          x["layers"], x.get("variant")) != (s, float(edges), part,
                                                             args.layers, args.variant)] + new
            JSON.write_text(json.dumps(saved, indent=1))
            print(f"  {r['status']} {r['elapsed_s']} s best "
                  f"{new[0].get('best_test_acc')}", file=sys.stderr, flush=True)
    return saved


def _fmt(x: Optional[float]) -> str:
    return "—" if x is None else (f"{x:.0f} s" if x >= 100 else f"{x:.3g} s")


def render(saved: dict) -> list[str]:
    runs = [r for r in saved.get("runs", []) if "error" not in r and "variant" not in r]
    cmds = saved.get("commands", [])
    lines = ["# Where communication dominates: the map (#47)", "",
             "Commands: " + "; ".join(f"`{c}`" for c in cmds), "",
             "Seconds to 98 % of `centralized`'s test accuracy, **projected** from each run's "
             "measured compute and counted bytes (a core per host; link tiers `lan` 1 Gbit/s "
             "0.5 ms, `wan` 100 Mbit/s 20 ms, `edge` 10 Mbit/s 50 ms per hop): set-up "
             "communication + training through the first evaluation that reached it + that "
             "evaluation. *not reached*: not within the run's budget (best accuracy shown). "
             "GCN, hidden 64, P = 4, every strategy at its defaults.", ""]
    cells = sorted({(r["edges"], r["partition"], r["layers"]) for r in runs})
    lines += ["## At a glance", "",
              "| graph | layers | link | `halo` to 98 % | fastest to 98 % | × `halo` | "
              "fastest to 95 % | × `halo` |", "|---|---|---|---|---|---|---|---|"]
    for edges, part, layers in cells:
        for k in LINKS:
            at = [r for r in runs if (r["edges"], r["partition"], r["layers"], r["link"]) ==
                  (edges, part, layers, k)]
            halo = {p: next((r.get(f"projected_seconds_to_{p}") for r in at
                             if r["strategy"] == "halo"), None) for p in (95, 98)}
            row = f"| {edges:.0e} `{part}` | {layers} | {k} | {_fmt(halo[98])} |"
            for p in (98, 95):
                got = [(r[f"projected_seconds_to_{p}"], r["strategy"]) for r in at
                       if r.get(f"projected_seconds_to_{p}") is not None]
                t, s = min(got) if got else (None, "none")
                ratio = f"{halo[p] / t:.2g}" if t and halo[p] else "—"
                row += f" `{s}` {_fmt(t)} | {ratio} |"
            lines.append(row)
    lines.append("")
    lines += _what_if(runs, cells)
    for edges, part, layers in cells:
        cell = [r for r in runs if (r["edges"], r["partition"], r["layers"]) == (edges, part,
                                                                               layers)]
        c = cell[0]["centralized_test_acc"]
        lines += [f"## {edges:.0e} edges, `{part}` partitions, {layers} layers "
                  f"(`centralized` {c:.4f}; 98 % = {0.98 * c:.4f})", "",
                  "| strategy | bytes/epoch | compute/epoch | best acc | epochs run | "
                  + " | ".join(f"to 98 % @ {k}" for k in LINKS) + " |",
                  "|---|---|---|---|---|" + "---|" * len(LINKS)]
        for s in dict.fromkeys(r["strategy"] for r in cell):
            rs = {r["link"]: r for r in cell if r["strategy"] == s}
            r0 = next(iter(rs.values()))
            t = [rs[k].get("projected_seconds_to_98") if k in rs else None for k in LINKS]
            lines.append(f"| {s} | {r0['bytes_per_epoch'] / 1e6:.3g} MB | "
                         f"{r0['compute_s_per_epoch']:.3g} s | {r0['best_test_acc']:.4f} | "
                         f"{r0['epochs_run']:.4g} ({r0['status']}) | "
                         + " | ".join(_fmt(x) if x is not None else "not reached" for x in t)
                         + " |")
        lines += ["", "| link | target | fastest | its seconds | `halo`'s | `halo` / fastest |",
                  "|---|---|---|---|---|---|"]
        for k in LINKS:
            for pct in (90, 95, 98):
                key = f"projected_seconds_to_{pct}"
                got = [(r[key], r["strategy"]) for r in cell
                       if r["link"] == k and r.get(key) is not None]
                halo = next((r.get(key) for r in cell
                             if r["link"] == k and r["strategy"] == "halo"), None)
                if not got:
                    lines.append(f"| {k} | {pct} % | none reached | | {_fmt(halo)} | |")
                    continue
                t, s = min(got)
                lines.append(f"| {k} | {pct} % | {s} | {_fmt(t)} | {_fmt(halo)} | "
                             f"{'—' if not halo else f'{halo / t:.3g}x'} |")
        lines.append("")
    lines += _variants(saved)
    checked = [r for r in saved.get("runs", []) if "measured_exit_codes" in r]
    if checked:
        lines += ["## Measured on emulated hosts", "",
                  "The same runs on 4 emulated hosts (`--measure LINK`: network namespaces, "
                  "egress capped by htb, no added latency, the hosts sharing this machine's "
                  "cores), counted as the projection counts (set-up left out on both sides of "
                  "this check). *projected, shared cores*: the projection of that run's own "
                  "records for hosts sharing the cores and a link without latency - the check "
                  "of the model; the map above projects hosts with a core each.", "",
                  "| cell | strategy | link | measured to 90 / 95 / 98 % | projected to 98 %, "
                  "shared cores | error | exit codes |", "|---|---|---|---|---|---|---|"]
        for r in checked:
            m, p = r.get("measured_seconds_to_98"), r.get("projected_shared_seconds_to_98")
            err = f"{100 * (p / m - 1):+.0f}%" if m and p else "—"
            lines.append(f"| {r['edges']:.0e} {r['partition']} L{r['layers']} | "
                         f"{r['strategy']} | {r['link']} | "
                         + " / ".join(_fmt(r.get(f"measured_seconds_to_{k}")) for k in
                                      (90, 95, 98))
                         + f" | {_fmt(p)} | {err} | {r['measured_exit_codes']} |")
        lines.append("")
    return lines


def _what_if(runs: list[dict], cells: list[tuple]) -> list[str]:
    """Seconds to 98 % with every rank's compute k times faster than measured here (the same
    runs, bytes and epochs): where a faster processor leaves the link as the bottleneck."""
    keys = [("projected_seconds_to_98", "as measured")] + [
        (f"projected_seconds_to_98_compute_x{k}", f"compute ×{k}") for k in SPEEDUPS]
    lines = ["## What if compute were faster", "",
             "A what-if, not a measurement: the same runs projected with every rank's compute "
             "(training and evaluation) "
             + " and ".join(f"{k}×" for k in SPEEDUPS) + " faster than on these cores, as an "
             "accelerator would make it; bytes, rounds and epochs as counted. `halo` to 98 %, "
             "the fastest strategy and `halo` / fastest.", "",
             "| graph | layers | link | " + " | ".join(n for _, n in keys) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    for edges, part, layers in cells:
        for link in LINKS:
            at = [r for r in runs if (r["edges"], r["partition"], r["layers"], r["link"]) ==
                  (edges, part, layers, link)]
            row = f"| {edges:.0e} `{part}` | {layers} | {link} |"
            for key, _ in keys:
                halo = next((r.get(key) for r in at if r["strategy"] == "halo"), None)
                got = [(r[key], r["strategy"]) for r in at if r.get(key) is not None]
                if not got or halo is None:
                    row += " — |"
                    continue
                t, best = min(got)
                row += f" {_fmt(halo)}; `{best}` {_fmt(t)}, {halo / t:.2g}× |"
            lines.append(row)
    return lines + [""]


def _variants(saved: dict) -> list[str]:
    """Each changed option (``--variant``) beside its strategy's defaults in the same cell."""
    runs = [r for r in saved.get("runs", []) if "error" not in r]
    var = [r for r in runs if "variant" in r and r["link"] == "10mbit"]
    if not var:
        return []
    lines = ["## Options changed (item 3)", "",
             "A strategy with one option changed (`--variant NAME --option KEY=VALUE`), beside "
             "its defaults in the same cell; projected seconds to 98 % per link.", "",
             "| cell | strategy | options | best acc | epoch to 98 % | bytes/epoch | setup bytes | "
             + " | ".join(f"to 98 % @ {k}" for k in LINKS) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(LINKS)]
    keys = dict.fromkeys((v["strategy"], v["edges"], v["partition"], v["layers"]) for v in var)
    for key in keys:
        _, edges, part, layers = key
        for r in [x for x in runs if x["link"] == "10mbit" and (x["strategy"], x["edges"],
                  x["partition"], x["layers"]) == key]:   # the defaults first, as recorded
            t = [next((x.get("projected_seconds_to_98") for x in runs if x.get("variant") ==
                       r.get("variant") and x["link"] == k and (x["strategy"], x["edges"],
                       x["partition"], x["layers"]) == key), None) for k in LINKS]
            opts = ", ".join(f"{a}={b}" for a, b in r.get("options", {}).items()) or "defaults"
            lines.append(f"| {edges:.0e} {part} L{layers} | {r['strategy']} "
                         f"| {opts} | {r['best_test_acc']:.4f} | {r.get('epoch_to_98')} | "
                         f"{r['bytes_per_epoch'] / 1e6:.3g} MB | {r['setup_bytes'] / 1e6:.3g} MB"
                         " | " + " | ".join(_fmt(x) if x is not None else "not reached"
                                            for x in t) + " |")
    return lines + [""]


def plot(saved: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [r for r in saved.get("runs", []) if "variant" not in r
            and (r.get("projected_seconds_to_98") is not None or "error" not in r)]
    cells = sorted({(r["edges"], r["partition"], r["layers"]) for r in runs})
    fig, axes = plt.subplots(1, max(len(cells), 1), figsize=(6 * max(len(cells), 1), 4),
                             squeeze=False)
    for ax, (edges, part, layers) in zip(axes[0], cells):
        cell = [r for r in runs if (r["edges"], r["partition"], r["layers"]) == (edges, part,
                                                                               layers)]
        names = list(dict.fromkeys(r["strategy"] for r in cell))
        width = 0.8 / len(LINKS)
        for i, k in enumerate(LINKS):
            ys = [next((r.get("projected_seconds_to_98") for r in cell if r["strategy"] == s
                        and r["link"] == k), None) for s in names]
            ax.bar([j + i * width for j in range(len(names))], [y or 0 for y in ys], width,
                   label=k)
        ax.set_yscale("log")
        ax.set_xticks([j + width for j in range(len(names))], names, rotation=45, ha="right")
        ax.set_title(f"{edges:.0e} edges, {part}, {layers} layers (no bar: not reached)",
                     fontsize=10)
        ax.set_ylabel("projected seconds to 98 %")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="append", default=[],
                    help="EDGES:PARTITION=PREPARED_DIR (repeatable), e.g. "
                    "1e6:hash=benchmarks/out/regimes/syn-1e6-hash")
    ap.add_argument("--reference", help="the same graph prepared with --parts 1 (centralized)")
    ap.add_argument("--strategies", default=STRATEGIES)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="wall seconds a run may take here (then stopped: its records count)")
    ap.add_argument("--measure", choices=list(LINKS),
                    help="measure the --strategies on the --graph on emulated hosts at this "
                    "link (as root; after the projected run of the same cell)")
    ap.add_argument("--variant", help="a name for a run with changed options (--option): "
                    "recorded beside the strategy's defaults, not in the map")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a strategy option for this run (repeatable; needs --variant)")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--reproject", action="store_true",
                    help="project every record again from its run directory, then render")
    args = ap.parse_args()
    if bool(args.variant) != bool(args.option):
        ap.error("--variant and --option go together: name the run whose options changed")
    saved = json.loads(JSON.read_text()) if JSON.is_file() else {}
    if args.reproject:
        saved = reproject(saved)
        JSON.write_text(json.dumps(saved, indent=1))
    elif args.measure:
        cmd = "python benchmarks/bench_regimes.py " + " ".join(sys.argv[1:])
        if cmd not in saved.setdefault("commands", []):
            saved["commands"].append(cmd)
        saved = measure(args, saved)
    elif not args.render:
        if not args.graph or not args.reference:
            ap.error("--graph and --reference are needed to run (or --render)")
        cmd = "python benchmarks/bench_regimes.py " + " ".join(sys.argv[1:])
        saved.setdefault("commands", [])
        if cmd not in saved["commands"]:
            saved["commands"].append(cmd)
        saved = run(args, saved)
    OUT.mkdir(parents=True, exist_ok=True)
    lines = render(saved)
    (OUT / "regimes.md").write_text("\n".join(lines) + "\n")
    plot(saved, OUT / "regimes.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
