"""``quietgnn report``: tables and plots from benchmark results.

::

    quietgnn report bench-out/results.jsonl --out bench-out/report
    quietgnn report bench-out --out report --tier metro:10G:2ms --target-frac 0.95

Inputs: ``results.jsonl`` / ``results/*.json`` of ``quietgnn bench`` (or its output folder),
or ``summary.json`` files of single ``quietgnn train`` runs. Per-epoch data comes from the
result's stored curve, or from the run directory's ``metrics/`` (the summary's ``run_dir``).

Output in ``--out``: ``report.md`` (one table per dataset x model), ``report.json`` (the same
numbers), and per dataset x model three PNGs (:mod:`quietgnn.analysis.plots`): accuracy vs
cumulative training bytes, accuracy vs projected training time on every tier, per-epoch time
breakdown.

Definitions (see :mod:`quietgnn.analysis.projection` for the projection):

* test acc: at the best validation epoch, mean +- std over seeds; delta in points vs
  ``centralized`` on the same dataset and model.
* training bytes/epoch: bytes sent in phase ``train``, summed over ranks (phase ``data`` is
  shown separately when any run has it); eval bytes/epoch: the same of phase ``eval`` (every
  evaluation the run made, the final exact one included), and its ratio to training's. Every
  per-epoch figure is per *epoch-equivalent* (one pass over the training set,
  :attr:`EpochResult.work`): the same as per epoch for every strategy but ``tma``, whose
  trainer epoch is an averaging period of many passes.
* projected times include the evaluations the run made (their compute and rounds).
* time to accuracy: projected training time until test accuracy first reaches the target,
  default ``--target-frac`` 0.98 x centralized's test accuracy; mean over the seeds that reach
  it (``k/n`` shown when not all do).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional, Sequence

from ..comm.network import Tier, resolve_tiers
from ..runtime.outputs import outermost_missing, remove_made
from ..safefiles import below, check_below, write_below
from .inputs import load_results, with_curve as _with_curve
from .matrix import UNCAPPED, Result
from .tables import BASELINE, REFERENCE, markdown
from .projection import (Curve, curve_work as _work, measured_epoch_s,
                         measured_time_to_accuracy, project, time_to_accuracy)

__all__ = ["load_results", "build_report", "Report", "Group", "Row", "cli_main"]

# ---------------------------------------------------------------------- numbers
@dataclasses.dataclass
class Reach:
    """Projected time to the target on one tier, over a row's seeds."""

    seconds: Optional[float]           #: mean over the seeds that reached it
    reached: int
    of: int
    epoch: Optional[float]             #: the mean epoch it was reached at


@dataclasses.dataclass
class Row:
    """One strategy label x P of a group: the mean over its seeds (``report.json``)."""

    strategy: str
    strategy_name: str
    parts: int
    run_ids: list[str]
    seeds: int
    test_acc: Optional[float]
    test_acc_std: float
    train_bytes_per_epoch: Optional[float]
    data_bytes_per_epoch: float
    eval_bytes_per_epoch: float
    eval_train_ratio: Optional[float]
    compute_s_per_epoch: Optional[float]
    peak_rss_mb: float
    epochs: Optional[float]
    epoch_s: dict[str, Optional[float]]            #: projected seconds per epoch, by tier
    tta: dict[str, Optional[Reach]]                #: time to the target, by tier
    delta_acc: Optional[float] = None              #: test accuracy less centralized's
    bytes_ratio: Optional[float] = None            #: training bytes per epoch over halo's
    tta_ratio: dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
    #: on emulated hosts (``quietgnn bench --links``): the link, and measured seconds per
    #: epoch (training) and to the target beside their projection on the link (no latency;
    #: the hosts sharing this machine's cores, as they ran)
    link: Optional[str] = None
    #: training bytes per epoch-equivalent by message kind (:attr:`Curve.train_bytes_by_kind`)
    bytes_by_kind: dict[str, float] = dataclasses.field(default_factory=dict)
    #: bytes sent over the whole run (set-up, training, evaluation) by traffic class, all
    #: ranks, mean over seeds (:attr:`RunSummary.bytes_sent_by_class`): what left the sites
    bytes_by_class: dict[str, float] = dataclasses.field(default_factory=dict)
    measured_epoch_s: Optional[float] = None
    link_epoch_s: Optional[float] = None
    #: runs on GPUs: the most any rank's tensors held on its device (MiB)
    peak_gpu_mb: Optional[float] = None
    measured_tta_s: Optional[float] = None
    link_tta_s: Optional[float] = None
    #: its runs selected on each rank's own graph (``train.eval_mode local``, P > 1): their
    #: curves' accuracy is not the exact one the target is, so their time to it may be late
    local_curve: bool = False

    def tta_s(self, tier: str) -> Optional[float]:
        t = self.tta.get(tier)
        return t.seconds if t else None


@dataclasses.dataclass
class Group:
    """One dataset x model: its rows, centralized's accuracy and the target."""

    dataset: str
    model: str
    reference_acc: Optional[float]
    target_acc: Optional[float]
    rows: list[Row]


@dataclasses.dataclass
class Report:
    """What ``report.json`` holds."""

    groups: list[Group]
    tiers: dict[str, dict[str, Any]]
    target_frac: float
    target_acc: Optional[float]
    failed: list[dict[str, str]]
    #: the what-if of ``--compute-speedup``: projected compute that many times faster
    compute_speedup: float = 1.0
    #: ``--with-setup``: time to accuracy counts the set-up's communication too
    with_setup: bool = False
    #: ``--without-eval``: projected times leave the evaluations out
    without_eval: bool = False
    #: ``--by-class``: the markdown adds each group's bytes by traffic class, whole run
    by_class: bool = False
    plots: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _mean(xs: Sequence[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


def _training_only(c: Curve) -> Curve:
    """``c`` with its evaluations' compute and rounds left out (``--without-eval``)."""
    return dataclasses.replace(c, epochs=[dataclasses.replace(
        p, eval_compute_s=0.0, eval_compute_sum_s=0.0, eval_cpu_sum_s=0.0, eval_hops=0.0,
        eval_crit_bytes=0.0) for p in c.epochs])


def _row(label: str, parts: int, runs: list[Result], tiers: dict[str, Tier],
         target: Optional[float], link: Optional[str] = None, speedup: float = 1.0,
         with_setup: bool = False, without_eval: bool = False) -> Row:
    accs = [r.summary.test_acc for r in runs]
    curves = [r.curve for r in runs if r.curve is not None and r.curve.epochs]
    projected = [_training_only(c) for c in curves] if without_eval else curves
    per_epoch = [c.epochs for c in curves]
    row = Row(
        strategy=label, strategy_name=runs[0].name, parts=parts, run_ids=[r.id for r in runs],
        seeds=len(runs), test_acc=_mean(accs),
        test_acc_std=statistics.stdev(accs) if len(accs) > 1 else 0.0,
        train_bytes_per_epoch=_mean([r.summary.train_bytes_per_epoch for r in runs]),
        data_bytes_per_epoch=_mean([sum(e.data_bytes or 0 for e in ep) / _work(ep)
                                    for ep in per_epoch]) or 0.0,
        eval_bytes_per_epoch=_mean([sum(e.eval_bytes or 0 for e in ep) / _work(ep)
                                    for ep in per_epoch]) or 0.0,
        eval_train_ratio=_mean([_ratio(sum(e.eval_bytes or 0 for e in ep),
                                       sum(e.train_bytes for e in ep)) for ep in per_epoch]),
        compute_s_per_epoch=_mean([sum(e.compute_s for e in ep) / _work(ep)
                                   for ep in per_epoch]),
        peak_rss_mb=max(r.summary.peak_rss_mb or 0.0 for r in runs),
        peak_gpu_mb=max((r.summary.peak_gpu_mb for r in runs
                         if r.summary.peak_gpu_mb is not None), default=None),
        epochs=_mean([r.summary.epochs for r in runs]), epoch_s={}, tta={},
        local_curve=parts > 1 and any(r.summary.selected_by == "local" for r in runs))
    kinds = [c.train_bytes_by_kind for c in curves if c.train_bytes_by_kind]
    for k in sorted({k for d in kinds for k in d}):
        row.bytes_by_kind[k] = sum(d.get(k, 0.0) for d in kinds) / len(kinds)
    classes = [r.summary.bytes_sent_by_class or {} for r in runs]
    for c in sorted({c for d in classes for c in d}):
        row.bytes_by_class[c] = sum(d.get(c, 0) for d in classes) / len(classes)
    for name, tier in tiers.items():
        row.epoch_s[name] = _mean([sum(p.time_s for p in project(c, tier, None, speedup)) /
                                   _work(c.epochs) for c in projected])
        if target is None or not curves:
            row.tta[name] = None
            continue
        hits = [time_to_accuracy(c, tier, target, None, speedup) for c in projected]
        got = [(h, c) for h, c in zip(hits, projected) if h]
        row.tta[name] = Reach(seconds=_mean([h.cum_s + (_setup_s(c, tier) if with_setup else 0.0)
                                             for h, c in got]), reached=len(got),
                              of=len(hits), epoch=_mean([h.epoch for h, _ in got]))
    if link:
        _measured_on(row, link, runs, target)
    return row


def _setup_s(c: Curve, tier: Tier) -> float:
    """The set-up's communication on ``tier`` (e.g. ``halo``'s static inputs, fetched once)."""
    return tier.seconds(c.setup.hops or 0, c.setup.crit_bytes or 0) if c.setup else 0.0


def _measured_on(row: Row, link: str, runs: list[Result], target: Optional[float]) -> None:
    """``row``'s measured seconds on its emulated hosts and their projection on the link."""
    from ..runtime.netcluster import rate_bps
    tier = Tier(link, rate_bps(link) if link != UNCAPPED else 1e15, 0.0)
    row.link, row.strategy = link, runs[0].row_label
    curves = [(r.curve, r.host_cores) for r in runs if r.curve is not None and r.curve.epochs]
    row.measured_epoch_s = _mean([measured_epoch_s(c) for c, _ in curves])

    def training(c: Any, cores: Optional[int]) -> float:   # as measured: evaluation aside
        eps = project(c, tier, cores)
        return sum(p.compute_s + p.comm_s for p in eps[1:] or eps) / \
            _work(c.epochs[1:] or c.epochs)
    row.link_epoch_s = _mean([training(c, cores) for c, cores in curves])
    if target is not None:
        row.measured_tta_s = _mean([measured_time_to_accuracy(c, target) for c, _ in curves])
        hits = [time_to_accuracy(c, tier, target, cores) for c, cores in curves]
        row.link_tta_s = _mean([h.cum_s if h else None for h in hits])


def build_report(results: Sequence[Result | dict[str, Any]], tiers: dict[str, Tier], *,
                 target_frac: float = 0.98, target_acc: Optional[float] = None,
                 reference: Sequence[Result | dict[str, Any]] = (),
                 compute_speedup: float = 1.0, with_setup: bool = False,
                 without_eval: bool = False) -> Report:
    """Group ok results by dataset x model, rows by strategy label x parts, with
    reference-relative numbers; ``compute_speedup``: the projections' what-if (emulated
    hosts' measured seconds stay as measured); ``with_setup``: time to accuracy counts the
    set-up's communication; ``without_eval``: projections leave the evaluations out (where
    they are the study's instrument, not the user's cost)."""
    results = [_with_curve(Result.from_json(r)) for r in results]
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    groups: dict[tuple[str, str], dict[tuple[str, int, Optional[str]], list[Result]]] = \
        defaultdict(lambda: defaultdict(list))
    for r in ok:    # a run on emulated hosts is a row of its link's
        groups[(r.dataset, r.model)][(r.strategy, int(r.parts), r.link)].append(r)
    refs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in [Result.from_json(x) for x in reference] + ok:
        if r.ok and r.name == REFERENCE:
            refs[(r.dataset, r.model)].append(r.summary.test_acc)
    out_groups = []
    for (ds, model), by_label in groups.items():   # in the results' order (the matrix's)
        ref_acc = _mean(refs.get((ds, model), []))
        target = target_acc if target_acc is not None else \
            (target_frac * ref_acc if ref_acc is not None else None)
        rows = {key: _row(*key[:2], runs, tiers, target, key[2], compute_speedup, with_setup,
                          without_eval)
                for key, runs in by_label.items()}
        # the baseline is the run labelled `halo`; a variant of it (e.g. `halo-vanilla`) only
        # where no plain one ran at that P (and link)
        halos: dict[tuple[int, Optional[str]], Row] = {}
        for (lbl, p, link), s in rows.items():
            if s.strategy_name == BASELINE and ((p, link) not in halos or lbl == BASELINE):
                halos[(p, link)] = s
        for (label, parts, link), st in rows.items():
            # else the one halo on this link at another P (centralized's P = 1), if one
            same_link = [h for (_, lnk), h in halos.items() if lnk == link]
            base = halos.get((parts, link)) or (same_link[0] if len(same_link) == 1 else None)
            st.delta_acc = None if ref_acc is None or st.test_acc is None else \
                st.test_acc - ref_acc
            st.bytes_ratio = _ratio(st.train_bytes_per_epoch,
                                    base and base.train_bytes_per_epoch)
            st.tta_ratio = {t: _ratio(st.tta_s(t), base and base.tta_s(t)) for t in tiers}
        order = sorted(rows.values(), key=lambda s: (s.strategy_name != REFERENCE,
                                                     s.strategy_name != BASELINE,
                                                     s.strategy, s.parts))
        out_groups.append(Group(dataset=ds, model=model, reference_acc=ref_acc,
                                target_acc=target, rows=order))
    return Report(groups=out_groups, tiers={n: vars(t) for n, t in tiers.items()},
                  target_frac=target_frac, target_acc=target_acc, compute_speedup=compute_speedup,
                  with_setup=with_setup, without_eval=without_eval,
                  failed=[{"id": r.id, "error": (r.error or "unknown error")
                           .strip().splitlines()[0][:400], "tail": (r.error or "")[-2000:]}
                          for r in failed])


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---------------------------------------------------------------------- command line
def cli_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="quietgnn report", description="Markdown tables and PNG "
                                 "plots from `quietgnn bench` results or run summaries.")
    ap.add_argument("results", nargs="+", help="run directories, bench output folders, "
                    "results.jsonl, or result/summary JSON files")
    ap.add_argument("--out", help="output folder (report.md, report.json, PNGs); default "
                    "DIR/report when the only input is a directory DIR")
    ap.add_argument("--tier", action="append", default=[], metavar="NAME:BW:LAT",
                    help="extra network tier, e.g. metro:10G:2ms (repeatable)")
    ap.add_argument("--table-tiers", default="lan,wan", help="tiers with time-to-accuracy "
                    "columns in the table (default lan,wan)")
    ap.add_argument("--target-frac", type=float, default=0.98, help="target = this fraction of "
                    "centralized test accuracy (default 0.98)")
    ap.add_argument("--target-acc", type=float, help="absolute target test accuracy instead")
    ap.add_argument("--reference", action="append", default=[], help="results holding the "
                    "centralized reference runs, if not among RESULTS")
    ap.add_argument("--compute-speedup", type=float, default=1.0, metavar="K",
                    help="what-if: project every run's compute K times faster than measured "
                    "(an accelerator's), bytes, rounds and epochs as counted (default 1)")
    ap.add_argument("--with-setup", action="store_true", help="count each run's set-up "
                    "communication (e.g. halo's static inputs, fetched once) in its time to "
                    "accuracy")
    ap.add_argument("--without-eval", action="store_true", help="leave the evaluations' "
                    "compute and traffic out of projected times (where a study evaluates "
                    "more often than a user would)")
    ap.add_argument("--by-class", action="store_true", help="add each group's bytes sent "
                    "over the whole run by traffic class (features, embeddings, gradients, "
                    "...): what left each rank's site, e.g. under runtime.residency")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(list(argv))
    try:
        if not 0 < args.target_frac <= 1:
            raise ValueError(f"--target-frac {args.target_frac}; expected a fraction of "
                             f"centralized's test accuracy in (0, 1], like 0.98 (--target-acc "
                             f"sets an absolute target)")
        if args.target_acc is not None and not 0 < args.target_acc <= 1:
            raise ValueError(f"--target-acc {args.target_acc}; expected a test accuracy in "
                             f"(0, 1], like 0.8 (a fraction, not a percentage)")
        if not args.compute_speedup > 0:
            raise ValueError(f"--compute-speedup {args.compute_speedup}; expected a factor > 0 "
                             f"(e.g. 10: compute 10 times faster than measured)")
        tiers = resolve_tiers(args.tier)
        table_tiers = [t.strip() for t in args.table_tiers.split(",") if t.strip()]
        for t in table_tiers:
            if t not in tiers:
                raise ValueError(f"--table-tiers: unknown tier {t!r}; known: {list(tiers)}")
        for p in args.results + args.reference:     # before --out, which they decide
            if not os.path.lexists(p):
                raise ValueError(f"results path {p!r} does not exist; pass run directories, "
                                 f"`quietgnn bench` output folders or result files")
        if args.out is None:
            if len(args.results) != 1 or not Path(args.results[0]).is_dir():
                raise ValueError("--out is needed unless the only input is a run or bench "
                                 "directory (the report then goes to DIR/report)")
            args.out = str(Path(args.results[0]) / "report")
        # a bad input leaves no --out folder made; a reference of another graph is refused
        results = load_results(args.results, check_with=args.reference)
        reference = load_results(args.reference) if args.reference else []
        made = outermost_missing(Path(args.out))
        root, parts = _out_place(args.out, args.results + args.reference)
    except ValueError as exc:
        print(f"quietgnn report: error: {exc}", file=sys.stderr)
        return 2
    rep = build_report(results, tiers, target_frac=args.target_frac, target_acc=args.target_acc,
                       reference=reference, compute_speedup=args.compute_speedup,
                       with_setup=args.with_setup, without_eval=args.without_eval)
    rep.by_class = args.by_class
    out = Path(args.out)

    written: list[str] = []

    def open_out(name: str) -> Any:
        written.append(name)
        return write_below(root, parts + [name], _OUT_FIX)
    try:
        plots: dict[str, list[str]] = {}
        if not args.no_plots:
            from .plots import plot_group
            for g in rep.groups:
                plots[f"{g.dataset}/{g.model}"] = plot_group(g, results, tiers, out,
                                                             args.compute_speedup, open_out)
        md = markdown(rep, table_tiers, plots)
        with open_out("report.md") as f:
            f.write(md.encode())
        rep.plots = plots
        with open_out("report.json") as f:
            f.write(json.dumps(rep.to_json(), indent=1, default=str).encode())
    except ValueError as exc:      # a link or a file planted since the check
        print(f"quietgnn report: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:         # safefiles.WriteError: a full disk, a read-only folder
        if made is not None:       # a folder this report made: no half report left in it
            for name in written:
                with contextlib.suppress(OSError):
                    (out / name).unlink()
            remove_made(((out, made),))
        print(f"quietgnn report: error: {exc}", file=sys.stderr)
        return 1
    print(md)
    local = sorted({f"{g.dataset}/{g.model} {r.strategy}" for g in rep.groups for r in g.rows
                    if r.local_curve})
    if local and table_tiers:
        print(f"quietgnn report: note: {len(local)} row(s) evaluated locally during training "
              f"(train.eval_mode local; e.g. {local[0]}): their time to accuracy may be late "
              f"(‡ in report.md); rerun with --train.eval_mode exact to compare it",
              file=sys.stderr)
    print(f"quietgnn report: {out / 'report.md'}, {out / 'report.json'}, "
          f"{sum(len(v) for v in plots.values())} plot(s)", file=sys.stderr)
    return 0


_OUT_FIX = ", or pass --out a folder outside the results' folders"


def _out_place(out: str, inputs: Sequence[str]) -> tuple[str, list[str]]:
    """Where the report's files go, as ``(root, parts)`` for :func:`safefiles.write_below`,
    checked before the work. Inside an input's folder (a run directory, a bench folder: the
    default ``DIR/report``), from that folder down: a link planted there (``report`` -> a
    folder elsewhere) is refused, never followed. Elsewhere, from ``--out`` itself: a folder
    the user named, which may be a link they made (followed), made when missing."""
    # a bench folder's own results.jsonl stands for its folder; any other file's folder (the
    # working directory, often) is the user's, where --out may be a link they made
    folders = [str(p if p.is_dir() else p.parent) for p in map(Path, inputs)
               if p.is_dir() or p.name == "results.jsonl"]
    inside = [(f, below(f, out)) for f in folders]
    inside = [(f, parts) for f, parts in inside if parts is not None]
    if inside:
        root, parts = max(inside, key=lambda fp: len(fp[1]))    # the outermost folder
        check_below(root, parts + ["report.md"], _OUT_FIX)
        return root, parts
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out!r} is a file; expected a folder for report.md, "
                         f"report.json and the plots: name another")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out!r}: cannot make the folder ({exc.strerror or exc}); "
                         f"name a folder you can write") from None
    return out, []
