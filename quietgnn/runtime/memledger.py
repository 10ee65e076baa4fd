"""A rank's memory ledger: every tensor and array reachable from the strategy, by attribute
path, with its bytes and whether its pages are anonymous or a mapped file.

Diagnostics only, off unless ``QUIETGNN_MEM_LEDGER`` is set (to anything): the trainer then
writes ``logs/memledger-rank<k>-<when>.json`` after set-up and after training. Peak RSS alone
cannot tell a copy from the page cache of a memory-mapped part (clean file pages the kernel
reclaims under pressure), nor name the buffer that grew; this does both:

* ``status``: ``RssAnon`` / ``RssFile`` / ``VmHWM`` of ``/proc/self/status`` (KiB), now;
* ``buffers``: one row per distinct storage (views of one storage count once, under the
  first path that reached them), biggest first, with ``mapped`` true when its first byte lies
  in a file-backed mapping of ``/proc/self/maps`` (its resident pages are then page cache).
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["enabled", "write_ledger", "ledger"]

_ENV = "QUIETGNN_MEM_LEDGER"


def enabled() -> bool:
    return bool(os.environ.get(_ENV))


def _file_maps() -> tuple[list[int], list[tuple[int, int, str]]]:
    """Sorted starts and (start, end, path) of the file-backed mappings of this process."""
    regions = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/"):
                lo, hi = (int(v, 16) for v in fields[0].split("-"))
                regions.append((lo, hi, fields[5].strip()))
    regions.sort()
    return [r[0] for r in regions], regions


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[key] = int(val.split()[0])
    return out


def _key(k: Any) -> str:
    # an optimizer's state is keyed by its parameters: name them by shape, not by their values
    if isinstance(k, torch.Tensor):
        return f"<{str(k.dtype).replace('torch.', '')} {list(k.shape)}>"
    return repr(k)


def _walk(root: Any, name: str, max_depth: int = 7):
    """(path, tensor or ndarray) of everything reachable through attributes, containers and
    closures, each object visited once."""
    seen: set[int] = set()
    stack = [(name, root, 0)]
    while stack:
        path, obj, depth = stack.pop()
        if id(obj) in seen or depth > max_depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, np.ndarray)):
            yield path, obj
            continue
        if isinstance(obj, (str, bytes, int, float, bool, type(None), type)):
            continue
        if isinstance(obj, dict):
            items = [(f"{path}[{_key(k)}]", v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        elif callable(obj) and getattr(obj, "__closure__", None):
            items = [(f"{path}<closure{i}>", c.cell_contents)
                     for i, c in enumerate(obj.__closure__) if c.cell_contents is not None]
        else:
            d = getattr(obj, "__dict__", None)
            items = [(f"{path}.{k}", v) for k, v in d.items()] if isinstance(d, dict) else []
            for slot in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, slot):
                    items.append((f"{path}.{slot}", getattr(obj, slot)))
        stack.extend((p, v, depth + 1) for p, v in reversed(items))


def ledger(roots: dict[str, Any]) -> dict[str, Any]:
    starts, regions = _file_maps()
    rows, seen = [], set()
    for rname, root in roots.items():
        for path, a in _walk(root, rname):
            if isinstance(a, torch.Tensor):
                if a.device.type != "cpu" or a.layout != torch.strided:
                    continue
                st = a.untyped_storage()
                ptr, nbytes = st.data_ptr(), st.nbytes()
                dtype, shape = str(a.dtype).replace("torch.", ""), list(a.shape)
            else:
                base = a
                while isinstance(base.base, np.ndarray):
                    base = base.base
                ptr, nbytes = base.__array_interface__["data"][0], base.nbytes
                dtype, shape = str(a.dtype), list(a.shape)
            if ptr == 0 or (ptr, nbytes) in seen:
                continue
            seen.add((ptr, nbytes))
            i = bisect_right(starts, ptr) - 1
            mapped = i >= 0 and regions[i][0] <= ptr < regions[i][1]
            rows.append({"name": path, "dtype": dtype, "shape": shape, "bytes": int(nbytes),
                         "mapped": bool(mapped)})
    rows.sort(key=lambda r: -r["bytes"])
    anon = sum(r["bytes"] for r in rows if not r["mapped"])
    return {"status_kib": _status(), "anon_buffer_bytes": anon, "buffers": rows}


def write_ledger(run_dir: Path, rank: int, when: str, roots: dict[str, Any]) -> None:
    out = Path(run_dir) / "logs" / f"memledger-rank{rank}-{when}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(ledger(roots), indent=1))
