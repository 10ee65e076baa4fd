"""Fault injection for tests: ``QUIETGNN_FAULT`` makes one rank fail at a chosen collective.

It lives beside the communicator (which fires it at the start of every collective) so that
failure handling can be tested end to end through real process groups: a peer that exits, is
killed, raises, hangs or produces a NaN gradient.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Optional

__all__ = ["Fault"]


class Fault:
    """``QUIETGNN_FAULT="rank=1,round=12,action=exit"``: on that rank, when the collective with
    that round number starts, ``exit`` (os._exit(17)), ``kill`` (SIGKILL self), ``raise``
    (RuntimeError), ``hang`` (sleep until killed) or ``nan`` (the next
    :func:`~quietgnn.strategies.common.sync_gradients` on that rank sees a NaN gradient).
    ``epoch=E`` instead of ``round`` fires at the first collective of epoch E. Under torchrun
    the fault fires only in the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0), so a
    restarted group can show that it recovers."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec: Optional[dict[str, Any]] = spec

    @classmethod
    def from_env(cls) -> Optional["Fault"]:
        spec = os.environ.get("QUIETGNN_FAULT")
        if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
            return None
        out: dict[str, Any] = {}
        for item in spec.split(","):
            k, _, v = item.partition("=")
            out[k.strip()] = v.strip()
        for key in ("rank", "round", "epoch"):
            if key in out:
                out[key] = int(out[key])
        return cls(out)

    def fire(self, rank: int, round_: int, epoch: int) -> bool:
        """Act if this collective is the chosen one (once); True for a ``nan`` fault, which
        the caller turns into a poisoned gradient."""
        f = self.spec
        if not f or f.get("rank") != rank:
            return False
        if ("round" in f and f["round"] != round_) or ("epoch" in f and f["epoch"] != epoch):
            return False
        action = f.get("action", "raise")
        self.spec = None  # fire once
        if action == "nan":
            return True
        if action == "exit":
            os._exit(17)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "hang":
            while True:
                time.sleep(3600)
        raise RuntimeError(f"injected fault on rank {rank} at round {round_} (QUIETGNN_FAULT)")
