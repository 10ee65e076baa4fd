"""``tma``: RandomTMA / SuperTMA / PSGD-PA -- independent trainers, periodic model averaging.

Paper: "Simplifying Distributed Neural Network Training on Massive Graphs: Randomized
Partitions Improve Model Aggregation" (2023, arXiv 2305.09887).

What each rank does. It trains its *own* copy of the model, with its *own* Adam state, on the
node-induced subgraph of the nodes it owns (``LocalPartition.induced()``: edges to other
partitions are dropped, there is no halo), either full-graph (one step = one pass over the
local training nodes) or on neighbour-sampled mini-batches drawn inside that subgraph
(:class:`LocalSampler`). Trainers run asynchronously; at an *averaging point* every live
trainer finishes its current step and the models are averaged; everyone continues from the
average (optimizer states stay local).

One trainer call (one record in the metrics) = one averaging period: train until the period
is over, then average. ``train.epochs`` counts passes over the training set (epoch-equivalents),
as for every strategy: ``--epochs 50`` with the default 25-pass period is two averages; the
last period is cut short where the passes run out (``--epochs 10``: one average after 10).

The period, in order of precedence:

* ``period_s > 0``: time-based, as in the paper: each trainer trains for ``period_s`` seconds of
  wall clock (counted from the moment it received the previous average, so the trainers stay
  aligned) and at least one step;
* ``period_steps > 0``: that many local steps (reproducible; what the tests use);
* otherwise (the default) ``period_epochs`` local *epoch-equivalents*: passes over the trainer's
  own training nodes (1 step in ``full`` mode, ``ceil(n_train / batch_size)`` steps in
  ``minibatch`` mode). P trainers each making one pass see the whole training set once, the
  work of one ``halo`` epoch.

Why the defaults are 25 epoch-equivalents, 4-bit averages and the paper's lr 1e-3. One exact
average moves ``2 (P-1) * 4 |theta|`` bytes in all (plus headers) -- the same as one gradient
all-reduce, which ``halo`` pays *every* epoch on top of its halo rows. A 4-bit average
(``avg_bits``, below) moves 132 bytes per 256 values instead of 1024, so averaging every 25
epoch-equivalents costs at most 1/194 of one all-reduce per epoch-equivalent *on any graph*,
including graphs whose wide first layer makes the model as large as the halo. The period is
also what accuracy depends on: trainers drift apart between averages, by up to ``lr`` per
weight per Adam step, so a learning rate tuned for full-graph training (``train.lr``) lets
few-label trainers drift far between averages; the paper's local lr (``options.lr``) keeps the
drift small. A wall-clock period (the paper's ``period_s``) cannot promise a traffic budget:
how many passes fit in a second depends on the hardware. The measurements behind these
choices: docs/findings.md, "Per strategy", ``tma``.

The variant is the partitioner (``--partition.method``), not code:

==========  ============================================  =========================
variant     partition                                      flags
==========  ============================================  =========================
RandomTMA   every node to a uniformly random trainer        ``random``
SuperTMA    METIS into K >> P clusters dealt randomly      ``supernode`` (the default;
                                                            ``--partition.clusters K``)
PSGD-PA     METIS with K = P                                ``metis``
==========  ============================================  =========================

The ``variant`` option only checks that the partition book matches what you meant.

Why SuperTMA is the default. A random share of a sparse graph keeps only ~1/P of each node's
edges, so a RandomTMA trainer learns on a much thinner graph than the one it is evaluated on;
super-nodes keep the edges inside each small cluster and still give every trainer a
representative sample of the graph. K = max(16 P, N / 50) depends on no dataset: fewer, larger
clusters keep more edges but make each share a coarser sample (measured in docs/findings.md).

What crosses the network (training): only the averaging, through the fault-tolerant star
channel :class:`~quietgnn.comm.store.StarChannel` with rank 0 as the hub: each spoke uploads
``[theta * w | loss * w | steps | w]`` (float32, ``|theta|`` = floating entries of the model's
state dict; ``w`` = 1 if it trained this period, else 0) and downloads the sum plus one byte per
rank, each with a 20-byte header: ``2 * 20 + 8 (|theta| + 3) + P`` bytes per spoke per average,
``S - 1`` times that through the hub (S survivors). Nothing else crosses during training.
``avg_bits`` < 32 uploads ``theta - last average`` instead, stochastically quantized in rows of
256 (unbiased; :func:`~quietgnn.comm.qreduce.encode_flat`), the three scalars exact; the hub
sends the summed progress quantized once and every rank adds the same decoded mean to the same
anchor: ~``b/32`` of the bytes, replicas still identical.

Evaluation. Rank 0 is also the evaluation server: it holds the *whole* graph (read from the
partition book on disk when the launcher made one, otherwise gathered from all ranks once at
setup, counted as setup traffic ``eval_graph``) and evaluates the averaged model exactly on it
after every average, then tells the survivors the accuracies (a few bytes, eval traffic).
That is what keeps evaluation working after a trainer died: the dead rank's nodes are still on
rank 0, no halo of a dead peer is needed. With ``eval_nodes`` = k > 0 rank 0 holds no whole
graph: it evaluates a fixed sample of ~k nodes per split, reading their sampled
neighbourhoods from the partition book's memory-mapped parts (:mod:`quietgnn.sampling.book`).
Only rank 0 reads the other parts, so at setup it tells every rank whether it could (kind
``eval_setup``, control: ``20 + 5`` bytes to each spoke when it could, its error's text when
not): a damaged or unreadable book stops every rank before training, each naming the file.

Failures. A rank other than 0 may die at any time (see the channel docstring for how it is
detected: socket EOF at once, or ``fail_timeout_s`` of silence): the others average over the
survivors and the run finishes normally (``tolerates_failures``); the summary's
``strategy_report`` says who was lost, when, and how many ranks averaged at the end. Rank 0 is
the server: its death ends the run (as the paper's server would). Checkpoints
(``--runtime.checkpoint_every``) use gloo collectives and so only work while nobody has died.

What is given up: the cross-partition edges (each trainer sees a subgraph; randomized
partitions make that subgraph a representative sample, which is the paper's point), and the
exactness of the gradient (the average of P locally trained models is not a full-graph
step). With mini-batches, GCN normalisation inside a sampled block uses the local degree
clamped to the fanout (the expected number of sampled neighbours).
"""

from __future__ import annotations

import math
import os
import struct
import time
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ...comm.rendezvous import MAX_TIMEOUT_S
from ...comm.store import StarChannel
from ...comm.traffic import Traffic
from ...nn import SparseAdj, SparseFeatures, maybe_sparse
from ...sampling.evaluate import SPLITS
from ...sampling.fanouts import fanouts_for, parse_fanouts
from ...sampling.local import LocalSampler
from ...seeds import stream_seed
from ..base import EpochResult, Strategy, register
from .data import assemble_graph, open_book_eval, open_whole_graph

__all__ = ["TMA", "TMAOptions", "LocalSampler", "assemble_graph"]

VARIANTS = {"random": "random", "randomtma": "random", "supernode": "supernode",
            "supertma": "supernode", "psgd-pa": "metis", "psgd_pa": "metis", "metis": "metis"}


@dataclass
class TMAOptions:
    """Options of ``tma`` (``--options.KEY VALUE``)."""

    #: seconds of wall clock per averaging period (time-based, the paper's setting); 0: off.
    #: Takes precedence over the two below
    period_s: float = 0.0
    #: local steps per averaging period (reproducible, for tests); 0: off. Takes precedence
    #: over ``period_epochs``
    period_steps: int = 0
    #: local epoch-equivalents (passes over the trainer's own training nodes) per averaging
    #: period, the default kind of period; averaging costs at most 1/period_epochs of
    #: ``halo``'s bytes per epoch (see the module docstring for the accuracy side)
    period_epochs: float = 25.0
    #: 'minibatch' (neighbour-sampled, as in the paper) or 'full' (whole local subgraph per step)
    mode: str = "minibatch"
    #: neighbours sampled per layer, input layer first: a list or "10,25"; one value = all layers
    fanouts: Union[str, list, int] = "10,25"
    #: seed nodes per mini-batch
    batch_size: int = 512
    #: gradient-norm clipping (0 disables)
    clip: float = 1.0
    #: 'auto' or the variant you mean: 'random' (RandomTMA), 'supernode' (SuperTMA),
    #: 'psgd-pa' (METIS, K = P); checked against the partition book when known
    variant: str = "auto"
    #: seconds the hub waits for a silent live trainer before dropping it (0: runtime.timeout_s)
    fail_timeout_s: float = 0.0
    #: where rank 0 gets the whole graph for evaluation: 'book' (partition book on disk),
    #: 'gather' (from all ranks at setup, counted as setup traffic) or 'auto' (book if any)
    eval_graph: str = "auto"
    #: 0: rank 0 evaluates exactly on the whole graph; k > 0: on a fixed sample of ~k nodes
    #: per split, mini-batched with the training fanouts, read from the partition book's
    #: memory-mapped parts (needs the book; for graphs whose whole does not fit rank 0)
    eval_nodes: int = 0
    #: bits per value of an average's messages: 32 = exact; 8, 4, 2 send each trainer's
    #: progress since the last average (model - last average) stochastically quantized.
    #: 4 by default: with period_epochs 25 an average then costs <= 1/194 of one gradient
    #: all-reduce per epoch-equivalent, whatever the graph (module docstring)
    avg_bits: int = 4
    #: the local Adam's learning rate; 1e-3 by default, the paper's (0 = train.lr). A
    #: trainer's step size times the period is how far the trainers drift apart between
    #: averages; train.lr (0.01, tuned for full-graph training) lets them drift 10x further
    lr: float = 1e-3

    def __post_init__(self) -> None:
        if not float(self.period_s) >= 0:
            raise ValueError(f"options.period_s = {self.period_s!r}; expected seconds >= 0 "
                             f"(0 = step-based, see options.period_steps / period_epochs)")
        if not isinstance(self.period_steps, int) or self.period_steps < 0:
            raise ValueError(f"options.period_steps = {self.period_steps!r}; expected an int >= 0 "
                             f"(0 = use period_epochs)")
        if not float(self.period_epochs) > 0:
            raise ValueError(f"options.period_epochs = {self.period_epochs!r}; expected a number "
                             f"> 0 (e.g. 200, or 0.5 for half a pass)")
        if self.mode not in ("full", "minibatch"):
            raise ValueError(f"options.mode = {self.mode!r}; expected 'full' or 'minibatch'")
        self.fanouts = parse_fanouts(self.fanouts, allow_all=False)
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"options.batch_size = {self.batch_size!r}; expected an int >= 1")
        if not float(self.clip) >= 0:
            raise ValueError(f"options.clip = {self.clip!r}; expected >= 0 (0 disables)")
        v = str(self.variant).lower()
        if v != "auto" and v not in VARIANTS:
            raise ValueError(f"options.variant = {self.variant!r}; expected 'auto', 'random', "
                             f"'supernode' or 'psgd-pa'")
        if not 0 <= float(self.fail_timeout_s) <= MAX_TIMEOUT_S:   # torch's, as timeout_s
            raise ValueError(f"options.fail_timeout_s = {self.fail_timeout_s!r}; expected "
                             f"seconds >= 0 (0: runtime.timeout_s), at most {MAX_TIMEOUT_S:.0f}")
        if not float(self.lr) >= 0:
            raise ValueError(f"options.lr = {self.lr!r}; expected the local Adam's learning "
                             f"rate > 0 (e.g. 1e-3), or 0 for train.lr")
        if self.avg_bits not in (2, 4, 8, 32):
            raise ValueError(f"options.avg_bits = {self.avg_bits!r}; expected 2, 4, 8 (the "
                             f"averages quantized) or 32 (exact)")
        if self.eval_graph not in ("auto", "book", "gather"):
            raise ValueError(f"options.eval_graph = {self.eval_graph!r}; expected 'auto', "
                             f"'book' or 'gather'")
        if isinstance(self.eval_nodes, bool) or not isinstance(self.eval_nodes, int) or \
                self.eval_nodes < 0:
            raise ValueError(f"options.eval_nodes = {self.eval_nodes!r}; expected an int >= 0 "
                             f"(0: exact evaluation; k: a fixed sample of about k nodes per "
                             f"split)")
        if self.eval_nodes and self.eval_graph == "gather":
            raise ValueError("options.eval_nodes reads the sample from the partition book; "
                             "options.eval_graph = 'gather' has none: use eval_graph 'book' "
                             "(or 'auto') or eval_nodes 0")


@register
class TMA(Strategy):
    chan: Optional[StarChannel] = None
    name = "tma"
    description = ("RandomTMA/SuperTMA/PSGD-PA: independent trainers on induced subgraphs, "
                   "periodic model averaging, survives trainer failures")
    Options = TMAOptions
    default_partitioner = "supernode"
    residency_traffic = ("reads every rank's features and labels on rank 0 to evaluate (the "
                         "whole graph, or with eval_nodes a sample from the partition book): "
                         "rank 0 to evaluate")
    tolerates_failures = True
    own_schedule = True     # accuracy comes with averaging rounds

    # ------------------------------------------------------------------ setup
    @classmethod
    def reads_stored_part(cls, options: Any) -> bool:
        # mini-batches gather (and widen) their rows; rank 0 reads the evaluation sample from
        # the book itself; full mode and the whole-graph evaluation use the part as it is
        return options.mode == "minibatch" and bool(options.eval_nodes)

    def setup(self) -> None:
        ctx, p, o = self.ctx, self.ctx.part, self.options
        self._check_variant()
        self.model = ctx.build_model()
        # the paper's local step size (options.lr), not train.lr's, unless lr = 0
        self.opt = ctx.optimizer(self.model.parameters(), lr=o.lr or None)
        indptr, indices = p.induced()
        # the whole subgraph as one block: full mode only (mini-batches sample it instead; its
        # degree vectors would be two more O(n_own) copies beside the sampler's)
        self.adj: Optional[SparseAdj] = None
        if o.mode == "full":
            deg = indptr[1:] - indptr[:-1]
            self.adj = SparseAdj(indptr, indices, p.n_own, deg, deg).to(ctx.device)
        # mostly-zero features stay sparse (a trainer's subgraph is whole: nothing to
        # exchange); a mini-batch gathers its input rows from the sparse matrix
        self.x, self.y = maybe_sparse(p.x), p.y
        if isinstance(self.x, SparseFeatures) and self.x.values.dtype == torch.float16:
            # stored float16 (reads_stored_part): the few non-zeros widened once
            self.x = SparseFeatures(self.x.indptr, self.x.indices, self.x.values.float(),
                                    self.x.num_cols)
        self.train_idx = torch.nonzero(p.train_mask).flatten()
        if o.mode == "full":   # mini-batches gather their rows on the host and hand them over
            self.x, self.y = ctx.put(self.x), ctx.put(self.y)
            self._train_idx_dev = ctx.put(self.train_idx)
        self.check_model(o, ctx.model_cfg)
        fanouts = o.fanouts if len(o.fanouts) > 1 else o.fanouts * ctx.model_cfg.layers
        self.sampler = LocalSampler(indptr, indices, fanouts,
                                    seed=stream_seed(ctx.seed, "tma.sampler", ctx.rank))
        self._eval_fanouts = fanouts if o.mode == "minibatch" else [-1] * ctx.model_cfg.layers
        #: local steps of one pass over this trainer's training nodes (an epoch-equivalent)
        self.steps_per_epoch = 1 if o.mode == "full" else \
            math.ceil(self.train_idx.numel() / o.batch_size)
        self.period_len = o.period_steps if o.period_steps > 0 else \
            max(1, math.ceil(float(o.period_epochs) * self.steps_per_epoch))
        #: the ranks' mean steps per epoch-equivalent, from the global count of training
        #: nodes: an epoch's ``work`` must be the same number on every rank (the trainer
        #: decides from it when all evaluate together), and ``steps_per_epoch`` is not where
        #: parts hold different numbers of training nodes
        self.mean_steps_per_epoch = 1.0 if o.mode == "full" else max(
            1.0, p.num_train_global / (o.batch_size * ctx.world_size))
        self._queue: list[Tensor] = []
        self._anchor = self._flat_state()   # the last average (all ranks start from one init)
        self.avg_round = 0
        #: epoch-equivalents trained so far (the sum of the averages' ``work``: the same
        #: number on every rank) against the run's budget, ``train.epochs`` passes
        self.work_total, self.budget = 0.0, float(ctx.train_cfg.epochs)
        self.history: list[dict[str, Any]] = []     # rank 0: survivors per average
        timeout = o.fail_timeout_s or ctx.comm.timeout_s
        self.chan = StarChannel.open(ctx.comm, timeout_s=timeout)
        self._load_eval_graph()
        self._t_period = time.monotonic()

    @classmethod
    def check_model(cls, options: Any, model_cfg: Any) -> None:
        if options.mode == "minibatch":
            fanouts_for(options.fanouts, model_cfg.layers, parse_fanouts(cls.Options.fanouts),
                        one_for_all=True)

    @classmethod
    def check_partition(cls, options: Any, method: str, what: str = "the partitioner") -> None:
        v = str(options.variant).lower()
        want = VARIANTS.get(v)
        if want is not None and method != want:
            raise ValueError(f"options.variant = {options.variant!r} needs partition method "
                             f"{want!r}, but {what} is {method!r}; pass --partition.method "
                             f"{want} (or options.variant auto)")

    def _check_variant(self) -> None:
        book = os.environ.get("QUIETGNN_BOOK")
        if book:
            from ...partition import PartitionBook
            self.check_partition(self.options, PartitionBook.open(book).method,
                                 "the partition book's")

    def _load_eval_graph(self) -> None:
        """Rank 0's evaluator (``self.evaluator``; None elsewhere): the whole graph, or with
        ``eval_nodes`` a fixed sample read from the partition book."""
        how, book = self.options.eval_graph, os.environ.get("QUIETGNN_BOOK")
        if how == "auto":
            how = "book" if book else "gather"
        if how == "book" and not book:
            raise ValueError("options.eval_graph = 'book' but this run has no partition book "
                             "(QUIETGNN_BOOK unset); use 'gather' or run through `quietgnn train`")
        if self.options.eval_nodes:
            if not book:
                raise ValueError("options.eval_nodes > 0 reads the evaluation sample from the "
                                 "partition book, and this run has none (QUIETGNN_BOOK unset): "
                                 "run through `quietgnn train` or use eval_nodes 0")
            self.evaluator = open_book_eval(self.ctx, self.chan, book,
                                            self._eval_fanouts, self.options)
        else:
            self.evaluator = open_whole_graph(self.ctx, self.chan, book if how == "book"
                                              else None)

    # ------------------------------------------------------------------ training
    def _step(self) -> float:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        if self.options.mode == "full":
            logits = self.model(self.x, self.adj)
            idx = self._train_idx_dev
            loss = F.cross_entropy(logits[idx], self.y[idx])
        else:
            if not self._queue:
                self._queue = self.sampler.batches(self.train_idx, self.options.batch_size)
            seeds = self._queue.pop(0)
            nodes, blocks = self.sampler.sample(seeds)
            if isinstance(self.x, SparseFeatures):
                xb = self.x.rows(nodes)
            else:   # a part read as stored keeps float16 features: widen the rows (exact)
                xb = self.x[nodes].to(torch.promote_types(self.x.dtype, torch.float32))
            logits = self.model(self.ctx.put(xb), self.ctx.put(blocks))
            loss = F.cross_entropy(logits, self.ctx.put(self.y[seeds]))
        loss.backward()
        if self.options.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.clip)
        self.opt.step()
        return float(loss.detach())

    def _period_over(self, steps: int) -> bool:
        o = self.options
        # the passes left, in this trainer's steps (at least one step: a trainer with no
        # budget left still takes part in the last average)
        left = (self.budget - self.work_total) * self.steps_per_epoch
        if steps >= max(1, math.ceil(left - 1e-9)):
            return True
        if o.period_s > 0:
            return time.monotonic() - self._t_period >= o.period_s
        return steps >= self.period_len

    def train_epoch(self, epoch: int) -> EpochResult:
        steps, loss_sum = 0, 0.0
        if self.train_idx.numel():
            while True:
                loss = self._step()
                if not math.isfinite(loss):
                    raise FloatingPointError(f"rank {self.ctx.rank}: non-finite local loss in "
                                             f"epoch {epoch}; lower train.lr or options.clip")
                steps += 1
                loss_sum += loss
                if self._period_over(steps):
                    break
        w = 1.0 if steps else 0.0
        mean_loss = loss_sum / steps if steps else 0.0
        flat, bits = self._flat_state(), self.options.avg_bits
        if bits < 32:
            # Quantize the progress since the last average, not the weights: its range (and
            # so the rounding error) is a small fraction of theirs. Every rank holds the same
            # anchor and gets the same decoded mean, so the replicas stay identical.
            flat = flat - self._anchor
        buf = torch.cat([flat * w, torch.tensor([mean_loss * w, float(steps), w])])
        gen = torch.Generator().manual_seed(stream_seed(
            self.ctx.seed, f"tma.average/{self.avg_round}", self.ctx.rank))
        total, ranks = self.chan.reduce_sum(buf, kind="model_avg", bits=bits, exact_tail=3,
                                            generator=gen, carries=Traffic.PARAMETERS)
        wsum = float(total[-1])
        if wsum > 0:
            mean = total[:-3] / wsum
            if bits < 32:
                mean = self._anchor + mean
            self._anchor = mean             # the last average, whatever the width
            self._load_flat(mean)
        self.avg_round += 1
        self._t_period = time.monotonic()
        loss = float(total[-3]) / wsum if wsum > 0 else float("nan")
        if self.ctx.rank == 0:
            self.history.append({"round": self.avg_round, "epoch": epoch, "ranks": ranks})
        mean_steps = float(total[-2]) / max(1, len(ranks))
        self.work_total += mean_steps / self.mean_steps_per_epoch
        return EpochResult(loss=loss if math.isfinite(loss) else 0.0, steps=steps,
                           work=mean_steps / self.mean_steps_per_epoch,
                           extra={"avg_round": self.avg_round, "survivors": len(ranks),
                                  "averaged_ranks": ranks, "local_steps": steps,
                                  "local_epochs": steps / max(1, self.steps_per_epoch),
                                  "mean_steps": mean_steps})

    def _float_state(self) -> list[Tensor]:
        return [t for t in self.model.state_dict().values() if t.is_floating_point()]

    def _flat_state(self) -> Tensor:
        """The model's floats in one host vector: averages are summed on the host (the hub
        moves bytes, and the anchor is one more model copy best kept out of device memory)."""
        return torch.cat([t.detach().reshape(-1).float() for t in self._float_state()]).cpu()

    def _load_flat(self, flat: Tensor) -> None:
        off = 0
        with torch.no_grad():
            for t in self._float_state():
                k = t.numel()
                t.copy_(flat[off:off + k].view_as(t))   # host to device where the model is
                off += k

    def model_numel(self) -> int:
        """Floats per model copy that cross the network in an average (``|theta|``)."""
        return sum(t.numel() for t in self._float_state())

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        accs = self.evaluator.evaluate(self.model) if self.ctx.rank == 0 else None
        # as fixed-width IEEE bits, not JSON numbers (whose length follows the digits): the
        # bytes a run sends must not depend on the values (a GPU run's records equal the CPU's)
        packed = struct.pack("<3d", *(accs[k] for k in SPLITS)).hex() if accs else None
        got = self.chan.broadcast_object(packed, kind="eval_metrics", carries=Traffic.CONTROL)
        return dict(zip(SPLITS, struct.unpack("<3d", bytes.fromhex(got))))

    # ------------------------------------------------------------------ run summary
    def gather_objects(self, obj: Any) -> Optional[list[Any]]:
        got = self.chan.gather_object(obj, kind="summary", carries=Traffic.CONTROL)
        return list(got.values()) if got is not None else []

    def run_report(self) -> dict[str, Any]:
        last = self.history[-1]["ranks"] if self.history else list(range(self.ctx.world_size))
        return {"variant": self._variant_name(), "averages": self.avg_round,
                "trainers": self.ctx.world_size, "survivors": len(last),
                "averaged_ranks_last": last, "lost": list(self.chan.lost),
                "model_floats": self.model_numel(),
                "survivors_per_average": [len(h["ranks"]) for h in self.history]}

    def _variant_name(self) -> str:
        method = None
        book = os.environ.get("QUIETGNN_BOOK")
        if book:
            from ...partition import PartitionBook
            method = PartitionBook.open(book).method
        return {"random": "RandomTMA", "supernode": "SuperTMA", "metis": "PSGD-PA"}.get(
            method or "", str(self.options.variant))

    def finished(self) -> bool:
        # done once less than half a step (of the ranks' mean pass) is left
        return (self.budget - self.work_total) * self.mean_steps_per_epoch < 0.5

    def max_calls(self, epochs: int) -> int:
        # a period is at least one step: at most one average per step of the budget
        return math.ceil(epochs * self.mean_steps_per_epoch) + 1

    def close(self) -> None:
        if self.chan is not None:     # None: setup failed before it opened the hub
            self.chan.close()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "avg_round": self.avg_round, "sampler_rng": self.sampler.gen.get_state(),
                "queue": list(self._queue), "history": list(self.history),
                "anchor": self._anchor.clone(), "work_total": self.work_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.avg_round = int(state["avg_round"])
        self.sampler.gen.set_state(state["sampler_rng"])
        self._queue = list(state.get("queue", []))
        self.history = list(state.get("history", []))
        self._anchor = state["anchor"].clone() if "anchor" in state else self._flat_state()
        # a checkpoint from before the budget was kept: every average was a whole period
        self.work_total = float(state.get("work_total", self.avg_round *
                                          float(self.options.period_epochs)))
