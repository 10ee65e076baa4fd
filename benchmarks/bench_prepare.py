"""Out-of-core prepare at scale: `quietgnn prepare synthetic` from 10^6 to 10^9 undirected edges.

    .venv/bin/python benchmarks/bench_prepare.py                       # 1e6 .. 1e9 edges
    .venv/bin/python benchmarks/bench_prepare.py --edges 1e6,1e7 --out /tmp/prep

Each size is one `quietgnn prepare synthetic --edges E --parts 4` process (16 features stored
as float16, average degree 20, the ldg partitioner unless ``--partitioner hash``) under a memory budget (default 4 GiB).
Per size: stored edges, nodes, wall seconds and stored edges per second, the process's peak
resident memory (``wait4``'s ``ru_maxrss``: DuckDB runs inside it) against the budget, the
prepared directory's size on disk, the edge cut and halo sizes; and the log-log slopes of time
and memory against edges. A size is skipped when the disk would not hold it (estimated from
the previous size: prepared directory + DuckDB's table and spill).

Writes ``benchmarks/results/prepare-scale/prepare.{json,md}``. The prepared directories stay
under ``--work`` (large; delete them when done) so `quietgnn train --data` can use them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _study import slope  # noqa: E402  (the log-log slope the scale studies share)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_one(edges: float, args: argparse.Namespace, work: Path) -> dict:
    out = work / f"syn-{edges:.0e}".replace("+", "")
    cmd = [sys.executable, "-m", "quietgnn", "prepare", "synthetic", "--edges", f"{edges:.0f}",
           "--parts", str(args.parts), "--synthetic.preset", "easy",   # as recorded
           "--synthetic.avg_degree", str(args.degree),
           "--synthetic.feature_dim", str(args.features), "--x-dtype", "float16",
           "--memory-budget", args.budget, "--partitioner", args.partitioner, "--out", str(out)]
    print(" ".join(cmd[1:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    log = (work / f"{out.name}.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    # the largest the work in progress got on disk (DuckDB's tables and spill + the parts)
    disk_peak = [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(2.0):
            for tmp in out.parent.glob(f".{out.name}.tmp-*"):
                try:
                    disk_peak[0] = max(disk_peak[0], du(tmp))
                except OSError:     # a file went away while being counted
                    pass
    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    stop.set()
    watcher.join()
    secs = time.perf_counter() - t0
    log.close()
    text = (work / f"{out.name}.log").read_text(errors="replace")
    row = {"target_edges": edges, "seconds": secs, "peak_rss_mb": usage.ru_maxrss / 1024.0,
           "work_disk_peak_bytes": disk_peak[0],
           "budget_mb": _mib(args.budget), "status": "ok" if status == 0 else "failed"}
    if status != 0:
        lines = text.strip().splitlines()
        if os.WIFSIGNALED(status):
            stages = [ln for ln in lines if ln.startswith("[")]
            row["error"] = (f"stopped by signal {os.WTERMSIG(status)} after {secs:.0f} s"
                            + (f" (last: {stages[-1].strip()})" if stages else ""))
        else:
            row["error"] = lines[-1] if lines else f"exit status {os.WEXITSTATUS(status)}"
        return row
    book = json.loads((out / "book.json").read_text())
    g, st = book["graph"], book["stats"]
    row.update(edges=g["num_edges"] // 2, stored_edges=g["num_edges"], nodes=g["num_nodes"],
               stored_edges_per_s=g["num_edges"] / secs, disk_bytes=du(out),
               edge_cut_fraction=st["edge_cut_fraction"], halo=st["halo"],
               within_budget=usage.ru_maxrss / 1024.0 <= _mib(args.budget),
               stages=[ln for ln in text.splitlines() if ln.startswith("[")])
    return row


def _mib(size: str) -> float:
    from quietgnn.prepare import parse_size
    return parse_size(size) / 2 ** 20


def render(data: dict) -> list[str]:
    meta, rows = data["meta"], data["rows"]
    md = ["# Out-of-core prepare: `quietgnn prepare synthetic`, P = 4", "",
          f"Streamed synthetic graph (average degree {meta['degree']}, {meta['features']} "
          f"features stored as float16), {meta['partitioner']} partitioner, memory budget {meta['budget']}, "
          f"on a shared 2-core machine (DuckDB with 2 threads). Peak memory is the prepare "
          f"process's maximum resident set (DuckDB runs inside it).", "",
          "| undirected edges | stored | nodes | seconds | stored edges/s | peak memory | "
          "within budget | on disk | peak disk while preparing | edge cut |", "|" + "---|" * 10]
    for r in rows:
        if r["status"] != "ok":
            # how far a failed run got: its time, peak memory and disk, where measured
            sec, rss = r.get("seconds"), r.get("peak_rss_mb")
            disk = r.get("work_disk_peak_bytes")
            md.append(f"| {r['target_edges']:.4g} | {r['status']}: {r.get('error', '')} | | "
                      f"{'' if sec is None else f'{sec:.1f}'} | | "
                      f"{'' if rss is None else f'{rss:.0f} MiB'} | | | "
                      f"{'' if disk is None else f'{disk / 2 ** 30:.2f} GiB'} | |")
            continue
        md.append(f"| {r['edges']:,} | {r['stored_edges']:,} | {r['nodes']:,} | "
                  f"{r['seconds']:.1f} | {r['stored_edges_per_s'] / 1e6:.2f} M | "
                  f"{r['peak_rss_mb']:.0f} MiB | {'yes' if r['within_budget'] else 'NO'} | "
                  f"{r['disk_bytes'] / 2 ** 30:.2f} GiB | "
                  f"{r.get('work_disk_peak_bytes', 0) / 2 ** 30:.2f} GiB | "
                  f"{100 * r['edge_cut_fraction']:.1f} % |")
    fmt = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    md += ["", "Log-log slope against stored edges: " +
           ", ".join(f"{k} {fmt(v)}" for k, v in data["slopes"].items()), "",
           f"Command: `{meta['command']}` ({meta['when']}, commit {meta['commit']})", ""]
    md += [f"- {note}" for note in data.get("notes", [])]   # runs added with --append
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 1.005e9: the generator draws pairs and the prepare drops repeated ones (~0.2% at 10^8),
    # so at least 10^9 distinct undirected edges remain
    ap.add_argument("--edges", default="1e6,1e7,1e8,3e8,1.005e9",
                    help="undirected edge counts to draw (repeated pairs are dropped)")
    ap.add_argument("--degree", type=float, default=20.0)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--budget", default="4GiB")
    ap.add_argument("--partitioner", default="ldg", choices=["ldg", "hash"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "prepare-scale"))
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "prepare"))
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of other sizes already in prepare.json")
    args = ap.parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        md = render(json.loads((out / "prepare.json").read_text()))
        (out / "prepare.md").write_text("\n".join(md))
        print("\n".join(md))
        return 0
    work.mkdir(parents=True, exist_ok=True)
    sizes = [float(x) for x in args.edges.split(",")]
    rows: list[dict] = []
    if args.append and (out / "prepare.json").is_file():   # keep the other sizes' rows
        # a row is replaced by a size of the same directory name (1e9 by 1.005e9)
        names = {f"{e:.0e}" for e in sizes}
        rows = [r for r in json.loads((out / "prepare.json").read_text())["rows"]
                if f"{r['target_edges']:.0e}" not in names]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    note = (f"{', '.join(f'{e:.4g}' for e in sizes)}: `python benchmarks/bench_prepare.py "
            f"{' '.join(argv or sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M')}, commit "
            f"{commit})")
    for e in sizes:
        done = [r for r in rows if r["status"] == "ok" and r["target_edges"] < e]
        if done:
            # the work's peak on disk (DuckDB's tables and spill, the parts), linear in edges
            # from the previous size (older rows without it: ~32 bytes a stored edge more)
            prev = max(done, key=lambda r: r["target_edges"])
            peak = prev.get("work_disk_peak_bytes") or prev["disk_bytes"] + 64 * prev["edges"]
            need = peak * e / prev["edges"]
            free = shutil.disk_usage(work).free
            if need > 0.8 * free:
                rows.append({"target_edges": e, "status": "skipped",
                             "error": f"needs ~{need / 2 ** 30:.0f} GiB of disk, "
                                      f"{free / 2 ** 30:.0f} GiB free"})
                continue
        rows.append(run_one(e, args, work))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "stages"}),
              file=sys.stderr, flush=True)
        write(out, rows, args, argv, note)  # after every size: a stopped run keeps what it did
    md = write(out, rows, args, argv, note)
    print("\n".join(md))
    return 0


def write(out: Path, rows: list[dict], args: argparse.Namespace, argv,
          note: str = "") -> list[str]:
    rows = sorted(rows, key=lambda r: r["target_edges"])
    ok = [r for r in rows if r["status"] == "ok"]
    xs = [r["stored_edges"] for r in ok]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    data = {"meta": {"degree": args.degree, "features": args.features, "parts": args.parts,
                     "partitioner": args.partitioner,
                     "budget": args.budget, "when": time.strftime("%Y-%m-%d %H:%M"),
                     "commit": commit,
                     "command": "python benchmarks/bench_prepare.py " + " ".join(argv or
                                                                                 sys.argv[1:])},
            "rows": rows,
            "slopes": {"seconds": slope(xs, [r["seconds"] for r in ok]),
                       "peak memory": slope(xs, [r["peak_rss_mb"] for r in ok]),
                       "disk": slope(xs, [r["disk_bytes"] for r in ok])}}
    old = out / "prepare.json"
    if args.append and old.is_file():
        # the other rows' provenance stays; this run's is a note of its own (once, however
        # often the run writes)
        prev = json.loads(old.read_text())
        notes = prev.get("notes", [])
        data["notes"] = notes + ([note] if note and note not in notes else [])
        data["meta"] = prev["meta"]
    old.write_text(json.dumps(data, indent=1))
    md = render(data)
    (out / "prepare.md").write_text("\n".join(md))
    return md


if __name__ == "__main__":
    sys.exit(main())
