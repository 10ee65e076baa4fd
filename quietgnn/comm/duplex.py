"""The all-to-all split by direction: one gloo connection per pair of ranks and direction.

gloo keeps one TCP connection per pair of ranks and an all-to-all sends both directions of
an exchange over it. Between hosts on a capped link the two directions then slow each other
(measured on emulated hosts: docs/findings.md), so that an exchange takes well over its
bytes / bandwidth. With ``runtime.duplex`` on (the default when the ranks span hosts) the
communicator creates two more gloo groups over every rank, one carrying the payloads from
lower to higher ranks and one the other way, and posts an all-to-all's blocks as
point-to-point sends and receives on them: each connection carries one direction. The bytes,
their order and the records are those of the collective.
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist
from torch import Tensor

__all__ = ["direction_groups", "post_pairs"]


def direction_groups(comm: Any, mode: str) -> Optional[tuple[Any, Any]]:
    """(lower -> higher, higher -> lower) gloo groups for ``comm``, or None where the split
    is off: ``mode`` 'off', one rank, no gloo process group, or 'auto' with every rank on
    one host (the liveness labels, which every rank reads alike, so all decide alike)."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"runtime.duplex = {mode!r}; expected auto, on or off")
    spans = comm.liveness is not None and comm.liveness.spans_hosts
    if mode == "off" or (mode == "auto" and not spans) or comm.world_size < 2 or \
            not dist.is_initialized() or dist.get_backend() != "gloo":
        return None
    return dist.new_group(backend="gloo"), dist.new_group(backend="gloo")


class _Works:
    """Point-to-point requests waited on as one, all within ``timeout_s`` of the first wait (a
    point-to-point wait has no group timeout of its own: a vanished peer would hang it)."""

    def __init__(self, works: list[Any], timeout_s: float) -> None:
        self.works, self.timeout_s = works, timeout_s

    def wait(self) -> bool:
        deadline = time.monotonic() + self.timeout_s
        for w in self.works:
            w.wait(timedelta(seconds=max(0.001, deadline - time.monotonic())))
        return True


def post_pairs(groups: tuple[Any, Any], rank: int, flat_recv: Tensor, flat_send: Tensor,
               recv_n: list[int], send_n: list[int], timeout_s: float) -> _Works:
    """Post an all-to-all of flat buffers (``send_n[j]`` elements to rank ``j``, ``recv_n[j]``
    from it, in rank order) as sends and receives on the direction ``groups``; the own block
    is copied."""
    up, down = groups
    roff = [0, *itertools.accumulate(recv_n)]
    soff = [0, *itertools.accumulate(send_n)]
    works = []
    for j in range(len(recv_n)):
        if j == rank:
            flat_recv[roff[j]:roff[j + 1]].copy_(flat_send[soff[j]:soff[j + 1]])
            continue
        if recv_n[j]:
            works.append(dist.irecv(flat_recv[roff[j]:roff[j + 1]], j,
                                    group=up if j < rank else down))
        if send_n[j]:
            works.append(dist.isend(flat_send[soff[j]:soff[j + 1]], j,
                                    group=up if rank < j else down))
    return _Works(works, timeout_s)
