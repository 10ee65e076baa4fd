"""``quietgnn bench``: run a matrix of training runs, each isolated, resumably.

The matrix is datasets x strategies x partition counts x models x seeds, from a YAML file
and/or flags (flags win)::

    quietgnn bench --matrix benchmarks/headline.yaml
    quietgnn bench --datasets cora,citeseer --root ../shared/data/planetoid \\
        --strategies centralized,halo --parts 4 --models gcn,sage --seeds 0,1 --epochs 200 \\
        --out bench-out

YAML (every key optional; see ``benchmarks/headline.yaml``)::

    out: benchmarks/results/headline
    datasets:                        # names, or mappings with a root / extra config keys
      - {name: cora, root: ../shared/data/planetoid}
      - {name: synthetic, label: syn10k, set: {synthetic.nodes: 10000}}
    strategies:                      # names, or mappings with options / extra keys / a label
      - centralized
      - halo
      - {name: adaqp, label: adaqp-2bit, options: {bits: 2}}
      - {name: minibatch, datasets: [cora]}   # only on these datasets (names or labels)
    parts: [4]
    models: [gcn, sage]
    seeds: [0]
    set: {train.epochs: 200, model.hidden: 64}   # config keys for every run
    links: [uncapped, 100mbit]       # optional: every multi-rank run on emulated hosts
    run_timeout_s: 1800

Strategy names and options are plain data passed to ``quietgnn train`` (``--options.KEY``),
so a strategy that registers later joins the matrix with no change here. A strategy with
``fixed_parts`` (``centralized``: 1) runs once per dataset x model x seed, whatever ``parts``.

Every run is a subprocess ``python -m quietgnn train ... --summary-json`` with its own run
directory and one compute thread per worker (``runtime.threads 1``). Output under ``--out``::

    results/<id>.json   one per run (a :class:`Result`): spec, command, status (ok | failed),
                        summary, error tail, and the per-epoch curve ``quietgnn report`` reads
                        (:class:`~quietgnn.analysis.projection.Curve`, a list per field)
    results.jsonl       every result of the study: earlier runs kept, this run's in place
    runs/<id>/          the run directory (metrics/rank-k.jsonl, summary.json, logs/)
    logs/<id>.log       stdout + stderr of the run

With ``links`` (or ``--links``), each run of P ranks is measured on P emulated hosts of this
machine per link (:mod:`quietgnn.runtime.netcluster`: network namespaces, each host's egress
capped at the link's rate, ``uncapped`` for none; root and iproute2), launched by ``torchrun``
as across real machines; a strategy with ``fixed_parts`` 1 runs locally, once. The run's id
ends with its link, and ``quietgnn report`` shows its measured seconds beside the projection.

Resumable: a run whose result file exists is skipped (``--retry-failed`` reruns failed ones).
A failing run is recorded with the tail of its output and the matrix goes on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from ..runtime.records import Record, RunSummary, optional
from .projection import Curve

__all__ = ["RunSpec", "Result", "build_matrix", "load_matrix", "run_matrix", "cli_main"]


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
    raise ValueError(f"matrix key {what!r} = {v!r}; expected a list or a comma-separated string")


def _entry(item: Any, what: str) -> dict[str, Any]:
    if isinstance(item, str):
        return {"name": item}
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        allowed = {"name", "label", "root", "options", "set", "datasets"}
        bad = sorted(set(item) - allowed)
        if bad:
            raise ValueError(f"matrix {what} entry {item!r}: unknown key(s) {bad}; allowed "
                             f"{sorted(allowed)}")
        return item
    raise ValueError(f"matrix {what} entry {item!r}: expected a name or a mapping with 'name'")


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
             "run_timeout_s", "epochs", "links"}
    bad = sorted(set(m) - known)
    if bad:
        raise ValueError(f"unknown matrix key(s) {bad}; valid keys: {sorted(known)}")
    datasets = [_entry(d, "datasets") for d in _as_list(m.get("datasets"), "datasets")]
    strategies = [_entry(s, "strategies") for s in _as_list(m.get("strategies"), "strategies")]
    parts = [int(p) for p in _as_list(m.get("parts", [4]), "parts")]
    models = [str(x) for x in _as_list(m.get("models", ["gcn"]), "models")]
    seeds = [int(s) for s in _as_list(m.get("seeds", [0]), "seeds")]
    links = [_link(str(x)) for x in _as_list(m.get("links"), "links")]
    common = dict(m.get("set") or {})
    if m.get("epochs") is not None:
        common["train.epochs"] = int(m["epochs"])
    for name, lst in (("datasets", datasets), ("strategies", strategies), ("parts", parts),
                      ("models", models), ("seeds", seeds)):
        if not lst:
            raise ValueError(f"the matrix has no {name}; give --{name} or '{name}:' in the YAML")
    specs: list[RunSpec] = []
    seen: set[str] = set()
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
                            overrides={**common, **(d.get("set") or {}), **(s.get("set") or {})})
                        if spec.id not in seen:
                            seen.add(spec.id)
                            specs.append(spec)
    return specs


def _link(link: str) -> str:
    """``uncapped`` or a tc rate (``100mbit``), checked before any run starts."""
    if link != UNCAPPED:
        from ..runtime.netcluster import rate_bps
        try:
            rate_bps(link)
        except ValueError as exc:
            raise ValueError(f"link {link!r} ('links' / --links): {exc}, or {UNCAPPED!r}") \
                from None
    return link.strip().lower()


#: a link on emulated hosts with no cap (their traffic as fast as this machine moves it)
UNCAPPED = "uncapped"


def load_matrix(path: Optional[str]) -> dict[str, Any]:
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"matrix file {str(p)!r} does not exist")
    try:
        m = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"matrix file {str(p)!r} is not valid YAML: {exc}") from exc
    if not isinstance(m, dict):
        raise ValueError(f"matrix file {str(p)!r} must hold a mapping (datasets, strategies, ...)")
    return m


# ---------------------------------------------------------------------- running
def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _run_one(spec: RunSpec, out: Path, timeout_s: float, log: Any) -> dict[str, Any]:
    """The run's result, as its file will hold it."""
    run_dir = out / "runs" / spec.id
    summary_path = run_dir / "summary.json"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a previous, unfinished attempt
    summary_copy = out / "runs" / f"{spec.id}.summary.json"
    cmd = spec.command(run_dir, summary_copy)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log_path = out / "logs" / f"{spec.id}.log"
    t0 = time.perf_counter()
    status, error = "ok", None
    with open(log_path, "w") as lf:
        lf.write(" ".join(cmd) + "\n")
        lf.flush()
        if spec.link:
            from ..runtime.netcluster import run_on_hosts
            try:
                rc = run_on_hosts(spec.train_args(run_dir, summary_copy), spec.parts,
                                  None if spec.link == UNCAPPED else spec.link, spec.id, lf,
                                  timeout_s)
            except (RuntimeError, OSError) as exc:   # the hosts could not be built: this
                lf.write(f"emulated hosts: {exc}\n")  # run fails, the matrix goes on
                rc = 1
        else:   # own process group: a timeout kills the launcher and all its workers
            proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
            except KeyboardInterrupt:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
    elapsed = time.perf_counter() - t0
    output = log_path.read_text(errors="replace")
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "")
    if rc is None:
        status, error = "failed", f"timed out after {timeout_s:g}s\n{_tail(output)}"
    elif rc != 0:
        status, error = "failed", f"exit code {rc}: {last[:300]}\n{_tail(output)}"
    elif not summary_copy.is_file():
        status, error = "failed", f"finished without a summary\n{_tail(output)}"
    res: dict[str, Any] = {**spec.as_dict(), "status": status, "error": error,
                           "command": cmd, "elapsed_s": round(elapsed, 2),
                           "run_dir": str(run_dir), "finished_at": time.strftime("%FT%TZ",
                                                                                  time.gmtime())}
    if spec.link:
        res["host_cores"] = len(os.sched_getaffinity(0))
    if status == "ok":
        res["summary"] = json.loads(summary_copy.read_text())
        summary_copy.unlink()
        try:
            from .projection import epoch_curve
            from ..runtime.metrics import read_metrics
            res["curve"] = epoch_curve(read_metrics(run_dir)).to_json()
        except (ValueError, OSError, KeyError, TypeError, AttributeError) as exc:
            res["curve_error"] = f"{type(exc).__name__}: {exc}"
    elif summary_path.is_file():
        res["summary"] = json.loads(summary_path.read_text())
    log(f"  {status} in {elapsed:.1f}s" + ("" if status == "ok" else f": "
                                           f"{(error or '').splitlines()[0]}  (log: {log_path})"))
    return res


def run_matrix(specs: Sequence[RunSpec], out: str | Path, *, timeout_s: float = 3600.0,
               retry_failed: bool = False, log: Any = print) -> list[Result]:
    """Run every spec not already done; returns all results (old and new) in matrix order and
    writes ``results.jsonl``. A result kept from before is written back as it was read."""
    out = Path(out)
    for sub in ("results", "runs", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    results = []
    for i, spec in enumerate(specs):
        path = out / "results" / f"{spec.id}.json"
        if path.is_file():
            try:
                old = json.loads(path.read_text())
            except json.JSONDecodeError:
                old = None  # torn by a crash while writing: rerun
            status = Result.from_json(old).status if isinstance(old, dict) else None
            if status is not None and (status == "ok" or not retry_failed):
                log(f"[{i + 1}/{len(specs)}] {spec.id}: done before ({status}), skipped")
                results.append((spec.id, old))
                continue
        log(f"[{i + 1}/{len(specs)}] {spec.id}")
        res = _run_one(spec, out, timeout_s, log)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, separators=(",", ":"), default=str))
        tmp.replace(path)  # atomic: a result file is either whole or absent
        results.append((spec.id, res))
    _write_jsonl(out / "results.jsonl", results)
    return [Result.from_json(r) for _, r in results]


def _write_jsonl(path: Path, results: list[tuple[str, dict[str, Any]]]) -> None:
    """``results.jsonl``: what it held before, each of ``results`` in its run's place (new
    runs after), so that a run of part of a matrix (``--strategies``, ``--datasets``) adds to
    the study instead of replacing it; written whole to a temporary file, then moved."""
    lines: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rid = json.loads(line).get("id")    # the id alone: no curve parsed
            except (json.JSONDecodeError, AttributeError):
                continue        # a torn or foreign line: the result files are the record
            if rid:
                lines[rid] = line
    for rid, r in results:
        lines[rid] = json.dumps(r, separators=(",", ":"), default=str)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines.values()))
    tmp.replace(path)


# ---------------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="quietgnn bench", description="Run a benchmark matrix (datasets x strategies x "
        "parts x models x seeds), each run isolated; resumable.",
        epilog="Flags override the YAML file. Extra config keys for every run: "
               "--set train.epochs=50 --set model.hidden=128. Strategy options: "
               "--options adaqp.bits=2.")
    ap.add_argument("--matrix", help="YAML matrix file (see benchmarks/headline.yaml)")
    ap.add_argument("--datasets", help="comma-separated dataset names")
    ap.add_argument("--root", help="dataset root directory (for all datasets)")
    ap.add_argument("--strategies", help="comma-separated strategy names")
    ap.add_argument("--parts", help="comma-separated partition counts")
    ap.add_argument("--models", help="comma-separated model architectures (gcn, sage, ...)")
    ap.add_argument("--seeds", help="comma-separated seeds")
    ap.add_argument("--epochs", type=int, help="training epochs of every run")
    ap.add_argument("--links", help="comma-separated links (uncapped, 100mbit, ...): every "
                    "multi-rank run on emulated hosts of this machine, once per link (root)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config key for every run (repeatable)")
    ap.add_argument("--options", action="append", default=[], metavar="STRATEGY.KEY=VALUE",
                    help="option for one strategy (repeatable)")
    ap.add_argument("--out", help="output directory (default: the matrix's 'out' or bench-out)")
    ap.add_argument("--run-timeout", type=float, help="seconds before a run is killed and "
                    "recorded as failed (default 3600)")
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs recorded as failed")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and commands only")
    return ap


def _kv(items: Sequence[str], what: str) -> dict[str, Any]:
    out = {}
    for it in items:
        if "=" not in it:
            raise ValueError(f"{what} {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _select(entries: Any, names: str, what: str) -> list[Any]:
    """``--datasets cora,cs`` on top of a YAML list: keep the YAML entries of those names
    (with their roots, labels, options) and add plain entries for names it lacks."""
    known = [_entry(e, what) for e in _as_list(entries, what)]
    out: list[Any] = []
    for name in _as_list(names, what):
        hit = [e for e in known if e["name"] == name or e.get("label") == name]
        out += hit or [name]
    return out


def cli_main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    # a terminated bench must take its running run (its own process group) down with it
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _main(args)
    finally:
        signal.signal(signal.SIGTERM, old)


def _main(args: argparse.Namespace) -> int:
    try:
        m = load_matrix(args.matrix)
        for key in ("datasets", "strategies", "parts", "models", "seeds", "root", "epochs",
                    "links"):
            v = getattr(args, key)
            if v is not None:
                m[key] = _select(m.get(key), v, key) if key in ("datasets", "strategies") else v
        if args.set:
            m["set"] = {**(m.get("set") or {}), **_kv(args.set, "--set")}
        if args.options:
            opts = _kv(args.options, "--options")
            strategies = [_entry(s, "strategies") for s in _as_list(m.get("strategies"),
                                                                      "strategies")]
            for key, v in opts.items():
                name, _, opt = key.partition(".")
                hit = [s for s in strategies if s["name"] == name]
                if not opt or not hit:
                    raise ValueError(f"--options {key}={v}: expected STRATEGY.KEY=VALUE with a "
                                     f"strategy of the matrix ({[s['name'] for s in strategies]})")
                for s in hit:
                    s.setdefault("options", {})[opt] = v
            m["strategies"] = strategies
        out = Path(args.out or m.get("out") or "bench-out")
        timeout = float(args.run_timeout or m.get("run_timeout_s") or 3600.0)
        specs = build_matrix({k: v for k, v in m.items() if k not in ("out", "run_timeout_s")})
    except ValueError as exc:
        print(f"quietgnn bench: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for s in specs:
            print(s.id + (f"  (on {s.parts} emulated hosts, link {s.link})" if s.link else ""))
            print("   ", " ".join(s.command(out / "runs" / s.id, out / "runs" /
                                            f"{s.id}.summary.json", python="python")))
        return 0
    if any(s.link for s in specs):
        from ..runtime.netcluster import available
        why = available()
        if why:
            links = sorted({s.link for s in specs if s.link})
            print(f"quietgnn bench: error: the matrix has links {links} but emulated hosts "
                  f"cannot be built here: {why} (or leave 'links' out: local runs)",
                  file=sys.stderr)
            return 2
    print(f"quietgnn bench: {len(specs)} run(s) -> {out}", file=sys.stderr)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    results = run_matrix(specs, out, timeout_s=timeout, retry_failed=args.retry_failed, log=log)
    failed = [r for r in results if r.status != "ok"]
    print(f"quietgnn bench: {len(results) - len(failed)} ok, {len(failed)} failed; results in "
          f"{out / 'results.jsonl'} (next: quietgnn report {out / 'results.jsonl'} --out "
          f"{out / 'report'})", file=sys.stderr)
    for r in failed:
        print(f"  failed: {r.id}: {(r.error or 'unknown error').splitlines()[0]}",
              file=sys.stderr)
    return 0 if not failed else 1
