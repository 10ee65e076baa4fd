"""The one parser of ``options.fanouts`` (neighbours per layer), for every sampling strategy."""

from __future__ import annotations

from typing import Any

__all__ = ["parse_fanouts", "fanouts_for"]


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


def fanouts_for(fanouts: list[int], layers: int, default: list[int],
                one_for_all: bool = False) -> list[int]:
    """``fanouts`` for a model of ``layers`` layers (``one_for_all``: one value serves every
    layer), or a ValueError naming the values, whether they are the strategy's ``default``
    (made for two layers: a user who set only ``--layers 1`` never chose them) and a list
    that fits."""
    fan = list(fanouts) * layers if one_for_all and len(fanouts) == 1 else list(fanouts)
    if len(fan) == layers:
        return fan
    said = " (the default, made for 2 layers)" if list(fanouts) == list(default) else ""
    fits = ",".join(str(default[min(i, len(default) - 1)]) for i in range(layers))
    raise ValueError(f"options.fanouts = {list(fanouts)}{said} has {len(fanouts)} entries but "
                     f"model.layers = {layers}; give one fanout per layer, e.g. "
                     f"--options.fanouts {fits}")

