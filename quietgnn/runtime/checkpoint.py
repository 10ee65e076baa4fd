"""Checkpoints: one shard per rank, a commit marker, the last K kept, resume from the newest
checkpoint that is complete on *every* rank.

Layout (``<run>/checkpoints``)::

    epoch-000012/
        rank-0.pt ... rank-<P-1>.pt   one shard per rank (torch.save of a dict of tensors and
                                      plain data, see below)
        COMMIT.json                   written by rank 0 once every shard is durable: format,
                                      version, epoch, world size, the run identity (config
                                      fields that must not change across a resume), the
                                      size + sha256 of every shard and the features every
                                      rank trained on (a digest)

A shard holds what this rank needs to continue bit-for-bit: the trainer's state (epoch, best
accuracies, per-epoch history), the strategy's ``state_dict()`` (model, optimizer, scheduler
and whatever the strategy keeps: bit widths, averaging round, sampler RNG, ...), the global
RNG states of torch / numpy / python (dropout masks differ per rank, so every rank saves its
own), the communicator's round counter, the partition-book identity and the config. The
mechanism needs nothing from a strategy but ``state_dict`` / ``load_state_dict``.

Save protocol (:meth:`Checkpointer.save`), crash-safe at every step:

1. every rank writes its shard to a temp file, fsyncs it, renames it into place, fsyncs the
   directory (a crash leaves either no shard or a whole one);
2. one ``all_gather_object`` of the shards' sizes and checksums (the barrier: nobody marks the
   checkpoint complete before every rank's shard is on disk; a rank whose write failed says
   so here and *every* rank raises :class:`CheckpointError` together instead of hanging);
3. rank 0 writes ``COMMIT.json`` the same atomic way, then deletes all but the newest
   ``keep`` committed checkpoints and any uncommitted leftovers older than them;
4. a second gather: ``save`` returns on every rank only once the checkpoint is committed.

Load protocol (:meth:`Checkpointer.load_latest`): each rank lists the checkpoints usable from
its point of view (marker present and readable, every field of its type and every shard name
a plain file inside the checkpoint's directory, same format version and world size, its own
shard present with the recorded size and checksum); one ``all_gather_object`` intersects the
lists and every rank loads the same, newest epoch. Torn checkpoints (no marker, a missing or
truncated shard) are skipped with a warning. A resume with an incompatible run (other dataset,
number of parts, model shape, strategy or options, other partition assignment, other feature
values) fails with a ``ValueError`` naming every differing field. Checkpoints newer than the
one resumed from (from the abandoned attempt) are deleted so they can never be mixed with the
new ones.

The directory must be visible to every rank under the same path (one host, or a shared file
system). Shards hold tensors and plain data only and are loaded with
``torch.load(weights_only=True)`` (:mod:`quietgnn.serial`): numpy values (numpy's RNG state)
are stored as tagged uint8 tensors and restored bit for bit, and a state that holds anything
else fails when it is *saved*. A shard that holds code (a planted pickle, with its checksum
updated in the marker) is refused with a one-line ``ValueError`` on every rank and never
unpickled; the checksums detect damage, not tampering.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..safefiles import atomic_write, outside
from ..serial import json_excerpt, load_file, loads_json, save_bytes

from .identity import (ConfigLike, _features_differ, _incompatible, identity_differences,
                       run_identity)

__all__ = ["Checkpointer", "CheckpointError", "CKPT_FORMAT", "CKPT_VERSION", "capture_rng",
           "restore_rng", "committed_checkpoints", "check_resume_compatible",
           "check_resume_features"]

CKPT_FORMAT = "quietgnn-checkpoint"
#: 2: shards hold tensors and plain data only (numpy tagged), loaded with weights_only=True;
#: version-1 shards pickled numpy's RNG state, which that refuses: they are skipped by version
CKPT_VERSION = 2
MARKER = "COMMIT.json"


class CheckpointError(RuntimeError):
    """Writing a checkpoint failed on some rank (raised on every rank together)."""


def check_resume_features(ckpt_dir: str | Path, features: list[str]) -> None:
    """Pre-flight for the launcher once the book is known (``features``: every rank's
    :meth:`~quietgnn.partition.PartitionBook.features_identity`): raise ``ValueError``, one
    line, when the newest committed checkpoint in ``ckpt_dir`` was trained on other features
    (each worker checks again when it loads its shard)."""
    found = committed_checkpoints(ckpt_dir)
    if not found:
        return
    _, d, meta = found[0]
    diffs: list[str] = []
    for rank, now in enumerate(features):
        for diff in _features_differ(rank, (meta.get("features") or {}).get(str(rank)), now):
            if diff not in diffs:
                diffs.append(diff)
    if diffs:
        raise _incompatible(d, diffs)


# ---------------------------------------------------------------------- RNG
def capture_rng() -> dict[str, Any]:
    """Global RNG states of this process: torch (CPU, CUDA when present), numpy, python."""
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                          "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def restore_rng(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


# ---------------------------------------------------------------------- files
def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _epoch_of(d: Path) -> Optional[int]:
    if not d.is_dir() or not d.name.startswith("epoch-"):
        return None
    try:
        return int(d.name[len("epoch-"):])
    except ValueError:
        return None


def _read_marker(d: Path) -> tuple[Optional[dict[str, Any]], str]:
    """(marker, "") or (None, why it is unusable)."""
    m = d / MARKER
    if not m.is_file():
        return None, "no commit marker (torn: a rank stopped while writing it)"
    try:
        meta = loads_json(m.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"commit marker unreadable ({type(exc).__name__})"
    if not isinstance(meta, dict) or meta.get("format") != CKPT_FORMAT:
        return None, f"{MARKER} is not a quietgnn checkpoint marker"
    if meta.get("version") != CKPT_VERSION:
        return None, (f"checkpoint format version {meta.get('version')!r}, this quietgnn reads "
                      f"version {CKPT_VERSION}")
    for key in ("epoch", "world_size", "shards", "identity"):
        if key not in meta:
            return None, f"commit marker lacks field {key!r}"
    why = _marker_problem(d, meta)
    return (None, f"{str(m)!r}: {why} (edited or damaged)") if why else (meta, "")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _marker_problem(d: Path, meta: dict[str, Any]) -> str:
    """What in a parsed marker has the wrong type or leads out of ``d`` ("" if nothing): the
    fields are used as they are, so each is checked before anything trusts it."""
    def shown(v: Any) -> str:
        return f"{type(v).__name__} {json_excerpt(v)}"
    if not _is_int(meta["epoch"]) or meta["epoch"] != _epoch_of(d):
        return f"field 'epoch' is {shown(meta['epoch'])}, expected {_epoch_of(d)} (its directory)"
    if not _is_int(meta["world_size"]) or meta["world_size"] < 1:
        return f"field 'world_size' is {shown(meta['world_size'])}, expected an int >= 1"
    for key in ("identity", "shards", "book_ids", "features"):
        if key in meta and not isinstance(meta[key], dict):
            return f"field {key!r} is {shown(meta[key])}, expected a mapping"
    for rank, info in meta["shards"].items():
        if not isinstance(info, dict) or not _is_int(info.get("bytes")) or \
                not isinstance(info.get("sha256"), str):
            return (f"shards[{rank!r}] is {shown(info)}, expected a mapping with 'file', "
                    f"'bytes' (int) and 'sha256' (str)")
        bad = outside(d, info.get("file"))
        if bad:
            return f"shards[{rank!r}].file {bad}"
    return ""


def committed_checkpoints(ckpt_dir: str | Path) -> list[tuple[int, Path, dict[str, Any]]]:
    """``[(epoch, dir, marker)]`` of checkpoints with a valid marker, newest first (shards are
    not verified here; :meth:`Checkpointer.load_latest` does that)."""
    root = Path(ckpt_dir)
    out = []
    if root.is_dir():
        for d in root.iterdir():
            e = _epoch_of(d)
            if e is None:
                continue
            meta, _ = _read_marker(d)
            if meta is not None:
                out.append((e, d, meta))
    return sorted(out, key=lambda t: -t[0])


def check_resume_compatible(cfg: ConfigLike, ckpt_dir: str | Path) -> Optional[int]:
    """Pre-flight for the launcher (before any worker starts): raise ``ValueError`` naming the
    differing fields when the newest committed checkpoint in ``ckpt_dir`` belongs to another
    configuration; returns its epoch (None when there is none)."""
    found = committed_checkpoints(ckpt_dir)
    if not found:
        root = Path(ckpt_dir)
        damaged = [f"epoch {_epoch_of(d)} ({_read_marker(d)[1]})" for d in
                   sorted(root.iterdir() if root.is_dir() else []) if _epoch_of(d) is not None
                   and (d / MARKER).is_file()]
        if damaged:     # what the workers would refuse, said before any of them starts
            raise ValueError(f"--resume: no usable checkpoint in {str(root)!r}; every "
                             f"committed one is damaged or incompatible: "
                             f"{' | '.join(damaged)}. Delete {str(root)!r} to start afresh")
        return None
    epoch, d, meta = found[0]
    diffs = identity_differences(meta["identity"], run_identity(cfg))
    if diffs:
        raise _incompatible(d, diffs)
    return epoch


# ---------------------------------------------------------------------- the checkpointer
class Checkpointer:
    """Saves and loads this rank's checkpoint shards (see the module docstring).

    ``save`` and ``load_latest`` are collective: every rank must call them at the same point
    (the trainer does)."""

    def __init__(self, directory: str | Path, rank: int, world_size: int, keep: int = 2,
                 comm: Any = None, log: Optional[Callable[[str], None]] = None) -> None:
        if keep < 2:
            raise ValueError(f"keep = {keep!r}; expected >= 2 (a torn newest checkpoint must "
                             f"leave an older complete one)")
        if world_size > 1 and comm is None:
            raise ValueError("a Checkpointer on more than one rank needs the communicator")
        self.dir = Path(directory)
        self.rank, self.world_size, self.keep, self.comm = rank, world_size, keep, comm
        self._log = log or (lambda m: print(f"[rank {rank}] {m}", file=sys.stderr, flush=True))

    def _gather(self, obj: Any) -> list[Any]:
        if self.world_size == 1 or self.comm is None:
            return [obj]
        with self.comm.phase("control"):
            out = self.comm.all_gather_object(obj, carries="control")   # shard bookkeeping
        return out

    def epoch_dir(self, epoch: int) -> Path:
        return self.dir / f"epoch-{epoch:06d}"

    # ------------------------------------------------------------------ save
    def save(self, epoch: int, state: dict[str, Any], identity: Optional[dict[str, Any]] = None,
             ) -> Path:
        """Write this rank's shard of ``state`` (plus RNG states) and, on rank 0, the commit
        marker once every rank's shard is durable. Collective. ``identity`` (see
        :func:`run_identity`) defaults to the one of ``state['config']``."""
        d = self.epoch_dir(epoch)
        shard = dict(state)
        shard.update({"format": CKPT_FORMAT, "version": CKPT_VERSION, "epoch": int(epoch),
                      "rank": self.rank, "world_size": self.world_size, "rng": capture_rng()})
        if self.comm is not None:
            # The round the next epoch starts at in an unbroken run (save's two gathers).
            shard["comm_round"] = int(getattr(self.comm, "round", 0)) + \
                (2 if self.world_size > 1 else 0)
        info: dict[str, Any] = {"rank": self.rank, "ok": True}
        try:
            d.mkdir(parents=True, exist_ok=True)
            # tensors and plain data only (numpy values tagged): loadable with
            # weights_only=True; anything else raises here, not when resuming
            data = save_bytes(shard, where="checkpoint state")
            name = f"rank-{self.rank}.pt"
            atomic_write(d / name, data)
            info.update(file=name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                        book_id=state.get("book_id"), features=state.get("features"))
        except Exception as exc:  # noqa: BLE001 - reported to every rank below
            info.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        everyone = self._gather(info)
        bad = [i for i in everyone if not i["ok"]]
        if bad:
            raise CheckpointError(
                f"checkpoint of epoch {epoch} in {str(d)!r} failed on rank(s) "
                f"{[i['rank'] for i in bad]}: {bad[0]['error']}; training stopped on every rank "
                f"({self._left(epoch)})")
        commit_error = None
        if self.rank == 0:
            try:
                if identity is None:
                    identity = run_identity(state["config"]) if "config" in state else {}
                marker = {"format": CKPT_FORMAT, "version": CKPT_VERSION, "epoch": int(epoch),
                          "world_size": self.world_size, "identity": identity,
                          "shards": {str(i["rank"]): {k: i[k] for k in ("file", "bytes",
                                                                          "sha256")}
                                     for i in everyone},
                          "book_ids": {str(i["rank"]): i.get("book_id") for i in everyone},
                          "features": {str(i["rank"]): i.get("features") for i in everyone},
                          "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
                atomic_write(d / MARKER, json.dumps(marker, indent=1).encode())
                self._prune()
            except Exception as exc:  # noqa: BLE001 - reported to every rank below
                commit_error = f"{type(exc).__name__}: {exc}"
        # Second barrier: save() returns on every rank only once the checkpoint is committed
        # (or every rank raises), so nothing can observe a half-finished one.
        commit_error = self._gather(commit_error)[0]
        if commit_error:
            raise CheckpointError(f"checkpoint of epoch {epoch} in {str(d)!r}: rank 0 could not "
                                  f"commit it ({commit_error}); training stopped on every rank "
                                  f"({self._left(epoch)})")
        return d

    def _left(self, epoch: int) -> str:
        """What a failed checkpoint of ``epoch`` leaves to resume from, said as it is."""
        earlier = [e for e, _, _ in committed_checkpoints(self.dir) if e < epoch]
        if earlier:     # newest first: the one a resume continues from
            return (f"the checkpoint of epoch {earlier[0]} is intact: --runtime.resume true "
                    f"continues from it")
        return "there is no earlier checkpoint: a rerun starts over"

    def _prune(self) -> None:
        committed = committed_checkpoints(self.dir)
        keep = {d for _, d, _ in committed[: self.keep]}
        oldest_kept = min((e for e, d, _ in committed[: self.keep]), default=None)
        for sub in self.dir.iterdir():
            e = _epoch_of(sub)
            if e is None or sub in keep:
                continue
            # Older than what we keep: committed-but-surplus or torn leftovers. Newer torn
            # directories cannot exist here (load_latest removed them on resume).
            if oldest_kept is not None and e < oldest_kept:
                shutil.rmtree(sub, ignore_errors=True)

    def start_fresh(self) -> Optional[Path]:
        """A run starting at epoch 0 in a directory holding an earlier run's checkpoints: move
        them aside to ``checkpoints.stale-<time>`` (never silently deleted, never mixed with
        this run's: pruning would otherwise keep the old, higher epochs and drop the new
        ones). Collective; returns where they went."""
        dest = None
        if self.rank == 0 and self.dir.is_dir() and any(
                _epoch_of(d) is not None for d in self.dir.iterdir()):
            stamp, n = time.strftime("%Y%m%d-%H%M%S"), 0
            dest = self.dir.with_name(f"{self.dir.name}.stale-{stamp}")
            while dest.exists():
                n += 1
                dest = self.dir.with_name(f"{self.dir.name}.stale-{stamp}-{n}")
            os.replace(self.dir, dest)
            self._log(f"checkpoint: an earlier run's checkpoints were moved to {dest}")
        self._gather(None)   # nobody saves before they are out of the way
        return dest

    # ------------------------------------------------------------------ load
    def _usable(self, d: Path) -> tuple[bool, str, Optional[dict[str, Any]]]:
        meta, why = _read_marker(d)
        if meta is None:
            return False, why, None
        if meta["world_size"] != self.world_size:
            return False, (f"written by {meta['world_size']} rank(s), this run has "
                           f"{self.world_size}"), meta
        info = meta["shards"].get(str(self.rank))
        if not isinstance(info, dict) or not {"file", "bytes", "sha256"} <= set(info):
            return False, f"the marker lists no shard for rank {self.rank}", meta
        f = d / str(info["file"])
        if not f.is_file():
            return False, f"shard {f.name} is missing", meta
        size = f.stat().st_size
        if size != info["bytes"]:
            return False, (f"shard {f.name} has {size} bytes, the marker records "
                           f"{info['bytes']} (truncated)"), meta
        if _sha256_file(f) != info["sha256"]:
            return False, f"shard {f.name} does not match its checksum (damaged)", meta
        return True, "", meta

    def load_latest(self, cfg: Optional[ConfigLike], book_id: Optional[str] = None,
                    features: Optional[str] = None) -> Optional[dict[str, Any]]:
        """This rank's shard of the newest checkpoint usable on every rank, or None when there
        is none (a fresh start). Collective. Raises ``ValueError`` (on every rank together)
        when the run configuration, the partition-book identity or the features
        (``features``: :meth:`~quietgnn.partition.LocalPartition.features_identity`, compared
        when the checkpoint recorded one of the same kind) differ from the checkpoint's, or
        when committed checkpoints exist but none is usable on every rank (rather than
        silently starting over)."""
        mine: dict[int, str] = {}   # epoch -> "" (usable) or the reason it is not
        metas: dict[int, tuple[Path, Optional[dict[str, Any]]]] = {}
        if self.dir.is_dir():
            for d in self.dir.iterdir():
                e = _epoch_of(d)
                if e is None:
                    continue
                ok, why, meta = self._usable(d)
                mine[e] = "" if ok else why
                metas[e] = (d, meta)
        everyone = self._gather({"rank": self.rank, "status": mine})
        epochs = sorted({e for o in everyone for e in o["status"]}, reverse=True)
        chosen: Optional[int] = None
        skipped: list[str] = []
        for e in epochs:
            reasons = [f"rank {o['rank']}: {o['status'].get(e, 'directory missing')}"
                       for o in everyone if o["status"].get(e, "directory missing") != ""]
            if not reasons:
                chosen = e
                break
            skipped.append(f"epoch {e} ({'; '.join(reasons)})")
        if skipped and self.rank == 0:
            for s in skipped:
                self._log(f"checkpoint: skipping {s}")
        newest_meta = next((m for e in epochs if e in metas for m in [metas[e][1]] if m), None)
        if newest_meta is not None and cfg is not None:
            # Another configuration is the likeliest reason nothing fits: say so by field.
            diffs = identity_differences(newest_meta["identity"], run_identity(cfg))
            if newest_meta["world_size"] != self.world_size and not any(
                    x.startswith("parts:") for x in diffs):
                diffs.append(f"parts: checkpoint {newest_meta['world_size']!r}, this run "
                             f"{self.world_size!r}")
            if diffs:
                raise _incompatible(self.dir, diffs)
        if chosen is None:
            committed = [s for s in skipped if "no commit marker" not in s]
            if committed:
                raise ValueError(
                    f"--resume: no usable checkpoint in {str(self.dir)!r}; every committed one "
                    f"is damaged or incompatible: {' | '.join(committed)}. Delete "
                    f"{str(self.dir)!r} to start afresh")
            return None
        d, meta = metas[chosen]
        assert meta is not None
        diffs = identity_differences(meta["identity"], run_identity(cfg)) if cfg is not None \
            else []
        saved_book = (meta.get("book_ids") or {}).get(str(self.rank))
        if book_id is not None and saved_book is not None and saved_book != book_id:
            diffs.append(f"partition book identity (rank {self.rank}): checkpoint "
                         f"{saved_book!r}, this run {book_id!r} (other graph or node assignment)")
        diffs += _features_differ(self.rank, (meta.get("features") or {}).get(str(self.rank)),
                                  features)
        f = d / meta["shards"][str(self.rank)]["file"]
        state, error = None, (str(_incompatible(d, diffs)) if diffs else None)
        if error is None:
            try:
                state = load_file(f, "checkpoint shard",
                                  f"delete {str(d)!r} to resume from an older checkpoint, or "
                                  f"resume only from run directories you trust")
                if not isinstance(state, dict) or state.get("epoch") != chosen:
                    raise ValueError(f"checkpoint shard {str(f)!r} does not hold epoch {chosen}")
            except ValueError as exc:
                error = str(exc)
        # Every rank raises together (rather than the others waiting for a rank that stopped)
        errors = [e for e in self._gather(error) if e]
        if errors:
            raise ValueError(errors[0] if error is None else error)
        # Anything newer belongs to the abandoned attempt: never mix it with what comes next.
        if self.rank == 0:
            for e in epochs:
                if e > chosen and e in metas:
                    shutil.rmtree(metas[e][0], ignore_errors=True)
        self._gather(None)   # nobody proceeds (and re-saves) before the cleanup is done
        return state
