"""A run's identity: the config fields (and the features) a checkpoint is only valid for,
and how two identities differ, in words a resume refusal can show
(:mod:`quietgnn.runtime.checkpoint` records them and checks them on resume)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

if TYPE_CHECKING:
    from ..config import RunConfig

#: a run's config, or its plain dictionary (``RunConfig.to_dict()``, as a checkpoint keeps it)
ConfigLike = Union["RunConfig", Mapping[str, Any]]

__all__ = ["ConfigLike", "run_identity", "identity_differences", "rank_settings",
           "settings_digest", "check_ranks_agree"]


def _as_dict(cfg: ConfigLike) -> dict[str, Any]:
    return cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)


def run_identity(cfg: ConfigLike) -> dict[str, Any]:
    """The config fields a checkpoint is only valid for, flattened to ``section.key``.

    ``train.*`` is in (a resume with another learning rate, seed or evaluation period would
    report a curve no single setting produced), except ``train.epochs``: training a run further
    is what a resume is for. Left out on purpose: paths (``dataset.root``, ``partition.book``
    / ``file``: data may move; the partition-book identity checks the assignment itself) and
    ``runtime.*`` but ``runtime.residency``, which changes what a strategy may compute from
    (``retexo`` rebuilds its first input from the rank's own rows under a level, fetches the
    halo's without one)."""
    d = _as_dict(cfg)
    parts = getattr(cfg, "num_parts", None)
    if parts is None:
        parts = (d.get("partition") or {}).get("parts")
    method = getattr(cfg, "partition_method", None) or (d.get("partition") or {}).get("method")
    if method is None or parts is None:   # a plain dict: resolve what the config would
        try:
            from ..strategies.base import get_strategy
            cls = get_strategy(d.get("strategy"))
            method = method or cls.default_partitioner
            parts = cls.fixed_parts or parts
        except (ValueError, TypeError):
            pass
    ident: dict[str, Any] = {"strategy": d.get("strategy"), "parts": parts,
                             "partition.method": method}
    part = d.get("partition") or {}
    for k in ("seed", "clusters"):
        ident[f"partition.{k}"] = part.get(k)
    data = d.get("dataset") or {}
    ident["dataset.name"] = data.get("name")
    ident["dataset.split_seed"] = data.get("split_seed")
    if data.get("split", "standard") != "standard":    # absent before dataset.split existed
        ident["dataset.split"] = data["split"]
    if data.get("name") == "synthetic":
        for k, v in sorted((d.get("synthetic") or {}).items()):
            ident[f"synthetic.{k}"] = v
    for k, v in sorted((d.get("model") or {}).items()):
        ident[f"model.{k}"] = v
    for k, v in sorted((d.get("train") or {}).items()):
        if k != "epochs":
            ident[f"train.{k}"] = v
    for k, v in sorted((d.get("options") or {}).items()):
        ident[f"options.{k}"] = v
    ident["runtime.residency"] = (d.get("runtime") or {}).get("residency", "none")
    return json.loads(json.dumps(ident, default=str))   # plain JSON values (tuples -> lists)


#: settings every rank of one run must share beyond its identity: the loop's length, what is
#: saved and resumed, how the ranks talk (paths, threads and timeouts may differ per host; a
#: backend that differs fails where the process group forms, before anything is compared)
_RANKS_SHARE = {"train": ("epochs",), "runtime": ("resume", "checkpoint_every",
                                                   "keep_checkpoints", "deterministic",
                                                   "duplex")}


_SOFTWARE: dict[str, str] = {}


def software() -> dict[str, str]:
    """What this process runs, as ``software.*`` settings: quietgnn's own code (a digest of its
    sources, since two checkouts of one version may differ: a host not updated), torch's
    version and Python's major.minor. Ranks that differ compute and pickle differently."""
    if not _SOFTWARE:
        import hashlib
        import sys

        import torch
        pkg = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(pkg.rglob("*.py")):
            rel = f.relative_to(pkg)
            if any(p.startswith(".") for p in rel.parts) or not f.is_file():
                continue    # an editor's lock file, a notebook's checkpoints: not the code
            try:
                data = f.read_bytes()
            except OSError as exc:     # every rank must reach the gather: folded in, not raised
                data = f"unreadable: {exc.strerror}".encode()
            h.update(rel.as_posix().encode() + b"\0" + data + b"\0")
        _SOFTWARE.update({"software.quietgnn": h.hexdigest()[:12],
                          # the release; a local build tag (+cu121 / +cu124) interoperates
                          "software.torch": torch.__version__.split("+")[0],
                          "software.python": f"{sys.version_info[0]}.{sys.version_info[1]}"})
    return dict(_SOFTWARE)


def rank_settings(cfg: ConfigLike) -> dict[str, Any]:
    """What :func:`check_ranks_agree` compares: the identity, :data:`_RANKS_SHARE` and the
    :func:`software`."""
    mine = {**run_identity(cfg), **software()}
    name = mine.get("dataset.name")
    if isinstance(name, str) and ("/" in name or os.sep in name):
        mine["dataset.name"] = Path(name).name   # a graph file may lie elsewhere on each host
    d = _as_dict(cfg)
    for section, keys in _RANKS_SHARE.items():
        for k in keys:
            mine[f"{section}.{k}"] = (d.get(section) or {}).get(k)
    return json.loads(json.dumps(mine, default=str))


def settings_digest(settings: dict[str, Any]) -> str:
    """A short digest of :func:`rank_settings`: what every rank gathers first."""
    import hashlib
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def check_ranks_agree(comm: Any, cfg: ConfigLike) -> None:
    """Refuse, on every rank alike (``ValueError``: exit 2), ranks started with settings that
    differ (torchrun, where each rank builds its config from its own command line): another
    ``--lr`` trained silently, another ``--epochs`` or ``checkpoint_every`` hung in a
    collective, another ``--model.hidden`` aborted gloo. One gather of a 16-byte digest; a
    second, of the settings themselves, only when the digests differ."""
    from ..serial import json_excerpt
    mine = rank_settings(cfg)
    digests = comm.all_gather_object(settings_digest(mine), "config_check", carries="control")
    if len(set(digests)) == 1:
        return
    every = comm.all_gather_object(mine, "config_check", carries="control")
    # other software first: it explains any other difference (a key another version lacks)
    keys = sorted({k for e in every for k in e},
                  key=lambda k: (not k.startswith("software."), k != "strategy", k))
    differ = [f"{k}: " + ", ".join(f"rank {r} " + (json_excerpt(e[k], 40) if k in e else
                                                   "(none)") for r, e in enumerate(every))
              for k in keys if len({json.dumps(e.get(k, [])) for e in every}) > 1]
    fix = "install the same quietgnn code, torch and Python on every host" if any(
        d.startswith("software.") for d in differ) else \
        "start every rank with the same command line and recipe"
    raise ValueError(f"the ranks were started with different settings ({'; '.join(differ[:4])}"
                     f"{'; …' if len(differ) > 4 else ''}): {fix}")


def _default_identity(strategy: Any) -> dict[str, Any]:
    """The identity of a run of ``strategy`` left at every default ({} for an unknown one)."""
    try:
        from ..config import RunConfig
        return run_identity(RunConfig(strategy=strategy))
    except (ValueError, TypeError):
        return {}


def identity_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``["model.hidden: checkpoint 16, this run 32", ...]`` (empty when compatible). A key
    the checkpoint lacks because it predates that setting (a knob added since) is compatible
    when this run leaves it at its default: the checkpoint's run behaved as that default."""
    out = []
    defaults: Optional[dict[str, Any]] = None
    for k in sorted(set(saved) | set(now)):
        a, b = saved.get(k, "<unset>"), now.get(k, "<unset>")
        if k not in saved and k in now:
            if defaults is None:
                defaults = _default_identity(now.get("strategy"))
            if k in defaults and defaults[k] == b:
                continue
        if a != b:
            out.append(f"{k}: checkpoint {a!r}, this run {b!r}")
    return out


def _features_differ(rank: int, saved: Any, now: Optional[str]) -> list[str]:
    """The features this rank trains on against those its checkpoint was trained on (a
    digest: ``graph:``, ``x.npy:`` or ``part:`` and the hash), compared when both are of one
    kind; a checkpoint from before features were recorded has none."""
    kind = now.split(":", 1)[0] if now else None
    if not isinstance(saved, str) or saved == now or saved.split(":", 1)[0] != kind:
        return []
    whose = "" if kind == "graph" else f" (rank {rank})"     # the whole graph's: every rank's
    return [f"features{whose}: checkpoint {saved!r}, this run {now!r} (the same graph, labels "
            f"and split with other feature values: the feature file was edited or replaced "
            f"since; resume with the features the checkpoint was trained on)"]


def _incompatible(where: Path, diffs: list[str]) -> ValueError:
    return ValueError(
        f"cannot resume from {str(where)!r}: the checkpoint was written by a different run "
        f"configuration or on other data ({'; '.join(diffs)}). Resume with the checkpoint's "
        f"settings and data, or start a fresh run (another --run-name or --out, without "
        f"--resume)")


def check_resume_epochs(saved: ConfigLike, cfg: ConfigLike, epoch: int, calls: int,
                        finished: bool) -> bool:
    """A resume from the checkpoint of call ``epoch`` (written under the config ``saved``) by
    a run of ``calls`` trainer calls (``Strategy.max_calls(train.epochs)``) must have work
    left (``finished``: the strategy's own schedule, restored, says it is done), or be the
    run's own last checkpoint: otherwise it would train nothing (or past its budget) and
    report the checkpoint's local selection as the run's result, without the final exact
    evaluation (``--epochs 10`` on a checkpoint of epoch 39). Returns whether nothing is left
    (the run's own last: it ends as it was); raises ``ValueError`` (one line; the same on
    every rank: they loaded one checkpoint)."""
    was = (_as_dict(saved).get("train") or {}).get("epochs")
    now = (_as_dict(cfg).get("train") or {}).get("epochs")
    if not finished and epoch + 1 < calls:
        return False
    if was == now:
        return True
    more = f"above {epoch + 1}" if calls == now else "larger"   # calls are passes: say one
    raise ValueError(f"--resume: the newest checkpoint is of epoch {epoch} (of a run of "
                     f"--epochs {was}), and this run asks for --epochs {now}: it would train "
                     f"nothing; pass --epochs {more} to train further, or use what the run "
                     f"has (its checkpoints, or a fresh run)")
