"""AdaQP against `halo`: halo traffic, accuracy, projected LAN epoch time, bit-widths, overlap.

    .venv/bin/python benchmarks/bench_adaqp.py                  # the full matrix (hours)
    .venv/bin/python benchmarks/bench_adaqp.py --datasets cora --configs small --seeds 0
    .venv/bin/python benchmarks/bench_adaqp.py --overlap-study  # overlap on vs off, seed 0
    .venv/bin/python benchmarks/bench_adaqp.py --render-only    # adaqp.md from adaqp.json

P = 4 (METIS), GCN and SAGE, configs ``small`` (2 layers, hidden 64) and ``paper`` (3 layers,
hidden 256, LayerNorm, as in the AdaQP paper); dropout 0.5, Adam lr 0.01, weight decay 5e-4.
Strategies: ``halo`` and ``adaqp`` (adaptive widths with the default lam = 0.5, group size
100 and solver; ``assign_cycle=5`` so that the all-8-bit warm-up is a small part of a run;
``time_model=lan``: on this loopback-only machine a start-up profile would time memory copies,
so the assignment uses the LAN tier the projection reports). Every (dataset, config, model,
seed) runs both strategies in one set of 4 gloo processes (``spawn_function``; one compute
thread each) with the same seed, epochs and hyperparameters; adaqp draws the same dropout
masks as halo, so the two runs differ by quantization alone. ``--overlap-study`` runs adaqp
with overlap on and off (seed 0, GCN) for the overlap table.

Per run, from the communicator's records (training phase, sent bytes summed over ranks):

* halo-message bytes / epoch: ``halo_fwd + halo_bwd`` vs ``adaqp_fwd + adaqp_bwd +
  adaqp_assign`` (the goal's quantity), and all training bytes (+ the fp32 gradient
  all-reduce, which adaqp leaves alone);
* test accuracy at the best validation epoch (evaluated every ``--eval-every`` epochs and at
  the last, fp32 messages), mean over seeds;
* projected LAN epoch time (1 Gbit/s, 0.5 ms; :mod:`quietgnn.analysis.projection`): per round hops x
  latency + slowest rank's bytes / bandwidth, plus the slowest rank's measured CPU compute
  (thread time outside communication; adaqp: codec, split blocks and the solver included).
  ``no overlap`` charges every exchange in full; ``overlap`` subtracts, per exchange, the
  smaller of its LAN time and the CPU every rank spent computing while it was in flight;
* the bit-width histogram (rows sent per width, over all epochs and ranks; per exchange and
  over the epochs), and overlap on this machine: seconds the exchanges were in flight vs
  seconds spent blocked waiting for them.

Resumable: ``benchmarks/results/adaqp/adaqp.json`` is rewritten after every run and runs already in
it are skipped (delete a key to redo it); ``benchmarks/results/adaqp/adaqp.md`` is drawn from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "adaqp"
CACHE = Path("/tmp/quietgnn-bench-adaqp")
DATA = ROOT.parent / "shared" / "data"
CONFIGS = {"small": dict(layers=2, hidden=64, norm="none"),
           "paper": dict(layers=3, hidden=256, norm="layer")}
ROOTS = {"cora": "planetoid", "citeseer": "planetoid", "computers": "amazon", "cs": "coauthor"}
ADAQP = {"bits": "adaptive", "time_model": "lan", "assign_cycle": 5}
STRATEGIES = {"halo": ("halo", {}),
              "adaqp": ("adaqp", ADAQP),
              "adaqp-no-overlap": ("adaqp", dict(ADAQP, overlap=False))}
HALO_KINDS = {"halo_fwd", "halo_bwd", "adaqp_fwd", "adaqp_bwd", "adaqp_assign"}
EXCHANGE_KINDS = {"halo_fwd", "halo_bwd", "adaqp_fwd", "adaqp_bwd"}


def load_graph(name: str):
    from quietgnn.datasets import load_dataset
    return load_dataset(name, str(DATA / ROOTS[name]) if name in ROOTS else None)


def book_for(name: str, P: int) -> str:
    from quietgnn.partition.book import make_book
    path = CACHE / "books" / f"{name}-metis-p{P}"
    if not (path / "book.json").is_file():
        make_book(path, load_graph(name), "metis", P, seed=0)
    return str(path)


def _worker(comm, book, model_kw, seed, strategies, epochs, eval_every):
    """One rank: every strategy in turn on this rank's part, through the package's trainer
    (``_study``); per epoch its training rounds, wall and compute seconds, and accuracies."""
    from _study import run_jobs
    from quietgnn.partition import PartitionBook
    part = PartitionBook.open(book).load_part(comm.rank, comm.world_size)
    jobs = [{"strategy": name, "options": dict(opts), "eval_every": eval_every,
             "model": {"arch": model_kw["arch"], "hidden": model_kw["hidden"],
                       "layers": model_kw["layers"], "dropout": 0.5, "norm": model_kw["norm"]},
             "train": {"epochs": epochs, "lr": 0.01, "seed": seed}}
            for name, opts in strategies.values()]
    return {label: [_row(rec) for rec in run["records"][1:]]     # the set-up's left out
            for label, run in zip(strategies, run_jobs(comm, part, jobs))}


def _row(rec: dict) -> dict:
    """A trainer record as this study reads it: the training phase's rounds, bytes and wall
    time only (evaluation is not part of the exchange being studied)."""
    row = {"epoch": rec["epoch"], "wall_s": rec["wall_s"] - rec["eval_s"],
           "compute_s": rec["compute_s"], "extra": rec["extra"], "loss": rec["loss"],
           "rounds": [r[:6] for r in rec["rounds"] if r[2] == "train"],
           "bytes": {"train": {"sent": rec["bytes"].get("train", {}).get("sent", 0)}}}
    if rec["test_acc"] is not None:
        row.update(test_acc=rec["test_acc"], val_acc=rec["val_acc"])
    return row


def _lan_overlap_saving(per_rank: list[list[dict]], e: int, tier) -> float:
    """Seconds of epoch ``e``'s LAN exchange time hidden behind computation: per exchange
    round, min(its LAN time, the least CPU any rank computed while it was in flight)."""
    inflight: dict[int, list[float]] = {}
    for rk in per_rank:
        for rnd, cpu in (rk[e].get("extra") or {}).get("inflight", []):
            inflight.setdefault(int(rnd), []).append(float(cpu))
    saving = 0.0
    for rnd, cpus in inflight.items():
        if len(cpus) != len(per_rank):
            continue
        hops = crit = 0.0
        for rk in per_rank:
            for r, _kind, phase, sent, recv, h in rk[e]["rounds"]:
                if r == rnd and phase == "train":
                    hops, crit = max(hops, h), max(crit, sent, recv)
        saving += min(tier.seconds(hops, crit), min(cpus))
    return saving


def _lan_exchange(per_rank: list[list[dict]], e: int, tier) -> float:
    """LAN seconds of epoch ``e``'s halo exchanges: per round, the slowest rank's bytes."""
    rounds: dict[int, tuple[float, float]] = {}
    for rk in per_rank:
        for r, kind, phase, sent, recv, h in rk[e]["rounds"]:
            if kind in EXCHANGE_KINDS and phase == "train":
                hops, crit = rounds.get(r, (0.0, 0.0))
                rounds[r] = (max(hops, h), max(crit, sent, recv))
    return sum(tier.seconds(h, c) for h, c in rounds.values())


def summarize(per_rank: list[list[dict]]) -> dict:
    from quietgnn.analysis.projection import epoch_curve, project
    from quietgnn.comm.network import TIERS
    lan = TIERS["lan"]
    for rk in per_rank:      # rank 0's solver runs while the others wait: critical path
        for row in rk:
            row["compute_s"] += (row.get("extra") or {}).get("solve_s", 0.0)
    curve = epoch_curve({k: recs for k, recs in enumerate(per_rank)})
    proj = [p.to_json() for p in project(curve, lan)]
    r0 = per_rank[0]
    E = len(r0)
    evals = [r for r in r0 if "test_acc" in r]
    best = max(evals, key=lambda r: (r["val_acc"], -r["epoch"]))

    def kind_bytes(kinds: set) -> float:
        return statistics.mean(sum(rd[3] for rk in per_rank for rd in rk[e]["rounds"]
                                   if rd[1] in kinds and rd[2] == "train") for e in range(E))

    hist: dict[str, int] = {}
    by_key: dict[str, dict[str, int]] = {}
    by_epoch = []
    span = wait = codec = 0.0
    for e in range(E):
        ep_hist: dict[str, int] = {}
        for rk in per_rank:
            ex = rk[e].get("extra") or {}
            for b, n in (ex.get("bits_hist") or {}).items():
                hist[b] = hist.get(b, 0) + n
                ep_hist[b] = ep_hist.get(b, 0) + n
            for k, h in (ex.get("bits_by_key") or {}).items():
                for b, n in h.items():
                    by_key.setdefault(k, {})[b] = by_key.setdefault(k, {}).get(b, 0) + n
            span += ex.get("exch_span_s", 0.0)
            wait += ex.get("exch_wait_s", 0.0)
            codec += ex.get("codec_s", 0.0)
        by_epoch.append([ep_hist.get(b, 0) for b in ("2", "4", "8", "32")])
    saving = [_lan_overlap_saving(per_rank, e, lan) for e in range(E)]
    # Per round the slowest rank's bytes, like the projection and the hidden share above
    # (rank 0 alone understates it on unbalanced partitions, e.g. METIS on CS).
    lan_exch = statistics.mean(_lan_exchange(per_rank, e, lan) for e in range(E))
    n = E * len(per_rank)
    return {"test_acc": best["test_acc"], "best_epoch": best["epoch"],
            "final_test_acc": evals[-1]["test_acc"],
            "curve": [[r["epoch"], round(r["val_acc"], 4), round(r["test_acc"], 4)]
                      for r in evals],
            "loss": [round(r["loss"], 5) for r in r0],
            "halo_bytes_per_epoch": kind_bytes(HALO_KINDS),
            "assign_bytes_per_epoch": kind_bytes({"adaqp_assign"}),
            "train_bytes_per_epoch": statistics.mean(c.train_bytes for c in curve.epochs),
            "lan_epoch_s": statistics.mean(p["time_s"] for p in proj),
            "lan_epoch_overlap_s": statistics.mean(p["time_s"] - s for p, s in zip(proj, saving)),
            "lan_comm_s": statistics.mean(p["comm_s"] for p in proj),
            "lan_exchange_s": lan_exch, "lan_exchange_slowest": True,
            "lan_hidden_s": statistics.mean(saving),
            "compute_s": statistics.mean(p["compute_s"] for p in proj),
            "wall_s": statistics.mean(max(rk[e]["wall_s"] for rk in per_rank) for e in range(E)),
            "bits_hist": hist, "bits_by_key": by_key, "bits_by_epoch": by_epoch,
            "exch_span_s": span / n, "exch_wait_s": wait / n, "codec_s": codec / n}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10).stdout.strip()
    except Exception:
        return "unknown"


def _epochs_for(ds: str, cfg: str, default: int, overrides: str) -> int:
    """``--epochs-override cs:paper=40,computers=60`` (dataset[:config]=epochs)."""
    best = default
    for item in filter(None, overrides.split(",")):
        key, val = item.split("=")
        d, _, c = key.partition(":")
        if d == ds and c in ("", cfg):
            best = int(val)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="cora,citeseer,synthetic,computers,cs")
    ap.add_argument("--configs", default="small,paper")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--epochs-override", default="",
                    help="per dataset[:config] epochs, e.g. 'cs:paper=40'")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--strategies", default="halo,adaqp")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--overlap-study", action="store_true",
                    help="adaqp with overlap on and off, seed 0, GCN, --overlap-epochs epochs")
    ap.add_argument("--overlap-epochs", type=int, default=10)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--out", default=str(RESULTS), help="results folder")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jpath = out / "adaqp.json"
    data = json.loads(jpath.read_text()) if jpath.exists() else {}
    data.setdefault("runs", {})
    data.setdefault("commands", [])
    if not args.render_only:
        from quietgnn.runtime.spawn import spawn_function
        cmd = "python benchmarks/bench_adaqp.py " + " ".join(sys.argv[1:] if argv is None
                                                             else argv)
        if cmd not in data["commands"]:
            data["commands"].append(cmd)
        if args.overlap_study:
            group, models, seeds = "overlap", ["gcn"], [0]
            strategies = {k: STRATEGIES[k] for k in ("adaqp", "adaqp-no-overlap")}
        else:
            group, models, seeds = "main", args.models.split(","), \
                [int(s) for s in args.seeds.split(",")]
            strategies = {k: STRATEGIES[k] for k in args.strategies.split(",")}
        for ds in args.datasets.split(","):
            for cfg in args.configs.split(","):
                epochs = args.overlap_epochs if args.overlap_study else \
                    _epochs_for(ds, cfg, args.epochs, args.epochs_override)
                for arch in models:
                    for seed in seeds:
                        keys = {lb: f"{group}|{ds}|{cfg}|{arch}|{lb}|{seed}|{epochs}"
                                for lb in strategies}
                        todo = {lb: strategies[lb] for lb, k in keys.items()
                                if k not in data["runs"]}
                        if not todo:
                            continue
                        t0 = time.perf_counter()
                        res = spawn_function(_worker, args.parts, timeout_s=6 * 3600, args=(
                            book_for(ds, args.parts), dict(arch=arch, **CONFIGS[cfg]), seed,
                            todo, epochs, args.eval_every))
                        took = time.perf_counter() - t0
                        for lb in todo:
                            data["runs"][keys[lb]] = dict(summarize([r[lb] for r in res]),
                                                          seconds=took, commit=_commit())
                        print(f"{group} {ds} {cfg} {arch} seed {seed} ({epochs} ep): {took:.0f}s "
                              + " ".join(f"{lb}={data['runs'][keys[lb]]['test_acc']:.4f}"
                                         for lb in todo), flush=True)
                        tmp = jpath.with_suffix(".json.tmp")
                        tmp.write_text(json.dumps(data, indent=1))
                        tmp.replace(jpath)
    (out / "adaqp.md").write_text(report(data))
    return 0


# ---------------------------------------------------------------------- report
def _fmt_b(n: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n:.0f} B"


def _mean(rs: list[dict], k: str) -> float:
    return statistics.mean(r[k] for r in rs)


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _shares(hist: dict) -> tuple[float, float, float]:
    tot = sum(hist.get(b, 0) for b in ("2", "4", "8")) or 1
    return tuple(100 * hist.get(b, 0) / tot for b in ("2", "4", "8"))  # type: ignore


def _merge(hists) -> dict:
    out: dict[str, int] = {}
    for h in hists:
        for b, n in h.items():
            out[b] = out.get(b, 0) + n
    return out


def _groups(data: dict, group: str) -> dict[tuple, dict[str, dict[int, dict]]]:
    out: dict[tuple, dict[str, dict[int, dict]]] = {}
    for key, r in data["runs"].items():
        parts = key.split("|")
        if len(parts) != 7 or parts[0] != group:
            continue
        _, ds, cfg, arch, label, seed, epochs = parts
        out.setdefault((ds, cfg, arch, int(epochs)), {}).setdefault(label, {})[int(seed)] = r
    return out


ORDER = {"cora": 0, "citeseer": 1, "synthetic": 2, "computers": 3, "cs": 4}


def _sortkey(k: tuple) -> tuple:
    return (k[1] != "small", ORDER.get(k[0], 9), k[0], k[2], k[3])


def report(data: dict) -> str:
    main = _groups(data, "main")
    rows, goal = [], {"bytes": [0, 0], "acc": [0, 0], "abs": [0, 0]}
    lines = [
        "# AdaQP vs halo (P = 4, METIS)", "",
        "Produced by `benchmarks/bench_adaqp.py` (exact commands at the end) on the shared "
        "2-core CPU machine: 4 gloo processes, one compute thread each, alongside other "
        "people's work, so measured seconds are noisy; byte counts are exact. adaqp: adaptive "
        "widths, default lam = 0.5 / group size 100 / solver, LAN time model, assignment every "
        "5 epochs (8 bits before the first). Both strategies: same seed, same dropout masks, "
        "same epochs; dropout 0.5, Adam lr 0.01, weight decay 5e-4.", "",
        "* **acc**: test accuracy at the best validation epoch (evaluated every 5 epochs, fp32 "
        "messages), mean over seeds; **delta**: adaqp - halo in points, mean over seeds "
        "+- standard deviation of the per-seed (paired) differences.",
        "* **halo msgs B/ep**: bytes of halo messages sent per epoch, summed over ranks "
        "(adaqp: quantized rows + bit-assignment traffic); **ratio** = halo / adaqp (goal: >= "
        "4x). **total ratio**: all training bytes, including the fp32 gradient all-reduce "
        "that adaqp does not compress.",
        "* **LAN ep**: projected epoch time at 1 Gbit/s, 0.5 ms per hop = measured CPU compute "
        "(slowest rank) + modelled communication; adaqp without and with credit for overlap "
        "(per exchange, min(LAN time, CPU computed while it was in flight)). **ratio** = halo / "
        "adaqp (> 1: adaqp faster). **LAN comm ratio**: communication alone.", ""]
    for cfg_name, title in (("small", "2 layers, hidden 64"), ("paper", "3 layers, hidden 256, "
                                                                         "LayerNorm (paper)")):
        sel = {k: g for k, g in main.items() if k[1] == cfg_name and "halo" in g
               and "adaqp" in g}
        if not sel:
            continue
        lines += [f"## {title}", "",
                  "| dataset | model | epochs | seeds | halo acc | adaqp acc | delta (pts) | "
                  "halo msgs B/ep: halo | adaqp | ratio | total ratio | LAN ep halo | adaqp "
                  "no overlap | adaqp overlap | LAN ep ratio (overlap) | LAN comm ratio | "
                  "2/4/8-bit % |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k in sorted(sel, key=_sortkey):
            ds, cfg, arch, ep = k
            g = sel[k]
            seeds = sorted(set(g["halo"]) & set(g["adaqp"]))
            if not seeds:
                continue
            h = [g["halo"][s] for s in seeds]
            a = [g["adaqp"][s] for s in seeds]
            deltas = [100 * (x["test_acc"] - y["test_acc"]) for x, y in zip(a, h)]
            d = statistics.mean(deltas)
            br = _mean(h, "halo_bytes_per_epoch") / _mean(a, "halo_bytes_per_epoch")
            tr = _mean(h, "train_bytes_per_epoch") / _mean(a, "train_bytes_per_epoch")
            s2, s4, s8 = _shares(_merge(r["bits_hist"] for r in a))
            goal["bytes"][0] += br >= 4
            goal["bytes"][1] += 1
            if len(seeds) >= 3:
                goal["acc"][0] += d >= -0.3
                goal["acc"][1] += 1
                goal["abs"][0] += abs(d) <= 0.3
            rows.append((k, d, br))
            lines.append(
                f"| {ds} | {arch} | {ep} | {len(seeds)} | {100 * _mean(h, 'test_acc'):.2f} | "
                f"{100 * _mean(a, 'test_acc'):.2f} | {d:+.2f} +- {_sd(deltas):.2f} | "
                f"{_fmt_b(_mean(h, 'halo_bytes_per_epoch'))} | "
                f"{_fmt_b(_mean(a, 'halo_bytes_per_epoch'))} | {br:.2f}x | {tr:.2f}x | "
                f"{1e3 * _mean(h, 'lan_epoch_s'):.1f} ms | {1e3 * _mean(a, 'lan_epoch_s'):.1f} ms "
                f"| {1e3 * _mean(a, 'lan_epoch_overlap_s'):.1f} ms | "
                f"{_mean(h, 'lan_epoch_s') / _mean(a, 'lan_epoch_overlap_s'):.2f}x | "
                f"{_mean(h, 'lan_comm_s') / _mean(a, 'lan_comm_s'):.2f}x | "
                f"{s2:.0f} / {s4:.0f} / {s8:.0f} |")
        lines.append("")
    if rows:
        lines += ["## Goals", "",
                  f"* halo-message bytes >= 4x fewer than halo: {goal['bytes'][0]} of "
                  f"{goal['bytes'][1]} rows (lowest ratio {min(r[2] for r in rows):.2f}x).",
                  f"* test accuracy at most 0.3 points below halo (rows with 3 seeds): "
                  f"{goal['acc'][0]} of {goal['acc'][1]}; |delta| <= 0.3 (above counts too): "
                  f"{goal['abs'][0]} of {goal['acc'][1]} (mean delta over rows "
                  f"{statistics.mean(r[1] for r in rows):+.2f} points, worst "
                  f"{min(r[1] for r in rows):+.2f}).", ""]
    lines += _histogram_section(main)
    lines += _overlap_section(data, main)
    lines += ["## Commands", "", "Results are merged over these invocations (the JSON holds "
              "every run, with its git commit and seconds):", ""]
    lines += [f"    {c}" for c in data.get("commands", [])]
    lines.append("")
    return "\n".join(lines)


def _bar(pct: float, width: int = 40) -> str:
    return "#" * round(pct * width / 100)


def _histogram_section(main: dict) -> list[str]:
    runs = [(k, r) for k, g in main.items() for r in g.get("adaqp", {}).values()]
    if not runs:
        return []
    lines = ["## Bit-width histogram (adaqp, rows sent over training, all ranks and seeds)", ""]
    for cfg in ("small", "paper"):
        sel = [r for k, r in runs if k[1] == cfg]
        if not sel:
            continue
        tot = _merge(r["bits_hist"] for r in sel)
        n = sum(tot.get(b, 0) for b in ("2", "4", "8"))
        lines += [f"{cfg}: {n:,} rows", "", "```"]
        for b, pct in zip(("2", "4", "8"), _shares(tot)):
            lines.append(f"{b} bit | {_bar(pct):<40} {pct:5.1f}%")
        lines += ["```", ""]
    lines += ["Per exchange (`f<l>`: input of layer l forward, `b<l>`: its gradient backward), "
              "2/4/8-bit % over training, all seeds and both models:", "",
              "| dataset | config | " + " | ".join(f"f{i}" for i in range(3)) + " | " +
              " | ".join(f"b{i}" for i in (1, 2)) + " |", "|---|---|---|---|---|---|---|"]
    by: dict[tuple, dict[str, list]] = {}
    for k, r in runs:
        for key, h in r["bits_by_key"].items():
            by.setdefault((k[0], k[1]), {}).setdefault(key, []).append(h)
    for ds, cfg in sorted(by, key=lambda x: (x[1] != "small", ORDER.get(x[0], 9))):
        cells = []
        for key in ("f0", "f1", "f2", "b1", "b2"):
            hs = by[(ds, cfg)].get(key)
            cells.append(" / ".join(f"{s:.0f}" for s in _shares(_merge(hs))) if hs else "-")
        lines.append(f"| {ds} | {cfg} | " + " | ".join(cells) + " |")
    lines += ["", "Over the epochs (2/4/8-bit % of the rows sent in each epoch window, all "
              "datasets, models and seeds of a config; epochs 0-4 are the 8-bit warm-up):", "",
              "| config | " + " | ".join(["ep 0-4", "5-9", "10-19", "20-49", "50-"]) + " |",
              "|---|---|---|---|---|---|"]
    for cfg in ("small", "paper"):
        sel = [r for k, r in runs if k[1] == cfg]
        if not sel:
            continue
        cells = []
        for lo, hi in ((0, 5), (5, 10), (10, 20), (20, 50), (50, 10 ** 6)):
            acc = [0, 0, 0, 0]
            for r in sel:
                for row in r["bits_by_epoch"][lo:hi]:
                    acc = [x + y for x, y in zip(acc, row)]
            t = sum(acc[:3])
            cells.append(" / ".join(f"{100 * x / t:.0f}" for x in acc[:3]) if t else "-")
        lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
    return lines + [""]


def _overlap_section(data: dict, main: dict) -> list[str]:
    lines = ["## Overlap", "",
             "How much communication the central-rows-first order hides. **LAN**: exchange "
             "time of halo messages projected at 1 Gbit/s / 0.5 ms per epoch, and the part of it "
             "hidden behind the CPU each rank computed while the exchange was in flight (the "
             "slowest-rank figure per exchange; mean over seeds and models). **here**: measured "
             "on this machine per rank and epoch, seconds the exchanges were in flight and "
             "seconds the rank sat blocked in `wait()`; hidden = 1 - blocked / in flight.", "",
             "| dataset | config | LAN exchange (adaqp) | LAN hidden | hidden % | here: in flight "
             "| blocked | hidden % |", "|---|---|---|---|---|---|---|---|"]
    agg: dict[tuple, list] = {}
    for k, g in main.items():
        agg.setdefault((k[0], k[1]), []).extend(g.get("adaqp", {}).values())
    for ds, cfg in sorted(agg, key=lambda x: (x[1] != "small", ORDER.get(x[0], 9))):
        rs = agg[(ds, cfg)]
        if not rs:
            continue
        ex, hid = _mean(rs, "lan_exchange_s"), _mean(rs, "lan_hidden_s")
        sp, wt = _mean(rs, "exch_span_s"), _mean(rs, "exch_wait_s")
        # Runs recorded before the exchange column took the slowest rank per round carry
        # rank 0's figure: flag them rather than mix the two silently.
        old = "" if all(r.get("lan_exchange_slowest") for r in rs) else " *"
        lines.append(f"| {ds} | {cfg} | {1e3 * ex:.2f} ms{old} | {1e3 * hid:.2f} ms | "
                     f"{100 * hid / ex if ex else 0:.0f}% | {1e3 * sp:.1f} ms | {1e3 * wt:.1f} ms "
                     f"| {100 * (1 - wt / sp) if sp else 0:.0f}% |")
    if any(not r.get("lan_exchange_slowest") for rs in agg.values() for r in rs):
        lines += ["", "\\* LAN exchange of runs recorded before the fix: rank 0's bytes per "
                  "round instead of the slowest rank's, so it understates the exchange where "
                  "rank 0 is not the busiest (hidden % can then exceed 100)."]
    ov = _groups(data, "overlap")
    if ov:
        lines += ["", "Overlap on vs off (`--overlap-study`: adaqp adaptive, GCN, seed 0; "
                  "measured step = wall seconds of the training step, slowest rank):", "",
                  "| dataset | config | epochs | off: in flight / blocked / step | on: in flight "
                  "/ blocked / step | LAN ep off | LAN ep on (overlap credit) | test acc off / "
                  "on |", "|---|---|---|---|---|---|---|---|"]
        for k in sorted(ov, key=_sortkey):
            g = ov[k]
            if "adaqp" not in g or "adaqp-no-overlap" not in g:
                continue
            on, off = g["adaqp"][0], g["adaqp-no-overlap"][0]

            def f(r: dict) -> str:
                return (f"{1e3 * r['exch_span_s']:.1f} / {1e3 * r['exch_wait_s']:.1f} / "
                        f"{1e3 * r['wall_s']:.0f} ms")
            lines.append(f"| {k[0]} | {k[1]} | {k[3]} | {f(off)} | {f(on)} | "
                         f"{1e3 * off['lan_epoch_overlap_s']:.1f} ms | "
                         f"{1e3 * on['lan_epoch_overlap_s']:.1f} ms | "
                         f"{100 * off['test_acc']:.1f} / {100 * on['test_acc']:.1f} |")
    return lines + [""]


if __name__ == "__main__":
    sys.exit(main())
