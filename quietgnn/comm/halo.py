"""Differentiable halo exchange over a :class:`~quietgnn.partition.LocalPartition`.

Forward: every rank sends ``h[send_idx[j]]`` to peer ``j`` and appends the received blocks, so
a ``[n_own, d]`` input becomes ``[n_own + n_halo, d]`` in the partition's local numbering.
Backward: the gradient w.r.t. the halo rows goes back to their owners, who add it to the
gradient of the rows they sent. Both directions use the static plans, so no size handshake
is needed: traffic per call is exactly ``4 * d * sum_j |B_{i->j}|`` bytes (fp32).

Rows that have just been through keyed dropout travel without their dropped entries (both
ends recompute the mask from the rows' global ids): ``4 * kept`` bytes each way, about
``(1 - p)`` of the dense size, still without a handshake. The remaining zeros (ReLU's) are
not worth an index: at ReLU's typical half density, (index, value) pairs cost as much as the
dense values, and learning which encoding the peer chose would cost a round trip per layer.
Static rows (input features) are another matter: :func:`fetch_static_rows` sends them sparse,
once.

What crosses (``carries``, :mod:`.traffic`): forward rows of layer 0 are the input features,
those of later layers embeddings (a caller whose rows are of another kind says so), and the
backward carries gradients of single nodes' activations.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ..nn.keyed import keep_mask, row_keep_mask
from ..nn.sparse import SparseFeatures
from ..partition.local import LocalPartition
from .communicator import Communicator
from .rowwire import block_nnz, decode_rows, encode_rows, sparse_is_smaller, wire_words
from .traffic import Traffic

__all__ = ["HaloExchanger", "fetch_static_rows", "sparse_is_smaller"]

#: boundary rows gathered per round of :meth:`HaloExchanger.fill_halo`, all peers together
FILL_ROUND_BYTES = 64 << 20


class _HaloFn(torch.autograd.Function):
    # Buffers: one gather of all boundary rows (split into per-peer views, sent without a
    # further copy) and the output [h ; halo] allocated once, the halo rows received straight
    # into it. At 10^7+ edges each avoided copy is hundreds of MB per layer.
    @staticmethod
    def forward(ctx, h: Tensor, ex: "HaloExchanger", kind_bwd: str, kind_fwd: str,
                carries: Traffic) -> Tensor:
        ctx.ex, ctx.kind_bwd = ex, kind_bwd
        send = torch.split(h.index_select(0, ex.send_all), ex.send_counts)
        out = h.new_empty((ex.n_own + ex.n_halo,) + tuple(h.shape[1:]))
        out[: ex.n_own] = h
        ex.comm.all_to_all(send, kind_fwd, ex.recv_counts, out=out[ex.n_own:], carries=carries)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        ex = ctx.ex
        n_own = ex.n_own
        # the halo rows' gradients, grouped by owner in peer order (this rank's own block is
        # empty): per-peer views of one buffer, sent as they are
        send = torch.split(grad[n_own:].contiguous(), ex.recv_counts)
        back = grad.new_empty((ex.send_all.numel(),) + tuple(grad.shape[1:]))
        ex.comm.all_to_all(send, ctx.kind_bwd, ex.send_counts, out=back,
                           carries=Traffic.ACTIVATION_GRADS)
        # every row this rank sent gets the gradients its peers computed for it (one scatter)
        return grad[:n_own].index_add(0, ex.send_all, back), None, None, None, None


class _KeptFn(torch.autograd.Function):
    # The exchange of rows that just went through keyed dropout (p, key): both ends know which
    # entries dropout zeroed (the masks are a function of the global id), so only the kept
    # values travel, in row-major order per peer block, and the receiver puts them back. In
    # backward the gradients of the dropped entries are not sent either: dropout's own backward
    # multiplies them by zero on the owner, so the result is exact.
    @staticmethod
    def forward(ctx, h: Tensor, ex: "HaloExchanger", kind_bwd: str, kind_fwd: str,
                carries: Traffic, p: float, key: int) -> Tensor:
        width = int(h.shape[1])
        m_send = row_keep_mask(ex.send_ids, width, p, key)
        m_recv = row_keep_mask(ex.halo_ids, width, p, key)
        n_send = [int(c.sum()) for c in m_send.sum(1).split(ex.send_counts)]
        n_recv = [int(c.sum()) for c in m_recv.sum(1).split(ex.recv_counts)]
        ctx.ex, ctx.kind_bwd, ctx.masks, ctx.counts = ex, kind_bwd, (m_send, m_recv), \
            (n_send, n_recv)
        sel = h.index_select(0, ex.send_all)
        send = torch.split(sel[m_send], n_send)
        got = ex.comm.all_to_all(list(send), kind_fwd, n_recv, carries=carries)
        out = h.new_zeros((ex.n_own + ex.n_halo, width))
        out[: ex.n_own] = h
        out[ex.n_own:][m_recv] = torch.cat(got)      # one block per rank, own one empty
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        ex = ctx.ex
        m_send, m_recv = ctx.masks
        n_send, n_recv = ctx.counts
        send = torch.split(grad[ex.n_own:][m_recv], n_recv)
        got = ex.comm.all_to_all(list(send), ctx.kind_bwd, n_send,
                                 carries=Traffic.ACTIVATION_GRADS)
        back = grad.new_zeros((ex.send_all.numel(), grad.shape[1]))
        back[m_send] = torch.cat(got)
        return grad[:ex.n_own].index_add(0, ex.send_all, back), None, None, None, None, None, \
            None


class _SampledFn(torch.autograd.Function):
    # The exchange of a sample of the boundary rows (BNS-GCN): both ends know which rows are
    # in it (a keyed function of the global id, :meth:`HaloExchanger.row_sample`), so only
    # those travel, both ways, with no size handshake; the receiver scales them by 1 / rate
    # (an unbiased estimate of the full aggregation) and holds zeros for the others.
    @staticmethod
    def forward(ctx, h: Tensor, ex: "HaloExchanger", kind_bwd: str, kind_fwd: str,
                carries: Traffic, m_send: Tensor, m_recv: Tensor, scale: float) -> Tensor:
        n_send = [int(c.sum()) for c in m_send.split(ex.send_counts)]
        n_recv = [int(c.sum()) for c in m_recv.split(ex.recv_counts)]
        ctx.ex, ctx.kind_bwd, ctx.scale = ex, kind_bwd, scale
        ctx.save_for_backward(m_send, m_recv)
        ctx.counts = (n_send, n_recv)
        send = torch.split(h.index_select(0, ex.send_all[m_send]), n_send)
        got = ex.comm.all_to_all(list(send), kind_fwd, n_recv, carries=carries)
        out = h.new_zeros((ex.n_own + ex.n_halo,) + tuple(h.shape[1:]))
        out[: ex.n_own] = h
        out[ex.n_own:][m_recv] = torch.cat(got) * scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        ex = ctx.ex
        m_send, m_recv = ctx.saved_tensors
        n_send, n_recv = ctx.counts
        send = torch.split(grad[ex.n_own:][m_recv] * ctx.scale, n_recv)
        got = ex.comm.all_to_all(list(send), ctx.kind_bwd, n_send,
                                 carries=Traffic.ACTIVATION_GRADS)
        return grad[:ex.n_own].index_add(0, ex.send_all[m_send], torch.cat(got)), None, None, \
            None, None, None, None, None


class HaloExchanger:
    """``exchanger(h, layer)`` -> ``[h ; halo rows]`` with gradients routed back to owners.

    ``exchanger(h, layer, keep=(p, key))``: ``h`` has just been through keyed dropout with
    that rate and key (:func:`quietgnn.nn.keyed.keyed_dropout`) *keyed by the partition's own
    global ids* (``part.owned``), so only the kept entries are sent, both ways: ``4 * kept``
    bytes instead of ``4 * rows * d``, no size handshake. Off unless ``skip_dropped``: a caller
    whose dropout keys differ would send the wrong entries."""

    def __init__(self, comm: Communicator, part: LocalPartition, kind: str = "halo",
                 skip_dropped: bool = False) -> None:
        #: the model may pass ``keep`` (only what dropout kept is then sent)
        self.skips_dropped = skip_dropped
        self.comm = comm
        self.kind = kind
        self.n_own = part.n_own
        self.n_halo = part.n_halo
        self.send_idx = [t.to(comm.device) for t in part.send_idx]
        self.send_all = torch.cat(self.send_idx) if self.send_idx else \
            torch.zeros(0, dtype=torch.int64, device=comm.device)
        self.recv_counts = [int(c) for c in part.recv_counts]
        self.send_counts = [int(t.numel()) for t in part.send_idx]
        self.recv_counts_no_self = [c for j, c in enumerate(self.recv_counts) if j != comm.rank]
        # global ids of the rows sent and received: the keys of their dropout masks
        self.send_ids = part.owned.to(comm.device).index_select(0, self.send_all)
        self.halo_ids = part.halo.to(comm.device)
        self.num_nodes_global = int(part.num_nodes_global)

    def __call__(self, h: Tensor, layer: int = 0,
                 keep: Optional[tuple[float, int]] = None,
                 carries: Optional[Traffic] = None) -> Tensor:
        """``carries``: what the rows are; by default layer 0's are input features and later
        layers' embeddings."""
        if carries is None:
            carries = Traffic.FEATURES if layer == 0 else Traffic.EMBEDDINGS
        # checked here too, so that a forbidden exchange fails alike at P = 1
        self.comm.declare(carries, "halo exchange", f"{self.kind}_fwd")
        if self.comm.world_size == 1:
            return h
        if keep is not None and h.dim() == 2:
            return _KeptFn.apply(h, self, f"{self.kind}_bwd", f"{self.kind}_fwd", carries,
                                 *keep)
        return _HaloFn.apply(h, self, f"{self.kind}_bwd", f"{self.kind}_fwd", carries)

    @torch.no_grad()
    def fill_halo(self, out: Tensor, carries: Traffic) -> Tensor:
        """The forward exchange into a buffer the caller filled: ``out [n_own + n_halo, ...]``
        holds this rank's rows in ``out[:n_own]``; the halo rows are received into
        ``out[n_own:]`` (no gradient). The same op and bytes as ``exchanger(h)``, without
        its copy of ``h`` into a fresh output: a caller that computes its rows into ``out``
        never holds them twice (hundreds of MB for a wide layer at 10^7+ nodes).

        The rows sent are gathered in rounds of at most :data:`FILL_ROUND_BYTES` (one round
        while ``P * num_nodes_global`` rows fit): every boundary row gathered at once is a
        second copy of most of the boundary. Every rank makes the same number of calls, so
        the count is bounded by what all know: no rank sends a peer more rows than the graph
        has nodes (for large graphs most rounds are empty; they cost a latency each)."""
        kind, P = f"{self.kind}_fwd", self.comm.world_size
        self.comm.declare(carries, "halo exchange", kind)
        if P == 1:
            return out
        own, halo = out[: self.n_own], out[self.n_own:]
        row = max(1, math.prod(out.shape[1:]) * out.element_size())   # alike on every rank
        per = max(1, FILL_ROUND_BYTES // (P * row))          # rows per peer per round
        if self.num_nodes_global <= per:
            send = torch.split(own.index_select(0, self.send_all), self.send_counts)
            self.comm.all_to_all(send, kind, self.recv_counts, out=halo, carries=carries)
            return out
        at = [sum(self.recv_counts[:j]) for j in range(P)]
        for a in range(0, self.num_nodes_global, per):
            idx = [t[a:a + per] for t in self.send_idx]
            send = torch.split(own.index_select(0, torch.cat(idx)), [t.numel() for t in idx])
            got = self.comm.all_to_all(send, kind, [max(0, min(c, a + per) - a)
                                                    for c in self.recv_counts], carries=carries)
            for j, g in enumerate(got):
                halo[at[j] + a: at[j] + a + g.shape[0]] = g
        return out

    def row_sample(self, rate: float, key: int) -> tuple[Tensor, Tensor]:
        """(rows sent, halo rows received) in the sample ``key`` of ``rate`` of the boundary
        rows: bool masks over ``send_all`` and the halo, a keyed function of each row's
        global id, so both ends agree without a message."""
        return (keep_mask(self.send_ids, 1.0 - rate, key),
                keep_mask(self.halo_ids, 1.0 - rate, key))

    def sampled(self, h: Tensor, layer: int, masks: tuple[Tensor, Tensor],
                scale: float) -> Tensor:
        """``[h ; halo rows]`` with only the rows in ``masks`` (:meth:`row_sample`) exchanged
        (forward and backward), received rows times ``scale``, the others zero."""
        carries = Traffic.FEATURES if layer == 0 else Traffic.EMBEDDINGS
        self.comm.declare(carries, "halo exchange", f"{self.kind}_fwd")
        if self.comm.world_size == 1:
            return h
        return _SampledFn.apply(h, self, f"{self.kind}_bwd", f"{self.kind}_fwd", carries,
                                masks[0], masks[1], float(scale))

    def bytes_per_call(self, width: int, element_size: int = 4) -> int:
        """Analytic bytes this rank sends in one forward exchange of ``width`` columns."""
        return sum(self.send_counts) * width * element_size


# ---------------------------------------------------------------------- static rows, once
def fetch_static_rows(comm: Communicator, part: LocalPartition, x: Tensor | SparseFeatures,
                      kind: str = "data", carries: Traffic = Traffic.FEATURES,
                      sparse_out: bool = False) -> Tensor | SparseFeatures:
    """This rank's halo rows of a static matrix ``x [n_own, F]`` (fp32; input features), in
    halo order, fetched once: one all-to-all of the non-zero counts (8 bytes per peer), then
    one of the rows, each peer's block sent sparse when smaller (:mod:`.rowwire`). Bytes sent
    to peer j: ``8 + min(4 r F, 4 r + 8 nnz)`` (r rows, nnz non-zeros, F columns). Both ops
    carry ``carries`` (the counts are of the rows' non-zeros).

    ``x`` may be :class:`~quietgnn.nn.SparseFeatures`, and ``sparse_out`` returns the rows as
    one: a mostly-zero matrix then never exists dense on either side (the same bytes cross)."""
    P, me = comm.world_size, comm.rank
    width = int(x.shape[1])
    if x.dtype != torch.float32:
        raise TypeError(f"fetch_static_rows: expected float32 rows, got {x.dtype}")
    if isinstance(x, SparseFeatures):
        blocks: list = [x.rows(idx) for idx in part.send_idx]
    else:
        blocks = [x.index_select(0, idx.to(x.device)) for idx in part.send_idx]
    nnz_of = [block_nnz(b) if j != me else 0 for j, b in enumerate(blocks)]
    nnz = [torch.tensor([nnz_of[j]] if j != me else [], dtype=torch.int64, device=x.device)
           for j in range(P)]
    got = comm.all_to_all(nnz, kind, [0 if j == me else 1 for j in range(P)], carries=carries)
    peer_nnz = [int(g[0]) if g.numel() else 0 for g in got]
    recv_rows = [int(c) for c in part.recv_counts]
    send = [encode_rows(b, nnz_of[j]) if j != me else
            torch.zeros(0, dtype=torch.int32, device=x.device)
            for j, b in enumerate(blocks)]
    del blocks
    flat = comm.all_to_all(send, kind, [wire_words(r, z, width)
                                        for r, z in zip(recv_rows, peer_nnz)], carries=carries)
    pieces = [decode_rows(blk, r, z, width, sparse_out)
              for r, z, blk in zip(recv_rows, peer_nnz, flat) if r]
    if sparse_out:
        return SparseFeatures.cat([p.to(x.device) for p in pieces]) if pieces else \
            SparseFeatures.from_dense(torch.zeros((0, width), dtype=x.dtype, device=x.device))
    return torch.cat(pieces).to(x.device) if pieces else \
        torch.zeros((0, width), dtype=x.dtype, device=x.device)
