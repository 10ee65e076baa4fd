"""The Python API: train from a notebook or a script the way ``quietgnn train`` does.

    import quietgnn
    graph = quietgnn.load_dataset("cora", root="../shared/data/planetoid")
    run = quietgnn.train(graph, strategy="halo", parts=4, epochs=100, model={"hidden": 128})
    run.summary.test_acc, run.metrics[-1].loss, run.run_dir
    proba = run.model.predict_proba(graph.x, graph.edge_index())

This module is thin on purpose: :func:`train` builds the same :class:`~quietgnn.config.RunConfig`
the command line builds (same keys, same validation, same errors) and calls the same launcher
(:func:`~quietgnn.runtime.launcher.launch`: P worker processes joined by gloo on 127.0.0.1);
there is no second training loop.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from .datasets import load_dataset
from .graph import Graph
from .nn.export import TrainedModel, load_model
from .runtime.records import EpochRecord, RunSummary
from .serial import loads_json

__all__ = ["load_dataset", "train", "load_model", "Run", "TrainedModel", "predict_to_file"]


@dataclass
class Run:
    """A finished run: ``summary`` (what ``summary.json`` holds, a
    :class:`~quietgnn.runtime.records.RunSummary`), ``run_dir``, and lazily ``metrics`` (rank
    0's per-epoch :class:`~quietgnn.runtime.records.EpochRecord` s; every rank's:
    :func:`~quietgnn.runtime.metrics.read_records`) and ``model`` (the best-validation model,
    a :class:`~quietgnn.nn.export.TrainedModel`)."""

    run_dir: Path
    summary: RunSummary
    _model: Optional[TrainedModel] = field(default=None, repr=False)

    @property
    def metrics(self) -> list[EpochRecord]:
        from .runtime.metrics import read_records
        return read_records(self.run_dir).get(0, ([], None))[0]

    @property
    def model(self) -> TrainedModel:
        if self._model is None:
            self._model = load_model(self.run_dir)
        return self._model


def _config_dict(strategy: str, parts: Optional[int], overrides: dict[str, Any]) -> dict:
    """``train``'s keyword arguments as the nested dict the CLI's flags become: a mapping is
    a section (``model={"hidden": 128}``), anything else a key (``epochs=5``, shortcut) or a
    dotted key (``**{"model.hidden": 128}``)."""
    from .config import SECTIONS, SHORTCUTS, _merge, parse_overrides
    from .readyaml import brief
    pairs: list[tuple[str, Any]] = [("strategy", strategy)]
    if parts is not None:
        pairs.append(("partition.parts", parts))
    sections: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, dict):
            sections = _merge(sections, {key: value})
            continue
        if (key in SECTIONS or key in ("synthetic", "options")) and \
                not (key in SHORTCUTS and isinstance(value, (str, os.PathLike))):  # a shortcut
            short = f"a string ({key}= sets {SHORTCUTS[key]}) or " if key in SHORTCUTS else ""
            raise ValueError(f"train({key}={brief(value)}): expected {short}the section as a "
                             f"mapping of its keys ({key}={{...}}), got {type(value).__name__}")
        dashed = key.replace("_", "-")     # summary_json= for the CLI's --summary-json
        pairs.append((dashed if key not in SHORTCUTS and dashed in SHORTCUTS else key, value))
    return _merge(sections, parse_overrides(pairs))


def _graph_of(data: Any) -> Optional[Graph]:
    if isinstance(data, Graph):
        if data.meta.get("labels") == "absent":
            raise ValueError(f"graph {data.name!r} was loaded without its labels (to predict "
                             f"on: load_dataset(..., labels=False)); training needs them: load "
                             f"it with its labels")
        return data
    if type(data).__module__.split(".")[0] == "torch_geometric":
        return Graph.from_pyg(data, name=str(getattr(data, "name", None) or "graph"))
    return None


def train(data: Union[Graph, Any, str, os.PathLike] = "synthetic", strategy: str = "halo",
          parts: Optional[int] = None, **overrides: Any) -> Run:
    """Train ``strategy`` on ``data`` with ``parts`` local worker processes; returns a :class:`Run`.

    ``data``: a :class:`~quietgnn.graph.Graph`, a PyG ``Data``, a dataset name or graph file
    (as ``--dataset``; give ``root=``), or a directory written by ``quietgnn prepare`` (as
    ``--data``). An in-memory graph reaches the workers as a file: it is saved with
    :meth:`Graph.save` to ``<run_dir>/<name>.npz`` (plain arrays, never a pickle) and the run
    loads that, so ``config.json`` names a file that reproduces the run.

    ``parts``: worker processes, default 4 (a prepared directory: its own number of parts).
    ``overrides`` use the command line's keys: shortcuts (``epochs=50``, ``lr=0.01``,
    ``hidden=128``, ``model="sage"``, ``root=...``, ``out="runs"``, ``run_name=...``),
    sections as mappings (``model={"hidden": 128}``, ``options={"bits": 4}``) or dotted keys
    (``**{"model.hidden": 128}``). Unknown keys and bad values raise the CLI's ``ValueError``.
    A failed worker raises :class:`~quietgnn.runtime.launcher.LaunchError` with its traceback.
    """
    from .config import load_config
    from .runtime.launcher import ensure_open_files, launch
    from .runtime.plan import plan_local_run
    from .runtime.outputs import check_outputs
    nested = _config_dict(strategy, parts, overrides)
    given = nested.get("dataset", {})
    if given.get("name") is not None or given.get("prepared") is not None:
        raise ValueError("train(): the graph is the data argument; leave out dataset= / data= "
                         "in the keyword arguments (e.g. quietgnn.train('cora', root=...))")
    graph = _graph_of(data)
    label = None
    if graph is not None:
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", graph.name).strip("._") or "graph"
        nested = _with(nested, name=label)       # stands in until the file exists
    elif isinstance(data, (str, os.PathLike)):
        p = Path(data)
        nested = _with(nested, prepared=str(p)) if (p / "book.json").is_file() else \
            _with(nested, name=os.fspath(data))
    else:
        raise TypeError(f"train(data={type(data).__name__}): expected a quietgnn Graph, a "
                        f"torch_geometric Data, a dataset name or path, or a prepared directory")
    cfg = load_config(None, nested)
    ensure_open_files(cfg.num_parts, "train")       # as the command line's train does
    if graph is not None and cfg.runtime.resume:
        raise ValueError("train(resume=True) with an in-memory graph: resume from the file the "
                         "first run saved, quietgnn.train('<run_dir>/<name>.npz', resume=True, "
                         "run_name=...)")
    made = check_outputs(cfg, "out", "summary_json")

    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    def stage(run_dir: Path) -> Optional[Path]:
        """The in-memory graph as a file in the run directory, named in the config."""
        if graph is None:
            return None
        saved = graph.save(run_dir / f"{label}.npz")
        cfg.dataset.name, cfg.dataset.root = str(saved.resolve()), None
        return saved

    # refused before launch: the plan leaves nothing behind, as the CLI's does
    plan = plan_local_run(cfg, log, made=made, label=label, stage=stage)
    run_dir = plan.run_dir
    summary = launch(plan)
    if summary is None:
        raise RuntimeError(f"run {str(run_dir)!r} ended without a summary (rank 0 wrote none)")
    if cfg.runtime.summary_json:
        from .runtime.rundir import write_json
        write_json(Path(cfg.runtime.summary_json), summary)
    return Run(Path(run_dir), RunSummary.from_json(summary))


def _with(nested: dict[str, Any], **dataset: Any) -> dict[str, Any]:
    return {**nested, "dataset": {**nested.get("dataset", {}), **dataset}}


def predict_to_file(run_dir: str | os.PathLike, dataset: str | os.PathLike,
                    root: Optional[str] = None, out: Optional[str | os.PathLike] = None,
                    embed: bool = False, synthetic: Optional[dict[str, Any]] = None,
                    overwrite: bool = False) -> Path:
    """``quietgnn predict``: per-node class probabilities (``embed``: the last hidden layer)
    of the run's model on ``dataset``, one row per node in node order, as ``.npy`` or, when
    ``out`` ends in ``.parquet``, a table with columns ``node``, ``p0..`` (``h0..``).

    ``dataset="synthetic"`` is the run's own synthetic graph (the ``synthetic`` section its
    ``config.json`` records), or with ``synthetic`` (the ``synthetic.*`` keys, as ``train``
    takes them) the graph those build; one of other widths than the model's is refused.

    An ``out`` that exists is refused unless ``overwrite`` (it replaced any file, the graph's
    own labels file included); the default file is predict's own and is replaced. Every file
    is written to a temporary name and renamed over its name, so a failed write (a full disk)
    leaves the old one whole. A file inside the run directory (the default
    ``<run_dir>/predict-<dataset>.npy``) is written as training writes there: never through a
    symbolic link planted on its way (one is refused by name)."""
    from .safefiles import below, check_below, write_below, write_replacing
    model = load_model(run_dir)
    if out is not None and Path(out).suffix not in (".npy", ".parquet"):
        raise ValueError(f"--out {str(out)!r}: expected a file ending in .npy or .parquet")
    exists = ValueError(f"--out {str(out)!r} exists: pass --overwrite (overwrite=True) to "
                        f"replace it, or choose another file")
    if out is not None and not overwrite and os.path.exists(out) and \
            below(run_dir, out) is None:     # (in the run: its links are refused first, below)
        raise exists                         # before the graph is loaded
    spec = _synthetic_spec(Path(run_dir), dataset, synthetic, model)
    # labels and masks are not read: a graph to predict on may have none
    graph = load_dataset(dataset, root, synthetic=spec, labels=False)
    path = Path(out) if out else Path(run_dir) / f"{'embed' if embed else 'predict'}-" \
                                                 f"{graph.name}.npy"
    inside = below(run_dir, path)
    fix = ", or pass --out a file outside the run directory"
    if inside is not None:
        if not inside:
            raise ValueError(f"--out {str(path)!r} is the run directory itself; expected a file "
                             f"ending in .npy or .parquet")
        check_below(run_dir, inside, fix)     # before the work, and again as it writes
        if out is not None and not overwrite and os.path.exists(path):
            raise exists
    with torch.no_grad():
        arr = (model.embed if embed else model.predict_proba)(graph.x, graph.edge_index())
    arr = arr.numpy()
    if inside is not None:
        with write_below(run_dir, inside, fix) as f:
            _write_array(f, arr, path.suffix, embed)
        return path
    # a path the user chose outside the run directory: a link on it is theirs to have made
    # (e.g. into a shared results folder), not one planted in a run, so it is followed
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from .safefiles import write_failure
        raise write_failure(path, exc) from exc
    with write_replacing(path, follow=True) as f:
        _write_array(f, arr, path.suffix, embed)
    return path


def _write_array(f: Any, arr: np.ndarray, suffix: str, embed: bool) -> None:
    if suffix == ".npy":
        np.save(f, arr)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq
    cols = {"node": pa.array(np.arange(arr.shape[0], dtype=np.int64))}
    cols.update({f"{'h' if embed else 'p'}{j}": pa.array(arr[:, j]) for j in range(arr.shape[1])})
    pq.write_table(pa.table(cols), f)


def _synthetic_spec(run_dir: Path, dataset: Any, given: Optional[dict[str, Any]],
                    model: TrainedModel) -> Any:
    """The spec of the synthetic graph to predict on (None: ``dataset`` is another). Without
    options, the run's own: predicting on the default graph instead (20000 nodes) gave
    silently the probabilities of another graph than the run's."""
    from .config import load_config
    if not (isinstance(dataset, str) and dataset.strip().lower() == "synthetic"):
        if given:
            raise ValueError(f"--synthetic.* options ({', '.join(sorted(given))}) describe the "
                             f"synthetic graph, but --dataset is {str(dataset)!r}: leave them "
                             f"out, or use --dataset synthetic")
        return None
    cfg_file = run_dir / "config.json"
    recorded = _run_config(cfg_file)
    trained_on = (recorded.get("dataset") or {}).get("name") if recorded else \
        model.info.get("dataset")
    own = isinstance(trained_on, str) and trained_on.strip().lower() == "synthetic"
    if given:
        source, values = "your --synthetic.* options", given
    elif own and recorded:
        source, values = f"the run's {str(cfg_file)!r}", recorded.get("synthetic") or {}
    elif own:
        raise ValueError(f"the run trained on a synthetic graph, but {str(cfg_file)!r}, which "
                         f"records which one, is missing: restore it, or give the run's "
                         f"--synthetic.* options (e.g. --synthetic.nodes)")
    else:
        source, values = "the defaults", {}
    try:
        spec = load_config(None, {"synthetic": values}).synthetic
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    dims = (model.gnn.dims[0], model.gnn.dims[-1])
    if (spec.feature_dim, spec.classes) != dims:
        fix = f"set --synthetic.feature_dim {dims[0]} --synthetic.classes {dims[1]}" if given \
            else f"predict on the dataset it trained on ({trained_on!r})"
        raise ValueError(f"--dataset synthetic from {source} has {spec.feature_dim} features "
                         f"and {spec.classes} classes; the run's model takes {dims[0]} features "
                         f"and gives {dims[1]} classes: {fix}")
    return spec


def _run_config(path: Path) -> Optional[dict[str, Any]]:
    """The run's ``config.json`` (None: there is none), read as a regular file."""
    from .safefiles import open_no_follow
    if not os.path.lexists(path):
        return None
    with open_no_follow(path) as f:
        raw = f.read()
    try:
        cfg = loads_json(raw)
    except ValueError as exc:
        raise ValueError(f"{str(path)!r} is not JSON ({exc}); restore the config.json the "
                         f"run wrote") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("dataset", {}), dict):
        raise ValueError(f"{str(path)!r} is not a run's config (expected a mapping with a "
                         f"'dataset' section); restore the config.json the run wrote")
    return cfg
