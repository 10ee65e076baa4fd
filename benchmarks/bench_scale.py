"""Scale: ``halo`` at P = 4 on synthetic graphs from 1e5 to 5e7 edges.

    .venv/bin/python benchmarks/bench_scale.py                  # 1e5 .. 1e8 edges (memory allowing)
    .venv/bin/python benchmarks/bench_scale.py --edges 1e5,1e6 --out /tmp/scale

Each size is one isolated ``quietgnn train --strategy halo --dataset synthetic`` run (through
``quietgnn bench``, so finished sizes are skipped on a rerun), GCN 2 x 64, one compute
thread per worker, few epochs (the per-epoch cost is what is measured). Per size:

* seconds/epoch: measured wall seconds of an epoch (max over ranks; loopback network, so
  this is compute plus local copies) and the slowest rank's compute seconds;
* bytes/epoch: training bytes sent per epoch, all ranks;
* peak resident memory per rank (max over ranks), of the launcher while it generates and
  partitions the graph (before any worker starts; it then hands that memory back and idles
  at the size logged as "after"), and of the whole run's largest process;
* the log-log slope of each against the number of edges (1.0 = linear).

Every size builds its partition book afresh (a cache under the work folder), so the
launcher's partitioning peak is measured, not skipped.

Memory guard: the two phases of a run do not overlap - first the launcher alone (generate,
METIS, write the book), then the P workers plus the idle launcher - so a size needs
``max(launcher peak, P x rank peak + launcher after)``, each extrapolated linearly in edges
from the two previous sizes. A size is skipped, not attempted, if that exceeds ``--mem-frac``
of the memory available now (the machine is shared). The largest size that trained is
reported.

Writes ``benchmarks/results/scale.json`` and ``benchmarks/results/scale.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR_MB = 300.0   # resident memory of a worker with torch imported, before any graph


def mem_info_mb(field: str = "MemAvailable:") -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024.0
    return float("inf")


def mem_available_mb() -> float:
    return mem_info_mb("MemAvailable:")


def slope(xs: list[float], ys: list[float]) -> float | None:
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def launcher_log(log_path: Path) -> dict:
    """Edge count and the launcher's memory as it logged them when partitioning
    ('... (N nodes, E edges) ... (peak memory X MiB, Y MiB after)'); {} when the book came
    from a cache."""
    if log_path.is_file():
        text = log_path.read_text(errors="replace")
        m = re.search(r"\((\d+) nodes, (\d+) edges\)", text)
        out = {"edges": int(m.group(2))} if m else {}
        m = re.search(r"peak memory ([\d.]+) MiB, ([\d.]+) MiB after", text)
        if m:
            out.update(launcher_peak_mb=float(m.group(1)), launcher_after_mb=float(m.group(2)))
        return out
    return {}


def _extrapolate(done: list[dict], key: str, edges: float) -> float:
    """Linear in edges through the two largest sizes that recorded ``key`` (with one size:
    through the fixed floor of an interpreter with torch loaded)."""
    pts = sorted((r for r in done if r.get(key)), key=lambda r: r["edges"])[-2:]
    if not pts:
        return FLOOR_MB
    if len(pts) == 1 or pts[1]["edges"] == pts[0]["edges"]:
        m, e = pts[-1][key], pts[-1]["edges"]
        return FLOOR_MB + max(0.0, m - FLOOR_MB) * edges / e
    (e0, m0), (e1, m1) = [(r["edges"], r[key]) for r in pts]
    return m1 + max(0.0, (m1 - m0) / (e1 - e0)) * (edges - e1)


def estimate_mb(done: list[dict], edges: float, parts: int) -> float:
    """Memory a run needs at ``edges``: the larger of its two phases, which do not overlap -
    the launcher alone generating and partitioning, then ``parts`` ranks at their peak plus
    the launcher idling (it handed the graph back before starting them). Older results
    without the launcher's log fall back to adding the largest process on top (pessimistic)."""
    if any(r.get("launcher_peak_mb") for r in done):
        return max(_extrapolate(done, "launcher_peak_mb", edges),
                   parts * _extrapolate(done, "peak_rss_rank_mb", edges) +
                   _extrapolate(done, "launcher_after_mb", edges))
    return parts * _extrapolate(done, "peak_rss_rank_mb", edges) + \
        _extrapolate(done, "peak_run_mb", edges)


def epochs_for(edges: float) -> int:
    return 10 if edges <= 2e6 else 5 if edges <= 2e7 else 3


def render(data: dict) -> list[str]:
    """The markdown report of a ``scale.json`` (``--render-only`` redraws it)."""
    meta, rows, largest = data["meta"], data["rows"], data["largest"]
    slopes, marginal = data["slopes"], data["marginal_slopes"]
    md = ["# Scale: `halo`, P = 4, synthetic graphs", "",
          f"GCN 2 x 64, {meta['features']} features, average degree {meta['degree']}, "
          f"{meta['partitioner']} partitions, 1 compute thread per worker; seconds/epoch exclude "
          "epoch 0. Wall seconds include the loopback exchange of all ranks on a shared "
          "2-core machine; compute is the slowest rank's thread CPU time.", "",
          "| edges | nodes | epochs | s/epoch (wall) | compute s/epoch (slowest rank) | "
          "training bytes/epoch | peak RSS/rank | launcher peak (partitioning) | "
          "training phase (P ranks + launcher) |",
          "|" + "---|" * 9]
    for r in rows:
        if r["status"] != "ok":
            why = (r.get("why") or r.get("error") or "").strip().splitlines()
            md.append(f"| {r['target_edges']:.2g} | — | — | {r['status']}: "
                      f"{why[-1] if why else ''} | | | | | |")
            continue
        lp, la = r.get("launcher_peak_mb"), r.get("launcher_after_mb")
        train_phase = "—" if la is None else \
            f"{(meta['parts'] * r['peak_rss_rank_mb'] + la) / 1024:.1f} GiB"
        md.append(f"| {r['edges']:,} | {r['nodes']:,} | {r['epochs']} | {r['epoch_s']:.3f} | "
                  f"{r['compute_s']:.3f} | {r['bytes_per_epoch'] / 1e6:.1f} MB | "
                  f"{r['peak_rss_rank_mb']:.0f} MiB | "
                  f"{'—' if lp is None else f'{lp:.0f} MiB'} | {train_phase} |")
    fmt = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    md += ["", "Log-log slope vs edges, all sizes: " +
           ", ".join(f"{k} {fmt(v)}" for k, v in slopes.items()),
           "", "Between the two largest sizes: " +
           ", ".join(f"{k} {fmt(v)}" for k, v in marginal.items()),
           "", f"Largest graph trained: {largest['edges']:,} edges ({largest['nodes']:,} nodes)"
           if largest else "No size trained.", "", f"Command: `{meta['command'].strip()}` "
           f"({meta['when']})", ""]
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edges", default="1e5,1e6,1e7,2.5e7,5e7,7.5e7,1e8",
                    help="target edge counts (directed CSR entries)")
    ap.add_argument("--degree", type=int, default=20, help="average degree (edges per node)")
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--partitioner", default="metis")
    ap.add_argument("--mem-frac", type=float, default=0.7)
    ap.add_argument("--run-timeout", type=float, default=3600)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config keys (e.g. synthetic.classes=8)")
    ap.add_argument("--nodes-key", default="synthetic.nodes")
    ap.add_argument("--degree-key", default="synthetic.avg_degree")
    ap.add_argument("--features-key", default="synthetic.feature_dim")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "scale"),
                    help="runs, logs and partition books (large: ~1.3 GB of books at 5e7 edges)")
    ap.add_argument("--render-only", action="store_true",
                    help="redraw scale.md from an existing scale.json")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.render_only:
        md = render(json.loads((out / "scale.json").read_text()))
        (out / "scale.md").write_text("\n".join(md))
        print("\n".join(md))
        return 0
    from quietgnn.bench import _kv, build_matrix, run_matrix
    work = Path(args.work)
    # a cache of our own: every size builds its book, so the launcher's peak is measured
    os.environ["QUIETGNN_CACHE"] = str(work / "cache")
    rows: list[dict] = []
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    for target in [float(e) for e in args.edges.split(",")]:
        nodes = int(target / args.degree)
        label = f"syn{target:.0e}".replace("+", "")
        done = [r for r in rows if r["status"] == "ok"]
        if any(r["status"] == "failed" for r in rows):
            log(f"{label}: skipped, a smaller size failed")
            rows.append({"label": label, "target_edges": target, "status": "skipped",
                         "why": "a smaller size failed"})
            continue
        if done:
            need = estimate_mb(done, target, args.parts)
            avail = mem_available_mb()
            if need > args.mem_frac * avail:
                log(f"{label}: skipped, needs ~{need:.0f} MiB, {avail:.0f} MiB available")
                rows.append({"label": label, "target_edges": target, "status": "skipped",
                             "why": f"estimated {need:.0f} MiB > {args.mem_frac} x "
                                    f"{avail:.0f} MiB available"})
                continue
        ds = {"name": "synthetic", "label": label,
              "set": {args.nodes_key: nodes, args.degree_key: args.degree,
                      args.features_key: args.features, **_kv(args.set, "--set")}}
        spec = build_matrix({"datasets": [ds], "strategies": ["halo"], "parts": [args.parts],
                             "models": ["gcn"], "seeds": [0],
                             "set": {"train.epochs": epochs_for(target),
                                     "train.eval_every": 1000, "partition.method":
                                         args.partitioner, "runtime.timeout_s": 600}})
        t0 = time.perf_counter()
        (res,) = run_matrix(spec, work, timeout_s=args.run_timeout, log=log)
        peak_run = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
        row = {"label": label, "target_edges": target, "nodes": nodes, "status": res["status"],
               "elapsed_s": time.perf_counter() - t0, "id": res["id"]}
        if res["status"] == "ok":
            s, eps = res["summary"], res["curve"]["epochs"]
            steady = eps[1:] or eps   # epoch 0 pays one-off allocation
            launcher = launcher_log(work / "logs" / f"{res['id']}.log")
            row.update({
                "edges": launcher.get("edges") or int(target),
                "launcher_peak_mb": launcher.get("launcher_peak_mb"),
                "launcher_after_mb": launcher.get("launcher_after_mb"),
                "epochs": len(eps),
                "epoch_s": sum(e["wall_s"] for e in steady) / len(steady),
                "compute_s": sum(e["compute_s"] for e in steady) / len(steady),
                "bytes_per_epoch": sum(e["train_bytes"] for e in eps) / len(eps),
                "peak_rss_rank_mb": max(e["peak_rss_mb"] for e in eps),
                # RUSAGE_CHILDREN: the largest process of any run so far (grows with size)
                "peak_run_mb": max(peak_run, max(e["peak_rss_mb"] for e in eps)),
                "wall_total_s": s["wall_seconds"]})
        else:
            row["error"] = (res.get("error") or "")[-1500:]
        rows.append(row)
        log(json.dumps({k: v for k, v in row.items() if k != "error"}))
    ok = [r for r in rows if r["status"] == "ok"]
    xs = [r["edges"] for r in ok]
    slopes = {k: slope(xs, [r.get(k) for r in ok])
              for k in ("epoch_s", "compute_s", "bytes_per_epoch", "peak_rss_rank_mb",
                        "launcher_peak_mb")}
    # a rank's memory above the ~300 MiB every process pays for Python + torch + gloo
    slopes["rank_mb_above_floor"] = slope(xs, [r["peak_rss_rank_mb"] - FLOOR_MB for r in ok])
    # the smallest sizes sit on a fixed floor (~300 MiB of interpreter + torch per process);
    # the slope between the two largest sizes shows the marginal growth
    top = sorted(ok, key=lambda r: r["edges"])[-2:]
    marginal = {k: slope([r["edges"] for r in top], [r.get(k) for r in top]) for k in slopes}
    marginal["rank_mb_above_floor"] = slope([r["edges"] for r in top],
                                            [r["peak_rss_rank_mb"] - FLOOR_MB for r in top])
    largest = max(ok, key=lambda r: r["edges"]) if ok else None
    meta = {"parts": args.parts, "degree": args.degree, "features": args.features,
            "partitioner": args.partitioner, "model": "gcn 2x64", "threads_per_worker": 1,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python benchmarks/bench_scale.py " + " ".join(argv or sys.argv[1:]),
            "mem_total_mb": mem_info_mb("MemTotal:"), "mem_available_mb_at_end":
                mem_available_mb()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(
        {"meta": meta, "rows": rows, "slopes": slopes, "marginal_slopes": marginal,
         "largest": largest}, indent=1))
    md = render({"meta": meta, "rows": rows, "slopes": slopes, "marginal_slopes": marginal,
                 "largest": largest})
    (out / "scale.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
