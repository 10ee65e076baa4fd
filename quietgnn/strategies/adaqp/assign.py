"""AdaQP's adaptive bit-widths (used by :mod:`quietgnn.strategies.adaqp`): the aggregation
weight of each incoming halo row, the per-channel time model, and the assignment -- score the
messages, solve on rank 0, share the widths (the module docstring of the strategy has the
method). A mixin of :class:`~quietgnn.strategies.adaqp.AdaQP`: it reads the strategy's
exchange (``ex``), partition and options."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from ...comm.bitassign import AssignProblem, solve
from ...comm.traffic import Traffic
from ...rows import chunk_bounds

__all__ = ["Assignment"]

_CODE = {2: 0, 4: 1, 8: 2}
_WIDTH = torch.tensor([2, 4, 8], dtype=torch.int64)


class Assignment:
    """The bit-width assignment of :class:`~quietgnn.strategies.adaqp.AdaQP`."""

    def _forward_beta(self) -> list[torch.Tensor]:
        """Per peer ``j``: total aggregation weight of each halo row from ``j`` here."""
        p = self.ctx.part
        if self.options.lean:     # GCN over the whole block, its weights a slice at a time
            a = self.adj
            # summed where the block lives; the widths it weighs are decided on the host
            beta = torch.zeros(p.n_halo, dtype=torch.float64, device=a.indices.device)
            for lo, hi in chunk_bounds(a.indptr, 1 << 22):
                s, e = int(a.indptr[lo]), int(a.indptr[hi])
                cols = a.indices[s:e].long()
                halo = cols >= p.n_own
                beta.index_add_(0, cols[halo] - p.n_own, a.gcn_weights(lo, hi)[halo].double())
            return list(torch.split(beta.cpu(), [int(c) for c in p.recv_counts]))
        a, arch = self.adj_m, self.model.arch
        if arch == "gcn":
            w = a.gcn_norm()[0]
        elif arch == "sage":
            w = a.mean_norm()
        elif arch == "gat":   # attention is data dependent: use the uniform share
            w = 1.0 / (a.row_count.float() + 1)[a.row()]
        else:
            w = a.ones()
        halo = a.indices >= p.n_own
        beta = torch.zeros(p.n_halo, dtype=torch.float64, device=a.indices.device)
        beta.index_add_(0, a.indices[halo] - p.n_own, w[halo].double())
        return list(torch.split(beta.cpu(), [int(c) for c in p.recv_counts]))

    def _channel_model(self) -> None:
        """Fit ``t = alpha MB + gamma`` per outgoing channel (or take a tier), share with all."""
        comm, o, P, r = self.ctx.comm, self.options, self.ctx.comm.world_size, self.ctx.rank
        alpha, gamma = [0.0] * P, [0.0] * P
        if o.time_model == "profile":
            sizes = [4 << 10, 64 << 10, 512 << 10]
            for k in range(1, P):
                dst, src = (r + k) % P, (r - k) % P
                xs, ts = [], []
                for size in sizes:
                    best = math.inf   # the fastest repetition: noise only ever adds time
                    for _ in range(o.profile_reps):
                        send = [torch.zeros(size if j == dst else 0, dtype=torch.uint8)
                                for j in range(P)]
                        rc = [size if j == src else 0 for j in range(P)]
                        t0 = time.perf_counter()
                        comm.all_to_all(send, "adaqp_profile", rc, carries=Traffic.CONTROL)  # zeros
                        best = min(best, time.perf_counter() - t0)
                    xs.append(size / 1e6)
                    ts.append(best)
                a_fit, g_fit = np.polyfit(np.array(xs), np.array(ts), 1)
                alpha[dst], gamma[dst] = max(float(a_fit), 1e-6), max(float(g_fit), 0.0)
        else:
            from ...comm.network import TIERS
            t = TIERS[o.time_model]
            alpha = [8e6 / t.bandwidth] * P
            gamma = [t.latency] * P
        meta = comm.all_gather_object({"recv": self.ex.recv_counts, "alpha": alpha,
                                       "gamma": gamma}, kind="adaqp_setup",
                                      carries=Traffic.CONTROL)
        self.alpha = np.array([m["alpha"] for m in meta])   # [src, dst]
        self.gamma = np.array([m["gamma"] for m in meta])
        self.recv_all = np.array([m["recv"] for m in meta])  # [i, j]: rows i gets from j (fwd)
        # global group layout: for each key, channels (src -> dst) in (dst, src) order
        gs = self.options.group_size
        self.layout: list[tuple[Any, int, int, int, int]] = []   # key, src, dst, offset, groups
        off = 0
        for key in self.ex.keys(self.L):
            if key == ("f", 0) and self.cached:
                continue   # the cached input rows are never sent, so never given a width
            for dst in range(P):
                for src in range(P):
                    n = int(self.recv_all[dst, src] if key[0] == "f" else self.recv_all[src, dst])
                    if src != dst and n:
                        g = math.ceil(n / gs)
                        self.layout.append((key, src, dst, off, g))
                        off += g
        self.total_groups = off

    # ------------------------------------------------------------------ bit assignment
    def _assign(self) -> None:
        """Score incoming messages, solve on rank 0, share the widths (see module docstring)."""
        comm, ex, o, P, r = self.ctx.comm, self.ex, self.options, self.ctx.world_size, self.ctx.rank
        gs = o.group_size
        sums = torch.zeros(self.total_groups, dtype=torch.float32)
        orders: dict[Any, list] = {}
        for key, src, dst, off, g in self.layout:
            if dst != r:
                continue
            n_tr = max(ex.traced_n[key], 1)
            sig = ex.traced[key][src] / n_tr
            if key[0] == "f":
                sig = sig * self._beta_fwd[src] ** 2
            order = torch.argsort(-sig, stable=True)
            orders[(key, src)] = order
            grp = torch.arange(order.numel()) // gs
            sums[off:off + g] = torch.zeros(g, dtype=torch.float64).index_add_(
                0, grp, sig[order]).float()
        # group sums of each row's value range (a group may be one row): derived from the
        # rows themselves, raw features at layer 0, so they travel as those
        comm.all_reduce(sums, "adaqp_assign", carries=Traffic.FEATURES)
        codes = torch.zeros(self.total_groups, dtype=torch.uint8)
        if r == 0:
            codes = self._solve(sums.double().numpy())
        comm.broadcast(codes, 0, "adaqp_assign", carries=Traffic.FEATURES)   # (from the sums)
        widths = _WIDTH[codes.long()]
        # receivers: expand groups to rows, then tell every sender the widths of its rows
        for key, src, dst, off, g in self.layout:
            if dst != r:
                continue
            order = orders[(key, src)]
            w = torch.empty(order.numel(), dtype=torch.int64)
            w[order] = widths[off:off + g].repeat_interleave(gs)[:order.numel()]
            ex.widths[key]["recv"][src] = w
        keys = ex.keys(self.L)
        send = [torch.cat([ex.widths[k]["recv"][j] for k in keys]).to(torch.uint8) if j != r
                else torch.zeros(0, dtype=torch.uint8) for j in range(P)]
        rc = [0 if j == r else sum(ex.rows(k, "send")[j] for k in keys) for j in range(P)]
        # one width per row, from that row's own values (so: as the sums above)
        got = comm.all_to_all(send, "adaqp_assign", rc, carries=Traffic.FEATURES)
        for j in range(P):
            if j == r:
                continue
            parts = torch.split(got[j].long(), [ex.rows(k, "send")[j] for k in keys])
            for k, w in zip(keys, parts):
                ex.widths[k]["send"][j] = w
        ex.reset_trace(self.L)
        self.assignments += 1

    def _solve(self, sums: np.ndarray) -> torch.Tensor:
        o, gs = self.options, self.options.group_size
        codes = torch.zeros(self.total_groups, dtype=torch.uint8)
        t0 = time.perf_counter()
        for key in self.ex.keys(self.L):
            ents = [e for e in self.layout if e[0] == key]
            if not ents:
                continue
            sig, size, chan, al, ga = [], [], [], [], []
            for c, (_, src, dst, off, g) in enumerate(ents):
                n = int(self.recv_all[dst, src] if key[0] == "f" else self.recv_all[src, dst])
                sig.append(sums[off:off + g])
                size.append(np.minimum(gs, n - gs * np.arange(g)))
                chan.append(np.full(g, c))
                al.append(self.alpha[src, dst])
                ga.append(self.gamma[src, dst])
            prob = AssignProblem(np.concatenate(sig), np.concatenate(size), np.concatenate(chan),
                                 np.array(al), np.array(ga), self.ex.dims[key[1]], o.lam)
            bits = solve(prob, o.solver)
            flat = torch.tensor([_CODE[int(b)] for b in bits], dtype=torch.uint8)
            pos = 0
            for _, _, _, off, g in ents:
                codes[off:off + g] = flat[pos:pos + g]
                pos += g
        self.assign_log.append({"solve_s": time.perf_counter() - t0})
        return codes
