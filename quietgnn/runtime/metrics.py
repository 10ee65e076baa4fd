"""Metrics: one JSON record per rank per epoch (``<run>/metrics/rank-<k>.jsonl``).

Record fields (all ranks; accuracies only on evaluated epochs)::

    epoch, rank, loss, steps, train_acc, val_acc, test_acc,
    wall_s        wall seconds of the epoch (train + eval)
    compute_s     CPU seconds of the training step outside communication (thread time; one
                  compute thread per worker makes this the rank's compute cost); on a GPU
                  wall seconds, the device synchronised, outside communication
    comm_s        wall seconds inside training collectives
    eval_s        wall seconds of evaluation
    bytes         {"train": {"sent": .., "recv": ..}, "eval": {...}, "setup": {...}}
    bytes_by_kind {"train/halo_fwd": sent bytes, ...}
    messages      training messages sent
    rounds        [[round, kind, phase, sent, recv, hops, seconds], ...] every collective, for
                  the network-tier projection (rounds line up across ranks); an exchange
                  waited for later has an eighth: the CPU seconds computed while it flew
    peak_rss_mb   peak resident memory of this rank's process so far (its own VmHWM)
    peak_gpu_mb   on a GPU: the most memory this rank's tensors held on it since the run
                  started (absent on the CPU)
    extra         whatever the strategy reported (bit widths, averaging rounds, ...)

Lines are flushed as written, so a crash loses at most the epoch in progress.
"""

from __future__ import annotations

import errno
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from ..comm import OpRecord
from ..heap import peak_rss_mb
from ..safefiles import atomic_write
from ..serial import loads_json
from .records import EpochRecord, SetupRecord, metrics_line

__all__ = ["MetricsWriter", "peak_rss_mb", "peak_gpu_mb", "summarize_ops", "read_metrics",
           "read_records", "metrics_lines", "truncate_metrics"]


def peak_gpu_mb(device: Any) -> Optional[float]:
    """MiB this process's tensors held at most on ``device`` since the run started
    (``train_on`` resets the count), as ``torch.cuda.max_memory_allocated`` counts them (the
    allocator's cache and the CUDA context come on top), or None on the CPU."""
    import torch
    if device is None or torch.device(device).type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2 ** 20, 1)


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
                              round(r.seconds, 6)] + ([] if r.overlap_cpu_s is None else
                                                      [round(r.overlap_cpu_s, 6)]))
    out["bytes"] = {k: dict(v) for k, v in by_phase.items()}
    out["bytes_by_kind"] = dict(by_kind)
    return out


class MetricsWriter:
    """Appends one JSON line per epoch to ``<run_dir>/metrics/rank-<rank>.jsonl``.

    Each record goes down in one ``write`` to an append-only descriptor; if the disk fills up
    half-way, the file is cut back to the last whole record and the ``OSError`` names the path,
    so a reader never meets a torn line."""

    def __init__(self, run_dir: Path, rank: int, append: bool = False) -> None:
        self.path = Path(run_dir) / "metrics" / f"rank-{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: never through a link planted in the run directory
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | \
            (0 if append else os.O_TRUNC)
        self._fd: Optional[int] = os.open(self.path, flags, 0o644)

    def write(self, record: SetupRecord | EpochRecord) -> None:
        if self._fd is None:
            raise RuntimeError(f"metrics writer of {str(self.path)!r} used after close()")
        data = (json.dumps(record.to_json(), separators=(",", ":")) + "\n").encode()
        size = os.fstat(self._fd).st_size
        try:
            n = os.write(self._fd, data)
            if n != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            try:
                os.ftruncate(self._fd, size)   # back to the last whole record
            except OSError:
                pass
            raise OSError(exc.errno, f"cannot write the metrics record of epoch "
                                     f"{record.epoch} ({exc.strerror})",
                          str(self.path)) from exc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_records(run_dir: str | Path) -> dict[int, tuple[list[EpochRecord],
                                                         Optional[SetupRecord]]]:
    """All ranks' records of a run, typed: ``{rank: ([epoch record, ...], set-up record)}``
    (the epochs in the file's order: a resumed run appends, so an epoch may recur; the set-up
    the last one written, None if there is none)."""
    return {rank: to_records(recs) for rank, recs in read_metrics(run_dir).items()}


def to_records(lines: Iterable[Any]) -> tuple[list[EpochRecord], Optional[SetupRecord]]:
    """One rank's metrics lines (JSON objects or records) as (epoch records, set-up record):
    a line of epoch -1 is the set-up."""
    epochs, setup = [], None
    for line in lines:
        rec = metrics_line(line)
        if isinstance(rec, SetupRecord):
            setup = rec
        else:
            epochs.append(rec)
    return epochs, setup


def metrics_lines(path: Path) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """The lines of one metrics file that are records, each as (its bytes, its JSON object).
    A line torn by a crash, not UTF-8, or edited to another shape (``[1, 2]``, ``"x"``, an
    object whose ``epoch`` is no integer) is skipped: every reader (``--resume``, the
    launcher's failure report, :func:`read_metrics`) treats a damaged line alike."""
    for line in path.read_bytes().splitlines():
        try:
            rec = loads_json(line)
        except ValueError:          # JSONDecodeError and UnicodeDecodeError alike
            continue
        epoch = rec.get("epoch") if isinstance(rec, dict) else None
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            yield line, rec


def truncate_metrics(run_dir: Path, rank: int, epoch: int) -> None:
    """Drop rank ``rank``'s metric lines of epochs after ``epoch`` (written by an interrupted
    attempt; they are about to be trained again) so every epoch appears once; damaged lines
    (:func:`metrics_lines`) go too."""
    path = Path(run_dir) / "metrics" / f"rank-{rank}.jsonl"
    if not path.is_file():
        return
    keep = [line for line, rec in metrics_lines(path) if rec["epoch"] <= epoch]
    atomic_write(   # never through a link planted in the run directory
        path, b"".join(x + b"\n" for x in keep))


def read_metrics(run_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """All ranks' metrics lines as JSON objects: ``{rank: [line, ...]}`` (damaged lines
    skipped: :func:`metrics_lines`); :func:`read_records` reads them as records."""
    out: dict[int, list[dict[str, Any]]] = {}
    for f in sorted((Path(run_dir) / "metrics").glob("rank-*.jsonl")):
        rank = int(f.stem.split("-")[1])
        out[rank] = [rec for _, rec in metrics_lines(f)]
    return out


def human_bytes(n: Optional[float], digits: int = 1) -> str:
    """``n`` bytes in decimal units (``1.5 MB``), ``digits`` after the point above bytes;
    ``—`` for None. One formatter for the CLI, the progress line and the reports."""
    if n is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1000.0
    return str(n)
