"""What :func:`~quietgnn.analysis.advise.probe` takes and reads from its runs (step 1 of the
advisor): its strategies and parts (:func:`_names`, :func:`_parts_of`), a probe's per-epoch
costs (:func:`_per_work`), and its extension (:func:`plan_extension`).

The extension: on a graph where ``centralized`` ran (so the target and the work it took are
known), every strategy but a periodic one (``grappa``, probed at another reload period than a
real run's) is run on for as many epochs as ``centralized`` needed, evaluated after each, so
one that gets there sooner than the borrowed table expects is seen doing so on this graph
(a mini-batch strategy can need far fewer updates on one graph than the other graphs' runs
suggest), and one still short of
the target then is seen to be, and how far (``rank`` asks the borrowed runs that were as far
short what became of them: :func:`~quietgnn.analysis.advise.fit.late_odds`). ``tma``'s probe
epoch is its real averaging period, so its extension is its real run; a phased strategy
(``retexo``, probed a few rounds per layer) is extended at the real run's schedule (its first
epochs: its first layer's).

Not extended: a strategy that claims equality with ``centralized`` (``halo``: it needs what
``centralized`` needed, by construction). Bounded: the extensions together cost at most
about what the ``centralized`` run cost (its compute; theirs counted as all ranks' CPU
seconds, as the ranks share this machine while probing), the cheapest first, so one is cut
short, or left out, where the budget runs out; a prepared graph has no reference run, hence
no extension."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from ..projection import Curve, Point

__all__ = ["plan_extension"]


def _names(strategies: Sequence[str] | str) -> list[str]:
    """Strategy names, from a list or a comma-separated string (``"halo,tma"``); at least one
    (an empty list ran the centralized reference alone, then said every probe failed)."""
    names = [s.strip() for s in strategies.split(",") if s.strip()] \
        if isinstance(strategies, str) else list(strategies)
    if not names:
        raise ValueError(f"--strategies {','.join(strategies)!r} names no strategy to "
                         f"compare; expected names, e.g. halo,adaqp,tma (or all)")
    return names


def _parts_of(prepared: Optional[str], parts: Optional[int]) -> int:
    """The parts to probe at: a prepared graph's own (``parts`` must agree where given), else
    ``parts`` (default 4)."""
    if not prepared:
        return 4 if parts is None else parts
    from ...partition import PartitionBook
    own = PartitionBook.open(prepared).num_parts
    if parts is not None and parts != own:
        raise ValueError(f"parts = {parts} but {str(prepared)!r} is prepared in {own} parts; "
                         f"leave parts out (a prepared graph trains in its own parts), or "
                         f"prepare it again with --parts {parts}")
    return own


def _per_work(curve: Curve | Mapping[str, Any], period: int = 0,
              offset: int = 0) -> Optional[dict[str, float]]:
    """Per epoch-equivalent costs of a probe, split into what every epoch pays, what is paid
    once and (with ``period``: the probe's period of a periodic strategy) what is
    paid at every period boundary (epochs ``period - offset``, ``2 period - offset``, ...:
    offset 1 for work done at the end of a period's last epoch). The last epoch is
    the steady state (``retexo``'s first rounds of a layer carry that layer's one boundary
    exchange; ``halo``'s first epoch nothing extra): traffic above it in earlier epochs is
    charged once (or per period), not per epoch. Compute is the mean over the epochs after
    the first (warm-up: lazy set-up, the allocator) that are no boundary; a boundary's
    compute above that mean is part of its periodic cost."""
    rows = Curve.of(curve).epochs
    if not rows:
        return None
    last = rows[-1]
    w_last = last.passes or 1.0

    def traffic(r: Point) -> float:
        return float(r.train_bytes + (r.data_bytes or 0))

    steady = {"hops": last.hops / w_last, "crit_bytes": last.crit_bytes / w_last,
              "bytes": traffic(last) / w_last}

    def boundary(r: Point) -> bool:
        return period > 0 and r.epoch > 0 and (r.epoch + offset) % period == 0

    def excess(sel: list[Point]) -> dict[str, float]:
        out = {"hops": 0.0, "crit_bytes": 0.0, "bytes": 0.0}
        for r in sel:
            w = r.passes
            out["hops"] += max(0.0, r.hops - steady["hops"] * w)
            out["crit_bytes"] += max(0.0, r.crit_bytes - steady["crit_bytes"] * w)
            out["bytes"] += max(0.0, traffic(r) - steady["bytes"] * w)
        return out

    once = excess([r for r in rows[:-1] if not boundary(r)])
    timed = [r for r in rows[1:] if not boundary(r)] or rows
    work = sum(r.passes for r in timed)
    compute = sum(r.compute_s for r in timed) / max(work, 1e-12)
    out = {**steady, "compute_s": compute, "once": once,
           "peak_rss_mb": max(r.peak_rss_mb or 0.0 for r in rows),
           # epoch-equivalents in one of its epochs (tma's: an averaging period's passes)
           "epoch_work": last.passes or 1.0}
    if last.overlap_s is not None:
        # exchanges waited for after the compute they flew behind (pipegcn, adaqp's
        # overlap): rank charges only what that window does not hide (projection.hidden_s)
        windows = [r for r in timed if r.overlap_s is not None] or [last]
        out["overlap"] = {"hops": (last.overlap_hops or 0.0) / w_last,
                          "crit_bytes": (last.overlap_crit_bytes or 0.0) / w_last,
                          "window_s": sum(r.overlap_s or 0.0 for r in windows)
                          / max(sum(r.passes for r in windows), 1e-12)}
    marks = [r for r in rows if boundary(r)]
    if marks:
        per = excess(marks)
        per["compute_s"] = sum(max(0.0, r.compute_s - compute * r.passes) for r in marks)
        # one period's worth: the probe may hold more than one boundary
        out["periodic"] = {k: v / len(marks) for k, v in per.items()}
    return out


def plan_extension(measured: dict[str, Any], ref_work: float, ref_cost_s: float,
                   parts: int, probe_epochs: dict[str, int],
                   skip: set[str]) -> dict[str, int]:
    """Epochs to run each strategy for. ``measured``: the probe's per-strategy costs
    (:func:`_per_work`: ``compute_s`` per epoch-equivalent, ``epoch_work``, and
    ``updates_per_epoch`` per epoch-equivalent; or ``error``); ``ref_work``: ``centralized``'s
    updates to the target; ``ref_cost_s``: its run's compute seconds, the budget of all
    extensions together, spent on the cheapest first; ``probe_epochs``: the epochs each probe
    ran already; ``skip``: strategies not extended. A strategy is extended for as many
    updates as ``centralized`` needed, or what the budget left pays for; not one whose probe
    reached the target already, nor where that would be no longer than its probe."""
    wanted = []
    for s, m in measured.items():
        if s in skip or "error" in m or m.get("reached_at") or not m.get("compute_s"):
            continue
        work = ref_work / max(1, int(m.get("updates_per_epoch") or 1))   # epoch-equivalents
        # every rank's CPU: the ranks share this machine's cores while probing
        per_work = float(m["compute_s"]) * parts
        wanted.append((work * per_work, s, work, per_work, float(m.get("epoch_work") or 1.0)))
    out, left = {}, float(ref_cost_s)
    for _, s, work, per_work, epoch_work in sorted(wanted):
        k = min(math.ceil(work / epoch_work), math.floor(left / (per_work * epoch_work)))
        # train.epochs counts passes: a strategy whose epoch holds many (tma's averaging
        # period) is asked for its epochs' passes
        epochs = int(round(k * epoch_work)) if epoch_work > 1 else k
        if epochs > probe_epochs.get(s, 0):
            out[s] = epochs
            left -= k * epoch_work * per_work
    return out
