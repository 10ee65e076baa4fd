"""What the per-strategy studies share: one configuration trained by the package's own loop.

A study runs many configurations on the same parts. Each goes through
:func:`quietgnn.runtime.trainer.train_on` (the loop ``quietgnn train`` runs: same seeding,
phases, evaluation cadence, records) inside one process group that ``spawn_function`` started
once, so process start-up and partition loading are paid once per group, not per cell. No study
keeps a training loop of its own.

A job is a plain dict (it crosses to the spawned ranks): ``strategy``, ``model`` and ``train``
(the config sections), ``options``, ``eval_every``; everything else in it is the study's.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any


def job_config(job: dict[str, Any], parts: int) -> Any:
    """The :class:`~quietgnn.config.RunConfig` of ``job`` on ``parts`` ranks: every evaluation
    global and exact (the studies compare accuracy curves across strategies), no progress
    line, no checkpoints."""
    from quietgnn.config import load_config
    train = dict(job.get("train", {}), eval_mode="exact")
    if "eval_every" in job:
        train["eval_every"] = int(job["eval_every"])
    return load_config(None, {"strategy": job["strategy"], "model": dict(job.get("model", {})),
                              "train": train, "options": dict(job.get("options") or {}),
                              "partition": {"parts": parts}, "runtime": {"progress": False}})


def run_job(comm: Any, part: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Train ``job`` on this rank's ``part``: ``records``, this rank's records (the set-up's
    first, then one per epoch: loss, compute_s, bytes by phase and kind, rounds, accuracies
    when evaluated), and ``summary``, the run summary (rank 0; None elsewhere). The run
    directory (model file, metrics) is a temporary one."""
    from quietgnn.runtime.trainer import train_on
    cfg = job_config(job, comm.world_size)
    with tempfile.TemporaryDirectory(prefix="quietgnn-study-") as d:
        trainer = train_on(comm, part, cfg, Path(d), device=comm.device, keep_records=True)
    return {"records": trainer.records, "summary": trainer.summary}


def write_report(md: Path, lines: list[str], json_path: Path | None = None,
                 payload: Any = None) -> None:
    """A study's outputs: ``payload`` as JSON (when given) and its markdown table, which is
    also printed."""
    md.parent.mkdir(parents=True, exist_ok=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(payload, indent=1))
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y against log x (1.0 = linear); None below two points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None
