"""A study's matrix and its records: :class:`RunSpec` (one cell: what ``quietgnn train``
runs), :class:`Result` (what the run left: ``results/<id>.json``), and the expansion of a
matrix mapping (the YAML of :mod:`~quietgnn.analysis.bench`) into cells. Plain data: the
runner (:mod:`.runner`) runs the cells, the report reads the results."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..readyaml import brief, read_yaml_mapping
from ..safefiles import TEMP_NAME_EXTRA
from ..runtime.records import Record, RunSummary, optional
from .projection import Curve

__all__ = ["RunSpec", "Result", "UNCAPPED", "build_matrix", "load_matrix"]

@dataclass(frozen=True)
class Result(Record):
    """One run of a study: ``results/<id>.json`` and a line of ``results.jsonl``. A result
    read from a run's ``summary.json`` alone (``quietgnn report`` on a run directory) has the
    summary's names and ``status`` ok; the matrix's fields are then None."""

    id: str
    dataset: str                       #: the dataset's label in tables
    strategy: str                      #: the strategy's label in tables
    parts: int
    model: str
    seed: int
    status: str                        #: ok or failed
    run_dir: Optional[str]
    dataset_name: Optional[str] = None  #: what ``--dataset`` was
    strategy_name: Optional[str] = None  #: the registered strategy the label runs
    root: Optional[str] = None
    options: Optional[dict[str, Any]] = None
    overrides: Optional[dict[str, Any]] = None
    error: Optional[str] = None        #: a failed run's reason and the tail of its output
    command: Optional[list[str]] = None
    elapsed_s: Optional[float] = None
    finished_at: Optional[str] = None
    summary: Optional[RunSummary] = None
    curve: Optional[Curve] = None      #: its epochs merged (:func:`.projection.epoch_curve`)
    curve_error: Optional[str] = optional()
    link: Optional[str] = optional()   #: the emulated hosts' link (``links``), None: local
    host_cores: Optional[int] = optional()   #: the cores those hosts shared
    #: with ``--mem-floor``: the largest resident MiB one of the run's processes reached
    peak_rss_seen_mb: Optional[float] = optional()
    #: a short digest of the graph the run read (its files' content, or a prepared graph's
    #: fingerprint) and the file or folder it was read from, both taken as the run started: a
    #: resumed study and a report refuse to mix two graphs of one name (None: synthetic, or a
    #: result written before they were kept)
    graph_id: Optional[str] = optional()
    graph_path: Optional[str] = optional()

    @property
    def name(self) -> str:
        """The registered strategy (its label where the result does not say)."""
        return self.strategy_name or self.strategy

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.summary is not None

    @property
    def row_label(self) -> str:
        """Its row in a report: the label, with the link of a run on emulated hosts."""
        return self.strategy + (f" @ {self.link}" if self.link else "")


@dataclass
class RunSpec:
    """One cell of the matrix."""

    dataset: str
    strategy: str
    parts: int
    model: str
    seed: int
    label: str = ""                       # strategy label in tables (default: the name)
    dataset_label: str = ""
    root: Optional[str] = None
    options: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)   # section.key -> value
    link: Optional[str] = None            # on emulated hosts at this link; None: local

    @property
    def id(self) -> str:
        base = (f"{self.dataset_label or self.dataset}-{self.model}-{self.label or self.strategy}"
                f"-p{self.parts}-s{self.seed}" + (f"-{self.link}" if self.link else ""))
        # options / overrides that are not already in the label change the run: hash them so
        # two variants never share a result file
        extra = json.dumps({"o": self.options, "k": self.overrides, "r": self.root},
                           sort_keys=True, default=str)
        return f"{base}-{hashlib.sha1(extra.encode()).hexdigest()[:6]}".replace("/", "_")

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "dataset": self.dataset_label or self.dataset,
                "dataset_name": self.dataset, "strategy": self.label or self.strategy,
                "strategy_name": self.strategy, "parts": self.parts, "model": self.model,
                "seed": self.seed, "root": self.root, "options": self.options,
                "overrides": self.overrides, **({"link": self.link} if self.link else {})}

    def command(self, run_dir: Path, summary: Path, python: str = sys.executable) -> list[str]:
        return [python, *self.train_args(run_dir, summary)]

    def train_args(self, run_dir: Path, summary: Path) -> list[str]:
        """What follows the interpreter (or ``torchrun``'s options, on emulated hosts)."""
        cmd = ["-m", "quietgnn", "train", "--strategy", self.strategy,
               "--dataset", self.dataset, "--parts", str(self.parts), "--model", self.model,
               "--seed", str(self.seed), "--threads", "1",
               "--out", str(run_dir.parent), "--run-name", run_dir.name,
               "--summary-json", str(summary), "--runtime.progress", "false",
               # a cell is rerun only when it has no result: replace its half-written run
               "--runtime.overwrite", "true"]
        if self.root:
            cmd += ["--root", str(self.root)]
        for k, v in self.overrides.items():
            cmd += [f"--{k}", _scalar(v)]
        for k, v in self.options.items():
            cmd += [f"--options.{k}", _scalar(v)]
        return cmd


def _scalar(v: Any) -> str:
    """A value as ``quietgnn train`` reads it back (YAML scalars)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def _as_list(v: Any, what: str) -> list[Any]:
    if v is None:
        return []
    if isinstance(v, str):
        return [s.strip() for s in v.split(",") if s.strip()]
    if isinstance(v, (int, float)):
        return [v]
    if isinstance(v, list):
        return v
    raise ValueError(f"matrix key {what!r} = {brief(v)}; expected a list or a comma-separated "
                     f"string")


#: what a ``set`` / ``options`` mapping holds, for the message refusing another type
_SET = "a mapping of config keys to values (e.g. set: {train.epochs: 50})"
_OPTIONS = "a mapping of the strategy's options to values (e.g. options: {bits: 2})"


#: config keys each run's command sets itself (:meth:`RunSpec.train_args`), and where a
#: matrix gives them instead: one in a ``set`` would be overridden or would undo the runner's
#: bookkeeping (``runtime.out_dir`` wrote runs outside ``out`` and results.jsonl pointed at
#: a missing directory; ``runtime.summary_json`` made an ok run 'finished without a summary')
RUNNER_KEYS = {
    "dataset.name": "datasets are given in 'datasets'",
    "dataset.root": "a root is given as 'root', the matrix's or a dataset entry's, or --root",
    "partition.parts": "parts are given in 'parts' or --parts",
    "model.arch": "models are given in 'models' or --models",
    "train.seed": "seeds are given in 'seeds' or --seeds",
    "runtime.out_dir": "each run writes <out>/runs/<id>; give 'out' or --out",
    "runtime.run_name": "each run is named by its id",
    "runtime.summary_json": "the runner reads each run's summary from its own path",
    "runtime.progress": "runs are quiet; each one's output is in logs/<id>.log",
    "runtime.overwrite": "an unfinished run is replaced, a finished one skipped; "
                         "--retry-failed reruns failed ones",
    "runtime.resume": "each run starts afresh in its own directory; a stopped study "
                      "resumes by running quietgnn bench again",
}


def _check_set(values: dict[str, Any], what: str) -> dict[str, Any]:
    """``values`` (a ``set`` mapping) without a key the runner sets itself."""
    for key in values:
        if key in RUNNER_KEYS:
            raise ValueError(f"{what}: {key} is set by quietgnn bench itself for every run "
                             f"({RUNNER_KEYS[key]}); leave it out")
    return values


def _mapping(value: Any, what: str, holds: str) -> dict[str, Any]:
    """A ``set`` or ``options`` value as a dict of names, or a ValueError naming ``what``
    (``set: [1, 2]`` was a TypeError traceback, ``set: abc`` a message about 'dictionary
    update sequence elements')."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} = {brief(value)}; expected {holds}")
    for k in value:
        if not isinstance(k, str):
            raise ValueError(f"{what}: key {brief(k)} is not a name; expected {holds}")
    return dict(value)


#: the longest run id: ids name files, the longest ``runs/<id>.summary.json`` written through
#: its temporary name (safefiles.temp_name), and a file name holds at most 255 bytes (a
#: longer label was an ENAMETOOLONG traceback mid-study; an id that fitted only the final
#: name failed once the run was done)
MAX_ID_BYTES = 255 - len(".summary.json") - TEMP_NAME_EXTRA


def _file_part(value: str, what: str) -> str:
    """A name or label that becomes part of a run's id, hence of file names."""
    if "\0" in value:
        raise ValueError(f"{what} {brief(value)} holds a NUL character (\\0); names and "
                         f"labels become file names, which cannot hold one")
    if len(value.encode()) > MAX_ID_BYTES:
        raise ValueError(f"{what} {brief(value)} is {len(value.encode())} bytes; names and "
                         f"labels become part of file names (runs/<id>.summary.json), which "
                         f"hold at most 255 bytes: shorten it")
    return value


def _check_id(spec: RunSpec) -> None:
    """A run id short enough for the file names it becomes."""
    size = len(spec.id.encode())
    if size > MAX_ID_BYTES:
        raise ValueError(f"run id {brief(spec.id)} is {size} bytes; it names the run's files "
                         f"(runs/<id>.summary.json), which hold at most 255 bytes, so an id "
                         f"is at most {MAX_ID_BYTES}: shorten what it is made of (the dataset "
                         f"and strategy labels or names, the model, the seed)")


def _entry(item: Any, what: str) -> dict[str, Any]:
    if isinstance(item, str):
        return {"name": _file_part(item, f"matrix {what} entry")}
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        allowed = {"name", "label", "root", "options", "set", "datasets"}
        bad = sorted(set(item) - allowed, key=str)
        where = f"matrix {what} entry {brief(item['name'])}"
        if bad:
            raise ValueError(f"{where}: unknown key(s) {brief(bad)}; allowed {sorted(allowed)}")
        for key in ("label", "root"):
            if item.get(key) is not None and not isinstance(item[key], str):
                raise ValueError(f"{where}: {key} = {brief(item[key])}; expected a string "
                                 f"(quote one that YAML reads as a number)")
        _check_set(_mapping(item.get("set"), f"{where}: 'set'", _SET), f"{where}: 'set'")
        _mapping(item.get("options"), f"{where}: 'options'", _OPTIONS)
        _file_part(item["name"], f"matrix {what} entry name")
        _file_part(item.get("label") or "", f"{where}: label")
        return item
    raise ValueError(f"matrix {what} entry {brief(item)}: expected a name or a mapping with "
                     f"'name'")


def _fixed_parts(strategy: str) -> Optional[int]:
    """The strategy's ``fixed_parts`` if it is registered (unknown names run and fail)."""
    try:
        from ..strategies import get_strategy
        return get_strategy(strategy).fixed_parts
    except Exception:  # noqa: BLE001 - unknown or broken strategy: its run fails and is recorded
        return None


def build_matrix(m: dict[str, Any]) -> list[RunSpec]:
    """Expand a matrix mapping (YAML shape above) into run specs, deduplicated, in order
    dataset > model > strategy > parts > seed."""
    known = {"out", "datasets", "strategies", "parts", "models", "seeds", "set", "root",
             "run_timeout_s", "epochs", "links", "mem_floor_mb"}
    bad = sorted(set(m) - known)
    if bad:
        raise ValueError(f"unknown matrix key(s) {bad}; valid keys: {sorted(known)}")
    datasets = [_entry(d, "datasets") for d in _as_list(m.get("datasets"), "datasets")]
    strategies = [_entry(s, "strategies") for s in _as_list(m.get("strategies"), "strategies")]
    parts = _ints(m.get("parts", [4]), "parts")
    models = [_file_part(str(x), "matrix models entry")
              for x in _as_list(m.get("models", ["gcn"]), "models")]
    seeds = _ints(m.get("seeds", [0]), "seeds")
    links = [_link(str(x)) for x in _as_list(m.get("links"), "links")]
    common = _check_set(_mapping(m.get("set"), "matrix key 'set'", _SET),
                        "matrix key 'set' (or --set)")
    if m.get("epochs") is not None:   # was int(): 'invalid literal for int()', no key named
        epochs = m["epochs"]
        try:
            ok = not isinstance(epochs, bool) and float(epochs) == int(epochs) >= 1
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise ValueError(f"matrix key 'epochs' (or --epochs) = {brief(epochs)}; expected "
                             f"an integer >= 1, the epochs of every run (e.g. epochs: 200)")
        common["train.epochs"] = int(epochs)
    for name, lst in (("datasets", datasets), ("strategies", strategies), ("parts", parts),
                      ("models", models), ("seeds", seeds)):
        if not lst:
            raise ValueError(f"the matrix has no {name}; give --{name} or '{name}:' in the YAML")
    _check_dataset_labels(datasets, m.get("root"), common)
    specs: list[RunSpec] = []
    seen: set[str] = set()
    cells: dict[tuple, str] = {}
    for d in datasets:
        for model in models:
            for s in strategies:
                if "datasets" in s and (d.get("label") or d["name"]) not in \
                        _as_list(s["datasets"], "strategies.datasets"):
                    continue   # this strategy runs on the datasets it names only
                fixed = _fixed_parts(s["name"])
                for p, seed, link in ((p, seed, link) for p in ([fixed] if fixed else parts)
                                      for seed in seeds
                                      for link in (links if links and p > 1 else [None])):
                        spec = RunSpec(
                            dataset=d["name"], dataset_label=d.get("label", ""),
                            root=d.get("root", m.get("root")), strategy=s["name"],
                            label=s.get("label", ""), parts=p, model=model, seed=seed,
                            options=dict(s.get("options") or {}), link=link,
                            overrides=_with_seed({**common, **(d.get("set") or {}),
                                                  **(s.get("set") or {})}, seed))
                        if spec.id not in seen:
                            _check_id(spec)
                            seen.add(spec.id)
                            specs.append(spec)
                            cell = (spec.dataset_label or spec.dataset, spec.label or
                                    spec.strategy, p, model, seed, link)
                            if cells.setdefault(cell, spec.id) != spec.id:
                                # a report would take them for one cell: one result each
                                raise ValueError(
                                    f"strategies: two entries run as {cell[1]!r} on {cell[0]} "
                                    f"with other settings; give each its own label "
                                    f"(- {{name: {spec.strategy}, label: ..., ...}})")
    return specs


def _check_dataset_labels(datasets: list[dict[str, Any]], root: Any,
                          common: dict[str, Any]) -> None:
    """Two dataset entries a run's id and a report's cell would name alike (one label, or one
    name without labels) must be one graph: the second was dropped as a duplicate of the
    first (two files labelled 'graph'), or refused as two strategy entries."""
    seen: dict[str, tuple[str, str]] = {}
    for d in datasets:
        # as the run id spells it ('/' -> '_'), with the settings the runs get
        label = (d.get("label") or d["name"]).replace("/", "_")
        what = json.dumps([d["name"], d.get("root", root), {**common, **(d.get("set") or {})}],
                          sort_keys=True, default=str)
        first = seen.setdefault(label, (what, d["name"]))
        if first[0] != what:
            raise ValueError(f"datasets: two entries run as {brief(label)} ({brief(first[1])} "
                             f"and {brief(d['name'])}, or one graph with other settings); give "
                             f"each its own label (- {{name: ..., label: ...}})")


def _ints(values: Any, key: str) -> list[int]:
    out = []
    for v in _as_list(values, key):
        try:
            if isinstance(v, bool) or not isinstance(v, int) and float(v) != int(v):
                raise ValueError      # (an int as it is: a huge one is no float's equal)
            out.append(int(v))
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{key}: {brief(v)} is not an integer (e.g. {key}: [2, 4])") \
                from None
    return out


def check_settings(specs: list[RunSpec]) -> None:
    """Each distinct strategy, options and ``set`` of the specs validated as ``quietgnn train``
    will (a misspelled strategy, option or key, a value of the wrong type): ``quietgnn bench``
    refuses them before the first run starts rather than in every run (:func:`build_matrix`
    itself takes any name: the matrix is data). A run on a prepared directory not there yet
    (a matrix may name one an earlier step writes) is left to check itself: its partitioner,
    which options and residency depend on, is the directory's."""
    from ..config import load_config
    seen: set[str] = set()
    for s in specs:
        prepared = s.overrides.get("dataset.prepared")
        if prepared is not None and not (Path(str(prepared)) / "book.json").is_file():
            continue
        over = {"model.arch": s.model, "partition.parts": s.parts, "train.seed": s.seed,
                **s.overrides}
        key = json.dumps([s.strategy, s.options, over], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        nested: dict[str, Any] = {"strategy": s.strategy, "options": dict(s.options)}
        for k, v in over.items():
            section, _, name = k.partition(".")
            if not name:
                raise ValueError(f"set: {brief(k)}: expected section.key (e.g. train.epochs)")
            nested.setdefault(section, {})[name] = v
        try:
            load_config(None, nested)
        except (ValueError, TypeError) as exc:
            where = s.label or s.strategy
            raise ValueError(f"the matrix's {brief(where)} runs would be refused: {exc}") from None


def _with_seed(overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """A ``set`` value ``"{seed}"`` is the run's seed (``dataset.split_seed: "{seed}"``: each
    seed of the matrix its own split)."""
    # "--set k={seed}" reaches here as YAML read it: a mapping {seed: None}
    return {k: seed if v in ("{seed}", {"seed": None}) else v for k, v in overrides.items()}


def _link(link: str) -> str:
    """``uncapped`` or a tc rate (``100mbit``), checked before any run starts."""
    if link != UNCAPPED:
        from ..runtime.netcluster import rate_bps
        try:
            rate_bps(link)
        except ValueError as exc:
            raise ValueError(f"link {brief(link)} ('links' / --links): {exc}, or {UNCAPPED!r}") \
                from None
    return link.strip().lower()


#: a link on emulated hosts with no cap (their traffic as fast as this machine moves it)
UNCAPPED = "uncapped"


def load_matrix(path: Optional[str]) -> dict[str, Any]:
    if path is None:
        return {}
    return read_yaml_mapping(path, "matrix file", "a mapping (datasets, strategies, ...)")
