"""A run's outputs, proven writable before it starts and taken away again when it is refused.

The checks run before the (possibly long) run: a full or read-only file system, or a summary
path that is a directory, shows at once, not after hours of training. They make the
directories they need; a run refused before launch removes those again (while empty), so a
mistyped ``--out runs/typo/x`` leaves no ``runs/typo`` behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..safefiles import no_follow, temp_name

if TYPE_CHECKING:
    from ..config import RunConfig

__all__ = ["check_writable_dir", "check_writable_file", "check_outputs", "remove_made", "Made",
           "outermost_missing"]


def check_writable_dir(path: str | Path, what: str) -> Path:
    """Create ``path`` if needed and prove a file can be written and synced there (a full or
    read-only file system shows here, not after the run)."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / temp_name(".quietgnn-probe")     # made anew: nothing planted there
        with open(probe, "xb", opener=no_follow) as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"{what} {str(p)!r} is not a writable directory ({_oserr(exc)}); "
                         f"choose another path") from exc
    return p


def check_writable_file(path: str | Path, what: str) -> Path:
    """``path`` will be written at the end of the run: it must be a regular file (or not exist)
    in a writable directory."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise ValueError(f"{what} {str(p)!r} is not a regular file; give a file path such as "
                         f"out/summary.json")
    check_writable_dir(p.parent if str(p.parent) else Path("."), f"{what}'s directory")
    return p


#: directories the output checks made: (the one asked for, the outermost of its parents that
#: did not exist before), so that a refused run can take them away again
Made = tuple[tuple[Path, Path], ...]


def check_outputs(cfg: RunConfig, out_what: str, summary_what: str) -> Made:
    """Prove every output of the run writable before it starts, not unwritable after it
    (``out_what`` / ``summary_what``: how the caller names the two settings in errors).
    Returns the directories the checks made, for :func:`remove_made` (a refused run leaves
    none of them behind: ``--out runs/typo/x`` made ``runs/typo`` too)."""
    made = []
    summary_dir = (Path(cfg.runtime.summary_json).parent if cfg.runtime.summary_json
                   else None)
    for d in (Path(cfg.runtime.out_dir), summary_dir):
        top = outermost_missing(d) if d is not None else None
        if top is not None:
            made.append((d, top))
    try:
        check_writable_dir(cfg.runtime.out_dir, out_what)
        if cfg.runtime.summary_json:
            check_writable_file(cfg.runtime.summary_json, summary_what)
    except ValueError:
        remove_made(tuple(made))
        raise
    return tuple(made)


def outermost_missing(path: Path) -> Optional[Path]:
    """The outermost directory on ``path``'s way that does not exist yet (None: it exists)."""
    top = None
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        top, p = p, p.parent
    return top


def remove_made(made: Made) -> None:
    """Remove the directories :func:`check_outputs` made, innermost first, while empty."""
    for leaf, top in made:
        p = Path(os.path.abspath(leaf))
        while True:
            try:
                p.rmdir()       # fails on a non-empty directory: someone's files are kept
            except OSError:
                break
            if p == top or p == p.parent:
                break
            p = p.parent


def _oserr(exc: OSError) -> str:
    return f"{exc.strerror or type(exc).__name__}" + (f": {exc.filename}" if exc.filename else "")
