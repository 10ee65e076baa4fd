"""Files on disk, written and opened so that nothing planted beside them redirects quietgnn.

A run directory, a partition book and the cache are writable by whoever shares them, so:

* a file is written to a fresh temporary name (unpredictable, created with ``O_EXCL``: never
  an existing file or link) and renamed over its name (:func:`atomic_write`,
  :func:`write_below`); a failure leaves no temporary file and is one :class:`WriteError` line
  naming the file and the reason;
* below a directory the user named, every folder is opened relative to its parent with
  ``O_NOFOLLOW`` and a symbolic link on the way or at the name is refused, naming it
  (:func:`write_below`, :func:`check_below`, :func:`open_no_follow`);
* a file name read from a manifest (``book.json``, a checkpoint's ``COMMIT.json``) is data: it
  must stay inside its directory (:func:`outside`), or it is never opened.

Plain Python (no torch): the bottom floor, usable from anywhere.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import IO, Any, Iterator, Optional

__all__ = ["outside", "atomic_write", "write_replacing", "fsync_dir", "WriteError", "no_follow",
           "below", "check_below", "write_below", "open_no_follow", "temp_name",
           "TEMP_NAME_EXTRA", "disk_reason", "free_space_note", "write_failure"]

#: bytes a temporary name adds to its file's name: ``.<name>.tmp-<pid>-<8 hex>`` (a pid has
#: at most 7 digits); a name longer than 255 minus this cannot be written
TEMP_NAME_EXTRA = len(".") + len(".tmp-") + 7 + len("-") + 8


def temp_name(name: str) -> str:
    """The temporary name a file ``name`` is written under before it is renamed into place:
    unpredictable, so that nothing (a link, a hard link, a folder) can be planted there in
    advance; created with ``O_EXCL`` by the writers."""
    return f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


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


def disk_reason(exc: BaseException) -> Optional[tuple[int, str]]:
    """``(errno, reason)`` when ``exc`` says the disk is full or read-only, else None. The
    writers say it in their own words: numpy's short write (``"64000 requested and 48096
    written"``, no errno), DuckDB's IO errors (the OS message inside their text)."""
    code = getattr(exc, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return code, os.strerror(code)
    text = str(exc)
    if "No space left on device" in text or re.search(r"\d+ requested and \d+ written", text):
        return errno.ENOSPC, os.strerror(errno.ENOSPC)
    return None


def free_space_note(where: str | Path) -> str:
    """``"; 3 MiB free there"`` for the file system holding ``where`` ("" if unknown)."""
    try:
        left = shutil.disk_usage(where).free
    except OSError:
        return ""
    return f"; {left >> 20} MiB free there" if left >= 1 << 20 else f"; {left >> 10} KiB free there"


def write_failure(path: str | Path, exc: BaseException, fix: str = "") -> WriteError:
    """The one line for a failed write of ``path``: the reason (a full disk said as such, with
    the space left, whoever's words the writer used), then ``fix``."""
    known = disk_reason(exc)
    code, reason = known if known else (getattr(exc, "errno", None),
                                        getattr(exc, "strerror", None) or str(exc))
    free = free_space_note(Path(os.path.abspath(path)).parent) if known else ""
    return WriteError(code, f"could not write {str(path)!r}: {reason}{free}{fix}")


@contextlib.contextmanager
def write_replacing(path: str | Path, fix: str = "", follow: bool = False
                    ) -> Iterator[IO[bytes]]:
    """A binary file that becomes ``path`` once the block ends without error: temp file in the
    same directory -> fsync -> rename -> fsync the directory, so a failed write (a full disk)
    leaves the old file as it was and no temporary file (one :class:`WriteError` line naming
    ``path``: a full disk must not be made fuller by every failed attempt). A symbolic link
    at ``path`` is replaced by the file, unless ``follow`` (a path the user chose, whose link
    is theirs: its target is replaced)."""
    path = Path(os.path.realpath(path) if follow else path)
    tmp = path.with_name(temp_name(path.name))
    try:
        with open(tmp, "xb", opener=no_follow) as f:     # x: O_EXCL, a new file only
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise write_failure(path, exc, fix) from exc
        raise
    fsync_dir(path.parent)


def atomic_write(path: Path, data: bytes) -> None:
    """``data`` as the file ``path``, through :func:`write_replacing`."""
    with write_replacing(path) as f:
        f.write(data)


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
        raise write_failure(path, exc, fix) from exc
    assert dfd is not None
    # a name nobody can plant in advance (a folder or link at a predictable one stopped the
    # write); O_EXCL: never someone else's file
    name, tmp = parts[-1], temp_name(parts[-1])
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
                raise write_failure(path, exc, fix) from exc
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
