"""The record contract: what a run writes, field by field, for everything that reads it.

The trainer builds these; ``quietgnn report``, ``quietgnn bench``, the advisor, the
benchmarks and the tests read them. They are ``TypedDict``s, not classes: the files
(``metrics/rank-<r>.jsonl``, one :class:`SetupRecord` then one :class:`EpochRecord` per line;
``summary.json``, one :class:`RunSummary`) are plain JSON whose keys these types name, so a
reader of an old run directory reads the same dictionaries, and a type checker sees a key that
is not here. ``tests/test_records.py`` checks that what the trainer writes has exactly these
keys, so a new field is documented here or the suite fails.

Bytes are the communicator's exact counts of payload (and the header bytes it counts for
framed messages), never estimates; seconds are wall-clock unless named ``cpu`` or
``compute``. "Epoch-equivalent": one pass over the training set (``EpochResult.work``), the
unit in which strategies whose trainer epoch is several passes (``tma``) compare with the rest.
"""

# no ``from __future__ import annotations`` here: TypedDict reads NotRequired off evaluated
# annotations (as strings, every key would count as required)
from typing import Any, NotRequired, Optional, TypedDict

__all__ = ["PhaseBytes", "SetupRecord", "EpochRecord", "RunSummary"]


class PhaseBytes(TypedDict):
    """Bytes this rank sent and received in one phase (``setup``, ``train``, ``eval``, ...)."""

    sent: int
    recv: int


class SetupRecord(TypedDict):
    """The first line of a rank's metrics: the set-up (loading, partition plans, fetches)."""

    epoch: int                          #: always -1
    rank: int
    phase: str                          #: always "setup"
    bytes: dict[str, PhaseBytes]        #: by phase (the set-up's ops are all "setup")
    rounds: list[list[Any]]             #: per op: [round, kind, phase, sent, recv, hops, s]
    peak_rss_mb: float                  #: this process's peak resident memory so far
    setup_s: float                      #: wall seconds from the start to the first epoch


class EpochRecord(TypedDict):
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
    compute_s: float                    #: training CPU seconds less communication's
    comm_s: float                       #: wall seconds inside training collectives
    eval_s: float                       #: wall seconds of the evaluation (0 if none)
    eval_compute_s: float               #: the evaluation's CPU seconds less communication's
    cpu_s: float                        #: process CPU seconds of training (all threads)
    eval_cpu_s: float                   #: process CPU seconds of the evaluation
    eval_mode: Optional[str]            #: "local", "exact" or None (not evaluated)
    bytes: dict[str, PhaseBytes]        #: by phase: "train", "eval", "control", ...
    bytes_by_kind: dict[str, int]       #: sent, by "phase/kind" (e.g. "train/halo_fwd")
    messages: int                       #: point-to-point messages of training
    rounds: list[list[Any]]             #: per op: [round, kind, phase, sent, recv, hops, s]
    peak_rss_mb: float                  #: this process's peak resident memory so far
    extra: dict[str, Any]               #: the strategy's own per-epoch figures
    #: the exact evaluation of the selected state, on the run's last epoch
    selected: NotRequired[dict[str, Any]]


class RunSummary(TypedDict):
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
    stopped_early: bool                 #: by ``train.patience``
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
    strategy_report: NotRequired[dict[str, Any]]
