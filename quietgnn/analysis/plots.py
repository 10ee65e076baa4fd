"""The three PNGs per dataset x model of ``quietgnn report`` (split out of
:mod:`quietgnn.analysis.report`, which builds the numbers): accuracy vs cumulative training bytes,
accuracy vs projected time per tier, per-epoch time breakdown."""

from __future__ import annotations

import math
from pathlib import Path
from typing import IO, Any, Callable, ContextManager, Optional

from ..comm.network import Tier
from ..safefiles import write_below
from ..runtime.metrics import human_bytes
from .matrix import Result
from .projection import Curve, curve_work as _work, project
from .report import Group

__all__ = ["plot_group"]


def _mean_curve(curves: list[Curve], key: Any) -> tuple[list[float], list[float]]:
    """Mean over seeds of (x = key(epoch rows up to e), test acc) on evaluated epochs."""
    n = min(len(c.epochs) for c in curves)
    xs, ys = [], []
    xcols = [key(c) for c in curves]
    for e in range(n):
        accs = [c.epochs[e].test_acc for c in curves]
        if any(a is None for a in accs):
            continue
        xs.append(sum(x[e] for x in xcols) / len(xcols))
        ys.append(sum(accs) / len(accs))
    return xs, ys


def _cum(vals: list[float]) -> list[float]:
    out, s = [], 0.0
    for v in vals:
        s += v
        out.append(s)
    return out


def _log_x(ax: Any, fmt: Any = None) -> None:
    """Log x axis labelled at 1, 2, 5 x 10^k in plain units (default minor labels collide)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    wide = lo > 0 and hi / lo > 1e3      # over three decades: label the powers of ten only
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: (fmt or (lambda x: f"{x:g}"))(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_group(g: Group, results: list[Result], tiers: dict[str, Tier],
               out: Path, speedup: float = 1.0,
               open_out: Optional[Callable[[str], ContextManager[IO[bytes]]]] = None
               ) -> list[str]:
    """The group's PNGs in ``out`` (their paths); ``open_out(name)`` opens one to write
    (default :func:`~quietgnn.safefiles.write_below` in ``out``: never through a link there)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[tuple[str, int], list[Curve]] = {(r.strategy, int(r.parts)): [] for r in g.rows}
    for r in results:   # a run on emulated hosts is its link's row ("halo @ 100mbit")
        key = (r.row_label, int(r.parts))
        if r.ok and r.dataset == g.dataset and r.model == g.model and key in runs and r.curve:
            runs[key].append(r.curve)
    stem = f"{g.dataset}-{g.model}".replace("/", "_")
    label = lambda k: f"{k[0]} (P={k[1]})"  # noqa: E731
    color = {k: f"C{i % 10}" for i, k in enumerate(runs)}   # one colour per row, every plot
    files = []

    def finish(fig: Any, name: str) -> None:
        fname = f"{stem}-{name}.png"
        try:
            fig.tight_layout()
            with (open_out or (lambda n: write_below(out, [n])))(fname) as f:
                fig.savefig(f, format="png", dpi=110)
        finally:
            plt.close(fig)
        files.append(str(out / fname))

    def target_lines(ax: Any) -> None:
        if g.target_acc is not None:
            ax.axhline(g.target_acc, color="grey", ls=":", lw=1, label="target")

    # accuracy vs cumulative training bytes
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, curves in runs.items():
        if not curves:
            continue
        xs, ys = _mean_curve(curves, lambda c: _cum([e.train_bytes + (e.data_bytes or 0)
                                                     for e in c.epochs]))
        if xs and max(xs) > 0:
            # a curve of a few evaluations (tma: one per averaging period) needs markers
            ax.plot([max(x, 1.0) for x in xs], ys, label=label(k), lw=1.5, color=color[k],
                    marker="o" if len(xs) <= 5 else None)
        elif ys:
            ax.axhline(max(ys), ls="--", lw=1, color=color[k],
                       label=f"{label(k)}: no traffic (max test acc {max(ys):.3f})")
    target_lines(ax)
    _log_x(ax, lambda v: human_bytes(v, digits=2).replace(".00 ", " "))
    ax.set_xlabel("cumulative training bytes (all ranks, sent)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{g.dataset} / {g.model}: accuracy vs traffic")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    finish(fig, "acc_vs_bytes")

    # accuracy vs projected time, one panel per tier
    n = len(tiers)
    cols = min(3, n)
    rows_ = math.ceil(n / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.6 * cols, 3.6 * rows_), squeeze=False)
    for ax, (tname, tier) in zip(axes.flat, tiers.items()):
        for k, curves in runs.items():
            if curves:
                xs, ys = _mean_curve(curves, lambda c: [p.cum_s for p in
                                                        project(c, tier, None, speedup)])
                ax.plot(xs, ys, label=label(k), lw=1.3, color=color[k],
                        marker="o" if len(xs) <= 5 else None)
        target_lines(ax)
        _log_x(ax)
        ax.set_title(tier.describe(), fontsize=10)
        ax.set_xlabel("projected training time (s)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{g.dataset} / {g.model}: accuracy vs projected time")
    finish(fig, "acc_vs_time")

    # per-epoch time breakdown: measured (left), projected on each tier (right)
    keys = [k for k, c in runs.items() if c]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 0.6 * len(keys) + 2.2))
    parts = {"compute": [], "comm": [], "eval": [], "other": []}
    for k in keys:
        eps = [e for c in runs[k] for e in c.epochs]
        w = _work(eps)
        comp = sum(e.compute_s for e in eps) / w
        comm = sum(e.comm_s for e in eps) / w
        ev = sum(e.eval_s for e in eps) / w
        wall = sum(e.wall_s for e in eps) / w
        for name, v in zip(parts, (comp, comm, ev, max(0.0, wall - comp - comm - ev))):
            parts[name].append(v)
    left = [0.0] * len(keys)
    for name, vals in parts.items():
        a1.barh(range(len(keys)), vals, left=left, label=name)
        left = [a + b for a, b in zip(left, vals)]
    a1.set_yticks(range(len(keys)), [label(k) for k in keys], fontsize=8)
    a1.set_xlabel("measured seconds per epoch (this machine, loopback)")
    a1.set_title("measured: compute / comm / eval / other")
    a1.legend(fontsize=8)
    width = 0.8 / max(1, len(keys))
    for i, k in enumerate(keys):
        w = _work([e for c in runs[k] for e in c.epochs])
        comp = sum(e.compute_s for c in runs[k] for e in c.epochs) / w / speedup
        comms = [sum(p.comm_s for c in runs[k] for p in project(c, t)) / w
                 for t in tiers.values()]
        xs = [j + i * width for j in range(len(tiers))]
        a2.bar(xs, [comp] * len(xs), width, color=color[k], alpha=0.45)
        a2.bar(xs, comms, width, bottom=[comp] * len(xs), color=color[k], label=label(k))
    a2.set_xticks([j + 0.4 - width / 2 for j in range(len(tiers))], list(tiers))
    a2.set_yscale("log")
    comps = [e.compute_s for k in keys for c in runs[k] for e in c.epochs]
    if comps and min(comps) > 0:
        a2.set_ylim(bottom=0.5 * min(comps))
    a2.set_ylabel("projected s/epoch (light: compute, dark: comm)")
    a2.set_title("projected per tier")
    a2.legend(fontsize=7)
    fig.suptitle(f"{g.dataset} / {g.model}: per-epoch time")
    finish(fig, "time_breakdown")
    return files
