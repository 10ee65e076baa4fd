"""Communication strategies: one file each, discovered automatically (see ``base.py``)."""

from .base import (EpochResult, NonFiniteError, Strategy, TrainConfig, WorkerContext,
                   available_strategies, get_strategy, register)

__all__ = ["EpochResult", "NonFiniteError", "Strategy", "TrainConfig", "WorkerContext",
           "available_strategies", "get_strategy", "register"]
