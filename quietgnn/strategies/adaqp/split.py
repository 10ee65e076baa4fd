"""Narrowing GCN / SAGE layers split around AdaQP's halo exchange (used by ``adaqp``).

Why. With ``d_out < d_in`` the stock layers transform before they aggregate
(:mod:`quietgnn.nn.layers`). Run as two row blocks (central rows over ``[central | marginal]``,
marginal rows over ``[marginal | central | halo]``, see :mod:`.exchange`) every owned
row would be transformed twice -- on the first layer of a wide-feature graph (CS: 6805 -> 256)
that is most of an epoch's compute. Split instead:

* ``central(h)`` (while the messages fly): ``z = h W`` for the owned rows, once, and the
  central rows' aggregation over it;
* ``marginal(halo)`` (after they land): ``z_halo = halo W`` and the marginal rows'
  aggregation over ``[z_marginal | z_central | z_halo]``.

Same arithmetic as the stock layer on ``[own | halo]`` (``halo`` transforms the same rows
once), so with quantization off ``adaqp`` still equals ``halo`` (tested). The norm / ReLU
after the conv is the caller's (:meth:`quietgnn.nn.GNN.block` semantics).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn import SparseAdj
from ...nn.adj import spmm
from ...nn.layers import GCNConv, SAGEConv

__all__ = ["SplitConv"]


class SplitConv:
    """One narrowing GCN or SAGE layer over the central and marginal blocks (see module
    docstring); build one per forward pass (it holds the owned rows' transform in between)."""

    def __init__(self, conv: nn.Module, adj_c: SparseAdj, adj_m: SparseAdj) -> None:
        if not self.supports(conv):
            raise TypeError(f"SplitConv: {type(conv).__name__} {conv} is not a narrowing GCN or "
                            f"SAGE layer; run it on the two blocks instead")
        self.conv, self.adj_c, self.adj_m = conv, adj_c, adj_m
        self.nc = adj_c.n_dst
        self.z: Optional[Tensor] = None
        self.root: Optional[Tensor] = None

    @staticmethod
    def supports(conv: nn.Module) -> bool:
        return isinstance(conv, (GCNConv, SAGEConv)) and conv.out_dim < conv.in_dim

    def _transform(self, h: Tensor) -> Tensor:
        c = self.conv
        return c.lin(h) if isinstance(c, GCNConv) else F.linear(h, c.lin_l.weight)

    def _aggregate(self, adj: SparseAdj, z: Tensor, root: Optional[Tensor]) -> Tensor:
        c = self.conv
        if isinstance(c, GCNConv):
            ew, sw = adj.gcn_norm(z.dtype)
            out = spmm(adj, ew, z) + sw[:, None] * z[: adj.n_dst]
            return out if c.bias is None else out + c.bias
        agg = spmm(adj, adj.mean_norm(z.dtype), z)
        if c.lin_l.bias is not None:
            agg = agg + c.lin_l.bias
        return agg + root

    def central(self, h: Tensor) -> Tensor:
        """``h``: owned rows ``[n_own, d_in]`` (central | marginal); returns the central rows'
        conv output ``[n_central, d_out]``."""
        self.z = self._transform(h)
        if isinstance(self.conv, SAGEConv):
            self.root = self.conv.lin_r(h)
        return self._aggregate(self.adj_c, self.z, None if self.root is None
                               else self.root[: self.nc])

    def marginal(self, halo: Tensor) -> Tensor:
        """``halo``: the received rows ``[n_halo, d_in]``; returns the marginal rows' conv
        output ``[n_marginal, d_out]`` (call :meth:`central` first)."""
        if self.z is None:
            raise RuntimeError("SplitConv.marginal before central: the owned rows are not "
                               "transformed yet")
        z, nc = self.z, self.nc
        src = torch.cat([z[nc:], z[:nc], self._transform(halo)])
        return self._aggregate(self.adj_m, src, None if self.root is None
                               else self.root[nc:])
