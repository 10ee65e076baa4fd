"""What a rank's compute is measured in, per device: the figure every projection, report and
the advisor build on (``EpochRecord.compute_s``).

On a CPU, the thread's CPU seconds: one compute thread per worker, so waiting for a peer costs
nothing and the figure is what a machine of the rank's own would spend. On a GPU, wall
seconds once the device has run what was queued: its kernels run beside the thread, which may
spin or sleep while it waits for them, so its CPU seconds say little of them. Communication's
share is taken off in the same currency: its CPU seconds on a CPU; on a GPU the wall seconds
the caller was blocked in it (an exchange waited for later spans the compute it flew behind,
which is compute: ``OpRecord.blocked_s``).
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import torch

__all__ = ["ComputeClock"]


class ComputeClock:
    """``now()`` differences are compute plus communication; :meth:`less_comm` leaves the
    compute."""

    def __init__(self, device: Any) -> None:
        # (as train_on and metrics.peak_gpu_mb read a device: torch's own parse)
        self.device = torch.device(device)
        self.gpu = self.device.type == "cuda"

    def now(self) -> float:
        if self.gpu:
            torch.cuda.synchronize(self.device)
            return time.perf_counter()
        return time.thread_time()

    def less_comm(self, clocked: float, records: Iterable[Any]) -> float:
        """``clocked`` (a difference of :meth:`now`) less the communication of ``records``
        (``OpRecord``) made in it."""
        comm = sum(((r.seconds if r.blocked_s is None else r.blocked_s) if self.gpu
                    else r.cpu_seconds) for r in records)
        return max(0.0, clocked - comm)
