"""Metrics: one JSON record per rank per epoch (``<run>/metrics/rank-<k>.jsonl``).

Record fields (all ranks; accuracies only on evaluated epochs)::

    epoch, rank, loss, steps, train_acc, val_acc, test_acc,
    wall_s        wall seconds of the epoch (train + eval)
    compute_s     CPU seconds of the training step outside communication (thread time; one
                  compute thread per worker makes this the rank's compute cost)
    comm_s        wall seconds inside training collectives
    eval_s        wall seconds of evaluation
    bytes         {"train": {"sent": .., "recv": ..}, "eval": {...}, "setup": {...}}
    bytes_by_kind {"train/halo_fwd": sent bytes, ...}
    messages      training messages sent
    rounds        [[round, kind, phase, sent, recv, hops, seconds], ...] every collective, for
                  the network-tier projection (rounds line up across ranks)
    peak_rss_mb   peak resident memory of the process so far
    extra         whatever the strategy reported (bit widths, averaging rounds, ...)

Lines are flushed as written, so a crash loses at most the epoch in progress.
"""

from __future__ import annotations

import json
import resource
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from ..comm import OpRecord

__all__ = ["MetricsWriter", "peak_rss_mb", "summarize_ops", "read_metrics"]


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def summarize_ops(records: Iterable[OpRecord]) -> dict[str, Any]:
    """Bytes/messages/seconds of a batch of communicator records, by phase and kind."""
    by_phase: dict[str, dict[str, int]] = defaultdict(lambda: {"sent": 0, "recv": 0})
    by_kind: dict[str, int] = defaultdict(int)
    out = {"messages": 0, "comm_s": 0.0, "comm_cpu_s": 0.0, "rounds": []}
    for r in records:
        by_phase[r.phase]["sent"] += r.bytes_sent
        by_phase[r.phase]["recv"] += r.bytes_recv
        by_kind[f"{r.phase}/{r.kind}"] += r.bytes_sent
        if r.phase == "train":
            out["messages"] += r.messages
            out["comm_s"] += r.seconds
            out["comm_cpu_s"] += r.cpu_seconds
        out["rounds"].append([r.round, r.kind, r.phase, r.bytes_sent, r.bytes_recv, r.hops,
                              round(r.seconds, 6)])
    out["bytes"] = {k: dict(v) for k, v in by_phase.items()}
    out["bytes_by_kind"] = dict(by_kind)
    return out


class MetricsWriter:
    """Appends one JSON line per epoch to ``<run_dir>/metrics/rank-<rank>.jsonl``."""

    def __init__(self, run_dir: Path, rank: int, append: bool = False) -> None:
        self.path = Path(run_dir) / "metrics" / f"rank-{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a" if append else "w", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_metrics(run_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """All ranks' records of a run: ``{rank: [record, ...]}`` (torn last lines skipped)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for f in sorted((Path(run_dir) / "metrics").glob("rank-*.jsonl")):
        rank = int(f.stem.split("-")[1])
        recs = []
        for line in f.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a crash
        out[rank] = recs
    return out
