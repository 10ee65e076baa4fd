"""What several strategies build their epochs from: the partition's adjacency, the one
gradient all-reduce (with its stop on non-finite values), the masked loss, exact global
evaluation, and forward passes over the halo. The interface they implement is in
:mod:`.base`; these are tools, and a strategy is free not to use them.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..comm import Communicator, HaloExchanger, fetch_static_rows
from ..comm.lowrank import LowRankReducer
from ..comm.qreduce import quantized_all_reduce
from ..comm.traffic import Traffic
from ..nn import GNN, SparseAdj, SparseFeatures, maybe_sparse
from ..nn.sparse import SPARSE_MAX_DENSITY
from ..partition import LocalPartition
from ..rows import to_device

__all__ = ["NonFiniteError", "partition_adj", "sync_gradients", "masked_loss",
           "global_evaluate", "induced_forward", "halo_forward", "inputs_with_halo"]


class NonFiniteError(RuntimeError):
    """A loss or gradient was NaN/Inf on some rank; raised on *every* rank at the same step."""


def partition_adj(part: LocalPartition, device: torch.device | str = "cpu") -> SparseAdj:
    """The local ``[owned | halo]`` block with global degrees (exact aggregation)."""
    return SparseAdj(part.indptr, part.indices, part.n_local, part.in_degree,
                     part.in_degree[: part.n_own]).to(device)


def sync_gradients(comm: Communicator, params: list[nn.Parameter], loss: Tensor,
                   kind: str = "grad_allreduce", extra: Optional[Tensor] = None,
                   bits: int = 32, lowrank: Optional[LowRankReducer] = None) -> float:
    """Sum parameter gradients and the loss over ranks in *one* all-reduce and stop every rank
    together if anything is non-finite.

    The buffer is ``[grads (|theta|) | loss (1) | non-finite flag per rank (P) | extra]``: the
    flags tell every rank *which* rank went bad, so all raise :class:`NonFiniteError` with the
    same message before any optimizer step. ``extra`` (optional, a few floats such as
    validation counts) is summed in the same all-reduce and written back in place, which saves
    a collective (and its latency) per step. Returns the global loss.

    ``bits`` < 32 sends the gradients stochastically quantized
    (:func:`~quietgnn.comm.qreduce.quantized_all_reduce`: an unbiased estimate of the sum,
    identical on every rank); the loss, flags and ``extra`` are still summed exactly.
    ``lowrank`` (a :class:`~quietgnn.comm.lowrank.LowRankReducer` built for ``params``) sends
    the large matrices as rank-r factors with error feedback: two all-reduces, the flags in the
    first, so a non-finite value still stops every rank before the second.
    """
    P = comm.world_size
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    tail = [] if extra is None else [extra.detach().reshape(-1).float()]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1).float(),
                                                       loss.new_zeros(P).float()] + tail)
    n = flat.numel() - 1 - P - (0 if extra is None else extra.numel())
    if comm.take_poison():
        flat[0] = float("nan")   # QUIETGNN_FAULT action=nan: a NaN gradient on this rank
    # set without reading it back: on a GPU every read is a sync, and one per step will do
    flat[n + 1 + comm.rank] = (~torch.isfinite(flat[: n + 1]).all()).to(flat.dtype)

    def check(tail_sum: Tensor, grads_finite: Optional[Tensor] = None) -> float:
        """Raise on every rank alike; ``tail_sum`` = the summed ``[loss | flags | extra]``,
        ``grads_finite`` a 0-d bool (or None: not checked). Returns the loss (one host read)."""
        head = tail_sum[:1 + P]
        if grads_finite is not None:
            head = torch.cat([head, grads_finite.reshape(1).to(head.dtype)])
        vals = head.cpu().tolist()
        loss, flags = vals[0], vals[1:1 + P]
        finite = math.isfinite(loss) and (grads_finite is None or vals[-1] > 0)
        if any(f > 0 for f in flags) or not finite:
            ranks = [j for j, f in enumerate(flags) if f > 0]
            raise NonFiniteError(f"non-finite loss or gradient on rank(s) {ranks or 'unknown'} "
                                 f"in epoch {comm.epoch}; all ranks stopped before the optimizer "
                                 f"step (lower train.lr, check the input features, or resume from "
                                 f"the last checkpoint)")
        return loss

    if P > 1 and lowrank is not None:
        # zeros keep the factorisation finite (a no-op on finite values); the flag stops
        # every rank in check()
        flat[: n + 1] = torch.nan_to_num(flat[: n + 1], nan=0.0, posinf=0.0, neginf=0.0)
        views, off = [], 0
        for g in grads:
            views.append(flat[off:off + g.numel()].view_as(g))
            off += g.numel()
        summed, tail_sum = lowrank.reduce(comm, views, flat[n:], kind, bits, check)
        if extra is not None:
            extra.copy_(tail_sum[1 + P:].view_as(extra))
        for p, g in zip(params, summed):
            p.grad = g
        return float(tail_sum[0])
    if P > 1 and int(bits) < 32:
        # the codec refuses non-finite rows (a no-op on finite ones); the flag tells every rank
        flat[: n + 1] = torch.nan_to_num(flat[: n + 1], nan=0.0, posinf=0.0, neginf=0.0)
        flat = quantized_all_reduce(comm, flat, bits, kind, exact_tail=flat.numel() - n,
                                    carries=Traffic.GRADIENTS)
    elif P > 1:
        comm.all_reduce(flat, kind, carries=Traffic.GRADIENTS)
    if extra is not None:
        extra.copy_(flat[n + 1 + P:].view_as(extra))
    if P == 1:   # the flag already covers the gradients, which are the rank's own
        for p, g in zip(params, grads):
            p.grad = g   # the zeros of an unused parameter too, as the views below would
        return check(flat[n:])
    loss_sum = check(flat[n:], grads_finite=torch.isfinite(flat[:n]).all())
    off = 0
    for p, g in zip(params, grads):  # views into the fresh buffer: no copy needed
        k = g.numel()
        p.grad = flat[off:off + k].view_as(p)
        off += k
    return loss_sum


def masked_loss(logits: Tensor, y: Tensor, mask: Tensor, total: int) -> Tensor:
    """Sum of cross-entropy over ``mask`` divided by the *global* count ``total``: summing this
    over ranks gives the global mean loss, whatever the split of train nodes."""
    if total <= 0:
        raise ValueError("the global training set is empty")
    return F.cross_entropy(logits[mask], y[mask], reduction="sum") / total


@torch.no_grad()
def global_evaluate(model: nn.Module, part: LocalPartition, comm: Communicator,
                    forward: Callable[[], Tensor]) -> dict[str, float]:
    """Exact global accuracy: ``forward()`` must give logits for every owned node with its full
    neighbourhood; correct counts are summed over ranks (one small all-reduce)."""
    was = model.training
    model.eval()
    try:
        pred = forward().argmax(-1)
    finally:
        model.train(was)
    y = part.y.to(pred.device)
    counts = []
    for mask in (part.train_mask, part.val_mask, part.test_mask):
        m = mask.to(pred.device)
        counts += [float((pred[m] == y[m]).sum()), float(m.sum())]
    t = torch.tensor(counts, dtype=torch.float64, device=pred.device)
    comm.all_reduce(t, "eval_metrics", carries=Traffic.CONTROL)   # counts, not labels
    out = {}
    for i, split in enumerate(("train", "val", "test")):
        out[split] = float(t[2 * i] / t[2 * i + 1]) if t[2 * i + 1] > 0 else float("nan")
    return out


def induced_forward(model: GNN, part: LocalPartition,
                    device: torch.device | str = "cpu") -> Callable[[], Tensor]:
    """A closure running ``model`` on the subgraph induced by the owned nodes (edges to other
    ranks dropped, degrees of that subgraph): logits of every owned node with no traffic, for
    :func:`global_evaluate` as a local estimate (``Strategy.evaluate_local``)."""
    indptr, indices = part.induced()
    deg = indptr[1:] - indptr[:-1]
    adj = SparseAdj(indptr, indices, part.n_own, deg, deg).to(device)
    x = maybe_sparse(part.x[: part.n_own].to(device))
    return lambda: model(x, adj)


def halo_forward(model: GNN, part: LocalPartition, comm: Communicator, adj: SparseAdj,
                 kind: str = "halo", cache_inputs: bool = True,
                 halo_rows: Optional[Tensor] = None) -> Callable[[], Tensor]:
    """A closure running the full-neighbourhood forward pass with halo exchange (for
    :func:`global_evaluate`). ``cache_inputs``: the halo's input rows are fetched here, once
    (collective: call on every rank), and layer 0 exchanges nothing at each evaluation;
    ``halo_rows``: those rows, already fetched by the caller (then nothing is fetched)."""
    ex = HaloExchanger(comm, part, kind=kind)
    x = part.x.to(adj.device)
    if cache_inputs and comm.world_size > 1:
        x_in = inputs_with_halo(comm, part, adj.device, halo_rows=halo_rows)
        return lambda: model(x_in, adj, exchange=ex, inputs_have_halo=True)
    return lambda: model(x, adj, exchange=ex)


def inputs_with_halo(comm: Communicator, part: LocalPartition, device: torch.device,
                     sparse: bool = True,
                     halo_rows: Optional[Tensor | SparseFeatures] = None
                     ) -> Tensor | SparseFeatures:
    """``[owned ; halo]`` input rows in the part's dtype, the halo's fetched once (collective;
    kind ``data``) unless the caller holds them (``halo_rows``, in ``part.halo``'s order),
    sparse when mostly zero (and ``sparse``): layer 0 then needs no exchange. Mostly-zero
    rows are made sparse before they are fetched, so ``[owned ; halo]`` never exists dense."""
    if halo_rows is not None and tuple(halo_rows.shape) != (part.n_halo, part.num_features):
        raise ValueError(f"halo_rows has shape {tuple(halo_rows.shape)}; expected "
                         f"({part.n_halo}, {part.num_features}): one row per halo node")
    own = to_device(part.x, device)
    if sparse and part.x.dtype == torch.float32 and own.numel():
        own = maybe_sparse(own)
    if isinstance(own, SparseFeatures):
        halo = (halo_rows if isinstance(halo_rows, SparseFeatures) else
                SparseFeatures.from_dense(halo_rows)).to(device) if halo_rows is not None else \
            fetch_static_rows(comm, part, own, kind="data", carries=Traffic.FEATURES,
                              sparse_out=True)
        x = SparseFeatures.cat([own, halo])
        # the density of the whole, as the dense path decides it
        return x if x.nnz <= SPARSE_MAX_DENSITY * x.shape[0] * x.shape[1] else x.to_dense()
    if halo_rows is not None:
        halo_x = halo_rows.to(device)
        halo_x = halo_x.to_dense() if isinstance(halo_x, SparseFeatures) else halo_x
    else:
        halo_x = fetch_static_rows(comm, part, part.x.float(), kind="data",
                                   carries=Traffic.FEATURES).to(device)
    x = torch.cat([own, halo_x.to(part.x.dtype)])
    return maybe_sparse(x) if sparse else x
