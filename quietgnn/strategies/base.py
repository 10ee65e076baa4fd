"""The strategy interface and the registry (the pieces most strategies share: :mod:`.common`).

A strategy is one module in this package (a file, or a sub-package with its own helpers)
holding one :class:`Strategy` subclass decorated with :func:`register`; the registry discovers
them, so a new strategy touches nothing else. The trainer calls, on every rank::

    s = Strategy(ctx, options)     # ctx: WorkerContext; options: the strategy's Options
    s.setup()
    for epoch ...: s.train_epoch(epoch) -> EpochResult; sometimes s.evaluate() -> accuracies
                   (or s.evaluate_local(), an estimate on the rank's own graph, when it has one)
    s.state_dict() / s.load_state_dict(...)      # checkpoint and resume

Strategies talk to other ranks only through ``ctx.comm`` (never ``torch.distributed``), and
label no traffic themselves: the trainer wraps ``train_epoch`` in the ``train`` phase and
``evaluate`` in the ``eval`` phase.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Optional

import torch
from torch import Tensor, nn

from ..comm import Communicator
from ..comm.traffic import LEVELS
from ..nn import GNN, ModelConfig, build_model
from ..nn.model import TRAINING_COPIES
from ..nn.lean import LEAN_ARCHS
from ..partition import LocalPartition
from ..rows import to_device
from .common import global_evaluate, induced_forward

__all__ = ["Strategy", "WorkerContext", "EpochResult", "TrainConfig", "register",
           "get_strategy", "available_strategies", "options_from_dict", "check_residency"]


@dataclass
class TrainConfig:
    """Optimisation settings shared by all strategies (``train.*`` keys)."""

    #: passes over the training set (epoch-equivalents), the same work for every strategy
    #: (tma averages every options.period_epochs of them; retexo splits them over the layers)
    epochs: int = 100
    lr: float = 0.01             # Adam learning rate
    weight_decay: float = 5e-4   # Adam weight decay (L2)
    #: evaluate after every this many epoch-equivalents of training (passes over the training
    #: set, :attr:`EpochResult.work`; a ``tma`` epoch of 25 passes is evaluated every time),
    #: and always after the last epoch
    eval_every: int = 5
    #: ``local``: select the best-validation state on each rank's own graph where the strategy
    #: has a cheap one (:meth:`Strategy.evaluate_local`: no traffic but a few counts), then
    #: evaluate that state exactly once at the end; ``exact``: every evaluation is global
    eval_mode: str = "local"
    #: stop when validation accuracy has not improved for this many epoch-equivalents (0: off)
    patience: int = 0
    #: stop at the first evaluation after this many wall seconds of this attempt (0: off);
    #: the run then ends as after its last epoch (final evaluation, model, summary)
    budget_s: float = 0.0
    seed: int = 0                # seed of model init, dropout and sampling

    def __post_init__(self) -> None:
        for name, lo in (("epochs", 1), ("eval_every", 1), ("patience", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"train.{name} = {v!r}; expected an int >= {lo}")
        if self.eval_mode not in ("local", "exact"):
            raise ValueError(f"train.eval_mode = {self.eval_mode!r}; expected 'local' (select on "
                             f"each rank's own graph, one exact evaluation at the end) or "
                             f"'exact' (every evaluation global)")
        if not 0 < float(self.lr) < math.inf:
            raise ValueError(f"train.lr = {self.lr!r}; expected a finite positive number")
        if not 0 <= float(self.weight_decay) < math.inf:
            raise ValueError(f"train.weight_decay = {self.weight_decay!r}; expected a finite "
                             f"number >= 0")
        if isinstance(self.budget_s, bool) or not isinstance(self.budget_s, (int, float)) \
                or not self.budget_s >= 0:
            raise ValueError(f"train.budget_s = {self.budget_s!r}; expected seconds >= 0 "
                             f"(0: no budget)")


@dataclass
class WorkerContext:
    """What a strategy gets on its rank."""

    rank: int
    world_size: int
    comm: Communicator
    part: LocalPartition
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    run_dir: Optional[Path] = None
    log: Callable[[str], None] = print

    @property
    def seed(self) -> int:
        return self.train_cfg.seed

    def build_model(self, in_dim: Optional[int] = None, out_dim: Optional[int] = None) -> GNN:
        """The configured model, identical on every rank by construction (seeded init)."""
        m = build_model(self.model_cfg, in_dim or self.part.num_features,
                        out_dim or self.part.num_classes, self.seed,
                        copies=1 if self.device.type == "cuda" else TRAINING_COPIES)
        return m.to(self.device)

    def put(self, obj: Any) -> Any:
        """``obj`` (a tensor, SparseFeatures, SparseAdj, None, or a list/tuple of them) on this
        rank's device: host-side index work (sampling, chunk loads) hands its results over here."""
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.put(o) for o in obj)
        if isinstance(obj, Tensor):
            return to_device(obj, self.device)   # large arrays in slices (quietgnn.rows)
        return None if obj is None else obj.to(self.device)

    def optimizer(self, params: Iterable[nn.Parameter],
                  lr: Optional[float] = None) -> torch.optim.Optimizer:
        """Adam with ``train.lr`` (or ``lr``, a strategy's own step size) and weight decay."""
        return torch.optim.Adam(params, lr=self.train_cfg.lr if lr is None else float(lr),
                                weight_decay=self.train_cfg.weight_decay)


@dataclass
class EpochResult:
    """What one epoch reports: the global mean training loss, steps taken, anything else."""

    loss: float
    steps: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    #: epoch-equivalents of training work this trainer epoch did, the same on every rank: one
    #: pass over the whole training set, spread over the ranks (what one ``halo`` epoch does).
    #: 1 for every strategy whose epoch is such a pass; ``tma``, whose epoch is an averaging
    #: period of many local passes, reports how many. Summaries and reports divide bytes and
    #: time per epoch by it, so strategies compare per unit of work, not per trainer epoch.
    work: float = 1.0


@dataclass
class NoOptions:
    """This strategy has no options."""


class Strategy(ABC):
    """Base class of all strategies (see the module docstring)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    #: partitioner used when the run config names none
    default_partitioner: ClassVar[str] = "metis"
    #: a strategy that must run on exactly this many ranks (``centralized``: 1)
    fixed_parts: ClassVar[Optional[int]] = None
    #: claims equality with ``centralized`` (tested)
    exact: ClassVar[bool] = False
    #: its work to an accuracy is paced by its own schedule (averaging rounds, layers trained
    #: in turn), not only by the gradient steps ``centralized`` needs on the graph: the advisor
    #: may then model that work as a constant (:mod:`quietgnn.analysis.advise.fit`); False: a
    #: multiple of ``centralized``'s, as for any gradient method on the same model
    own_schedule: ClassVar[bool] = False
    #: the run survives the death of ranks other than 0: the launcher keeps the others running
    #: and rank 0 writes the summary. Such a strategy must not use gloo collectives after
    #: setup and overrides :meth:`gather_objects` (``tma``: averaging through a hub on rank 0)
    tolerates_failures: ClassVar[bool] = False
    #: the ``runtime.residency`` levels it runs under (comm/traffic.py); under any other level
    #: it is refused before the run starts, naming ``residency_traffic``
    residency_levels: ClassVar[tuple[str, ...]] = ("none",)
    #: what it sends that a stricter level forbids (one clause, for the refusal)
    residency_traffic: ClassVar[str] = "traffic it has not declared residency-safe"

    @classmethod
    def reads_stored_part(cls, options: Any) -> bool:
        """True when, with ``options``, the strategy takes a prepared part as stored: ``indices``
        int32 (when the part's local ids fit) and ``x`` float16 (when prepared so), both
        memory-mapped, instead of int64 / float32 copies of them in the rank's memory. Such a
        strategy widens only what it reads (a minibatch's rows); False (the default): every
        array arrives widened, as the in-memory partitions are."""
        return False

    @classmethod
    def check_model(cls, options: Any, model_cfg: ModelConfig) -> None:
        """Raise ``ValueError`` (naming the values and the fix) when ``options`` cannot train
        ``model_cfg``; called when a run's configuration is built, before any process starts,
        and again in :meth:`setup` by strategies that need it. Default: every model."""

    @classmethod
    def check_partition(cls, options: Any, method: str) -> None:
        """Raise ``ValueError`` (naming the values and the fix) when ``options`` cannot train
        on parts made by partitioner ``method``; called when a run's configuration is built,
        before any process starts. Default: any partitioner."""

    @classmethod
    def updates_per_pass(cls, options: Any, train_per_part: list[int]) -> int:
        """Optimizer updates in one epoch-equivalent (one pass over the training set) with
        ``options`` when part r owns ``train_per_part[r]`` training nodes: 1 for a full-batch
        strategy (one gradient step per pass); a mini-batch strategy takes one per batch. The
        advisor counts a strategy's work to the target in updates, not passes."""
        return 1

    def __init__(self, ctx: WorkerContext, options: Any = None) -> None:
        self.ctx = ctx
        self.options = options if options is not None else self.Options()

    @abstractmethod
    def setup(self) -> None: ...

    @abstractmethod
    def train_epoch(self, epoch: int) -> EpochResult: ...

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Global accuracies ``{'train': .., 'val': .., 'test': ..}`` (same on every rank)."""

    def evaluate_local(self) -> Optional[dict[str, float]]:
        """Accuracies from each rank's own graph, no feature or activation traffic (only the
        counts are summed), the same on every rank: an estimate to select the best state by
        (``train.eval_mode local``). ``None`` (the default): no cheaper evaluation than
        :meth:`evaluate`, which the trainer then uses. A strategy overriding this must make
        :meth:`eval_state` / :meth:`load_eval_state` hold what :meth:`evaluate` reads."""
        return None

    def eval_state(self) -> Any:
        """A copy of what :meth:`evaluate` reads (default: ``self.model``'s weights), kept when
        a local evaluation selects it and restored for the one exact evaluation at the end."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def load_eval_state(self, state: Any) -> None:
        self.model.load_state_dict(state)

    def _induced_evaluate(self) -> dict[str, float]:
        """:meth:`evaluate_local` of a strategy whose ``self.model`` runs on its partition:
        the subgraph induced by the owned nodes (:func:`induced_forward`, built once)."""
        fwd = getattr(self, "_induced_fwd", None)
        if fwd is None:
            fwd = self._induced_fwd = induced_forward(self.model, self.ctx.part, self.ctx.device)
        return global_evaluate(self.model, self.ctx.part, self.ctx.comm, fwd)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs (model, optimizer, the strategy's own state)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def finished(self) -> bool:
        """True when the strategy's own schedule is done before ``train.epochs``."""
        return False

    def max_calls(self, epochs: int) -> int:
        """The trainer's loop bound, asked after :meth:`setup`: ``epochs`` calls, one pass each.
        A strategy whose call is another amount of work bounds it here and ends the run with
        :meth:`finished` once ``train.epochs`` passes are done."""
        return epochs

    def settle(self) -> None:
        """The run ends, or its state is saved, with this epoch: wait for any traffic kept in
        flight across epochs (``pipegcn``'s pipeline), so that the epoch's records count it.
        Default: none."""

    def close(self) -> None:
        """Release what :meth:`setup` opened beside the communicator (sockets, threads), once
        the run is over; a process that trains again (a study's next configuration) starts
        clean. Default: nothing to release."""

    def export_model(self) -> Optional[GNN]:
        """The whole model :meth:`evaluate` scores, as a :class:`~quietgnn.nn.GNN` (what a run
        saves as its trained model), or None when what it scores is not one. Default: the
        strategy's ``self.model`` (replicated on every rank, or rank 0's average in ``tma``)."""
        model = getattr(self, "model", None)
        return model if isinstance(model, GNN) else None

    def gather_objects(self, obj: Any) -> Optional[list[Any]]:
        """Collect ``obj`` from every live rank on rank 0 for the run summary (others get
        ``[]``). ``None`` (the default): the trainer uses ``comm.all_gather_object``."""
        return None

    def run_report(self) -> dict[str, Any]:
        """Strategy facts for rank 0's summary (``summary['strategy_report']``), e.g. ranks
        lost during the run; empty: nothing to add."""
        return {}


# ---------------------------------------------------------------------- registry
_REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a non-empty class attribute 'name'")
    _REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    from .. import strategies as pkg
    for mod in pkgutil.iter_modules(pkg.__path__):
        if not mod.name.startswith("_") and mod.name != "base":
            importlib.import_module(f"{pkg.__name__}.{mod.name}")


def available_strategies() -> dict[str, type[Strategy]]:
    _discover()
    return dict(sorted(_REGISTRY.items()))


def get_strategy(name: str) -> type[Strategy]:
    reg = available_strategies()
    if name not in reg:
        raise ValueError(f"unknown strategy {name!r}; expected one of {list(reg)}")
    return reg[name]


def options_from_dict(cls: type[Strategy], values: dict[str, Any]) -> Any:
    """Build ``cls.Options`` from a dict, rejecting unknown keys by name."""
    fields = {f.name for f in dataclasses.fields(cls.Options)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for strategy {cls.name!r}; valid options: "
                         f"{sorted(fields) or 'none'}")
    return cls.Options(**values)


def check_residency(cls: type[Strategy], level: str, partition_method: Optional[str]) -> None:
    """Refuse, in one line, a strategy that needs traffic ``level`` forbids, or a partitioner
    that would move nodes away from where their data lives (None: a configured book's, checked
    where the book is opened)."""
    if level not in LEVELS:
        raise ValueError(f"runtime.residency = {level!r}; expected one of {list(LEVELS)}")
    if level == "none":
        return
    if level not in cls.residency_levels:
        ok = [n for n, c in available_strategies().items() if level in c.residency_levels]
        raise ValueError(f"runtime.residency = {level}: strategy {cls.name!r} "
                         f"{cls.residency_traffic}, which {level} forbids; strategies allowed "
                         f"under {level}: {', '.join(ok) or 'none'}")
    if partition_method not in (None, "given"):
        raise ValueError(f"runtime.residency = {level} keeps each node's data on the site that "
                         f"holds it, but partitioner {partition_method!r} would place nodes; "
                         f"pass --partitioner given --partition.file ASSIGNMENT (the site of "
                         f"each node), or a graph prepared with it")


# ---------------------------------------------------------------------- shared pieces
def check_gradient_compression(grad_bits: Any, grad_rank: Any) -> None:
    """``options.grad_bits`` / ``options.grad_rank`` of a strategy whose only training traffic
    is a gradient all-reduce (``grappa``, ``retexo``): quantized or low-rank, or exact."""
    if grad_bits not in (2, 4, 8, 32):
        raise ValueError(f"options.grad_bits = {grad_bits!r}; expected 2, 4, 8 (the gradient "
                         f"all-reduce stochastically quantized) or 32 (exact)")
    if not isinstance(grad_rank, int) or isinstance(grad_rank, bool) or grad_rank < 0:
        raise ValueError(f"options.grad_rank = {grad_rank!r}; expected an int >= 0 (0: exact "
                         f"gradients; r >= 1: rank-r factors with error feedback)")


class LeanOption:
    """A strategy with ``options.lean``: the memory-lean GCN path of :mod:`quietgnn.nn.lean`,
    which reads the part as stored and needs a GCN model (refused otherwise, before launch)."""

    name: ClassVar[str]

    @classmethod
    def reads_stored_part(cls, options: Any) -> bool:
        # the lean path widens what it reads a slice at a time (int32 edges, float16 rows)
        return bool(getattr(options, "lean", False))

    @classmethod
    def check_model(cls, options: Any, model_cfg: ModelConfig) -> None:
        if getattr(options, "lean", False) and model_cfg.arch not in LEAN_ARCHS:
            raise ValueError(f"{cls.name}: options.lean = true needs model.arch in "
                             f"{list(LEAN_ARCHS)}; got model.arch = {model_cfg.arch!r}: set "
                             f"model.arch gcn or options.lean false")
