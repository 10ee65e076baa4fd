"""Low-rank gradient all-reduce with error feedback (PowerSGD: Vogels, Karimireddy, Jaggi,
NeurIPS 2019), for strategies whose training traffic is a gradient all-reduce (``grappa``,
``retexo``).

Why low rank, when :mod:`.qreduce` already quantizes: quantization divides the bytes by at
most 32/b (16 at 2 bits) and its noise grows as b shrinks, while a GNN whose input is wide
(bag-of-words features: 1433 on Cora, 3703 on CiteSeer, 6805 on CS) has most of its
parameters in one ``hidden x features`` matrix whose per-step gradient is nearly low-rank
(it is a sum over a few hundred seed nodes of outer products, dominated by a few directions).
Sending a rank-``r`` factorisation costs ``r (n + m)`` floats instead of ``n m``: for
``64 x 1433`` at ``r = 2``, 1/31 of the floats. What the factorisation drops is not lost: each
rank keeps it as *error feedback* and adds it to its next gradient, so every direction is
applied eventually (the property PowerSGD's convergence rests on).

One step, for every compressed matrix ``G_k`` (rank ``k``'s gradient, ``n x m``) with error
memory ``E_k`` and the shared ``Q`` (``m x r``, warm-started from the previous step)::

    M_k = G_k + E_k
    P   = all_reduce_sum(M_k Q)            # n x r; first all-reduce (with everything exact)
    P^  = orthonormal columns of P         # identical on every rank (same input)
    Q'  = all_reduce_sum(M_k^T P^)         # m x r; second all-reduce
    G^  = P^ Q'^T                          # the approximation of sum_k M_k, identical everywhere
    E_k = M_k - P^ P^^T M_k                # what this rank's share lost
    Q   = Q'                               # warm start

Vectors, small matrices (where ``r (n + m)`` is not at most half of ``n m``), the loss, the
per-rank non-finite flags and any ``extra`` values ride exactly in the first all-reduce, so a
step costs two all-reduces (two latency rounds) of ``r sum (n + m) + exact`` floats. With
``bits`` < 32 both go through :func:`~.qreduce.quantized_all_reduce` (unbiased), the exact
tail still exact.

Replicas stay identical: ``G^`` is built from the two all-reduced buffers only. The error
memories differ per rank (they are local by design) and are part of a checkpoint.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from .communicator import Communicator
from .qreduce import quantized_all_reduce
from .traffic import Traffic

__all__ = ["LowRankReducer", "lowrank_floats"]


def _as_matrix(shape: Sequence[int]) -> Optional[tuple[int, int]]:
    """``(n, m)`` of a parameter viewed as a matrix, or None for vectors and scalars."""
    if len(shape) < 2:
        return None
    n = int(shape[0])
    return n, int(math.prod(shape[1:]))


def _worth(nm: Optional[tuple[int, int]], rank: int) -> bool:
    """Compress only where the factors are at most half the matrix (else send it exactly)."""
    return nm is not None and 2 * rank * (nm[0] + nm[1]) <= nm[0] * nm[1]


def lowrank_floats(shapes: Sequence[Sequence[int]], rank: int) -> tuple[int, int, int]:
    """(floats of the first all-reduce's factors, floats sent exactly, floats of the second
    all-reduce) for parameters of ``shapes`` at ``rank``: the analytic message sizes."""
    p_f = q_f = exact = 0
    for s in shapes:
        nm = _as_matrix(s)
        if _worth(nm, rank):
            p_f += nm[0] * rank
            q_f += nm[1] * rank
        else:
            exact += int(math.prod(s)) if len(s) else 1
    return p_f, exact, q_f


class LowRankReducer:
    """Rank-``rank`` PowerSGD state for one list of parameters (same order every step).

    ``seed`` must be the same on every rank: the initial ``Q`` is drawn from it, and every
    later ``Q`` is the all-reduced one, so all ranks hold the same ``Q`` at every step.
    """

    def __init__(self, shapes: Sequence[Sequence[int]], rank: int, seed: int = 0) -> None:
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"low-rank all-reduce: rank = {rank!r}; expected an int >= 1")
        self.rank = rank
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.mats = [_as_matrix(s) if _worth(_as_matrix(s), rank) else None
                     for s in self.shapes]
        gen = torch.Generator().manual_seed(int(seed))
        # Q: orthonormal random start (PowerSGD's), identical on every rank by the shared seed
        self.q: list[Optional[Tensor]] = [
            None if nm is None else torch.linalg.qr(torch.randn(nm[1], rank, generator=gen))[0]
            for nm in self.mats]
        self.err: list[Optional[Tensor]] = [None if nm is None else torch.zeros(nm)
                                            for nm in self.mats]

    @property
    def compressed(self) -> int:
        """Number of parameters sent as factors."""
        return sum(1 for m in self.mats if m is not None)

    def reduce(self, comm: Communicator, grads: Sequence[Tensor], tail: Tensor, kind: str,
               bits: int = 32, check: Any = None) -> tuple[list[Tensor], Tensor]:
        """Sum ``grads`` over ranks (compressed matrices approximately, the rest exactly) and
        ``tail`` exactly. ``check(tail_sum)`` runs between the two all-reduces on every rank
        (``sync_gradients`` raises there on a non-finite flag, before the second collective,
        so all ranks leave together). Returns (summed gradients, summed tail)."""
        if len(grads) != len(self.shapes) or any(
                tuple(g.shape) != s for g, s in zip(grads, self.shapes)):
            raise ValueError(f"low-rank all-reduce: gradient shapes "
                             f"{[tuple(g.shape) for g in grads]} differ from the ones this "
                             f"reducer was built for {self.shapes}")
        # the state follows the gradients to their device (it is built, and read from a
        # checkpoint, in host memory; .to is a no-op once it is there)
        dev = grads[0].device if grads else tail.device
        self.q = [None if t is None else t.to(dev) for t in self.q]
        self.err = [None if t is None else t.to(dev) for t in self.err]
        ms: list[Optional[Tensor]] = []
        first: list[Tensor] = []
        exact: list[Tensor] = []
        for g, nm, q, e in zip(grads, self.mats, self.q, self.err):
            if nm is None:
                ms.append(None)
                exact.append(g.detach().reshape(-1).float())
                continue
            m = g.detach().reshape(nm).float() + e
            ms.append(m)
            first.append((m @ q).reshape(-1))
        tail = tail.detach().reshape(-1).float()
        buf = torch.cat(first + exact + [tail])
        n_tail = tail.numel()
        buf = self._all_reduce(comm, buf, kind, bits, n_tail)
        tail_sum = buf[buf.numel() - n_tail:]
        if check is not None:
            check(tail_sum)

        # orthonormalise each summed P (the same on every rank), then the second all-reduce
        off, ps, mine, second = 0, [], [], []
        for nm, m in zip(self.mats, ms):
            if nm is None:
                ps.append(None)
                mine.append(None)
                continue
            p = buf[off:off + nm[0] * self.rank].view(nm[0], self.rank)
            off += nm[0] * self.rank
            p_hat = torch.linalg.qr(p)[0]
            ps.append(p_hat)
            mine.append(m.t() @ p_hat)                 # this rank's share of Q', kept for E
            second.append(mine[-1].reshape(-1))
        exact_off = off
        q_sum = self._all_reduce(comm, torch.cat(second), kind, bits, 0) if second else None

        out: list[Tensor] = []
        off_q = 0
        for i, (nm, m, p_hat, q_mine) in enumerate(zip(self.mats, ms, ps, mine)):
            shape = self.shapes[i]
            if nm is None:
                k = int(math.prod(shape)) if shape else 1
                out.append(buf[exact_off:exact_off + k].view(shape).clone())
                exact_off += k
                continue
            q_new = q_sum[off_q:off_q + nm[1] * self.rank].view(nm[1], self.rank)
            off_q += nm[1] * self.rank
            self.err[i] = m - p_hat @ q_mine.t()
            self.q[i] = q_new.clone()
            out.append((p_hat @ q_new.t()).reshape(shape))
        return out, tail_sum.clone()

    @staticmethod
    def _all_reduce(comm: Communicator, buf: Tensor, kind: str, bits: int,
                    n_tail: int) -> Tensor:
        if int(bits) < 32:
            return quantized_all_reduce(comm, buf, bits, kind, exact_tail=n_tail,
                                        carries=Traffic.GRADIENTS)
        return comm.all_reduce(buf, kind, carries=Traffic.GRADIENTS)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "shapes": self.shapes, "q": self.q, "err": self.err}

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        if state is None:
            raise ValueError(f"low-rank all-reduce: the checkpoint was written with exact "
                             f"gradients (grad_rank 0), this run has grad_rank {self.rank}; "
                             f"resume with the same grad_rank")
        if int(state["rank"]) != self.rank or [tuple(s) for s in state["shapes"]] != self.shapes:
            raise ValueError(f"low-rank all-reduce: the checkpoint's state is for rank "
                             f"{state['rank']} and shapes {state['shapes']}, this run's for "
                             f"rank {self.rank} and {self.shapes}; resume with the same "
                             f"grad_rank and model")
        self.q = [None if t is None else t.clone() for t in state["q"]]
        self.err = [None if t is None else t.clone() for t in state["err"]]
