"""What a collective carries, and which residency level lets it cross.

Every :class:`~quietgnn.comm.Communicator` operation declares one :class:`Traffic` class
(``carries=``). An op whose payload mixes classes declares the most restricted one (a chunk of
features and labels is ``features``). The level (``runtime.residency``) is the same on every
rank and the check depends on nothing else, so every rank that reaches a forbidden op raises
:class:`ResidencyError` at the same op, before any byte (or size handshake) is sent: no rank is
left waiting on a peer that never joins.

Levels:

* ``none``     everything may cross (the default);
* ``features`` raw input features and labels never leave the rank that owns the node;
* ``strict``   moreover nothing derived from a single node before the first learned layer
  (ids, edges, degrees, gradients of single nodes' activations): only learned embeddings of
  at least one layer, parameters, their gradients and control may cross.
"""

from __future__ import annotations

from enum import Enum
from typing import Union

__all__ = ["Traffic", "LEVELS", "ResidencyError", "allowed", "forbidden", "check_traffic"]


class Traffic(str, Enum):
    #: raw input features, or rows computed from them without a learned layer (aggregates,
    #: quantized or sparse encodings, sampled rows)
    FEATURES = "features"
    #: labels and split masks of single nodes
    LABELS = "labels"
    #: graph structure of single nodes: ids, edges, degrees
    STRUCTURE = "structure"
    #: outputs of at least one learned layer
    EMBEDDINGS = "embeddings"
    #: gradients w.r.t. single nodes' activations (the backward of a halo exchange)
    ACTIVATION_GRADS = "activation_grads"
    #: gradients of model parameters (with the loss and flags summed alongside them)
    GRADIENTS = "gradients"
    #: model parameters (averaging, broadcasts)
    PARAMETERS = "parameters"
    #: aggregates and bookkeeping: counts, sizes, accuracy counts, summaries, rendezvous
    CONTROL = "control"
    #: an op that declared nothing: allowed under ``none`` only (fail closed)
    UNDECLARED = "undeclared"


LEVELS = ("none", "features", "strict")

_ALWAYS = frozenset({Traffic.EMBEDDINGS, Traffic.GRADIENTS, Traffic.PARAMETERS, Traffic.CONTROL})
_ALLOWED = {
    "none": frozenset(Traffic),
    "features": frozenset(Traffic) - {Traffic.FEATURES, Traffic.LABELS, Traffic.UNDECLARED},
    "strict": _ALWAYS,
}


class ResidencyError(RuntimeError):
    """An operation would send traffic that ``runtime.residency`` forbids (raised before it)."""


def _level(level: str) -> str:
    if level not in _ALLOWED:
        raise ValueError(f"runtime.residency = {level!r}; expected one of {list(LEVELS)}")
    return level


def allowed(level: str) -> list[str]:
    """The traffic classes that may cross under ``level``."""
    return [t.value for t in Traffic if t in _ALLOWED[_level(level)]]


def forbidden(level: str) -> list[str]:
    return [t.value for t in Traffic if t not in _ALLOWED[_level(level)]]


def check_traffic(level: str, carries: Union[Traffic, str, None], *, rank: int, op: str,
                  kind: str) -> Traffic:
    """The declared class of an op (``None``: undeclared); raises :class:`ResidencyError` if
    ``level`` forbids it. Depends on ``(level, carries)`` only: every rank decides alike."""
    try:
        t = Traffic.UNDECLARED if carries is None else Traffic(carries)
    except ValueError:
        raise ValueError(f"{op} ({kind}): carries = {carries!r}; expected one of "
                         f"{[x.value for x in Traffic]}") from None
    if t not in _ALLOWED[_level(level)]:
        raise ResidencyError(
            f"rank {rank}: {op} ({kind}) carries {t.value}, which runtime.residency = {level} "
            f"forbids (allowed: {', '.join(allowed(level))}); stopped before sending anything")
    return t
