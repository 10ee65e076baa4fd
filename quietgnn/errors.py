"""How a failed run is reported: one classification of exceptions, by class name, for the worker
(its own exception), the launcher's supervisor (a rank's traceback, as text) and the CLI.

* *consequence*: a rank that failed because another did (a peer died or hung), or that stopped
  with every rank (a NaN, a checkpoint that could not be written): its one line says it all,
  and the cause is another rank's error;
* *input*: bad input (``ValueError``): the message names the value and the fix; exit code 2;
* *explained*: one line on stderr suffices (the two above, a residency violation, whose
  message names the traffic and the level, a rank that failed to authenticate, and a file
  that could not be written); anything else is a bug, and its traceback is shown.
"""

from __future__ import annotations

from typing import Union

__all__ = ["CONSEQUENCE", "INPUT", "EXPLAINED", "class_name", "is_consequence",
           "is_input_error", "is_explained"]

CONSEQUENCE = frozenset({"CommError", "NonFiniteError", "CheckpointError"})
INPUT = frozenset({"ValueError"})
#: WriteError: a file write's own (safefiles.atomic_write: "could not write '<path>': No space
#: left on device"); PartitionerError: METIS stopped (partition/partitioners.py); other
#: OSErrors (too many open files, a library that will not load) are bugs or environments
#: whose traceback helps
EXPLAINED = CONSEQUENCE | INPUT | {"ResidencyError", "AuthError", "WriteError",
                                   "PartitionerError"}


def class_name(error: Union[BaseException, str]) -> str:
    """The exception's class name; for a traceback's text, the class on its last line
    (``quietgnn.comm.communicator.CommError: rank 1: ...`` -> ``CommError``)."""
    if isinstance(error, BaseException):
        return type(error).__name__
    lines = [x for x in error.strip().splitlines() if x.strip()]
    head = lines[-1].strip().split(":", 1)[0] if lines else ""
    return head.rsplit(".", 1)[-1]


def is_consequence(error: Union[BaseException, str]) -> bool:
    return class_name(error) in CONSEQUENCE


def is_input_error(error: Union[BaseException, str]) -> bool:
    return class_name(error) in INPUT


def is_explained(error: Union[BaseException, str]) -> bool:
    return class_name(error) in EXPLAINED
