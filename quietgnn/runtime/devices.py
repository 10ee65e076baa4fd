"""Which device a rank trains on and which backend joins the ranks.

A rank on a host with ``n`` visible GPUs takes ``cuda:(local_rank % n)``: several ranks may
share a GPU (the emulated-host studies, or more parts than GPUs). NCCL refuses two ranks on
one GPU, so backend ``auto`` picks NCCL only when every rank on the host has a GPU of its own,
and gloo otherwise; gloo has no all-to-all of CUDA tensors, so the communicator stages each
collective through host memory (:attr:`~quietgnn.comm.Communicator.wire`). Under torchrun each
host decides for itself: hosts with different GPU counts should name ``--runtime.backend``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Placement", "place"]


@dataclass(frozen=True)
class Placement:
    device: torch.device
    backend: str
    why: str      # one line for the run's log

    def __str__(self) -> str:
        return f"device {self.device.type}, backend {self.backend} ({self.why})"


def place(device: str, backend: str, local_rank: int, local_world: int) -> Placement:
    """The placement of local rank ``local_rank`` of ``local_world`` ranks on this host.
    Raises ``ValueError`` (exit 2) for what cannot run here: ``cuda`` with no CUDA device
    visible, ``nccl`` on the CPU, ``nccl`` with more ranks on the host than GPUs."""
    if device == "cpu":
        if backend == "nccl":
            raise ValueError("runtime.backend = 'nccl' needs runtime.device cuda (NCCL moves GPU "
                             "memory only); use --runtime.backend gloo (or auto) for a CPU run")
        return Placement(torch.device("cpu"), "gloo", "CPU run")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"runtime.device = 'cuda' but no CUDA device is visible (torch "
                         f"{torch.__version__}, {build}); run with --runtime.device cpu, or "
                         f"install a CUDA build of torch on a machine with a GPU")
    n = torch.cuda.device_count()
    dev = torch.device("cuda", local_rank % n)
    own = local_world <= n
    if backend == "nccl" and not own:
        raise ValueError(f"runtime.backend = 'nccl' with {local_world} ranks on this host but "
                         f"{n} GPU(s): NCCL refuses two ranks on one GPU; use --runtime.backend "
                         f"auto (gloo, staged through host memory) or start at most {n} ranks "
                         f"per host")
    if backend == "auto":
        backend = "nccl" if own else "gloo"
    share = "each rank has its own GPU" if own else \
        f"{local_world} ranks share {n} GPU(s): collectives staged through host memory"
    return Placement(dev, backend, f"{n} GPU(s) on this host, {share}")
