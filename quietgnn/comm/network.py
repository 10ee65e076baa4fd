"""Network tiers: a network described by a bandwidth and a latency per hop.

The built-in tiers (:data:`TIERS`), a parser for custom ones (``name:bandwidth:latency``) and
the seconds a tier charges for some hops and bytes. What a recorded run would cost on a tier
is :mod:`quietgnn.analysis.projection`'s; strategies that choose by network (``adaqp``'s
``time_model``) read the tiers here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["Tier", "TIERS", "parse_tier", "resolve_tiers"]


@dataclass(frozen=True)
class Tier:
    """A network: ``bandwidth`` in bits per second per rank link, ``latency`` in seconds per
    hop."""

    name: str
    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth > 0
                and math.isfinite(self.bandwidth)):
            raise ValueError(f"tier {self.name!r}: bandwidth = {self.bandwidth!r}; expected a "
                             f"positive number of bits per second (e.g. 1e9 or 1G)")
        if not (isinstance(self.latency, (int, float)) and self.latency >= 0
                and math.isfinite(self.latency)):
            raise ValueError(f"tier {self.name!r}: latency = {self.latency!r}; expected seconds "
                             f">= 0 (e.g. 0.0005 or 500us)")

    def seconds(self, hops: float, crit_bytes: float) -> float:
        """Projected communication seconds for ``hops`` latency steps and ``crit_bytes``
        bytes on the slowest rank."""
        return hops * self.latency + 8.0 * crit_bytes / self.bandwidth

    def describe(self) -> str:
        return f"{self.name} ({_fmt_bw(self.bandwidth)}, {_fmt_lat(self.latency)})"


TIERS: dict[str, Tier] = {t.name: t for t in (
    Tier("datacenter", 100e9, 5e-6),
    Tier("cluster", 10e9, 50e-6),
    Tier("lan", 1e9, 0.5e-3),
    Tier("wan", 100e6, 20e-3),
    Tier("edge", 10e6, 50e-3),
)}

_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIME = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _fmt_bw(bps: float) -> str:
    for unit, f in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= f:
            return f"{bps / f:g} {unit}"
    return f"{bps:g} bit/s"


def _fmt_lat(s: float) -> str:
    if s >= 1e-3 or s == 0:
        return f"{s * 1e3:g} ms"
    return f"{s * 1e6:g} us"


def _number(text: str, units: Mapping[str, float], what: str, spec: str) -> float:
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([a-zA-Zµ]*?)(?:bit/s|bps|b/s)?\s*", text)
    if not m or m.group(2).lower() not in {k.lower() for k in units}:
        raise ValueError(f"tier {spec!r}: cannot read {what} {text!r}; expected a number with an "
                         f"optional unit in {sorted(u for u in units if u)}")
    unit = {k.lower(): v for k, v in units.items()}[m.group(2).lower()]
    try:
        return float(m.group(1)) * unit
    except ValueError as exc:
        raise ValueError(f"tier {spec!r}: {what} {text!r} is not a number") from exc


def parse_tier(spec: str) -> Tier:
    """``"name:bandwidth:latency"`` -> :class:`Tier`. Bandwidth in bit/s with an optional SI
    prefix (``1e9``, ``1G``, ``250M``); latency in seconds with an optional unit (``0.02``,
    ``20ms``, ``5us``). A bare built-in name (``wan``) returns the built-in tier."""
    if spec.lower() in TIERS:
        return TIERS[spec.lower()]
    parts = spec.split(":")
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"tier {spec!r}: expected NAME:BANDWIDTH_BITS_PER_S:LATENCY_S (e.g. "
                         f"'metro:10G:2ms' or 'sat:2e7:0.6') or one of {sorted(TIERS)}")
    return Tier(parts[0], _number(parts[1], _SI, "bandwidth", spec),
                _number(parts[2], _TIME, "latency", spec))


def resolve_tiers(extra: Sequence[str] = (), builtin: bool = True) -> dict[str, Tier]:
    """The built-in tiers (unless ``builtin=False``) plus custom ``extra`` specs, by name."""
    out = dict(TIERS) if builtin else {}
    for spec in extra:
        t = parse_tier(spec)
        out[t.name] = t
    return out
