"""AdaQP's quantized, overlappable halo exchange (used by :mod:`quietgnn.strategies.adaqp`).

Local layout. Owned nodes are renumbered *central | marginal* (central: no halo in-neighbour).
A layer then runs as two row blocks::

    central rows   over sources [central | marginal]            (h itself: no remote data)
    marginal rows  over sources [marginal | central | halo]     (built by the exchange)

Both blocks keep ``SparseAdj``'s layout (the first ``n_dst`` sources are the destinations),
so the stock layers run on them unchanged; their outputs, concatenated, are the layer's output
in central | marginal order.

Exchange as two autograd functions, so that computation can run while messages fly:

* ``_Start(h)``: quantize ``h[send_idx[j]]`` for every peer ``j`` at the widths of the current
  assignment (:func:`quietgnn.comm.codecs.encode_rows`), start ``all_to_all_async`` of the
  ``uint8`` payloads (kind ``adaqp_fwd``) and return a token.
* (the caller aggregates the central rows here)
* ``_Finish(h, token)``: wait, decode, return ``[marginal | central | halo]``.

Backward runs the mirror image: autograd processes nodes in reverse creation order, so
``_Finish``'s backward (quantize the halo-row gradients, start ``adaqp_bwd``) runs right after
the marginal block's backward, the central block's backward runs while the gradients fly, and
``_Start``'s backward waits and adds them to the owners' rows. Payload sizes follow from the
width tables both ends hold, so no size handshake is needed.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
from torch import Tensor

from ...comm import Communicator
from ...comm.codecs import decode_rows, encode_rows, payload_bytes
from ...comm.traffic import Traffic

__all__ = ["QuantizedHalo"]

Key = tuple[str, int]  # ("f", layer) forward input of layer l, ("b", layer) its gradient


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
            ctx, h: Tensor, ex: "QuantizedHalo", layer: int, box: dict) -> Tensor:
        ctx.ex, ctx.layer, ctx.box = ex, layer, box
        ex._start_fwd(h.detach(), layer, box)
        return h.new_empty(0)

    @staticmethod
    def backward(ctx, _g_token: Tensor):  # type: ignore[override]
        return ctx.ex._finish_bwd(ctx.layer, ctx.box), None, None, None


class _Finish(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
            ctx, h: Tensor, token: Tensor, ex: "QuantizedHalo", layer: int, box: dict,
            halo_only: bool) -> Tensor:
        ctx.ex, ctx.layer, ctx.box, ctx.halo_only = ex, layer, box, halo_only
        halo = ex._finish_fwd(layer, box, h.dtype)
        if halo_only:
            return halo
        nc = ex.n_central
        return torch.cat([h[nc:], h[:nc], halo])

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        ex = ctx.ex
        if ctx.halo_only:
            ex._start_bwd(g, ctx.layer, ctx.box)
            return None, g.new_zeros(0), None, None, None, None
        nm, n_own = ex.n_own - ex.n_central, ex.n_own
        g_h = torch.cat([g[nm:n_own], g[:nm]])
        ex._start_bwd(g[n_own:], ctx.layer, ctx.box)
        return g_h, g.new_zeros(0), None, None, None, None


class QuantizedHalo:
    """Halo exchange with per-row widths (see the module docstring).

    ``send_idx`` / ``recv_counts`` are the partition's plans in the central | marginal owned
    numbering; ``widths[key] = {"send": [Tensor per peer], "recv": [...]}`` are the per-row
    bit-widths (forward ``send[j]``: rows ``send_idx[j]``; backward ``send[j]``: my halo rows
    from ``j``). Widths are only used while ``quantize`` is on; otherwise rows travel as fp32.
    """

    def __init__(self, comm: Communicator, send_idx: list[Tensor], recv_counts: list[int],
                 n_own: int, n_central: int, dims: list[int], generator: torch.Generator,
                 kind: str = "adaqp") -> None:
        self.comm, self.kind = comm, kind
        self.P, self.rank = comm.world_size, comm.rank
        self.device = comm.device   # where the rows are; widths and traces stay on the host
        self.send_idx = [t.to(self.device) for t in send_idx]
        self.recv_counts = [int(c) for c in recv_counts]
        self.send_counts = [int(t.numel()) for t in send_idx]
        self.n_own, self.n_central, self.dims = n_own, n_central, dims
        self.gen = generator
        self.widths: dict[Key, dict[str, list[Tensor]]] = {}
        self.quantize = True     # False: fp32 rows (evaluation, bits = 32)
        self.trace = False       # training: trace received ranges, count rows and bytes
        self.traced: dict[Key, list[Tensor]] = {}
        self.traced_n: dict[Key, int] = {}
        self.reset_stats()

    # ------------------------------------------------------------------ plans and tables
    def rows(self, key: Key, side: str) -> list[int]:
        """Rows per peer of ``key`` on ``side`` (``send`` or ``recv``)."""
        fwd = key[0] == "f"
        if (side == "send") == fwd:
            return self.send_counts
        return self.recv_counts

    def set_uniform(self, bits: int, layers: int) -> None:
        """Every row of every exchange at ``bits``."""
        for key in self.keys(layers):
            self.widths[key] = {side: [torch.full((n,), bits, dtype=torch.int64)
                                       for n in self.rows(key, side)] for side in ("send", "recv")}

    @staticmethod
    def keys(layers: int) -> list[Key]:
        return [("f", l) for l in range(layers)] + [("b", l) for l in range(1, layers)]

    def reset_trace(self, layers: int) -> None:
        for key in self.keys(layers):
            self.traced[key] = [torch.zeros(n, dtype=torch.float64) for n in self.rows(key, "recv")]
            self.traced_n[key] = 0

    def reset_stats(self) -> None:
        # span_s / wait_s: wall seconds exchanges were in flight / this rank sat blocked;
        # rows: rows sent per width, by_key: the same per exchange ("f0", "b2", ...);
        # inflight: per exchange [communicator round, CPU seconds this rank computed while
        # it was in flight] (what overlap can hide a network transfer behind)
        self.stats: dict[str, Any] = {"span_s": 0.0, "wait_s": 0.0, "codec_s": 0.0,
                                      "rows": {}, "by_key": {}, "bytes": 0, "inflight": []}

    def _widths(self, key: Key, side: str, d: int) -> list[Tensor]:
        if self.quantize:
            return self.widths[key][side]
        return [torch.full((n,), 32, dtype=torch.int64) for n in self.rows(key, side)]

    # ------------------------------------------------------------------ public entry
    def __call__(self, h: Tensor, layer: int, central_fn: Any,
                 halo_only: bool = False) -> tuple[Tensor, Tensor]:
        """Exchange ``h`` (``[n_own, d]``, central | marginal order) and run ``central_fn(h)``
        while messages fly (after arrival when ``overlap`` is off: call with ``None`` and
        compute yourself). Returns ``(central_out, marginal_sources)``, the sources being
        ``[marginal | central | halo]`` rows, or the halo rows alone with ``halo_only``."""
        box: dict[str, Any] = {}
        token = _Start.apply(h, self, layer, box)
        out_c = central_fn(h) if central_fn is not None else None
        src = _Finish.apply(h, token, self, layer, box, halo_only)
        return out_c, src

    # ------------------------------------------------------------------ halves
    def _send(self, rows: list[Tensor], key: Key, d: int, box: dict, slot: str) -> None:
        t0 = time.perf_counter()
        send_w = self._widths(key, "send", d)
        recv_w = self._widths(key, "recv", d)
        payloads = []
        for j in range(self.P):
            if j == self.rank or rows[j].shape[0] == 0:
                payloads.append(torch.zeros(0, dtype=torch.uint8, device=self.device))
                continue
            pl, _ = encode_rows(rows[j], send_w[j], self.gen)
            payloads.append(pl)
        if self.trace:
            st = self.stats
            name = f"{key[0]}{key[1]}"
            per_key = st["by_key"].setdefault(name, {})
            for j in range(self.P):
                if j != self.rank:
                    for b, c in zip(*torch.unique(send_w[j], return_counts=True)):
                        st["rows"][int(b)] = st["rows"].get(int(b), 0) + int(c)
                        per_key[int(b)] = per_key.get(int(b), 0) + int(c)
                    st["bytes"] += int(payloads[j].numel())
        rcounts = [0 if j == self.rank else payload_bytes(recv_w[j], d) for j in range(self.P)]
        t1 = time.perf_counter()
        self.stats["codec_s"] += t1 - t0
        kind = f"{self.kind}_{'fwd' if key[0] == 'f' else 'bwd'}"
        carries = (Traffic.ACTIVATION_GRADS if key[0] != "f" else
                   Traffic.FEATURES if key[1] == 0 else Traffic.EMBEDDINGS)
        pending = self.comm.all_to_all_async(payloads, kind, rcounts, carries=carries)
        box[slot] = (pending, t1, recv_w, d, key, self.comm.round - 1, time.thread_time())

    def _recv(self, box: dict, slot: str) -> list[Optional[Tensor]]:
        pending, t1, recv_w, d, key, rnd, c1 = box.pop(slot)
        if self.trace:
            self.stats["inflight"].append([rnd, time.thread_time() - c1])
        tw = time.perf_counter()
        got = pending.wait()
        t2 = time.perf_counter()
        out: list[Optional[Tensor]] = []
        for j in range(self.P):
            if j == self.rank:
                out.append(None)
                continue
            rows, rng = decode_rows(got[j], recv_w[j], d, with_ranges=self.trace)
            out.append(rows)
            if rng is not None:
                self.traced[key][j] += (d / 6.0) * rng.double().cpu() ** 2
        st = self.stats
        st["span_s"] += t2 - t1
        st["wait_s"] += t2 - tw
        st["codec_s"] += time.perf_counter() - t2
        return out

    def _start_fwd(self, h: Tensor, layer: int, box: dict) -> None:
        d = h.shape[1]
        if self.P == 1:
            return
        self._send([h[idx] for idx in self.send_idx], ("f", layer), d, box, "fwd")

    def _finish_fwd(self, layer: int, box: dict, dtype: torch.dtype) -> Tensor:
        d = self.dims[layer]
        if self.P == 1:
            return torch.zeros(0, d, dtype=dtype, device=self.device)
        recv = self._recv(box, "fwd")
        return torch.cat([r for r in recv if r is not None]).to(dtype)

    def _start_bwd(self, g_halo: Tensor, layer: int, box: dict) -> None:
        if self.P == 1:
            return
        blocks = iter(torch.split(g_halo, [c for j, c in enumerate(self.recv_counts)
                                           if j != self.rank]))
        rows = [g_halo.new_zeros((0, g_halo.shape[1])) if j == self.rank else next(blocks)
                for j in range(self.P)]
        self._send(rows, ("b", layer), g_halo.shape[1], box, "bwd")

    def _finish_bwd(self, layer: int, box: dict) -> Tensor:
        d = self.dims[layer]
        g = torch.zeros(self.n_own, d, device=self.device)
        if self.P == 1:
            return g
        back = self._recv(box, "bwd")
        for j, idx in enumerate(self.send_idx):
            if back[j] is not None and idx.numel():
                g.index_add_(0, idx, back[j].to(g.dtype))
        return g
