"""``LocalPartition``: everything one rank holds of a partitioned graph.

Built once by :func:`build_partitions` (from the full graph, in the launcher or in
``quietgnn partition``), saved in the partition book, then read-only on the rank.

Local numbering. Rank ``i`` numbers its nodes ``[owned | halo]``:

* ``owned``  int64 ``[n_own]``   global ids of the nodes rank ``i`` owns, ascending;
* ``halo``   int64 ``[n_halo]``  global ids of *remote in-neighbours* of owned nodes, grouped by
  owner rank (ascending) and ascending within a group, so the rows received from peer ``j``
  are the contiguous block ``halo[recv_offsets[j]:recv_offsets[j+1]]``.

Local adjacency (destination-indexed CSR, the layout of :class:`quietgnn.graph.Graph`):

* ``indptr``  int64 ``[n_own + 1]``; ``indices`` int64 ``[E_loc]`` with values in
  ``[0, n_own + n_halo)``: row ``v`` lists *all* in-neighbours of owned node ``v`` (local or
  halo), so aggregation over a row sees exactly the neighbourhood of the full graph.
* ``in_degree`` / ``out_degree`` int64 ``[n_own + n_halo]``: **global** degrees (normalisation
  with global degrees is what makes distributed GCN equal the centralized one).

Communication plans (static, so exchanges need no size handshake):

* ``send_idx[j]`` int64 ``[|B_{i->j}|]``: local indices of owned nodes whose rows peer ``j``
  needs, in the order ``j`` stores them in its halo block from ``i``;
* ``recv_counts`` int64 ``[P]``: ``recv_counts[j]`` halo rows arrive from peer ``j``.

Node data for owned nodes only: ``x`` ``[n_own, F]``, ``y`` ``[n_own]``, masks ``[n_own]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..graph import Graph

__all__ = ["LocalPartition", "build_partitions", "gather_rows"]


def gather_rows(indptr: Tensor, indices: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """CSR rows ``rows`` of a CSR matrix, vectorised: returns (indptr', indices')."""
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    new_indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    new_indptr[1:] = counts.cumsum(0)
    total = int(new_indptr[-1])
    # position of each output entry = row start + offset within its row
    offs = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(new_indptr[:-1], counts)
    pos = torch.repeat_interleave(starts, counts) + offs
    return new_indptr, indices[pos]


@dataclass(eq=False)
class LocalPartition:
    """One rank's share of the graph (see the module docstring for every field's shape)."""

    rank: int
    num_parts: int
    num_nodes_global: int
    num_edges_global: int
    num_classes: int
    owned: Tensor
    halo: Tensor
    halo_owner: Tensor
    indptr: Tensor
    indices: Tensor
    in_degree: Tensor
    out_degree: Tensor
    x: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    send_idx: list[Tensor]
    recv_counts: Tensor
    num_train_global: int
    num_val_global: int
    num_test_global: int
    graph_name: str = "graph"
    graph_fingerprint: str = ""
    book_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ sizes
    @property
    def n_own(self) -> int:
        return int(self.owned.numel())

    @property
    def n_halo(self) -> int:
        return int(self.halo.numel())

    @property
    def n_local(self) -> int:
        return self.n_own + self.n_halo

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def recv_offsets(self) -> Tensor:
        """int64 [P + 1]: halo block of peer j is ``[recv_offsets[j], recv_offsets[j+1])``."""
        out = torch.zeros(self.num_parts + 1, dtype=torch.int64)
        out[1:] = self.recv_counts.cumsum(0)
        return out

    @property
    def send_counts(self) -> Tensor:
        return torch.tensor([t.numel() for t in self.send_idx], dtype=torch.int64)

    def local_ids(self) -> Tensor:
        """int64 [n_own + n_halo]: global id of every local row (``cat(owned, halo)``)."""
        return torch.cat([self.owned, self.halo])

    def edge_dst(self) -> Tensor:
        """int64 [E_loc]: local destination row of every local edge."""
        return torch.repeat_interleave(torch.arange(self.n_own), self.indptr[1:] - self.indptr[:-1])

    # ------------------------------------------------------------------ derived views
    def central_mask(self) -> Tensor:
        """bool [n_own]: owned nodes none of whose in-neighbours is a halo node (their
        aggregation needs no remote data; AdaQP computes them while messages fly)."""
        has_halo = torch.zeros(self.n_own, dtype=torch.bool)
        remote = self.indices >= self.n_own
        has_halo[self.edge_dst()[remote]] = True
        return ~has_halo

    def boundary_mask(self) -> Tensor:
        """bool [n_own]: owned nodes some peer holds as a halo node."""
        m = torch.zeros(self.n_own, dtype=torch.bool)
        for idx in self.send_idx:
            m[idx] = True
        return m

    def induced(self) -> tuple[Tensor, Tensor]:
        """CSR (indptr, indices) of the node-induced subgraph on owned nodes (halo edges dropped;
        used by strategies that train in isolation)."""
        keep = self.indices < self.n_own
        counts = torch.zeros(self.n_own, dtype=torch.int64)
        counts.index_add_(0, self.edge_dst()[keep], torch.ones(int(keep.sum()), dtype=torch.int64))
        indptr = torch.zeros(self.n_own + 1, dtype=torch.int64)
        indptr[1:] = counts.cumsum(0)
        return indptr, self.indices[keep]

    def stats(self) -> dict[str, int]:
        return {"rank": self.rank, "owned": self.n_own, "halo": self.n_halo,
                "edges": int(self.indices.numel()),
                "send_rows": int(sum(t.numel() for t in self.send_idx)),
                "train": int(self.train_mask.sum())}

    def __repr__(self) -> str:
        return (f"LocalPartition(rank={self.rank}/{self.num_parts}, owned={self.n_own}, "
                f"halo={self.n_halo}, edges={int(self.indices.numel())}, "
                f"features={self.num_features})")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LocalPartition":
        missing = [k for k in cls.__dataclass_fields__ if k not in d and k not in ("meta",
                   "graph_name", "graph_fingerprint", "book_id")]
        if missing:
            raise ValueError(f"partition data lacks field(s) {missing}; the file was written by "
                             f"another version or is damaged: re-run `quietgnn partition`")
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def build_partitions(graph: Graph, parts: np.ndarray | Tensor, ranks: list[int] | None = None,
                     book_id: str = "") -> list[LocalPartition]:
    """Build the ``LocalPartition`` of every rank in ``ranks`` (default: all), vectorised.

    Cost: O(E log E) once for the cross-partition pairs, then O(E_loc) per rank.
    """
    parts_t = torch.as_tensor(np.asarray(parts), dtype=torch.int64)
    n = graph.num_nodes
    if parts_t.shape != (n,):
        raise ValueError(f"partition assignment has shape {tuple(parts_t.shape)}, expected [{n}]")
    P = int(parts_t.max()) + 1 if n else 1
    ranks = list(range(P)) if ranks is None else ranks
    src, dst = graph.indices, graph.edge_dst()
    in_deg, out_deg = graph.in_degree(), graph.out_degree()

    # Unique (requester, source) pairs over cross-partition edges, ordered by
    # (requester, owner, source): that order *is* every rank's halo layout and every send plan.
    cross = parts_t[src] != parts_t[dst]
    req, u = parts_t[dst[cross]], src[cross]
    owner = parts_t[u]
    key = torch.unique((req * P + owner) * n + u)
    req_s, owner_s, u_s = key // (P * n), (key // n) % P, key % n
    del cross, req, u, owner, key
    bounds = torch.searchsorted(req_s, torch.arange(P + 1))   # halo block of each requester

    n_train = int(graph.train_mask.sum())
    n_val = int(graph.val_mask.sum())
    n_test = int(graph.test_mask.sum())
    fp = graph.fingerprint()
    out = []
    g2l = torch.full((n,), -1, dtype=torch.int64)
    for i in ranks:
        owned = torch.nonzero(parts_t == i).flatten()
        halo = u_s[bounds[i]:bounds[i + 1]]
        halo_owner = owner_s[bounds[i]:bounds[i + 1]]
        recv_counts = torch.bincount(halo_owner, minlength=P)
        # send plan to j: sources owned by i in j's halo block, already in j's order
        send_idx = []
        for j in range(P):
            blk = slice(int(bounds[j]), int(bounds[j + 1]))
            mine = u_s[blk][owner_s[blk] == i] if j != i else u_s[:0]
            send_idx.append(torch.searchsorted(owned, mine))
        indptr, cols = gather_rows(graph.indptr, graph.indices, owned)
        g2l[owned] = torch.arange(owned.numel())
        g2l[halo] = owned.numel() + torch.arange(halo.numel())
        local_cols = g2l[cols]
        g2l[owned] = -1
        g2l[halo] = -1
        ids = torch.cat([owned, halo])
        out.append(LocalPartition(
            rank=i, num_parts=P, num_nodes_global=n, num_edges_global=graph.num_edges,
            num_classes=graph.num_classes, owned=owned, halo=halo, halo_owner=halo_owner,
            indptr=indptr, indices=local_cols, in_degree=in_deg[ids], out_degree=out_deg[ids],
            x=graph.x[owned].contiguous(), y=graph.y[owned], train_mask=graph.train_mask[owned],
            val_mask=graph.val_mask[owned], test_mask=graph.test_mask[owned], send_idx=send_idx,
            recv_counts=recv_counts, num_train_global=n_train, num_val_global=n_val,
            num_test_global=n_test, graph_name=graph.name, graph_fingerprint=fp,
            book_id=book_id, meta={"evaluator": graph.meta.get("evaluator")}))
    return out


def partition_stats(graph: Graph, parts: np.ndarray | Tensor) -> dict[str, Any]:
    """Edge cut, balance and halo sizes of an assignment (no LocalPartition needed)."""
    parts_t = torch.as_tensor(np.asarray(parts), dtype=torch.int64)
    n, P = graph.num_nodes, int(parts_t.max()) + 1
    src, dst = graph.indices, graph.edge_dst()
    cross = parts_t[src] != parts_t[dst]
    pair = torch.unique(parts_t[dst[cross]] * n + src[cross])
    halo = torch.bincount(pair // n, minlength=P)
    sizes = torch.bincount(parts_t, minlength=P)
    edges = torch.bincount(parts_t[dst], minlength=P)
    return {
        "num_parts": P,
        "nodes": sizes.tolist(),
        "edges": edges.tolist(),
        "halo": halo.tolist(),
        "edge_cut": int(cross.sum()),
        "edge_cut_fraction": float(cross.float().mean()) if src.numel() else 0.0,
        "balance": float(sizes.max() / sizes.float().mean()),
        "halo_total": int(halo.sum()),
        "replication_factor": float((n + halo.sum()) / n),
    }
