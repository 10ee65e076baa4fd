"""Strategies whose epochs cost differently in successive phases of a run, for
``quietgnn advise`` (:mod:`quietgnn.analysis.advise`).

``retexo`` trains one layer at a time, each on the previous layer's frozen output: its first
layer's rounds read the raw features, the later ones a hidden-width embedding, and a layer's
last round carries its one boundary exchange. A run's first epochs are all first-layer
epochs (with the default schedule, half of ``train.epochs``), so a probe whose few epochs
squeeze every layer into one or two rounds measures a mix that no epoch of the real run
costs. The probe instead runs ``PROBE_PHASE`` rounds per layer: each layer's first round
(its start), a steady one, and its last (its end: the layer's output computed and its
boundary rows exchanged); a run of ``work`` epochs is charged each layer's steady cost for
the epochs it spends in that layer under the real schedule, plus the starts and ends it
crosses.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from ..projection import Curve, Point

#: the option that sets a phase's length in epochs, per phased strategy
PHASED = {"retexo": "rounds_per_layer"}
#: probe epochs per phase: the first carries the phase's start (in phase 0 also the warm-up),
#: the last its end (``retexo``: the layer's output computed and its boundary rows exchanged),
#: the middle one is the steady state every other epoch of the phase costs
PROBE_PHASE = 3


def phase_costs(curve: Curve | Mapping[str, Any], layers: int,
                schedule: list[int]) -> Optional[list[dict[str, Any]]]:
    """Per phase of a probe run at :data:`PROBE_PHASE` epochs per phase: the steady epoch's
    compute, hops, slowest rank's bytes and bytes (its middle epoch), what its first epoch
    (``start``) and its last (``end``) cost above that, and ``epochs``, the phase's length in
    the real run (``schedule``). Phase 0's start compute is left out (warm-up: lazy set-up,
    the allocator). None if the probe did not run every phase to its end."""
    rows = Curve.of(curve).epochs
    if len(rows) < PROBE_PHASE * layers or len(schedule) != layers:
        return None

    def cost(r: Point) -> dict[str, float]:
        w = r.passes or 1.0
        return {"compute_s": r.compute_s / w, "hops": r.hops / w, "crit_bytes": r.crit_bytes / w,
                "bytes": (r.train_bytes + (r.data_bytes or 0)) / w}

    out = []
    for k in range(layers):
        first, mid, last = (cost(r) for r in rows[k * PROBE_PHASE:(k + 1) * PROBE_PHASE])
        start = {x: max(0.0, first[x] - mid[x]) for x in mid}
        if k == 0:
            start["compute_s"] = 0.0
        out.append({**mid, "start": start, "end": {x: max(0.0, last[x] - mid[x]) for x in mid},
                    "epochs": int(schedule[k])})
    return out


def phased_seconds(phases: list[dict[str, Any]], work: float,
                   seconds: Callable[[float, float], float]) -> float:
    """Seconds of ``work`` epochs: each phase's steady epoch time for the epochs spent in it,
    the start of every phase after the first that the run enters (the first phase's is
    charged with the set-up) and the end of every phase it completes; epochs past the
    schedule cost what the last phase's do. ``seconds(hops, crit_bytes)``: the tier's
    communication time."""
    def once(x: dict[str, float]) -> float:
        return x["compute_s"] + seconds(x["hops"], x["crit_bytes"])

    total, start = 0.0, 0.0
    for k, ph in enumerate(phases):
        if work <= start:
            break
        last = k == len(phases) - 1
        n = (work - start) if last else min(work - start, float(ph["epochs"]))
        total += n * (ph["compute_s"] + seconds(ph["hops"], ph["crit_bytes"]))
        if k > 0:
            total += once(ph["start"])
        if not last and work > start + ph["epochs"]:
            total += once(ph["end"])
        start += ph["epochs"]
    return total
