"""Extraction step ``Q^h A (Q^{h+1})^T``: renumber sampled sources into the next frontier.

Per minibatch i the next level is the current level (same order: targets first) followed by
the sampled sources not in it, in order of first appearance (row order, then sampled order),
so the result does not depend on how the work was split. Two equivalent implementations of
the key lookup ``key = i * n + v`` (the extraction step of Tripathy et al., arXiv 2311.02909):

* **dense accumulator** (CPU fast path): a scratch array of int32 slots indexed by key,
  written and reset only where keys occur -- O(R + E) per hop, no sort. Three random passes
  over the E sampled entries (``scatter_reduce(amin)`` elects each key's first appearance,
  a gather reads it back, a scatter or a memset resets), then one prefix sum gives every
  entry its position (:meth:`Renumberer._dense`);
* **sort-unique** fallback (``n > cap``): one sort of ``R + E`` keys.

Both give bit-identical levels and columns (tested), so neither the bulk size nor the slab
size changes the batches.

Why slabs. The work is done in *slabs* of consecutive minibatches holding at most ``budget``
entries (and, dense, at most ``cap // n`` minibatches) -- a blocking loop whose trip count is
about ``E / budget``, whatever k is; each slab is one vectorised pass. Whole-bulk temporaries
of tens of MB cost more than the arithmetic on them: each such allocation is served by fresh
``mmap`` pages (glibc hands large blocks to the OS and takes them back on free), so every
elementwise op page-faults its output, and none of it stays in cache: the same ops on a
tenth of the elements cost far less than a tenth of the time.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..rows import chunk_bounds, cumsum0  # noqa: F401  (re-exported: the samplers use them)

__all__ = ["Renumberer", "cumsum0", "chunk_bounds", "BUDGET"]

_FREE = torch.iinfo(torch.int32).max     # resting value of every scratch slot
BUDGET = 1 << 17                         # entries per slab / chunk (int64: 1 MB arrays)


class Renumberer:
    """Holds the dense accumulator's scratch array (allocated on first use, at most ``cap``
    int32 slots, all ``_FREE`` between calls)."""

    def __init__(self, cap: int = 1 << 25, budget: int = BUDGET) -> None:
        self.cap, self.budget = int(cap), int(budget)
        self._mark: Optional[Tensor] = None

    def extend(self, nodes: Tensor, offsets: Tensor, depth: Tensor, new_ptr: Tensor,
               new_src: Tensor, num_nodes: int, hop: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Next frontier level. ``nodes``/``offsets``/``depth``: the current level (see
        :mod:`~quietgnn.sampling.bulk`); ``new_src`` [E]: global ids of the sampled entries,
        grouped by minibatch (minibatch i's are ``new_src[new_ptr[i]:new_ptr[i+1]]``). Returns
        ``(nodes', offsets', depth', cols [E])`` with ``cols`` the entries' positions in
        ``nodes'``."""
        n = int(num_nodes)
        dense = n <= self.cap
        old_count = offsets[1:] - offsets[:-1]
        cols = torch.empty(new_src.numel(), dtype=torch.int64)
        lv_nodes, lv_depth, lv_counts = [], [], []
        base = 0
        for a, b in chunk_bounds(offsets + new_ptr, self.budget,
                                 self.cap // max(n, 1) if dense else None):
            r0, r1, e0, e1 = (int(offsets[a]), int(offsets[b]), int(new_ptr[a]),
                              int(new_ptr[b]))
            args = (nodes[r0:r1], offsets[a:b + 1] - r0, new_ptr[a:b + 1] - e0,
                    new_src[e0:e1], n)
            win, c = self._dense(*args) if dense else self._sorted(*args)
            # slab level: minibatch after minibatch, old entries first, then the winners
            offs = cumsum0(old_count[a:b] + win)
            old_pos = torch.arange(r1 - r0) + torch.repeat_interleave(
                offs[:-1] - (offsets[a:b] - r0), old_count[a:b], output_size=r1 - r0)
            lv = torch.empty(int(offs[-1]), dtype=torch.int64)
            lv.scatter_(0, old_pos, nodes[r0:r1])
            lv.scatter_(0, c, new_src[e0:e1])          # duplicates write the same value
            dp = torch.full((lv.numel(),), hop + 1, dtype=torch.int64)
            dp.scatter_(0, old_pos, depth[r0:r1])
            torch.add(c, base, out=cols[e0:e1])
            base += lv.numel()
            lv_nodes.append(lv)
            lv_depth.append(dp)
            lv_counts.append(old_count[a:b] + win)
        cat = (lambda xs: xs[0]) if len(lv_nodes) == 1 else torch.cat
        return cat(lv_nodes), cumsum0(cat(lv_counts)), cat(lv_depth), cols

    def _scratch(self, need: int) -> Tensor:
        if self._mark is None or self._mark.numel() < need:
            self._mark = torch.full((need,), _FREE, dtype=torch.int32)
        return self._mark

    def _dense(self, nodes: Tensor, offsets: Tensor, new_ptr: Tensor, new_src: Tensor, n: int
               ) -> tuple[Tensor, Tensor]:
        """One slab: ``(win_count [k], cols [E])``: new nodes per minibatch, and every entry's
        position in the slab's next level.

        Entries are numbered in the *interleaved* order ``old_0, new_0, old_1, new_1, ...``
        (minibatch i's current level, then its sampled entries): the order of the next level.
        ``scatter_reduce(amin)`` of that number elects every key's first appearance (an old
        entry beats every new one of its minibatch); the running count of winners is then
        the position in the next level, read for every entry with one gather.
        """
        k = offsets.numel() - 1
        R, E = nodes.numel(), new_src.numel()
        old_count = offsets[1:] - offsets[:-1]
        new_count = new_ptr[1:] - new_ptr[:-1]
        if E == 0:
            return torch.zeros(k, dtype=torch.int64), new_src.new_empty(0)
        if R + E >= _FREE:                                      # numbers must fit int32
            return self._sorted(nodes, offsets, new_ptr, new_src, n)
        mark = self._scratch(k * n)
        keys = new_src + torch.repeat_interleave(torch.arange(0, k * n, n), new_count,
                                                 output_size=E)
        # interleaved numbers: old entry r -> r + new_ptr[i], new entry e -> e + offsets[i + 1]
        num = (torch.arange(E, dtype=torch.int32) +
               torch.repeat_interleave(offsets[1:].to(torch.int32), new_count, output_size=E))
        old_num = torch.arange(R, dtype=torch.int32) + torch.repeat_interleave(
            new_ptr[:-1].to(torch.int32), old_count, output_size=R)
        old_keys = nodes + torch.repeat_interleave(torch.arange(0, k * n, n), old_count,
                                                   output_size=R)
        mark.scatter_(0, old_keys, old_num)
        mark.scatter_reduce_(0, keys, num, reduce="amin")      # first appearance wins
        first = mark.gather(0, keys)
        # reset: a memset beats a scatter once the keys cover a good part of the slab
        if 4 * (R + E) > k * n:
            mark[:k * n].fill_(_FREE)
        else:
            mark.scatter_(0, keys, _FREE)
            mark.scatter_(0, old_keys, _FREE)
        win = torch.ones(R + E, dtype=torch.int32)
        win.scatter_(0, num.to(torch.int64), (first == num).to(torch.int32))
        pos = torch.cumsum(win, 0)                              # 1 + position in next level
        ends = offsets[1:] + new_ptr[1:]                        # interleaved end of each mb
        level_end = torch.where(ends > 0, pos.index_select(0, (ends - 1).clamp_(min=0)), 0)
        level_count = torch.diff(level_end, prepend=level_end.new_zeros(1))
        return level_count - old_count, pos.index_select(0, first) - 1

    @staticmethod
    def _sorted(nodes: Tensor, offsets: Tensor, new_ptr: Tensor, new_src: Tensor, n: int
                ) -> tuple[Tensor, Tensor]:
        """Sort-unique form of :meth:`_dense` (same outputs)."""
        k = offsets.numel() - 1
        R, E = nodes.numel(), new_src.numel()
        old_count = offsets[1:] - offsets[:-1]
        new_mb = torch.repeat_interleave(torch.arange(k), new_ptr[1:] - new_ptr[:-1],
                                         output_size=E)
        mb_row = torch.repeat_interleave(torch.arange(k), old_count, output_size=R)
        keys = torch.cat([mb_row * n + nodes, new_mb * n + new_src])
        uniq, inv = torch.unique(keys, return_inverse=True)
        first = torch.full((uniq.numel(),), R + E, dtype=torch.int64)
        first.scatter_reduce_(0, inv, torch.arange(R + E), reduce="amin")
        win = torch.sort(first[first >= R]).values - R         # new keys, appearance order
        win_mb = new_mb[win]
        win_count = torch.bincount(win_mb, minlength=k)
        win_local = old_count[win_mb] + torch.arange(win.numel()) - \
            cumsum0(win_count)[:-1][win_mb]
        local = torch.empty(uniq.numel(), dtype=torch.int64)
        local[inv[:R]] = torch.arange(R) - offsets[:-1][mb_row]
        local[inv[R + win]] = win_local
        level_start = cumsum0(old_count + win_count)[:-1]
        return win_count, local[inv[R:]] + level_start[new_mb]
