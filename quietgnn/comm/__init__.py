"""Counted communication: the communicator, halo exchange, (later) codecs and network model."""

from .communicator import CommError, Communicator, OpRecord, PendingExchange
from .halo import HaloExchanger, fetch_static_rows
from .traffic import ResidencyError, Traffic

__all__ = ["CommError", "Communicator", "OpRecord", "PendingExchange", "HaloExchanger",
           "fetch_static_rows", "ResidencyError", "Traffic"]
