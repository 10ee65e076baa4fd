"""Memory ledger: which buffer holds a rank's memory, measured at two sizes, extrapolated.

    python benchmarks/bench_prepare.py --edges 1e6,1e7     # the prepared graphs
    python benchmarks/bench_ledger.py                       # benchmarks/ledger.yaml
    python benchmarks/bench_ledger.py --render              # tables from the runs only

Peak RSS says how much a rank holds, not what. Every run of the matrix (the scale study's
settings, through :func:`quietgnn.analysis.runner.run_matrix`) trains with ``QUIETGNN_MEM_LEDGER=1``,
so each rank writes the ledger of :mod:`quietgnn.runtime.memledger` after set-up and after
training: every tensor and array it holds, by attribute path, anonymous or memory-mapped.

Per strategy, the rank with the largest peak at the larger size is compared with the same
rank at the smaller size. A buffer whose bytes grew with the graph (log-log slope above 0.5)
is extrapolated linearly in edges to the strategy's target (``targets`` in the matrix), one
that did not is taken as capped; one seen only at the larger size counts as linear. Mapped
buffers count nothing: their resident pages are page cache. What the ledger does not name
(``RssAnon`` minus the named anonymous buffers minus a bare interpreter's) and the step's
transients (the peak resident set ``VmHWM`` minus what the rank holds after training,
anonymous and file-backed: activations, their gradients, messages) are each taken as a
fixed part plus one linear in edges, through the two sizes.

Writes ``benchmarks/results/ledger.json`` and ``benchmarks/results/ledger/ledger.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml
from _study import slope   # the log-log slope the scale studies share (script directory)

ROOT = Path(__file__).resolve().parents[1]
#: anonymous memory of a rank before any data: the interpreter, torch, quietgnn and the gloo
#: group (memory-ledger.md's measurement), not a buffer of the graph
BASE_ANON_MIB = 225.0
GIB, MIB = 2 ** 30, 2 ** 20


def _ledgers(run_dir: Path, when: str) -> dict[int, dict]:
    out = {}
    for f in sorted((run_dir / "logs").glob(f"memledger-rank*-{when}.json")):
        out[int(f.name.split("-")[1][4:])] = json.loads(f.read_text())
    return out


def _edges(prepared: Path) -> int:
    return int(json.loads((prepared / "book.json").read_text())["graph"]["num_edges"]) // 2


def _specs(matrix: dict) -> list:
    from quietgnn.analysis.matrix import build_matrix
    return build_matrix({k: v for k, v in matrix.items()
                         if k not in ("targets", "budget_gib_per_rank")})


def run(matrix: dict, only: list[str]) -> None:
    from quietgnn.analysis.runner import run_matrix
    os.environ["QUIETGNN_MEM_LEDGER"] = "1"     # the runs inherit it
    specs = [s for s in _specs(matrix) if not only or (s.label or s.strategy) in only]
    out = ROOT / matrix["out"]
    run_matrix(specs, out, timeout_s=float(matrix.get("run_timeout_s", 3600)))
    # results.jsonl of the whole matrix (run_matrix wrote the runs of this call only)
    with open(out / "results.jsonl", "w") as f:
        for spec in _specs(matrix):
            p = out / "results" / f"{spec.id}.json"
            if p.is_file():
                f.write(json.dumps(json.loads(p.read_text()), separators=(",", ":")) + "\n")


def collect(matrix: dict) -> list[dict]:
    """One record per strategy: its sizes and, per buffer, bytes at each size and at the
    target."""
    out = ROOT / matrix["out"]
    sizes: dict[str, list[dict]] = {}
    for spec in _specs(matrix):
        res_path = out / "results" / f"{spec.id}.json"
        if not res_path.is_file() or json.loads(res_path.read_text()).get("status") != "ok":
            continue
        run_dir = out / "runs" / spec.id
        train, setup = _ledgers(run_dir, "train"), _ledgers(run_dir, "setup")
        if not train:
            print(f"{spec.id}: no ledger files (run without QUIETGNN_MEM_LEDGER?)",
                  file=sys.stderr)
            continue
        name = spec.label or spec.strategy
        sizes.setdefault(name, []).append({
            "edges": _edges(ROOT / spec.overrides["dataset.prepared"]), "run": spec.id,
            "train": train, "setup": setup})
    return [_extrapolate(name, sorted(runs, key=lambda r: r["edges"]),
                         float(matrix["targets"][name]), float(matrix["budget_gib_per_rank"]))
            for name, runs in sizes.items() if len(runs) >= 2 and name in matrix["targets"]]


def _extrapolate(name: str, runs: list[dict], target: float, budget_gib: float) -> dict:
    a, b = runs[-2], runs[-1]
    ea, eb = a["edges"], b["edges"]
    # the rank that peaked highest at the larger size, at both sizes
    rank = max(b["train"], key=lambda k: b["train"][k]["status_kib"]["VmHWM"])
    la, lb = a["train"][rank], b["train"][rank]
    small = {r["name"]: r for r in la["buffers"]}
    buffers = []
    for r in lb["buffers"]:
        s = small.get(r["name"])
        g = slope([ea, eb], [s["bytes"], r["bytes"]]) if s else None
        grows = g is None or g > 0.5
        at_target = 0.0 if r["mapped"] else r["bytes"] * (target / eb if grows else 1.0)
        buffers.append({"name": r["name"], "dtype": r["dtype"], "shape": r["shape"],
                        "mapped": r["mapped"], "mib_small": s["bytes"] / MIB if s else None,
                        "mib_large": r["bytes"] / MIB, "slope": g,
                        "grows": "linear" if grows else "capped",
                        "gib_target": at_target / GIB})
    buffers.sort(key=lambda x: (-x["gib_target"], -x["mib_large"]))

    def unnamed(led: dict) -> float:
        return max(led["status_kib"]["RssAnon"] / 1024 - led["anon_buffer_bytes"] / MIB
                   - BASE_ANON_MIB, 0.0)

    def transient(led: dict) -> float:
        # above what the rank holds after training: the step's activations, their gradients
        # and messages (the peak's file pages taken as those still resident at the end)
        st = led["status_kib"]
        return max(st["VmHWM"] - st["RssFile"] - st["RssAnon"], 0) / 1024

    def affine(va: float, vb: float, e: float) -> float:
        # a fixed part plus one linear in edges, through the two measured sizes
        return max(vb + (vb - va) / (eb - ea) * (e - eb), vb)

    un = [unnamed(la), unnamed(lb)]
    tr = [transient(la), transient(lb)]
    hwm = [la["status_kib"]["VmHWM"] / 1024, lb["status_kib"]["VmHWM"] / 1024]
    # the check: the same extrapolation at the sizes the scale study trained
    scale = ROOT / "benchmarks/results/archive/scale-script/scale.json"
    checks = [{"edges": r["edges"], "measured_peak_mib": r["peak_rss_rank_mb"],
               "extrapolated_peak_mib": affine(*hwm, r["edges"])}
              for r in (json.loads(scale.read_text())["runs"] if scale.is_file() else [])
              if r.get("strategy") == name and r.get("ok") and r["edges"] > eb
              and r.get("peak_rss_rank_mb")]
    held = sum(x["gib_target"] for x in buffers) + (BASE_ANON_MIB + affine(*un, target)) / 1024
    peak = held + affine(*tr, target) / 1024
    return {"strategy": name, "rank": rank, "edges": [ea, eb], "target_edges": target,
            "runs": [a["run"], b["run"]],
            "status_mib": [{k: v / 1024 for k, v in x["status_kib"].items()} for x in (la, lb)],
            "unnamed_mib": un, "unnamed_gib_target": affine(*un, target) / 1024,
            "transient_mib": tr, "transient_gib_target": affine(*tr, target) / 1024,
            "vmhwm_mib": hwm, "held_anon_gib_target": held, "peak_anon_gib_target": peak,
            "budget_gib_per_rank": budget_gib, "fits": peak <= budget_gib, "checks": checks,
            "buffers": buffers}


def _fmt(v, f: str) -> str:
    return "—" if v is None else format(v, f)


def render(recs: list[dict], top: int = 10) -> list[str]:
    lines = ["# Memory ledger: what a rank holds, measured at two sizes, extrapolated", "",
             "`python benchmarks/bench_ledger.py` (matrix `benchmarks/ledger.yaml`: the scale "
             "study's settings at P = 4, every rank writing its ledger; method in the script's "
             "docstring). Per rank, anonymous memory at the target: the named buffers (each "
             "extrapolated by its own measured growth), a bare interpreter "
             f"({BASE_ANON_MIB:.0f} MiB), what the ledger does not name, and the step's "
             "transients (peak resident set minus what is held after training: activations, "
             "their gradients, messages); the last two are a fixed part plus one linear in "
             "edges through the two sizes. Mapped part files count nothing (page cache).", "",
             "| strategy | measured at (edges) | rank | target (edges) | named buffers | "
             "not named | transients | total | budget/rank | fits |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        named = sum(x["gib_target"] for x in r["buffers"])
        lines.append(f"| {r['strategy']} | {r['edges'][0]:.1e}, {r['edges'][1]:.1e} | "
                     f"{r['rank']} | {r['target_edges']:.1e} | {named:.2f} GiB | "
                     f"{r['unnamed_gib_target']:.2f} GiB | {r['transient_gib_target']:.2f} GiB | "
                     f"{r['peak_anon_gib_target']:.2f} GiB | {r['budget_gib_per_rank']:.1f} GiB | "
                     f"{'yes' if r['fits'] else '**no**'} |")
    for r in recs:
        lines += ["", f"## {r['strategy']} (rank {r['rank']}, after training)", "",
                  f"| buffer | at {r['edges'][1]:.0e} | anon/map | MiB at {r['edges'][0]:.0e} "
                  f"| MiB at {r['edges'][1]:.0e} | growth (slope) | GiB at "
                  f"{r['target_edges']:.1e} |", "|---|---|---|---|---|---|---|"]
        for x in r["buffers"][:top]:
            lines.append(f"| `{x['name']}` | {x['dtype']} {x['shape']} | "
                         f"{'map' if x['mapped'] else 'anon'} | {_fmt(x['mib_small'], '.1f')} | "
                         f"{x['mib_large']:.1f} | {x['grows']} ({_fmt(x['slope'], '.2f')}) | "
                         f"{x['gib_target']:.2f} |")
        rest = r["buffers"][top:]
        if rest:
            lines.append(f"| {len(rest)} smaller buffers | | | | "
                         f"{sum(x['mib_large'] for x in rest):.1f} | | "
                         f"{sum(x['gib_target'] for x in rest):.2f} |")
        for what, key in (("not named by the ledger", "unnamed"), ("the step's transients",
                                                                  "transient")):
            v = r[f"{key}_mib"]
            lines.append(f"| {what} | | anon | {v[0]:.1f} | {v[1]:.1f} | affine | "
                         f"{r[f'{key}_gib_target']:.2f} |")
        st = r["status_mib"]
        lines += ["", "RssAnon / RssFile / VmHWM after training: "
                  + "; ".join(f"{e:.0e} edges {s['RssAnon']:.0f} / {s['RssFile']:.0f} / "
                              f"{s['VmHWM']:.0f} MiB" for e, s in zip(r["edges"], st))]
        for c in r["checks"]:
            lines += ["", f"Check against the scale study: the peak resident set, extrapolated "
                      f"the same way to {c['edges']:.2e} edges, is "
                      f"{c['extrapolated_peak_mib']:.0f} MiB a rank; the scale study measured "
                      f"{c['measured_peak_mib']:.0f} MiB (max over ranks; "
                      f"{c['extrapolated_peak_mib'] / c['measured_peak_mib'] - 1:+.0%})."]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default="benchmarks/ledger.yaml")
    ap.add_argument("--render", action="store_true", help="only rebuild the tables")
    ap.add_argument("--only", default="", help="comma-separated strategy labels to run "
                    "(the tables cover every strategy with runs)")
    args = ap.parse_args(argv)
    matrix = yaml.safe_load((ROOT / args.matrix).read_text())
    if not args.render:
        run(matrix, [x for x in args.only.split(",") if x])
    recs = collect(matrix)
    (ROOT / "benchmarks/results/ledger.json").write_text(json.dumps({"strategies": recs},
                                                                     indent=1))
    md = ROOT / matrix["out"] / "ledger.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(render(recs)) + "\n")
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
