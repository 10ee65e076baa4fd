"""The record contract: what a run writes, field by field, for everything that reads it.

The trainer builds these; ``quietgnn report``, ``quietgnn bench``, the advisor, the
benchmarks and the tests read them. The files (``metrics/rank-<r>.jsonl``, one
:class:`SetupRecord` then one :class:`EpochRecord` per line; ``summary.json``, one
:class:`RunSummary`) are plain JSON whose keys are these classes' fields: a record is built
with its fields named (a misspelt one is a ``TypeError``), written with :meth:`Record.to_json`
and read back with :meth:`Record.from_json`, and code reads fields as attributes, never by a
string. ``tests/test_records.py`` checks that what the trainer writes has exactly these fields,
so a new one is documented here or the suite fails.

Bytes are the communicator's exact counts of payload (and the header bytes it counts for
framed messages), never estimates; seconds are wall-clock unless named ``cpu`` or
``compute``. "Epoch-equivalent": one pass over the training set (``EpochResult.work``), the
unit in which strategies whose trainer epoch is several passes (``tma``) compare with the rest.
"""

import dataclasses
import functools
import typing
from typing import Any, Mapping, Optional, TypedDict, TypeVar

__all__ = ["Record", "PhaseBytes", "SetupRecord", "EpochRecord", "RunSummary", "optional",
           "metrics_line"]

R = TypeVar("R", bound="Record")


def optional(**kw: Any) -> Any:
    """A field a record may leave out: ``None`` by default, and then absent from the file."""
    return dataclasses.field(default=None, metadata={"optional": True}, **kw)


@dataclasses.dataclass(frozen=True)
class Record:
    """A record's fields and their JSON form. Reading is lenient with age: a file written
    before a field existed reads ``None`` (or the field's default) for it, and keys this
    version does not know are left out; a field whose type is a record (or a list of them)
    is read as one."""

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.metadata.get("optional"):
                continue
            out[f.name] = _to_json(v)
        return out

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        if isinstance(data, cls):
            return data
        hints = _hints(cls)
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                kw[f.name] = _from_json(data[f.name], hints[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                kw[f.name] = None
        return cls(**kw)

    @classmethod
    def required(cls) -> set[str]:
        """The fields every record of this kind holds in its file."""
        return {f.name for f in dataclasses.fields(cls) if not f.metadata.get("optional")}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # resolved once per class: a run's curve reads every metrics line through from_json
    return typing.get_type_hints(cls)


def _to_json(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, (list, tuple)):
        return [_to_json(x) for x in v]
    return v


def _record_type(hint: Any) -> Optional[type]:
    for h in (hint, *typing.get_args(hint)):      # X, Optional[X]
        if isinstance(h, type) and issubclass(h, Record):
            return h
    return None


def _from_json(v: Any, hint: Any) -> Any:
    if v is None:
        return None
    rec = _record_type(hint)
    if rec is not None and isinstance(v, Mapping):
        return rec.from_json(v)
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        rec = _record_type(item)
        if rec is not None:
            return [rec.from_json(x) for x in v]
    return v


class PhaseBytes(TypedDict):
    """Bytes this rank sent and received in one phase (``setup``, ``train``, ``eval``, ...)."""

    sent: int
    recv: int


@dataclasses.dataclass(frozen=True)
class SetupRecord(Record):
    """The first line of a rank's metrics: the set-up (loading, partition plans, fetches)."""

    epoch: int                          #: always -1
    rank: int
    phase: str                          #: always "setup"
    bytes: dict[str, PhaseBytes]        #: by phase (the set-up's ops are all "setup")
    #: per op: [round, kind, phase, sent, recv, hops, s], + overlap s for an op waited later
    rounds: list[list[Any]]
    peak_rss_mb: float                  #: this process's peak resident memory so far
    setup_s: float                      #: wall seconds from the start to the first epoch
    #: on a GPU, the most its tensors held there so far (MiB); None on the CPU
    peak_gpu_mb: Optional[float] = optional()

    def sent(self, phase: str) -> int:
        """Bytes this rank sent in ``phase``."""
        return _sent(self.bytes, phase)


@dataclasses.dataclass(frozen=True)
class EpochRecord(Record):
    """One line per trainer epoch and rank."""

    epoch: int                          #: 0, 1, ... (a trainer epoch: one ``train_epoch``)
    rank: int
    loss: float                         #: the training loss the strategy reported (global)
    steps: int                          #: optimizer steps in the epoch
    work: float                         #: epoch-equivalents of training done in the epoch
    train_acc: Optional[float]          #: accuracies of this epoch's evaluation, else None
    val_acc: Optional[float]
    test_acc: Optional[float]
    wall_s: float                       #: the epoch's wall seconds, evaluation included
    compute_s: float                    #: training CPU seconds less communication's (GPU: wall)
    comm_s: float                       #: wall seconds inside training collectives
    eval_s: float                       #: wall seconds of the evaluation (0 if none)
    eval_compute_s: float               #: the evaluation's CPU seconds less communication's
    cpu_s: float                        #: process CPU seconds of training (all threads)
    eval_cpu_s: float                   #: process CPU seconds of the evaluation
    eval_mode: Optional[str]            #: "local", "exact" or None (not evaluated)
    bytes: dict[str, PhaseBytes]        #: by phase: "train", "eval", "control", ...
    bytes_by_kind: dict[str, int]       #: sent, by "phase/kind" (e.g. "train/halo_fwd")
    messages: int                       #: point-to-point messages of training
    #: per op: [round, kind, phase, sent, recv, hops, s], + overlap s for an op waited later
    rounds: list[list[Any]]
    peak_rss_mb: float                  #: this process's peak resident memory so far
    extra: dict[str, Any]               #: the strategy's own per-epoch figures
    #: the exact evaluation of the selected state, on the run's last epoch
    selected: Optional[dict[str, Any]] = optional()
    #: on a GPU, the most this rank's tensors held there so far (MiB); None on the CPU
    peak_gpu_mb: Optional[float] = optional()

    def sent(self, phase: str) -> int:
        """Bytes this rank sent in ``phase`` (0 where it sent nothing)."""
        return _sent(self.bytes, phase)

    @property
    def passes(self) -> float:
        """``work``, 1 for a record written before it was kept."""
        return 1.0 if self.work is None else float(self.work)


def _sent(by_phase: Optional[Mapping[str, PhaseBytes]], phase: str) -> int:
    return int(((by_phase or {}).get(phase) or {}).get("sent", 0))


@dataclasses.dataclass(frozen=True)
class RunSummary(Record):
    """``summary.json``: rank 0's account of the whole run (every rank's records gathered)."""

    strategy: str
    dataset: str
    parts: int                          #: ranks (= partitions)
    partitioner: str
    model: str                          #: the architecture: gcn, sage, gat, gin
    layers: int
    hidden: int
    seed: int
    epochs: int                         #: trainer epochs run (the fewest of any rank)
    test_acc: float                     #: at the selected state (best validation)
    val_acc: float
    train_acc: Optional[float]
    best_epoch: int                     #: the trainer epoch of the selected state
    selected_by: str                    #: "exact", or "local" (then checked exactly once)
    eval_sample_nodes: Optional[int]    #: a strategy's fixed evaluation sample, else None
    local_val_acc: Optional[float]      #: the local estimate that selected it ("local")
    evaluations: int
    stopped_early: bool                 #: by ``train.patience`` or ``train.budget_s``
    final_loss: float
    train_bytes: int                    #: sent in training, all ranks, all epochs
    epoch_equivalents: float            #: passes over the training set (sum of ``work``)
    train_bytes_per_epoch: float        #: ``train_bytes`` per epoch-equivalent, all ranks
    rank0_train_bytes_per_epoch: float  #: what the progress line shows
    eval_bytes: int                     #: sent in evaluations, all ranks
    wall_seconds: float                 #: this attempt's wall seconds
    attempts: int                       #: torchrun restarts and resumes included
    wall_seconds_total: float           #: over every attempt
    compute_seconds: float              #: per epoch the slowest rank's, summed
    peak_rss_mb: float                  #: the largest of any rank
    run_dir: str
    options: dict[str, Any]             #: the strategy's options as run
    residency: str                      #: the data-residency level enforced
    bytes_sent_by_class: dict[str, int]            #: all ranks, by traffic class
    bytes_sent_by_class_per_rank: dict[str, dict[str, int]]
    #: the strategy's own account (``Strategy.run_report``), where it gives one
    strategy_report: Optional[dict[str, Any]] = optional()
    #: what stopped the run early: ``patience`` or ``budget`` (None: it ran its epochs)
    stopped_by: Optional[str] = optional()
    #: on GPUs, the most any rank's tensors held on its device (MiB); None on CPUs
    peak_gpu_mb: Optional[float] = optional()


def metrics_line(line: Mapping[str, Any] | SetupRecord | EpochRecord
                 ) -> SetupRecord | EpochRecord:
    """One line of a metrics file as its record: the set-up's (epoch -1) or an epoch's."""
    if isinstance(line, (SetupRecord, EpochRecord)):
        return line
    return (SetupRecord if line.get("epoch") == -1 else EpochRecord).from_json(line)
