"""Extraction step ``Q^h A (Q^{h+1})^T``: renumber sampled sources into the next frontier.

Per minibatch i the next level is the current level (same order: targets first) followed by
the sampled sources not in it, in order of first appearance (row order, then CSR order), so
the result does not depend on how the work was split. Two equivalent implementations of the
key lookup ``key = i * n + v`` (docs/methods.md section 5):

* **dense accumulator** (CPU fast path): a scratch array of ``k * n`` int32 slots, written and
  reset only where keys occur -- O(R + E) per hop, no sort; used while ``k * n <= cap``;
* **sort-unique** fallback: one sort of ``R + E`` keys.

Both give bit-identical levels and columns (tested), so the bulk size never changes the
batches.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["Renumberer"]


class Renumberer:
    """Holds the dense accumulator's scratch array (allocated on first use, at most
    ``cap`` int32 slots, all -1 between calls)."""

    def __init__(self, cap: int = 1 << 25) -> None:
        self.cap = int(cap)
        self._mark: Optional[Tensor] = None

    def extend(self, nodes: Tensor, offsets: Tensor, depth: Tensor, new_mb: Tensor,
               new_src: Tensor, num_nodes: int, hop: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Next frontier level. ``nodes``/``offsets``/``depth``: the current level (see
        :mod:`~quietgnn.sampling.bulk`); ``new_mb``/``new_src`` [E]: minibatch and global id of
        every sampled entry, grouped by minibatch. Returns ``(nodes', offsets', depth',
        cols [E])`` with ``cols`` the entries' positions in ``nodes'``."""
        k = offsets.numel() - 1
        R = nodes.numel()
        old_count = offsets[1:] - offsets[:-1]
        mb_row = torch.repeat_interleave(torch.arange(k), old_count, output_size=R)
        old_keys = mb_row * num_nodes + nodes
        new_keys = new_mb * num_nodes + new_src
        if k * num_nodes <= self.cap and R + new_keys.numel() < (1 << 31):
            win, new_pos, cols_of = self._dense(old_keys, new_keys, new_mb, old_count, mb_row, k,
                                                k * num_nodes)
        else:
            win, new_pos, cols_of = self._sorted(old_keys, new_keys, new_mb, old_count, mb_row, k)
        old_pos, new_offsets = new_pos
        total = int(new_offsets[-1])
        out_nodes = torch.empty(total, dtype=torch.int64)
        out_nodes[old_pos] = nodes
        out_nodes[cols_of[win]] = new_src[win]
        out_depth = torch.full((total,), hop + 1, dtype=torch.int64)
        out_depth[old_pos] = depth
        return out_nodes, new_offsets, out_depth, cols_of

    @staticmethod
    def _positions(win_mb: Tensor, old_count: Tensor, mb_row: Tensor, k: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
        """Positions of the old entries and of the first-appearance winners (appearance order,
        grouped by minibatch) in the next level, and its offsets."""
        new_count = torch.bincount(win_mb, minlength=k)
        new_offsets = torch.zeros(k + 1, dtype=torch.int64)
        torch.cumsum(old_count + new_count, 0, out=new_offsets[1:])
        new_before = torch.zeros(k, dtype=torch.int64)
        torch.cumsum(new_count[:-1], 0, out=new_before[1:])
        old_pos = torch.arange(mb_row.numel()) + new_before[mb_row]
        win_pos = (new_offsets[:-1] + old_count - new_before)[win_mb] + \
            torch.arange(win_mb.numel())
        return old_pos, win_pos, new_offsets

    def _dense(self, old_keys, new_keys, new_mb, old_count, mb_row, k, need):
        if self._mark is None or self._mark.numel() < need:
            self._mark = torch.full((need,), -1, dtype=torch.int32)
        mark = self._mark
        E = new_keys.numel()
        mark[old_keys] = 0                                  # membership of the current level
        cand = torch.nonzero(mark[new_keys] < 0).flatten()
        ck = new_keys[cand]
        mark[ck] = torch.iinfo(torch.int32).max
        mark.scatter_reduce_(0, ck, cand.to(torch.int32), reduce="amin")
        win = cand[mark[ck] == cand.to(torch.int32)]        # first appearance of each new key
        old_pos, win_pos, new_offsets = self._positions(new_mb[win], old_count, mb_row, k)
        mark[old_keys] = old_pos.to(torch.int32)
        mark[new_keys[win]] = win_pos.to(torch.int32)
        cols = mark[new_keys].to(torch.int64) if E else new_keys.new_empty(0)
        mark[old_keys] = -1
        mark[new_keys] = -1
        return win, (old_pos, new_offsets), cols

    def _sorted(self, old_keys, new_keys, new_mb, old_count, mb_row, k):
        R, E = old_keys.numel(), new_keys.numel()
        uniq, inv = torch.unique(torch.cat([old_keys, new_keys]), return_inverse=True)
        first = torch.full((uniq.numel(),), R + E, dtype=torch.int64)
        first.scatter_reduce_(0, inv, torch.arange(R + E), reduce="amin")
        is_new = first >= R                                 # not in the current level
        win = torch.sort(first[is_new]).values - R          # appearance order
        old_pos, win_pos, new_offsets = self._positions(new_mb[win], old_count, mb_row, k)
        pos = torch.empty(uniq.numel(), dtype=torch.int64)
        pos[inv[:R]] = old_pos
        pos[inv[R + win]] = win_pos
        return win, (old_pos, new_offsets), pos[inv[R:]]
