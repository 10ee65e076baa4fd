"""Scale: every strategy at P = 4 on prepared synthetic graphs, the largest each one trains.

    python benchmarks/bench_prepare.py --edges 1e6,1e7,1e8     # the prepared graphs
    python benchmarks/bench_scale.py                            # benchmarks/scale.yaml
    python benchmarks/bench_scale.py --render                   # tables from the results only

The runs are the matrix of ``benchmarks/scale.yaml`` through :func:`quietgnn.analysis.runner.run_matrix`
(the trainer, one isolated ``quietgnn train --data DIR`` per run; finished runs are skipped on
a rerun, and a run whose prepared graph has since been removed keeps its record from the last
``scale.json``), sizes in ascending order. Memory guard: a run is not attempted when its per-rank
peak, extrapolated linearly in edges from the strategy's two previous sizes, times P exceeds
``--mem-frac`` of the memory available now; it is recorded as skipped with that estimate,
which is where the limit is. ``--only LABELS`` runs those strategy labels alone (the
others keep their last records). ``--attempt LABEL@EDGES`` (e.g. ``grappa-minibatch@1e+08``) runs
one anyway, under a watchdog that kills it when less than ``--floor-mb`` of memory is left
(recorded as stopped, with the largest per-rank resident set seen): a measured limit instead
of an estimate.

Per run: edges (undirected), nodes, the prepare's time and peak memory (from
``benchmarks/results/prepare-scale/prepare.json``), the prepared data on disk (what the
workers map, shared through the page cache), per-rank peak RSS (max over ranks), training
seconds per epoch or per 1,000 steps (the mini-batch paths, whose epochs are capped), training bytes
per epoch-equivalent, test accuracy and the majority-class accuracy of the same test nodes;
per strategy the log-log slopes of time and memory against edges.

Writes ``benchmarks/results/scale.json`` (one record per run) and
``benchmarks/results/scale/scale.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y against log x (1.0 = linear); None below two points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024.0
    return float("inf")


def graph_facts(prepared: Path) -> dict:
    """Edges, nodes, bytes on disk and the majority-class accuracy on the test nodes, read
    from the prepared directory (its labels and masks are small, memory-mapped arrays)."""
    book = json.loads((prepared / "book.json").read_text())
    g = book["graph"]
    counts = np.zeros(int(g["num_classes"]), dtype=np.int64)
    for part in sorted(prepared.glob("part-*")):
        y = np.load(part / "y.npy", mmap_mode="r")
        test = np.load(part / "test_mask.npy", mmap_mode="r")
        counts += np.bincount(np.asarray(y[np.asarray(test)]), minlength=counts.size)
    disk = sum(f.stat().st_size for f in prepared.rglob("*.npy"))
    return {"edges": int(g["num_edges"]) // 2, "stored_edges": int(g["num_edges"]),
            "nodes": int(g["num_nodes"]), "data_on_disk_mb": disk / 2 ** 20,
            "majority_acc": float(counts.max() / max(counts.sum(), 1))}


def prepare_facts() -> dict[int, dict]:
    path = ROOT / "benchmarks/results/prepare-scale/prepare.json"
    if not path.is_file():
        return {}
    rows = json.loads(path.read_text())["rows"]
    return {int(r["nodes"]): r for r in rows if r.get("status") == "ok"}


def epoch_figures(run_dir: Path) -> dict:
    """Training seconds (wall minus evaluation, rank 0; the ranks step together) per epoch and
    per 1,000 steps, from the run's metrics."""
    recs = [json.loads(x) for x in (run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()
            if x.strip()]
    eps = [r for r in recs if r.get("epoch", -1) >= 0]
    train_s = [r["wall_s"] - r.get("eval_s", 0.0) for r in eps]
    steps = sum(int(r.get("steps") or 0) for r in eps)
    # the largest rank's resident memory once set up (its part, halo plans, samplers, model):
    # what the data costs before the first activation
    setup, setup_s = [], []
    for f in sorted((run_dir / "metrics").glob("rank-*.jsonl")):
        for x in f.read_text().splitlines():
            r = json.loads(x) if x.strip() else {}
            if r.get("epoch") == -1 and r.get("peak_rss_mb") is not None:
                setup.append(r["peak_rss_mb"])
                setup_s.append(r.get("setup_s") or 0.0)
    return {"seconds_per_epoch": sum(train_s) / len(eps) if eps else None,
            "seconds_per_1000_steps": 1000 * sum(train_s) / steps if steps else None,
            "steps_per_epoch": steps / len(eps) if eps else None,
            "setup_peak_rss_rank_mb": max(setup) if setup else None,
            "setup_seconds": max(setup_s) if setup_s else None,
            "epochs_logged": len(eps)}


class Watchdog:
    """Stops a run whose processes leave less than ``floor_mb`` of memory available (SIGKILL
    to every process whose command line names the run), so an attempt past the estimate
    cannot take the machine down; records the largest resident set it saw per process."""

    def __init__(self, run_id: str, floor_mb: float) -> None:
        self.run_id, self.floor_mb = run_id, floor_mb
        self.fired, self.peak_mb, self.ranks = False, 0.0, 0
        self._stop = threading.Event()

    def _procs(self) -> list[tuple[int, float]]:
        """(pid, resident MiB) of the run's launcher (its command line names the run) and of
        every process below it (the workers are spawned with another command line)."""
        parent, rss, roots = {}, {}, []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                rss[int(d.name)] = next(int(x.split()[1]) for x in
                                        (d / "status").read_text().splitlines()
                                        if x.startswith("VmRSS:")) / 1024.0
                if self.run_id.encode() in (d / "cmdline").read_bytes():
                    roots.append(int(d.name))
            except (OSError, StopIteration, ValueError, IndexError):
                continue
        mine = set(roots) - {os.getpid()}
        grew = True
        while grew:
            new = {p for p, q in parent.items() if q in mine} - mine
            grew, mine = bool(new), mine | new
        return [(p, rss[p]) for p in mine if p in rss]

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            procs = self._procs()
            if procs:
                self.peak_mb = max(self.peak_mb, max(m for _, m in procs))
                self.ranks = max(self.ranks, sum(1 for _, m in procs if m > 200))
            if procs and mem_available_mb() < self.floor_mb:
                self.fired = True
                for pid, _ in procs:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass

    def __enter__(self) -> "Watchdog":
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def estimate_mb(done: list[dict], edges: int) -> float | None:
    """Per-rank peak at ``edges``, linear in edges through the two largest earlier sizes."""
    pts = sorted((r["edges"], r["peak_rss_rank_mb"]) for r in done if r.get("ok"))
    if len(pts) < 2:
        return None
    (e0, m0), (e1, m1) = pts[-2], pts[-1]
    b = (m1 - m0) / (e1 - e0) if e1 != e0 else 0.0
    return m1 + b * (edges - e1)


def record(spec, res: dict, facts: dict, prep: dict, previous: dict) -> dict:
    s = res.get("summary") or {}
    p = prep.get(facts["nodes"], {})
    rec = {"strategy": spec.label or spec.strategy, "edges": facts["edges"],
           "stored_edges": facts["stored_edges"], "nodes": facts["nodes"],
           "parts": spec.parts, "ok": res.get("status") == "ok",
           "status": res.get("status"), "prepare_seconds": p.get("seconds"),
           "prepare_peak_rss_mb": p.get("peak_rss_mb"), "data_on_disk_mb": facts["data_on_disk_mb"],
           "peak_rss_rank_mb": s.get("peak_rss_mb"),
           "bytes_per_epoch": s.get("train_bytes_per_epoch"), "eval_bytes": s.get("eval_bytes"),
           "test_acc": s.get("test_acc"), "majority_acc": facts["majority_acc"],
           "options": spec.options, "run": spec.id}
    if rec["ok"]:
        run_dir = ROOT / res["run_dir"]      # absolute stays absolute
        if (run_dir / "metrics").is_dir():
            rec.update(epoch_figures(run_dir))
        else:   # run directories stay local: a finished run's figures from the last scale.json
            rec.update({k: v for k, v in previous.get(spec.id, {}).items()
                        if k in ("seconds_per_epoch", "seconds_per_1000_steps",
                                 "steps_per_epoch", "setup_peak_rss_rank_mb")})
    else:
        # its first line says what ended it; the tail, where it happened
        first, _, rest = (res.get("error") or "").partition("\n")
        rec["error"] = first[:200] + ("\n" + rest[-400:] if rest else "")
        run_dir = ROOT / res["run_dir"] if res.get("run_dir") else None
        if run_dir is not None and (run_dir / "metrics").is_dir():
            # how far it got: a run that finished its set-up logged that much
            figs = epoch_figures(run_dir)
            rec.update({k: figs[k] for k in ("setup_peak_rss_rank_mb", "setup_seconds",
                                             "epochs_logged")})
        else:
            rec.update({k: v for k, v in previous.get(spec.id, {}).items()
                        if k in ("setup_peak_rss_rank_mb", "setup_seconds", "epochs_logged")})
    return rec


def run(args: argparse.Namespace) -> list[dict]:
    from quietgnn.analysis.matrix import build_matrix
    from quietgnn.analysis.runner import run_matrix
    matrix = yaml.safe_load((ROOT / args.matrix).read_text())
    specs = build_matrix(matrix)
    out = ROOT / matrix["out"]
    prep = prepare_facts()
    old = ROOT / "benchmarks" / "results" / "scale.json"
    previous = {r.get("run"): r for r in json.loads(old.read_text())["runs"]} \
        if old.is_file() else {}
    records: list[dict] = []
    by_strategy: dict[str, list[dict]] = {}
    for spec in specs:
        prepared = ROOT / spec.overrides["dataset.prepared"]
        if args.only and (spec.label or spec.strategy) not in args.only:
            if spec.id in previous:     # not selected: its record from the last scale.json
                rec = previous[spec.id]
                by_strategy.setdefault(rec["strategy"], []).append(rec)
                records.append(rec)
            continue
        if not (prepared / "book.json").is_file():
            if spec.id in previous:     # measured before, its graph since removed: kept as is
                print(f"{spec.id}: {prepared} is missing; its record from the last "
                      f"scale.json is kept", file=sys.stderr)
                rec = previous[spec.id]
                by_strategy.setdefault(rec["strategy"], []).append(rec)
                records.append(rec)
            else:
                print(f"{spec.id}: {prepared} is missing; run benchmarks/bench_prepare.py "
                      f"first", file=sys.stderr)
            continue
        facts = graph_facts(prepared)
        name = spec.label or spec.strategy
        done = by_strategy.setdefault(name, [])
        est = estimate_mb(done, facts["edges"])
        avail = mem_available_mb()
        if done and not done[-1].get("ok"):
            rec = {"strategy": name, **facts, "parts": spec.parts, "ok": False,
                   "status": "skipped", "reason": "a smaller size did not train",
                   "run": spec.id}
        elif est is not None and est * spec.parts > args.mem_frac * avail and \
                not (out / "results" / f"{spec.id}.json").is_file() and \
                f"{name}@{facts['edges']:.0e}" not in args.attempt:
            rec = {"strategy": name, **facts, "parts": spec.parts, "ok": False,
                   "status": "skipped", "estimated_peak_rss_rank_mb": est,
                   "reason": f"estimated {est:.0f} MiB/rank x {spec.parts} ranks = "
                             f"{est * spec.parts / 1024:.1f} GiB > {args.mem_frac:.0%} of the "
                             f"{avail / 1024:.1f} GiB available", "run": spec.id}
        else:
            with Watchdog(spec.id, args.floor_mb) as dog:
                (res,) = run_matrix([spec], out,
                                    timeout_s=float(matrix.get("run_timeout_s", 3600)))
                res = res.to_json()
            rec = record(spec, res, facts, prep, previous)
            if dog.fired:   # the measured limit, not an estimate
                rec.update(status="stopped", peak_rss_rank_mb=None,
                           peak_rss_rank_seen_mb=dog.peak_mb, estimated_peak_rss_rank_mb=est,
                           reason=f"stopped by the watchdog when free memory fell below "
                                  f"{args.floor_mb} MiB: {dog.ranks} ranks at up to "
                                  f"{dog.peak_mb:.0f} MiB each")
        print(json.dumps({k: rec.get(k) for k in ("strategy", "edges", "status",
                                                  "peak_rss_rank_mb", "reason")}),
              file=sys.stderr, flush=True)
        done.append(rec)
        records.append(rec)
    # results.jsonl of the whole matrix (run_matrix wrote it for its last call only)
    with open(out / "results.jsonl", "w") as f:
        for spec in specs:
            p = out / "results" / f"{spec.id}.json"
            if p.is_file():
                f.write(json.dumps(json.loads(p.read_text()), separators=(",", ":")) + "\n")
    return records


#: the mini-batch paths: epochs capped at 50 steps, time per 1,000 steps
STEP_TIMED = ("minibatch", "grappa-minibatch", "tma")


def _f(v, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def render(records: list[dict]) -> list[str]:
    lines = ["# Scale: every strategy at P = 4 from prepared synthetic graphs", "",
             "`python benchmarks/bench_scale.py` (matrix `benchmarks/scale.yaml`; prepared by "
             "`python benchmarks/bench_prepare.py`). Time: training seconds (evaluation "
             "excluded) per epoch, or per 1,000 steps for the mini-batch paths (`minibatch`, "
             "`grappa-minibatch`, `tma`: epochs of 50 steps). "
             "Bytes: training bytes per epoch-equivalent, all ranks. Peak: per-rank peak RSS "
             "(max over ranks; includes the mapped part files the rank touched), after setup "
             "(data, halo plans, samplers, model: before the first activation) and over the "
             "whole run. Accuracy: "
             "test accuracy after two epochs (the mini-batch paths: on a fixed sample of "
             "20,000 nodes per split) "
             "against the majority class.", "",
             "| strategy | edges | nodes | status | peak RSS/rank: setup | whole run | time | "
             "bytes/epoch | test acc | majority |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r.get("ok"):
            t = f"{_f(r.get('seconds_per_1000_steps'), '.1f')} s/1k steps" \
                if r["strategy"] in STEP_TIMED else f"{_f(r.get('seconds_per_epoch'), '.1f')} s/epoch"
            lines.append(f"| {r['strategy']} | {r['edges']:.2e} | {r['nodes']:.1e} | ok | "
                         f"{_f(r.get('setup_peak_rss_rank_mb'), '.0f')} MiB | "
                         f"{r['peak_rss_rank_mb']:.0f} MiB | {t} | "
                         f"{r['bytes_per_epoch'] / 1e6:.1f} MB | {r['test_acc']:.3f} | "
                         f"{r['majority_acc']:.3f} |")
        else:
            # a failure's first line says what ended it ("timed out after ...", "exit code ...")
            why = r.get("reason") or (r.get("error") or "").strip().splitlines()[:1] or [""]
            why = why if isinstance(why, str) else why[0]
            if r.get("setup_seconds") is not None:   # it got through its set-up
                why += (f" (set-up done in {r['setup_seconds']:.0f} s; "
                        f"{r.get('epochs_logged', 0)} epochs logged)")
            setup = r.get("setup_peak_rss_rank_mb")
            cell = f" {setup:.0f} MiB" if setup is not None else ""
            lines.append(f"| {r['strategy']} | {r['edges']:.2e} | {r['nodes']:.1e} | "
                         f"{r['status']}: {why} |{cell} | | | | | {r['majority_acc']:.3f} |")
    lines += ["", "Log-log slopes against edges (1.0 = linear), over the sizes each strategy "
              "trained:", "", "| strategy | sizes | time | peak RSS/rank | largest trained |",
              "|---|---|---|---|---|"]
    for name in dict.fromkeys(r["strategy"] for r in records):
        ok = [r for r in records if r["strategy"] == name and r.get("ok")]
        key = "seconds_per_1000_steps" if name in STEP_TIMED else "seconds_per_epoch"
        xs = [r["edges"] for r in ok]
        st, sm = slope(xs, [r.get(key) for r in ok]), slope(xs, [r["peak_rss_rank_mb"] for r in ok])
        big = f"{max(xs):.0e}" if xs else "—"
        lines.append(f"| {name} | {len(ok)} | {_f(st, '.2f')} | {_f(sm, '.2f')} | {big} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--matrix", default="benchmarks/scale.yaml")
    ap.add_argument("--mem-frac", type=float, default=0.8,
                    help="fraction of the memory available now a run may be estimated to use")
    ap.add_argument("--render", action="store_true", help="only rebuild the tables")
    ap.add_argument("--attempt", action="append", default=[], metavar="LABEL@EDGES",
                    help="run this one even if its estimate does not fit, e.g. "
                         "grappa-minibatch@1e+08 (the watchdog stops it if memory runs out)")
    ap.add_argument("--only", type=lambda v: v.split(","), default=[], metavar="LABELS",
                    help="run only these strategy labels (comma-separated, e.g. halo-lean); "
                         "the others keep their records from the last scale.json")
    ap.add_argument("--floor-mb", type=float, default=1536.0,
                    help="the watchdog stops a run when less memory than this is available")
    args = ap.parse_args(argv)
    jpath = ROOT / "benchmarks/results/scale.json"
    from _study import write_report
    records = json.loads(jpath.read_text())["runs"] if args.render else run(args)
    write_report(ROOT / "benchmarks/results/scale/scale.md", render(records),
                 None if args.render else jpath,
                 {"matrix": args.matrix, "command": "python benchmarks/bench_scale.py " +
                  " ".join(argv or sys.argv[1:]), "runs": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
