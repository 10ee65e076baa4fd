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

File names that a manifest lists (``book.json``, a checkpoint's ``COMMIT.json``) are data too:
:func:`outside` says why one would lead out of its directory (an absolute path, ``..``, a
symbolic link pointing elsewhere), and such a name is never opened.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import json
import pickle
import re
import secrets
import stat
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, Iterator, Optional

import numpy as np
import torch

__all__ = ["to_plain", "from_plain", "dumps", "loads", "save_bytes",
           "load_file", "outside", "atomic_write", "fsync_dir",
           "WriteError", "no_follow", "below", "check_below", "write_below",
           "open_no_follow"]

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


def loads(data: bytes, what: str = "message") -> Any:
    """Inverse of :func:`dumps`; raises a one-line ``ValueError``
    for anything that is not tensors or plain data."""
    fmt, body = data[:1], data[1:]
    if fmt == b"J":
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
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


def outside(root: str | Path, name: Any, subdirs: bool = False, resolve: bool = True) -> str:
    """Why the file ``name`` read from a manifest in ``root`` is not confined to ``root``
    ("" when it is): it must be a string holding a plain relative name (``subdirs``: a
    relative POSIX path such as ``part-0/x.npy``), with no ``..``, ``.`` or empty component,
    not absolute, and (``resolve``, where the file is about to be read) no symbolic link on
    its way may lead out of ``root`` (the link's target is resolved; a name that does not
    exist yet is judged by its spelling alone). Without ``resolve`` the spelling alone: a
    manifest of many files is checked without a file-system walk per name."""
    if not isinstance(name, str):
        return f"{name!r} is a {type(name).__name__}, expected a file name (a string)"
    comps = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\0" in name or \
            any(c in ("", ".", "..") for c in comps) or (len(comps) > 1 and not subdirs):
        kind = "a relative path inside its directory" if subdirs else \
            "a plain file name inside its directory"
        return f"{name!r} is not {kind} (no '..', no absolute path)"
    if not resolve:
        return ""
    base = Path(root).resolve()
    try:
        real = (Path(root) / name).resolve()
    except (OSError, RuntimeError) as exc:       # a link loop
        return f"{name!r} cannot be resolved ({exc})"
    if not real.is_relative_to(base):
        return f"{name!r} leads out of {str(base)!r} (to {str(real)!r}, through a symbolic link)"
    return ""


# ---------------------------------------------------------------------- writing files
def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def no_follow(path: str, flags: int) -> int:
    """``open(..., opener=no_follow)``: never through a symbolic link planted at ``path`` (a
    run directory is writable by whoever may plant one: the write fails, ELOOP, instead of
    overwriting the link's target)."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


class WriteError(OSError):
    """A file could not be written (:func:`atomic_write`): the message names the file and the
    reason (a full disk, a read-only file system); one line says it all."""


def atomic_write(path: Path, data: bytes) -> None:
    """temp file in the same directory -> fsync -> rename -> fsync the directory. A failed
    write (disk full) removes its partial temp file and raises :class:`WriteError` naming ``path``:
    a full disk must not be made fuller by every failed attempt."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb", opener=no_follow) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise WriteError(exc.errno, f"could not write {str(path)!r}: "
                                    f"{exc.strerror or exc}") from exc
    fsync_dir(path.parent)


# ---------------------------------------------------------------------- inside a run directory
# `predict` and `report` write into a run directory by default, which whoever may plant a link
# there can write to: every directory below the one the user named is opened relative to its
# parent with O_NOFOLLOW, and the file is written beside its name and renamed over it, so no
# link planted there, before or during the write, redirects it (a hard link at the name is
# replaced, its other name untouched).
def below(root: str | Path, path: str | Path) -> Optional[list[str]]:
    """The components of ``path`` below the directory ``root``, or None when it lies elsewhere:
    judged on the absolute spelling with ``..`` folded (how the file is then reached), else
    with both resolved (a run named by another spelling)."""
    r, p = os.path.abspath(root), os.path.abspath(path)
    real = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
    for r, p in ((r, p), (os.path.realpath(r), real)):
        if p == r or p.startswith(r.rstrip("/") + "/"):
            return [c for c in p[len(r):].split("/") if c]
    return None


def _planted(path: str, root: str | Path, fix: str) -> ValueError:
    try:
        to = f" -> {os.readlink(path)!r}"
    except OSError:
        to = ""
    return ValueError(f"{path!r}{to} is a symbolic link inside {str(root)!r}; quietgnn never "
                      f"writes or reads a run directory's files through a link (one planted "
                      f"there would redirect it elsewhere): remove the link{fix}")


def _open_dirs(root: str | Path, parts: list[str], create: bool, fix: str) -> Optional[int]:
    """A descriptor of ``root/parts...`` reached without following a link below ``root``
    (``create``: making what is missing; else None when something is missing)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)   # the user's own path: may be a link
    here = str(root)
    try:
        for name in parts:
            here = os.path.join(here, name)
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(name, dir_fd=fd)
                st = os.lstat(name, dir_fd=fd)
            if stat.S_ISLNK(st.st_mode):
                raise _planted(here, root, fix)
            if not stat.S_ISDIR(st.st_mode):
                raise ValueError(f"{here!r} is a file, expected a folder; remove it{fix}")
            try:   # O_NOFOLLOW: a link swapped in since the lstat fails here
                nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _planted(here, root, fix) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _target(dfd: int, name: str, path: str, root: str | Path, fix: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise _planted(path, root, fix)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path!r} exists and is not a regular file; remove it{fix}")


def check_below(root: str | Path, parts: list[str], fix: str = "") -> None:
    """Refuse (``ValueError`` naming it) a link, or a file where a folder belongs, on the way to
    ``root/parts...`` or at it: :func:`write_below`'s checks, made before the work is done."""
    fd = _open_dirs(root, parts[:-1], False, fix)
    if fd is not None:
        try:
            _target(fd, parts[-1], os.path.join(str(root), *parts), root, fix)
        finally:
            os.close(fd)


@contextlib.contextmanager
def write_below(root: str | Path, parts: list[str], fix: str = "") -> Iterator[IO[bytes]]:
    """A binary file that becomes ``root/parts...`` once the block ends without error (missing
    folders made): nothing below ``root`` is reached through a symbolic link, and one at the
    way or the name is refused (``ValueError`` naming it, ending with ``fix``); a failed write
    leaves no temporary file and raises :class:`WriteError` naming the file."""
    path = os.path.join(str(root), *parts)
    try:
        dfd = _open_dirs(root, parts[:-1], True, fix)
    except OSError as exc:
        raise WriteError(exc.errno, f"could not write {path!r}: {exc.strerror or exc}") from exc
    assert dfd is not None
    # a name nobody can plant in advance (a folder or link at a predictable one stopped the
    # write); O_EXCL: never someone else's file
    name, tmp = parts[-1], f".{parts[-1]}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        _target(dfd, name, path, root, fix)
        ffd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666,
                      dir_fd=dfd)
        try:
            with os.fdopen(ffd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(exc, OSError) and not isinstance(exc, WriteError):
                raise WriteError(exc.errno, f"could not write {path!r}: "
                                            f"{exc.strerror or exc}") from exc
            raise
        with contextlib.suppress(OSError):
            os.fsync(dfd)
    finally:
        os.close(dfd)


def open_no_follow(path: str | Path) -> IO[bytes]:
    """The regular file ``path`` of a run directory, opened to read, not through a symbolic
    link planted at its name (``ValueError`` naming it), nor a FIFO or device (which could
    block or never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        if os.path.islink(path):
            raise _planted(str(path), os.path.dirname(str(path)) or ".", "") from None
        raise
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise ValueError(f"{str(path)!r} is not a regular file (a FIFO or a device); "
                         f"restore the file the run wrote")
    return f
