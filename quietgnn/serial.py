"""Safe serialization: tensors and plain data only, never a pickle that could run code.

Everything quietgnn reads from disk (partition parts, checkpoint shards) or receives from a
peer (gathered objects, the averaging hub's messages) is loaded with
``torch.load(weights_only=True)`` or parsed as JSON: a file or message crafted to run code
when unpickled (``__reduce__`` -> ``os.system``) is refused with a one-line ``ValueError``
instead, never with torch's advice to retry with
``weights_only=False``.

What may be stored: tensors, ``dict`` (and ``OrderedDict``, e.g. a ``state_dict``), ``list``,
``tuple``, ``set``, ``str``, ``bytes``, ``int``, ``float``, ``complex``, ``bool``, ``None``,
``torch.Size`` / ``dtype`` / ``device``, and numpy arrays and scalars, which are stored as a
tagged dict holding their bytes in a uint8 tensor (:func:`to_plain`) and restored bit for bit
with their dtype (:func:`from_plain`): ``np.random.get_state()`` round-trips exactly. Anything
else fails when it is *saved*, naming where it sits, so a checkpoint that was written can
always be read back.

How files are written and which names may be opened: :mod:`quietgnn.safefiles`.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, Optional

import numpy as np
import torch

__all__ = ["to_plain", "from_plain", "dumps", "loads", "save_bytes", "load_file", "loads_json",
           "json_excerpt"]

#: key of the tagged dict that stands for a numpy array or scalar
NP_TAG = "__quietgnn_numpy__"
_SCALARS = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device,
            torch.Size)
_JSON = object()   # marker: "this value is exact in JSON" (see _json_exact)


# ---------------------------------------------------------------------- numpy <-> tagged
def _np_encode(a: Any, where: str) -> dict[str, Any]:
    arr = np.asarray(a)
    if arr.dtype.hasobject:
        raise TypeError(f"{where}: numpy array of dtype object cannot be stored safely; "
                        f"convert it to numbers or plain Python values")
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return {NP_TAG: "scalar" if isinstance(a, np.generic) else "ndarray",
            "dtype": arr.dtype.str, "shape": list(arr.shape),
            "data": torch.from_numpy(raw.copy())}


def _np_decode(d: dict[str, Any]) -> Any:
    dtype = np.dtype(str(d["dtype"]))
    if dtype.hasobject or not isinstance(d.get("data"), torch.Tensor):
        raise ValueError(f"tagged numpy value with dtype {dtype} or without its bytes")
    arr = np.frombuffer(d["data"].numpy().tobytes(), dtype=dtype).reshape(d["shape"]).copy()
    return arr[()] if d[NP_TAG] == "scalar" else arr


def _rebuild(obj: Any, items: Any) -> Any:
    """A container like ``obj`` holding ``items``; a dict keeps its type and attributes
    (a ``state_dict``'s ``_metadata``)."""
    if isinstance(obj, dict):
        new = type(obj)(items)
        for k, v in getattr(obj, "__dict__", {}).items():
            setattr(new, k, v)
        return new
    return type(obj)(items)


def _plain_key(k: Any) -> bool:
    return type(k) in _SCALARS or (type(k) is tuple and all(_plain_key(x) for x in k))


def to_plain(obj: Any, where: str = "value") -> Any:
    """``obj`` with numpy arrays/scalars replaced by tagged dicts; raises ``TypeError`` naming
    the path of anything that ``torch.load(weights_only=True)`` would refuse. Containers
    without numpy inside are returned as they are (no copy)."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (np.ndarray, np.generic)):
        return _np_encode(obj, where)
    t = type(obj)
    if t in _SCALARS:
        return obj
    if t in (dict, OrderedDict):
        out, changed = {}, False
        for k, v in obj.items():
            if not _plain_key(k):
                raise TypeError(f"{where}: key {k!r} of type {type(k).__name__} cannot be "
                                f"stored safely (plain scalars or tuples of them only)")
            nv = to_plain(v, f"{where}[{k!r}]")
            changed |= nv is not v
            out[k] = nv
        if isinstance(obj, dict) and NP_TAG in obj:
            raise TypeError(f"{where}: the key {NP_TAG!r} is reserved")
        return _rebuild(obj, out.items()) if changed else obj
    if t in (list, tuple, set):
        items = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return t(items)
    raise TypeError(f"{where}: {t.__module__}.{t.__qualname__} cannot be stored safely "
                    f"(tensors, numpy arrays and plain Python data only)")


def from_plain(obj: Any) -> Any:
    """Undo :func:`to_plain` (tagged dicts back to numpy); other values as they are."""
    if isinstance(obj, dict):
        if NP_TAG in obj:
            return _np_decode(obj)
        out, changed = {}, False
        for k, v in obj.items():
            nv = from_plain(v)
            changed |= nv is not v
            out[k] = nv
        return _rebuild(obj, out.items()) if changed else obj
    if type(obj) in (list, tuple, set):
        items = [from_plain(v) for v in obj]
        return obj if all(a is b for a, b in zip(items, obj)) else type(obj)(items)
    return obj


# ---------------------------------------------------------------------- bytes
def _json_exact(obj: Any) -> bool:
    """True when JSON gives ``obj`` back exactly (str-keyed dicts, lists, str, int, float,
    bool, None): such objects travel as JSON, far smaller than a torch archive."""
    t = type(obj)
    if t in (str, int, float, bool, type(None)):
        return True
    if t is list:
        return all(_json_exact(v) for v in obj)
    if t is dict:
        return all(type(k) is str and _json_exact(v) for k, v in obj.items())
    return False


def save_bytes(obj: Any, where: str = "value", legacy: bool = False) -> bytes:
    """``torch.save`` of ``to_plain(obj)`` (loadable with ``weights_only=True``). ``legacy``:
    torch's pre-zip format, ~1 KB smaller per message (used on the wire)."""
    buf = io.BytesIO()
    torch.save(to_plain(obj, where), buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


def dumps(obj: Any, where: str = "value") -> bytes:
    """Bytes for the wire: ``b"J"`` + JSON when that is exact, else ``b"T"`` + torch.save."""
    if _json_exact(obj):
        return b"J" + json.dumps(obj, separators=(",", ":")).encode()
    return b"T" + save_bytes(obj, where, legacy=True)


def _refusal(exc: BaseException) -> str | None:
    """What torch's weights-only unpickler refused, in a few words (None: not a refusal).
    Never torch's advice to retry with ``weights_only=False``, which would run the code."""
    msg = str(exc)
    if not isinstance(exc, pickle.UnpicklingError) or "Weights only load failed" not in msg:
        return None
    for pat, fmt in ((r"unsupported global: GLOBAL ([\w.]+)", "unsupported global {}"),
                     (r"unsupported GLOBAL ([\w.]+)", "unsupported global {}"),
                     (r"Unsupported operand (\d+)", "unsupported pickle operation {}")):
        m = re.search(pat, msg, flags=re.IGNORECASE)
        if m:
            return fmt.format(m.group(1))
    m = re.search(r"WeightsUnpickler error:\s*([^\n]+)", msg)
    why = m.group(1).split(" Please")[0].strip().rstrip(".") if m else ""
    return why[:160] if why and "weights_only" not in why else "unsupported content"


def _torch_load(src: Any, what: str, fix: str) -> Any:
    try:
        with warnings.catch_warnings():   # a foreign pickle's protocol: the error says enough
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            obj = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear line
        why = _refusal(exc)
        if why is not None:
            raise ValueError(
                f"{what} holds something other than tensors and plain data ({why}) and was "
                f"not loaded: quietgnn never unpickles objects, which could run code (the "
                f"data is damaged, foreign, or crafted); {fix}") from None
        first = (str(exc).splitlines() or [""])[0][:200]
        raise ValueError(f"could not read {what} ({type(exc).__name__}: {first}); "
                         f"{fix}") from None
    try:
        return from_plain(obj)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{what} holds a malformed tagged value ({exc}); {fix}") from None
    except RecursionError:   # unpickling is iterative, so a list a million deep does load
        raise ValueError(f"{what} holds values nested deeper than quietgnn follows, where "
                         f"nothing it writes nests more than a few levels; {fix}") from None


#: the deepest JSON :func:`loads_json` returns: quietgnn's own files nest a few levels, and a
#: value ~990 deep, which the parser still reads, would overflow the next recursive reader
MAX_JSON_DEPTH = 64


def loads_json(data: str | bytes) -> Any:
    """JSON read from a file or received from a peer. Nesting deeper than
    :data:`MAX_JSON_DEPTH` (``[[[[…`` a hundred thousand deep: a few hundred kilobytes) is a
    ``json.JSONDecodeError`` like any other damaged JSON, never a ``RecursionError`` past
    every reader's handler, here or in whatever walks the value next."""
    try:
        value = json.loads(data)
    except RecursionError:
        value = None
    else:
        stack = [(value, 1)]          # (container, its depth): walked without recursion
        while stack:
            v, depth = stack.pop()
            if depth > MAX_JSON_DEPTH:
                break
            items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
            stack.extend((x, depth + 1) for x in items if isinstance(x, (dict, list)))
        else:
            return value
    raise JSONNestedTooDeep(f"nested deeper than {MAX_JSON_DEPTH} levels, where no quietgnn "
                            f"file nests more than a few", "", 0)


def json_excerpt(value: Any, limit: int = 60) -> str:
    """A value read from JSON, for a one-line error: its JSON, cut to ``limit`` characters
    (``…`` marks a cut), so a megabyte-long field does not become a megabyte of message."""
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


class JSONNestedTooDeep(json.JSONDecodeError):
    def __str__(self) -> str:       # no position: the nesting, not a character, is at fault
        return self.msg


def loads(data: bytes, what: str = "message") -> Any:
    """Inverse of :func:`dumps`; raises a one-line ``ValueError``
    for anything that is not tensors or plain data."""
    fmt, body = data[:1], data[1:]
    if fmt == b"J":
        try:
            return loads_json(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{what} is not valid JSON ({exc})") from None
    if fmt == b"T":
        return _torch_load(io.BytesIO(body), what, "it was dropped")
    raise ValueError(f"{what} has unknown format byte {fmt!r} (expected b'J' or b'T'); "
                          f"the sender is not a quietgnn rank of this version")


def load_file(path: str | Path, what: str, fix: str, src: Optional[IO[bytes]] = None) -> Any:
    """``torch.load(path, weights_only=True)`` (numpy values restored): a file holding code
    or anything else but tensors and plain data, or a damaged one, raises ``ValueError`` (one
    line, a plain ValueError: the launcher classifies input errors by that name) naming
    ``what`` and ``path`` and ending with ``fix``. ``src``: ``path`` already open (e.g. by
    :func:`open_no_follow`)."""
    return _torch_load(path if src is None else src, f"{what} {str(path)!r}", fix)
