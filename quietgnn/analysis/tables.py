"""``quietgnn report``'s markdown: the tables of a :class:`~quietgnn.analysis.report.Report`
(one per dataset x model, a summary across them, the runs measured on emulated hosts, the
training bytes by message kind)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..comm.network import Tier
from ..runtime.metrics import human_bytes as _human_bytes

if TYPE_CHECKING:   # the report builds what these render, and imports them to do so
    from .report import Group, Reach, Report, Row

#: the reference every row is compared with, and the baseline of the ratios
REFERENCE, BASELINE = "centralized", "halo"


def human_bytes(n: Optional[float]) -> str:
    """Bytes in the reports' tables: two digits after the point."""
    return _human_bytes(n, digits=2)


def human_time(s: Optional[float]) -> str:
    if s is None:
        return "—"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _fmt_ratio(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.3g}×"


def _fmt_pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _fmt_tta(t: Optional[Reach]) -> str:
    if not t:
        return "—"
    if not t.reached:
        return "not reached"
    s = human_time(t.seconds)
    return s if t.reached == t.of else f"{s} ({t.reached}/{t.of})"


def summary_tables(rep: Report, tier: str = "wan") -> list[str]:
    """Two compact tables across all dataset x model groups, one row per strategy label:
    test accuracy (difference to ``centralized``), and training bytes per epoch / projected
    time to the target accuracy on ``tier``, both relative to ``halo``."""
    groups = rep.groups
    labels = list(dict.fromkeys(r.strategy for g in groups for r in g.rows))
    cols = [f"{g.dataset} {g.model}" for g in groups]

    def row_of(g: Group, label: str) -> Optional[Row]:
        return next((r for r in g.rows if r.strategy == label), None)

    def acc(r: Row) -> str:
        if r.test_acc is None:
            return "—"
        d = "" if r.strategy_name == REFERENCE or r.delta_acc is None else \
            f" ({100 * r.delta_acc:+.1f})"
        return f"{100 * r.test_acc:.1f}{d}"

    def rel(x: Optional[float]) -> str:
        return "—" if x is None else (f"1/{1 / x:.0f}" if 0 < x < 0.1 else f"{x:.2f}")

    def traffic(r: Row) -> str:
        t = r.tta.get(tier)
        tta = "never" if t and not t.reached else rel(r.tta_ratio.get(tier))
        return f"{rel(r.bytes_ratio)} / {tta}"

    def table(fmt: Any, skip: Sequence[str] = ()) -> list[str]:
        out = ["| strategy | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for label in labels:
            cells = [row_of(g, label) for g in groups]
            if any(c is not None and c.strategy_name in skip for c in cells):
                continue
            out.append(f"| {label} | " + " | ".join("—" if c is None else fmt(c)
                                                     for c in cells) + " |")
        return out

    return ["## Summary", "",
            "Test accuracy (%) at the best validation epoch; in brackets the difference to "
            "`centralized` in points:", "", *table(acc), "",
            f"Training bytes per epoch-equivalent relative to `halo` / projected time to the "
            f"target accuracy on the {tier} tier relative to `halo` (below 1: less than halo; "
            f"never: the run did not reach the target):", "", *table(traffic, (REFERENCE,)), ""]


def markdown(rep: Report, table_tiers: Sequence[str], plots: dict[str, list[str]]) -> str:
    tiers = rep.tiers
    lines = ["# quietgnn benchmark report", "",
             "Projected times: per epoch, slowest rank's compute (CPU seconds, 1 thread) + "
             "sum over training rounds of (hops x latency + slowest rank's bytes / bandwidth). "
             "Tiers: " + "; ".join(Tier(**t).describe() for t in tiers.values()) + ".", ""]
    if rep.compute_speedup != 1:
        lines += [f"**What-if, not a measurement**: every projection with each rank's compute "
                  f"(training and evaluation) {rep.compute_speedup:g}x faster than measured, "
                  f"as an accelerator's would be; bytes, rounds and epochs as counted "
                  f"(`--compute-speedup`).", ""]
    if rep.with_setup or rep.without_eval:
        lines += ["Time to accuracy " + " and ".join(
            (["counts each run's set-up communication (`--with-setup`)"] if rep.with_setup
             else []) + (["leaves the evaluations out, as every projected time here does "
                          "(`--without-eval`)"] if rep.without_eval else [])) + ".", ""]
    if len(rep.groups) > 1 and "wan" in tiers:
        lines += summary_tables(rep, "wan")
    for g in rep.groups:
        has_data = any(r.data_bytes_per_epoch for r in g.rows)
        tgt = "no target (no centralized run)" if g.target_acc is None else \
            f"target test acc {g.target_acc:.4f}"
        ref = "" if g.reference_acc is None else f" (centralized {g.reference_acc:.4f})"
        lines += [f"## {g.dataset} / {g.model}", "", f"{tgt}{ref}", ""]
        head = ["strategy", "P", "test acc", "Δ vs centralized", "train bytes/epoch",
                "bytes vs halo", "eval bytes/epoch", "eval/train"]
        if has_data:
            head.insert(5, "data bytes/epoch")
        for t in table_tiers:
            head += [f"time to acc ({t})", f"vs halo ({t})"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in g.rows:
            acc = "—" if r.test_acc is None else f"{r.test_acc:.4f}"
            if r.seeds > 1:
                acc += f" ± {r.test_acc_std:.4f} (n={r.seeds})"
            delta = "—" if r.delta_acc is None else f"{100 * r.delta_acc:+.2f} pp"
            cells = [r.strategy + (" ‡" if r.local_curve and table_tiers else ""),
                     str(r.parts), acc, delta,
                     human_bytes(r.train_bytes_per_epoch), _fmt_ratio(r.bytes_ratio),
                     human_bytes(r.eval_bytes_per_epoch), _fmt_pct(r.eval_train_ratio)]
            if has_data:
                cells.insert(5, human_bytes(r.data_bytes_per_epoch))
            for t in table_tiers:
                cells += [_fmt_tta(r.tta.get(t)), _fmt_ratio(r.tta_ratio.get(t))]
            lines.append("| " + " | ".join(cells) + " |")
        if table_tiers and any(r.local_curve for r in g.rows):
            lines += ["", "‡ its runs evaluated each rank's own nodes during training "
                      "(`train.eval_mode local`: cut edges left out): its curve's accuracy can "
                      "stay below the exact one the target is, so its time to accuracy may be "
                      "late or 'not reached'; rerun with `--train.eval_mode exact` to compare "
                      "times to accuracy (its test acc is the exact one)."]
        lines += ["", "Projected seconds per epoch (compute + communication):", "",
                  "| strategy | P | compute | " + " | ".join(tiers) + " | peak RSS/rank |",
                  "|" + "---|" * (len(tiers) + 4)]
        for r in g.rows:
            lines.append(f"| {r.strategy} | {r.parts} | "
                         f"{human_time(r.compute_s_per_epoch)} | " +
                         " | ".join(human_time(r.epoch_s.get(t)) for t in tiers) +
                         f" | {r.peak_rss_mb:.0f} MiB"
                         + ("" if r.peak_gpu_mb is None else f" (GPU {r.peak_gpu_mb:.0f} MiB)")
                         + " |")
        lines.append("")
        lines += _hosts_table(g) + _kinds_table(g) + (_class_table(g) if rep.by_class else [])
        for p in plots.get(f"{g.dataset}/{g.model}", []):
            lines.append(f"![{Path(p).stem}]({Path(p).name})")
        lines.append("")
    if rep.failed:
        lines += ["## Failed runs", ""]
        for f in rep.failed:
            lines.append(f"- `{f['id']}`: {f['error']}")
        lines.append("")
    return "\n".join(lines)


def _hosts_table(g: Group) -> list[str]:
    rows = [r for r in g.rows if r.link]
    if not rows:
        return []
    out = ["Measured on emulated hosts (`quietgnn bench --links`; the hosts share this "
           "machine's cores; projected: on the link without latency, cores shared as run):",
           "", "| strategy | P | link | measured s/epoch | projected | measured to target | "
           "projected |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.strategy.rsplit(' @ ', 1)[0]} | {r.parts} | {r.link} | "
                   f"{human_time(r.measured_epoch_s)} | {human_time(r.link_epoch_s)} | "
                   f"{human_time(r.measured_tta_s)} | {human_time(r.link_tta_s)} |")
    return out + [""]


def _class_table(g: Group) -> list[str]:
    """Bytes sent over the whole run by traffic class: a class a row never sent is "—"
    (under ``runtime.residency features`` no feature row leaves its site)."""
    classes = sorted({c for r in g.rows for c in r.bytes_by_class})
    if not classes:
        return []
    out = ["Bytes sent over the whole run by traffic class (all ranks; set-up, training and "
           "evaluation; mean over seeds):", "",
           "| strategy | P | " + " | ".join(classes) + " |", "|---|---|" + "---|" * len(classes)]
    for r in g.rows:
        out.append(f"| {r.strategy} | {r.parts} | " + " | ".join(
            human_bytes(r.bytes_by_class[c]) if r.bytes_by_class.get(c) else "—"
            for c in classes) + " |")
    return out + [""]


def _kinds_table(g: Group) -> list[str]:
    """Training bytes per epoch by message kind, the kinds in order of their total bytes."""
    rows = [r for r in g.rows if r.bytes_by_kind]
    total: dict[str, float] = {}
    for r in rows:
        for k, v in r.bytes_by_kind.items():
            total[k] = total.get(k, 0.0) + v
    if not total:
        return []
    kinds = sorted(total, key=lambda k: -total[k])
    out = ["Training bytes per epoch by message kind (summed over ranks):", "",
           "| strategy | P | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for r in rows:
        out.append(f"| {r.strategy} | {r.parts} | " + " | ".join(
            human_bytes(r.bytes_by_kind[k]) if k in r.bytes_by_kind else "—" for k in kinds)
            + " |")
    return out + [""]
