"""``tma``'s data side: the whole graph rebuilt from the partitions for rank 0's evaluation,
or the fixed evaluation sample read from the partition book (kept apart from the strategy's
loop; its neighbour sampler is :class:`quietgnn.sampling.local.LocalSampler`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...comm.communicator import CommError
from ...comm.traffic import Traffic
from ...nn import SparseAdj, SparseFeatures, maybe_sparse
from ...sampling.evaluate import SPLITS


# ---------------------------------------------------------------------- whole graph on rank 0
def _part_pieces(part: Any) -> dict[str, Any]:
    """What rank 0 needs of one partition to rebuild the whole graph (global ids). Mostly-zero
    features go as their CSR arrays (gathered, and rebuilt on rank 0, without ever being
    dense)."""
    x = maybe_sparse(part.x) if part.x.dtype == torch.float32 else part.x
    if isinstance(x, SparseFeatures):
        x = {"indptr": x.indptr, "indices": x.indices, "values": x.values,
             "num_cols": x.num_cols}
    return {"owned": part.owned, "indptr": part.indptr,
            "src": part.local_ids()[part.indices], "x": x, "y": part.y,
            "train": part.train_mask, "val": part.val_mask, "test": part.test_mask}


def _features(pieces: list[dict[str, Any]], owned: Tensor) -> Tensor | SparseFeatures:
    """The whole graph's feature rows in global order, from every part's rows (``owned`` is
    the parts' ids one after the other): sparse when every part sent them sparse."""
    if all(isinstance(p["x"], dict) for p in pieces):
        rows = SparseFeatures.cat([SparseFeatures(p["x"]["indptr"], p["x"]["indices"],
                                                  p["x"]["values"], p["x"]["num_cols"])
                                   for p in pieces])
        at = torch.empty_like(owned)          # global id -> its row in the concatenation
        at[owned] = torch.arange(owned.numel())
        return rows.rows(at)
    xs = [SparseFeatures(p["x"]["indptr"], p["x"]["indices"], p["x"]["values"],
                         p["x"]["num_cols"]).to_dense() if isinstance(p["x"], dict) else p["x"]
          for p in pieces]
    x = xs[0].new_empty((owned.numel(),) + tuple(xs[0].shape[1:]))
    for p, xp in zip(pieces, xs):
        x[p["owned"]] = xp.to(x.dtype)
    return x


def assemble_graph(pieces: list[dict[str, Tensor]], num_nodes: int) -> dict[str, Any]:
    """Whole-graph CSR (rows = destinations, global ids) and node data from every partition's
    :func:`_part_pieces` (every node owned exactly once, rows list *all* in-neighbours)."""
    owned = torch.cat([p["owned"] for p in pieces])
    if owned.numel() != num_nodes or torch.unique(owned).numel() != num_nodes:
        raise ValueError(f"the partitions own {owned.numel()} nodes ({torch.unique(owned).numel()}"
                         f" distinct), the graph has {num_nodes}: cannot rebuild it for "
                         f"evaluation")
    dst = torch.cat([p["owned"].repeat_interleave(p["indptr"][1:] - p["indptr"][:-1])
                     for p in pieces])
    src = torch.cat([p["src"] for p in pieces])
    order = torch.argsort(dst, stable=True)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.bincount(dst, minlength=num_nodes).cumsum(0)
    x = _features(pieces, owned)
    y = pieces[0]["y"].new_empty((num_nodes,) + tuple(pieces[0]["y"].shape[1:]))
    masks = {k: torch.zeros(num_nodes, dtype=torch.bool) for k in ("train", "val", "test")}
    for p in pieces:
        y[p["owned"]] = p["y"]
        for k in masks:
            masks[k][p["owned"]] = p[k]
    return {"indptr": indptr, "indices": src[order], "x": x, "y": y, **masks}


class WholeGraphEval:
    """Rank 0's exact evaluation on the whole graph (:func:`assemble_graph`), on its device."""

    def __init__(self, ctx: Any, full: dict[str, Any]) -> None:
        deg = full["indptr"][1:] - full["indptr"][:-1]
        self.adj = SparseAdj(full["indptr"], full["indices"], deg.numel(), deg,
                             deg).to(ctx.device)
        x = full["x"]
        self.x = ctx.put(x if isinstance(x, SparseFeatures) else maybe_sparse(x))
        self.y, self.masks = full["y"], {k: full[k] for k in SPLITS}

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        model.eval()
        try:
            pred = model(self.x, self.adj).argmax(-1).cpu()
        finally:
            model.train()
        return {k: float((pred[m] == self.y[m]).float().mean()) if m.any() else float("nan")
                for k, m in self.masks.items()}


def open_whole_graph(ctx: Any, chan: Any, book: str | None) -> WholeGraphEval | None:
    """Rank 0: the whole-graph evaluator, the other parts read from the partition book
    ``book``, or (``None``) gathered from every rank once (setup traffic ``eval_graph``);
    elsewhere None."""
    p, full = ctx.part, None
    if book is not None:
        if ctx.rank == 0:
            from ...partition import PartitionBook
            pb = PartitionBook.open(book)
            pieces = [_part_pieces(p)] + [_part_pieces(pb.load_part(j))
                                          for j in range(1, ctx.world_size)]
            full = assemble_graph(pieces, p.num_nodes_global)
    else:
        got = chan.gather_object(_part_pieces(p), kind="eval_graph",
                                 carries=Traffic.FEATURES)   # with labels and edges
        if ctx.rank == 0:
            full = assemble_graph(list(got.values()), p.num_nodes_global)
    return WholeGraphEval(ctx, full) if full is not None else None


# ---------------------------------------------------------------------- the sample, from the book
def open_book_eval(ctx: Any, chan: Any, book: str, fanouts: list[int], options: Any) -> Any:
    """Rank 0: the evaluator of the fixed sample (``eval_nodes``), read from the partition
    book; elsewhere None. Only rank 0 reads the book for it, so it tells every rank whether
    that worked (one control message from the hub, kind ``eval_setup``) before anyone
    trains: a damaged or unreadable book stops every rank here, each naming rank 0's
    reason, instead of the trainers training on until they lose the hub."""
    k = options.eval_nodes
    ev, failure, why = None, None, None
    if ctx.rank == 0:
        from ...partition import PartitionBook
        from ...sampling.book import BookEvaluator
        try:
            ev = BookEvaluator(PartitionBook.open(book), fanouts, k,
                               options.batch_size, ctx.seed)
        except Exception as exc:  # noqa: BLE001 - the trainers must hear of any failure
            failure = exc
            why = [isinstance(exc, ValueError), f"{type(exc).__name__}: {exc}"]
    # None when rank 0 has its evaluator, else [input error?, its error]
    try:
        why = chan.broadcast_object(why, kind="eval_setup", carries=Traffic.CONTROL)
    except CommError as exc:
        if ctx.rank == 0:
            if failure is not None:
                raise failure from exc      # the book's error is the cause
            raise
        # the trainers wait here (up to the channel's 2 x timeout + 5 s) while rank 0
        # checks the sha256 of every file of the book it reads: say so when that ran out
        raise CommError(f"{exc}. It happened while rank 0 was opening the evaluation sample "
                        f"(options.eval_nodes = {k}) from the partition book {book!r}, "
                        f"which checks every file of the book it reads against its sha256: "
                        f"if rank 0 is alive and the book is large, raise "
                        f"options.fail_timeout_s or runtime.timeout_s") from exc
    if failure is not None:
        raise failure
    if why is not None:
        text = (f"rank {ctx.rank}: rank 0 could not open the evaluation sample "
                f"(options.eval_nodes = {k}) from the partition book {book!r}, so no rank "
                f"trains: {why[1]}")
        # a bad book is an input error on every rank; anything else is rank 0's failure,
        # whose traceback is the evidence (a CommError here is its consequence)
        raise ValueError(text) if why[0] else CommError(text)
    return ev
