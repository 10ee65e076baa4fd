"""The one parser of ``options.fanouts`` (neighbours per layer), for every sampling strategy."""

from __future__ import annotations

from typing import Any

__all__ = ["parse_fanouts"]


def parse_fanouts(value: Any, *, allow_all: bool = True) -> list[int]:
    """``value`` as a list of ints: an int, a list/tuple, or a string such as ``"15,10"``,
    ``"[25, 10]"`` or ``"15 10"`` (what ``--options.fanouts`` gets on the command line).
    Every entry is >= 1, or -1 for all neighbours where ``allow_all``; a ValueError names the
    value and the expected form otherwise."""
    raw = value
    if isinstance(value, bool):
        value = None
    elif isinstance(value, int):
        value = [value]
    elif isinstance(value, str):
        value = [v for v in value.strip("[]() ").replace(" ", ",").split(",") if v.strip()]
    try:
        out = [int(v) for v in value]          # type: ignore[union-attr]
        if any(isinstance(v, bool) or (isinstance(v, float) and v != int(v))
               for v in value):                 # type: ignore[union-attr]
            raise ValueError
    except (TypeError, ValueError):
        out = []
    if not out or any(f < 1 and not (allow_all and f == -1) for f in out):
        allowed = "ints >= 1 (or -1 for all neighbours)" if allow_all else "ints >= 1"
        raise ValueError(f"options.fanouts = {raw!r}; expected {allowed}, one per layer, e.g. "
                         f"'15,10' or [25, 10]")
    return out
