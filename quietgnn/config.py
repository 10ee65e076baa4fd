"""Run configuration: small validated dataclasses, YAML recipes, ``--section.key value``
overrides. Unknown sections or keys are rejected by name with the valid ones listed.

Sections (each a dataclass that validates itself):

* ``strategy``   name of a registered strategy (``quietgnn strategies`` lists them)
* ``dataset``    :class:`DataConfig`        which graph, where its files are
* ``synthetic``  :class:`~quietgnn.datasets.synthetic.SyntheticSpec` (dataset ``synthetic``)
* ``partition``  :class:`PartitionConfig`   partitioner, number of parts, seed, book
* ``model``      :class:`~quietgnn.nn.ModelConfig`
* ``train``      :class:`~quietgnn.strategies.base.TrainConfig`
* ``runtime``    :class:`RuntimeConfig`     threads, timeouts, output, checkpoints
* ``options``    the strategy's own ``Options`` dataclass (checked against the strategy)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from .comm.rendezvous import MAX_TIMEOUT_S
from .nn import ModelConfig
# the YAML reader and the cut echo of values: re-exported, where callers have found them
from .readyaml import (YamlRefused, brief, check_no_nul, read_yaml_mapping, yaml_problem,
                       yaml_value)
from .strategies.base import TrainConfig, check_residency, get_strategy, options_from_dict

__all__ = ["RunConfig", "DataConfig", "PartitionConfig", "RuntimeConfig", "load_config",
           "parse_overrides", "SHORTCUTS"]


@dataclass
class DataConfig:
    """Which graph to train on (``dataset.*``)."""

    #: a built-in dataset (``quietgnn datasets``), or a path to your .npz / edge list file
    name: str = "synthetic"
    #: directory holding the dataset's files (only read: files missing there are downloaded
    #: into ``$QUIETGNN_CACHE``)
    root: Optional[str] = None
    split_seed: int = 0               # seed of the random train/val/test split (no standard one)
    #: ``standard`` (the dataset's own split, else random 60/20/20), or ``per_class:K:V``: K
    #: random training nodes of every class, V validation nodes among the rest, every other
    #: node test (PyG's ``Planetoid(split="random")``), drawn with ``split_seed``
    split: str = "standard"
    #: a directory written by ``quietgnn prepare``: the graph (name, parts, book) comes from
    #: it, and no process loads the whole graph
    prepared: Optional[str] = None

    def __post_init__(self) -> None:
        from .datasets import parse_split
        parse_split(self.split)      # a clear error before any process starts
        if self.prepared and self.split != "standard":
            raise ValueError(f"dataset.split = {brief(self.split)} with dataset.prepared: a "
                             f"prepared directory holds the split it was prepared with; leave "
                             f"dataset.split out (or train from the dataset itself)")


@dataclass
class PartitionConfig:
    """How the graph is split (``partition.*``)."""

    method: Optional[str] = None      # partitioner (metis, random, ...); null: the strategy's
    parts: int = 4                    # number of parts = worker processes
    seed: int = 0                     # seed of randomised partitioners
    clusters: Optional[int] = None    # supernode: number of METIS clusters K >> parts
    file: Optional[str] = None        # given: assignment file (.npy / .pt / text)
    book: Optional[str] = None        # an existing partition book directory

    def __post_init__(self) -> None:
        if not isinstance(self.parts, int) or self.parts < 1:
            raise ValueError(f"partition.parts = {brief(self.parts)}; expected an int >= 1")
        from .partition import PARTITIONERS
        if self.method is not None and self.method not in PARTITIONERS:
            raise ValueError(f"partition.method = {brief(self.method)}; expected one of "
                             f"{sorted(PARTITIONERS)}")
        if self.clusters is not None and (not isinstance(self.clusters, int) or self.clusters < 1):
            raise ValueError(f"partition.clusters = {brief(self.clusters)}; expected an int >= 1")


@dataclass
class RuntimeConfig:
    """Processes, timeouts, outputs (``runtime.*``)."""

    threads: int = 1                  # compute threads per worker
    timeout_s: float = 120.0          # a collective waiting longer fails the run (<= 1e7)
    #: gloo | nccl | auto: nccl when every rank on a host has a GPU of its own, else gloo
    #: (config.json records the choice)
    backend: str = "auto"
    #: cpu | cuda: rank k of a host takes cuda:(k % GPUs on the host)
    device: str = "cpu"
    out_dir: str = "runs"             # parent directory of run directories
    run_name: Optional[str] = None    # default: <time>-<strategy>-<dataset>-p<parts>
    progress: bool = True             # rank 0 prints a progress line per epoch (stderr)
    summary_json: Optional[str] = None  # also copy summary.json to this path
    checkpoint_every: int = 0         # epochs between checkpoints (0: off)
    keep_checkpoints: int = 2         # committed checkpoints kept (>= 2)
    resume: bool = False              # continue from the run's newest complete checkpoint
    overwrite: bool = False           # replace the results of an earlier run of this name
    deterministic: bool = False       # torch deterministic algorithms (slower, repeatable)
    residency: str = "none"           # none | features (raw features, labels stay home) | strict
    #: all-to-all payloads over one gloo connection per pair and direction: auto (when the
    #: ranks span hosts) | on | off. gloo's one connection per pair carries both directions
    #: of an exchange, which slow each other on a capped link (docs/findings.md)
    duplex: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"runtime.threads = {brief(self.threads)}; expected an int >= 1")
        try:
            seconds = float(self.timeout_s)
        except (TypeError, ValueError):
            seconds = math.nan
        if not 0 < seconds <= MAX_TIMEOUT_S:
            raise ValueError(f"runtime.timeout_s = {brief(self.timeout_s)}; expected a finite "
                             f"number of seconds > 0, at most {MAX_TIMEOUT_S:.0f} (about "
                             f"{MAX_TIMEOUT_S / 86400:.0f} days)")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"runtime.backend = {brief(self.backend)}; expected auto, gloo "
                             f"or nccl")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"runtime.device = {brief(self.device)}; expected cpu or cuda")
        if self.duplex not in ("auto", "on", "off"):
            raise ValueError(f"runtime.duplex = {brief(self.duplex)}; expected auto (split the "
                             f"all-to-all's directions when the ranks span hosts), on or off")
        from .comm.traffic import LEVELS
        if self.residency not in LEVELS:
            raise ValueError(f"runtime.residency = {brief(self.residency)}; expected one of "
                             f"{list(LEVELS)} (features: raw features and labels never leave "
                             f"their rank; strict: only learned embeddings, parameters, "
                             f"gradients and counts cross)")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            raise ValueError(f"runtime.checkpoint_every = {brief(self.checkpoint_every)}; "
                             f"expected an int >= 0 (0 disables checkpoints)")
        if not isinstance(self.keep_checkpoints, int) or self.keep_checkpoints < 2:
            raise ValueError(f"runtime.keep_checkpoints = {brief(self.keep_checkpoints)}; "
                             f"expected an int >= 2 (a torn newest checkpoint must leave an "
                             f"older one)")
        if self.run_name is not None and (not str(self.run_name).strip() or
                                          Path(str(self.run_name)).name != str(self.run_name)
                                          or str(self.run_name) in (".", "..")):
            raise ValueError(f"runtime.run_name = {brief(self.run_name)}; expected a plain "
                             f"directory name (no '/'), e.g. cora-halo-1; use --out for the "
                             f"parent directory")


def _synthetic_spec(values: dict[str, Any]) -> Any:
    """The spec from section ``synthetic``: its ``preset`` (a name in
    :data:`~quietgnn.datasets.synthetic.PRESETS`) first, the keys set beside it over it."""
    from .datasets.synthetic import PRESETS, SyntheticSpec
    if isinstance(values, dict) and "preset" in values:
        values = dict(values)
        name = values.pop("preset")
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"synthetic.preset = {brief(name)}; expected one of {sorted(PRESETS)} "
                             f"(or leave it out and set the synthetic.* keys one by one)")
        values = {**PRESETS[name], **values}
    return _build(SyntheticSpec, values, "synthetic")


@dataclass
class RunConfig:
    strategy: str = "halo"
    dataset: DataConfig = field(default_factory=DataConfig)
    synthetic: Any = None
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    options: Any = None

    def __post_init__(self) -> None:
        if self.synthetic is None:
            self.synthetic = _synthetic_spec({})
        cls = get_strategy(self.strategy)
        if isinstance(self.options, dict):   # types checked by key, as for the sections
            known = {f.name: f for f in dataclasses.fields(cls.Options)}
            self.options = {k: _typed(known[k], v, "options") if k in known else v
                            for k, v in self.options.items()}
        if self.options is None or isinstance(self.options, dict):
            self.options = options_from_dict(cls, self.options or {})
        # a book's partitioner is checked where the book is opened (books.check_book_partition)
        check_residency(cls, self.runtime.residency,
                        None if self.partition.book else self.partition_method)
        cls.check_model(self.options, self.model)
        if not self.partition.book:   # a book's partitioner is checked where it is opened
            cls.check_partition(self.options, self.partition_method)

    @property
    def strategy_cls(self) -> Any:
        return get_strategy(self.strategy)

    @property
    def num_parts(self) -> int:
        fixed = self.strategy_cls.fixed_parts
        return fixed if fixed is not None else self.partition.parts

    @property
    def partition_method(self) -> str:
        return self.partition.method or self.strategy_cls.default_partitioner

    def to_dict(self) -> dict[str, Any]:
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = asdict(v) if dataclasses.is_dataclass(v) else v
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)


SECTIONS = {"dataset": DataConfig, "partition": PartitionConfig, "model": ModelConfig,
            "train": TrainConfig, "runtime": RuntimeConfig}

#: short flags accepted by ``quietgnn train`` besides ``--section.key``
SHORTCUTS = {"dataset": "dataset.name", "root": "dataset.root", "parts": "partition.parts",
             "partitioner": "partition.method", "book": "partition.book", "model": "model.arch",
             "data": "dataset.prepared",
             "epochs": "train.epochs", "lr": "train.lr", "seed": "train.seed",
             "hidden": "model.hidden", "layers": "model.layers", "threads": "runtime.threads",
             "timeout": "runtime.timeout_s", "out": "runtime.out_dir",
             "summary-json": "runtime.summary_json", "resume": "runtime.resume",
             "run-name": "runtime.run_name", "overwrite": "runtime.overwrite"}


def _build(cls: type, values: dict[str, Any], section: str) -> Any:
    if not isinstance(values, dict):
        raise ValueError(f"config section {section!r} must be a mapping, got "
                         f"{type(values).__name__}: {brief(values)}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"unknown key(s) {brief([f'{section}.{k}' for k in unknown], 300)}; "
                         f"valid keys in "
                         f"{section!r}: {sorted(names)}")
    values = {k: _typed(names[k], v, section) for k, v in values.items()}
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"bad value in section {section!r}: {exc}") from exc


def _typed(f: Any, value: Any, section: str) -> Any:
    """Check a value against the type of its field's default (bool / int / float), so that
    ``--resume maybe`` or ``--lr abc`` fail naming the key instead of being taken as truthy
    strings or failing deep inside; a string field takes a string (``os.PathLike`` too), or
    None where it is optional. Other fields without a plain default are left to the
    dataclass's own validation. Floats also accept numeric strings (YAML reads ``1e-3`` as a
    string)."""
    default = f.default
    want = None
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        value = value.item()        # a numpy scalar (np.int64(32)) is the number it holds
    if f.type in _STR_TYPES:        # a path, a name: a string (a Path from the Python API too)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if value is None and f.type != "str":
            return None
        if not isinstance(value, str):
            quote = " (in YAML, put it in quotes)" if isinstance(value, (bool, int, float)) else ""
            raise ValueError(f"{section}.{f.name} = {brief(value)} ({type(value).__name__}); "
                             f"expected a string{quote}")
        return value
    if isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        if not ok and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    else:
        return value
    if not ok:
        raise ValueError(f"{section}.{f.name} = {brief(value)} ({type(value).__name__}); expected "
                         f"{want}")
    if (f.name == "seed" or f.name.endswith("_seed")) and not 0 <= value <= MAX_SEED:
        # past these, a seed failed in every worker (torch: "Overflow when unpacking long
        # long") or in METIS (a 3-line pybind error), after the run directory was made
        raise ValueError(f"{section}.{f.name} = {value}; expected an integer in [0, {MAX_SEED}] "
                         f"(seeds reach METIS and numpy, which take 32-bit seeds)")
    return value


#: the largest seed: METIS takes a C int, numpy's generators an unsigned 32-bit one
MAX_SEED = 2**31 - 1


#: the annotations of the string fields (with ``from __future__ import annotations``)
_STR_TYPES = ("str", "Optional[str]")


def _string_field(key: str) -> Optional[bool]:
    """For ``section.key`` naming a string field, whether it may be null; None otherwise."""
    section, _, name = key.partition(".")
    for f in dataclasses.fields(SECTIONS[section]) if section in SECTIONS else ():
        if f.name == name and f.type in _STR_TYPES:
            return f.type != "str"
    return None


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def override_value(key: str, raw: Any, shown: str) -> Any:
    """One ``KEY VALUE`` given as text (a flag, bench's ``--set``): YAML scalars (``128`` ->
    int, ``true`` -> bool, ``null`` -> None; what is not YAML, a string), but the value of a
    string field (a path, a name) is taken as typed: read as YAML, ``"p #1"`` lost its
    ``" #1"``, ``007`` became 7, a newline a space, ``yes`` true (``null`` or ``~`` for an
    optional one: None). ``shown`` starts a refusal (``--key VALUE``)."""
    if not isinstance(raw, str):
        return raw
    nullable = _string_field(key)
    if nullable is not None or key == "strategy":
        return None if nullable and raw in ("null", "~") else raw
    try:
        return yaml_value(raw)
    except YamlRefused as exc:   # not taken as a plain string: it was meant as YAML
        raise ValueError(f"{shown}{yaml_problem(exc)}") from None
    except yaml.YAMLError:
        return raw


def parse_overrides(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """``[("model.hidden", "128"), ("strategy", "halo")]`` -> nested dict, each value read by
    :func:`override_value`."""
    out: dict[str, Any] = {}
    for key, raw in pairs:
        key = SHORTCUTS.get(key, key)
        value = override_value(key, raw, f"--{key} {brief(raw)}")
        parts = key.split(".")
        if len(parts) > 2:
            raise ValueError(f"config key {brief(key)} is nested too deeply; use section.key")
        if len(parts) == 1 and parts[0] != "strategy":
            sections = ['synthetic', 'options'] + sorted(SECTIONS)
            raise ValueError(f"unknown config key {brief(key)}; use 'strategy', a shortcut "
                             f"({', '.join('--' + s for s in sorted(SHORTCUTS))}) or "
                             f"section.key with a section in {sections}")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None, *,
                defaults: dict[str, Any] | None = None) -> RunConfig:
    """Defaults <- ``defaults`` (a command's own, e.g. ``prepare synthetic``'s preset) <- YAML
    recipe <- overrides, validated section by section."""
    raw = (read_yaml_mapping(path, "config file", "a mapping of sections")
           if path is not None else {})
    raw = _merge(_merge(defaults or {}, raw), overrides or {})
    try:
        check_no_nul(raw)
        return _resolve(raw)
    except ValueError as exc:
        # the sections' own checks (model, train, a strategy's options) echo values whole;
        # a long one is cut in the middle, keeping the key (first) and the remedy (last)
        text = str(exc)
        if len(text) <= MESSAGE_CHARS:
            raise
        keep = MESSAGE_CHARS // 2
        raise ValueError(f"{text[:keep]} … {text[-keep:]}") from None


#: the longest one-line error :func:`load_config` lets through: room for a few whole paths
#: (a message cut at 400 lost the graph a prepared directory holds), not for a megabyte
MESSAGE_CHARS = 2000


def _resolve(raw: dict[str, Any]) -> RunConfig:
    valid = {"strategy", "synthetic", "options"} | set(SECTIONS)
    unknown = sorted(set(raw) - valid)
    if unknown:
        raise ValueError(f"unknown config section(s) {brief(unknown, 300)}; valid sections: "
                         f"{sorted(valid)}")
    strategy = raw.get("strategy", "halo")
    if not isinstance(strategy, str):
        raise ValueError(f"strategy = {brief(strategy)}; expected a strategy name")
    kwargs: dict[str, Any] = {"strategy": strategy}
    for name, cls in SECTIONS.items():
        kwargs[name] = _build(cls, raw.get(name, {}) or {}, name)
    kwargs["synthetic"] = _synthetic_spec(raw.get("synthetic", {}) or {})
    kwargs["options"] = raw.get("options", {}) or {}
    if kwargs["dataset"].prepared:
        _from_prepared(kwargs, "parts" in (raw.get("partition") or {}),
                       (raw.get("dataset") or {}).get("name"))
    return RunConfig(**kwargs)


def _from_prepared(kwargs: dict[str, Any], parts_given: bool, name_given: Any = None) -> None:
    """``dataset.prepared``: the run's graph, parts and partition book are the directory's
    (its manifest is read; no array is). A dataset name given beside it must be the
    directory's graph (or its family: ``synthetic`` for ``synthetic-stream``)."""
    from .partition import PartitionBook
    data, part = kwargs["dataset"], kwargs["partition"]
    book = PartitionBook.open(data.prepared)
    if part.book and Path(part.book).resolve() != Path(data.prepared).resolve():
        raise ValueError(f"dataset.prepared = {brief(data.prepared)} and partition.book = "
                         f"{brief(part.book)} name two different directories; pass one of them")
    if parts_given and part.parts != book.num_parts:
        # the directory opened as a book: a real path, echoed whole (cut, it lost its end)
        raise ValueError(f"--parts {part.parts} does not match {str(data.prepared)!r}, which "
                         f"was prepared with {book.num_parts} parts; leave out --parts or run "
                         f"`quietgnn prepare ... --parts {part.parts}`")
    if part.method and part.method != book.method:
        raise ValueError(f"--partitioner {part.method} does not match "
                         f"{str(data.prepared)!r}, which was partitioned with {book.method}; "
                         f"leave out --partitioner or prepare the graph again with it")
    graph = str(book.graph.get("name", data.name))
    if name_given is not None and str(name_given) != graph and \
            not graph.startswith(f"{name_given}-"):
        given = str(name_given)[:200]
        raise ValueError(f"--dataset {given} does not match {str(data.prepared)!r}, which holds "
                         f"the graph {graph!r}; leave out --dataset (the directory names its "
                         f"graph) or pass the directory prepared from {given}")
    part.parts, part.book, part.method = book.num_parts, str(data.prepared), book.method
    data.name = graph


def config_from_dict(d: dict[str, Any]) -> RunConfig:
    """Inverse of :meth:`RunConfig.to_dict` (used by workers and checkpoints)."""
    return load_config(None, d)
