"""Communication strategies: one module each (a file, or a sub-package with
its own helpers), discovered automatically (see ``base.py``)."""

from .base import (EpochResult, Strategy, TrainConfig, WorkerContext, available_strategies,
                   get_strategy, register)
from .common import NonFiniteError

__all__ = ["EpochResult", "NonFiniteError", "Strategy", "TrainConfig", "WorkerContext",
           "available_strategies", "get_strategy", "register"]
