"""Command line: ``quietgnn train | config | prepare | predict | datasets | strategies``
(+ ``bench``, ``report``, ``advise``).

Examples::

    quietgnn train                                   # halo, synthetic graph, 4 local workers
    quietgnn train --strategy centralized --dataset cora --root ../shared/data
    quietgnn train --config configs/cora-halo.yaml --model.hidden 128 --parts 2
    quietgnn prepare --dataset cora --root ../shared/data --parts 4 --out data/cora-p4
    quietgnn train --data data/cora-p4 --strategy grappa
    torchrun --nnodes 2 --nproc-per-node 2 ... -m quietgnn train --data /shared/cora-p4 ...
    torchrun --nnodes 2 ... -m quietgnn prepare 'edges-{rank}.parquet' \
        --nodes 'nodes-{rank}.parquet' --out /shared/mine   # a graph that arrives split

Any config key can be set as ``--section.key value`` (see ``quietgnn.config``); unknown keys
are rejected with the valid ones listed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .errors import is_explained

if TYPE_CHECKING:
    from .config import RunConfig
    from .runtime.plan import RunPlan

__all__ = ["main"]


def _split_overrides(tokens: list[str]) -> list[tuple[str, str]]:
    """``--a.b 1 --flag --c=2`` -> [("a.b", "1"), ("flag", "true"), ("c", "2")]."""
    out, i = [], 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or tok == "--":
            raise ValueError(f"unexpected argument {tok!r}; options look like --section.key value")
        key = tok[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value = tokens[i + 1]
            i += 2
        else:
            value, i = "true", i + 1
        out.append((key.replace("-", "_") if "." in key else key, value))
    return out


def _config(args: argparse.Namespace, rest: list[str], defaults: dict | None = None,
            for_prepare: bool = False) -> RunConfig:
    from .config import load_config, parse_overrides
    pairs = _split_overrides(rest)
    if args.strategy:
        pairs.insert(0, ("strategy", args.strategy))
    overrides = parse_overrides(pairs)
    recipe = args.config
    level = None
    if for_prepare:
        # a prepare trains no strategy: its residency level is its own rule (run_prepare),
        # not the training strategy's (which refused the default 'halo' under any level),
        # whether the flag or the recipe gives it
        from .config import _merge
        from .readyaml import read_yaml_mapping
        raw = read_yaml_mapping(recipe, "config file", "a mapping of sections") \
            if recipe is not None else {}
        overrides, recipe = _merge(raw, overrides), None
        if isinstance(overrides.get("runtime"), dict):
            level = overrides["runtime"].pop("residency", None)
    cfg = load_config(recipe, overrides, defaults=defaults)
    if level is not None:      # checked as the runtime section checks it
        import dataclasses
        cfg.runtime = dataclasses.replace(cfg.runtime, residency=level)
    asked = (overrides.get("partition") or {}).get("parts")
    if asked is not None and asked != cfg.num_parts:
        # said, not refused: a script passes one --parts to every strategy it compares
        print(f"quietgnn: note: {cfg.strategy} runs in {cfg.num_parts} process(es); "
              f"--parts {asked} is not used", file=sys.stderr)
    return cfg


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ)


def print_summary(summary: dict[str, Any]) -> None:
    from .runtime.metrics import human_bytes
    from .runtime.records import RunSummary
    s = RunSummary.from_json(summary)
    parts = f"{s.parts} parts ({s.partitioner})" if s.parts > 1 else "1 part (the whole graph)"
    print(f"quietgnn: {s.strategy} on {s.dataset} | {parts} | {s.model} {s.layers}x{s.hidden}")
    eq = s.epochs if s.epoch_equivalents is None else s.epoch_equivalents
    work = "" if abs(eq - s.epochs) < 1e-9 else f", {eq:g} epoch-equivalents of work"
    print(f"  test accuracy   {s.test_acc:.4f}  (best val {s.val_acc:.4f} at epoch "
          f"{s.best_epoch} of 0-{s.epochs - 1}{work})")
    per = f"/epoch{'-equivalent' if work else ''}"
    # the progress line's basis first (rank 0, sent), then what all ranks sent
    rank0 = s.rank0_train_bytes_per_epoch
    print("  training bytes  " + (f"rank 0 sent {human_bytes(rank0)}{per}; " if rank0 is not
                                   None else "") +
          f"all ranks sent {human_bytes(s.train_bytes_per_epoch)}{per}, "
          f"{human_bytes(s.train_bytes)} in all")
    how = {"local": "selected on each rank's graph, then 1 exact", "exact": "exact"}.get(
        s.selected_by or "", "")
    if s.eval_sample_nodes:
        how = f"on a fixed sample of ~{s.eval_sample_nodes} nodes per split"
    ratio = f", {100 * s.eval_bytes / s.train_bytes:.1f}% of training" if s.train_bytes else ""
    print(f"  eval bytes      {human_bytes(s.eval_bytes)} "
          f"({'?' if s.evaluations is None else s.evaluations} evaluations, {how}{ratio})")
    print(f"  time            {s.wall_seconds:.1f} s wall, {s.compute_seconds:.1f} s "
          f"compute (slowest rank per epoch), peak memory {s.peak_rss_mb:.0f} MiB/rank"
          + ("" if s.peak_gpu_mb is None else f", GPU {s.peak_gpu_mb:.0f} MiB/rank"))
    if (s.attempts or 1) > 1:
        print(f"  attempts        {s.attempts} ({s.wall_seconds_total:.1f} s since the "
              f"first started; the time above is the last attempt's)")
    print(f"  run directory   {s.run_dir}")
    if (Path(s.run_dir) / "model.pt").is_file():
        print(f"  model           model.json + model.pt there (best validation epoch); "
              f"quietgnn predict --run {s.run_dir} --dataset ...")


def cmd_train(args: argparse.Namespace, rest: list[str]) -> int:
    from .runtime.launcher import launch
    from .runtime.plan import plan_local_run, plan_worker, torchrun_run_dir
    from .runtime.outputs import check_outputs
    cfg = _config(args, rest)
    _ensure_open_files(cfg, "train")
    made = check_outputs(cfg, "--out", "--summary-json")
    if _under_torchrun():
        summary = _torchrun_worker(plan_worker(cfg, torchrun_run_dir(cfg)))
    else:
        log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        summary = launch(plan_local_run(cfg, log, made=made))
    if summary is not None:
        print_summary(summary)
        if cfg.runtime.summary_json:
            from .runtime.rundir import write_json
            write_json(Path(cfg.runtime.summary_json), summary)
    return 0


def _ensure_open_files(cfg: RunConfig, command: str) -> None:
    """Before anything starts: too few open files failed a rank in C++ and kept the others
    waiting out runtime.timeout_s (:func:`~quietgnn.runtime.launcher.ensure_open_files`).
    Under torchrun each rank raises its own limit, for WORLD_SIZE ranks (a malformed
    WORLD_SIZE is refused, with its own message, where the rank joins)."""
    from .runtime.launcher import ensure_open_files
    parts = cfg.num_parts
    if _under_torchrun():
        try:
            parts = max(parts, int(os.environ["WORLD_SIZE"]))
        except (KeyError, ValueError):
            pass
    ensure_open_files(parts, command)


def _torchrun_worker(plan: RunPlan) -> Optional[dict[str, Any]]:
    """One rank under torchrun: the same checks as the launcher's, then the worker, with its
    stderr copied to ``logs/rank-<k>.log`` and a failure to ``logs/rank-<k>.error``."""
    from .runtime.rundir import claim_run_dir, tee_stderr
    from .runtime.worker import _report_failure, run_worker, watch_parent, worker_env
    rank, run_dir = worker_env()[0], plan.run_dir
    watch_parent(rank)
    # Before Communicator.init: no rank can have written results yet (they all wait there),
    # so every rank sees the directory as the previous invocation left it.
    claim_run_dir(plan.cfg, run_dir, lock=rank == 0)
    run_dir.mkdir(parents=True, exist_ok=True)
    tee_stderr(run_dir, rank)
    try:
        return run_worker(plan, write_config=True)
    except Exception:
        _report_failure(run_dir, rank)
        raise


def cmd_prepare(args: argparse.Namespace, rest: list[str]) -> int:
    """Write a prepared directory (partition book, one memory-mappable part per rank):
    :mod:`quietgnn.prepare.command`."""
    from .prepare.command import run_prepare
    # the streamed generator's graphs are the large ones the strategies are compared on: its
    # default is the preset where they can be told apart (a recipe or --synthetic.* wins)
    defaults = {"synthetic": {"preset": "hard"}} if args.source == "synthetic" else None
    cfg = _config(args, rest, defaults, for_prepare=True)
    _ensure_open_files(cfg, "prepare")
    return run_prepare(args, cfg, rest, under_torchrun=_under_torchrun())


def cmd_predict(args: argparse.Namespace, rest: list[str]) -> int:
    """Per-node class probabilities (or ``--embed``: last hidden layer) of a run's model on a
    dataset, written as ``.npy`` or ``.parquet``."""
    from .api import predict_to_file
    from .config import parse_overrides
    # the synthetic graph's keys, as train takes them (default: the run's own graph)
    try:
        pairs: Optional[list[tuple[str, str]]] = _split_overrides(rest)
    except ValueError:
        pairs = None
    if pairs is None or any(not k.startswith("synthetic.") for k, _ in pairs):
        raise ValueError(f"quietgnn predict: unexpected argument(s) {rest}; expected --run DIR "
                         f"--dataset NAME [--root DIR] [--out FILE.npy|.parquet [--overwrite]] "
                         f"[--embed] "
                         f"[--synthetic.KEY VALUE ...]")
    if not args.run or not args.dataset:
        raise ValueError("quietgnn predict needs --run DIR (a finished run) and --dataset NAME "
                         "(or a .npz / edge-list path)")
    synthetic = parse_overrides(pairs).get("synthetic") if pairs else None
    out = predict_to_file(args.run, args.dataset, root=args.root, out=args.out,
                          embed=args.embed, synthetic=synthetic, overwrite=args.overwrite)
    if out.suffix == ".npy":
        import numpy as np
        n, w = np.load(out, mmap_mode="r").shape
        layout = "a float32 array [nodes, columns]"
    else:
        import pyarrow.parquet as pq
        meta = pq.read_metadata(out)
        n, w = meta.num_rows, meta.num_columns - 1
        c = "h" if args.embed else "p"
        layout = f"a table: node, then {c}0..{c}{w - 1}"
    what = (f"the last hidden layer ({w} values per node)" if args.embed else
            f"class probabilities ({w} classes per node; the predicted class is the largest)")
    print(f"wrote {out}: {what} for {n} nodes, one row per node in the dataset's node order, "
          f"as {layout}")
    return 0


def _no_extra(command: str, rest: list[str], takes: str) -> None:
    if rest:
        raise ValueError(f"quietgnn {command} takes {takes}; got also {' '.join(rest)!r}")


def cmd_datasets(args: argparse.Namespace, rest: list[str]) -> int:
    from .datasets import available_datasets
    _no_extra("datasets", rest, "no arguments")
    for name, desc in available_datasets():
        print(f"{name:14s} {desc}")
    return 0


def cmd_strategies(args: argparse.Namespace, rest: list[str]) -> int:
    from .strategies import available_strategies
    _no_extra("strategies", rest, "at most one strategy name (quietgnn strategies NAME)")
    found = available_strategies()
    if args.name:
        if args.name not in found:
            raise ValueError(f"unknown strategy {args.name!r}; expected one of {sorted(found)}")
        from .confdoc import strategy_help
        print(strategy_help(args.name, found[args.name]))
        return 0
    for name, cls in found.items():
        print(f"{name:12s} {cls.description}  [default partitioner: "
              f"{cls.fixed_parts and 'single process' or cls.default_partitioner}; residency: "
              f"{', '.join(cls.residency_levels)}]")
    print("\n`quietgnn strategies NAME` lists a strategy's options with defaults and meaning")
    return 0


def cmd_config(args: argparse.Namespace, rest: list[str]) -> int:
    """The resolved config of a command line (recipe <- overrides, defaults filled in) as a
    YAML recipe that ``--config`` takes back."""
    import yaml
    cfg = _config(args, rest)
    print("# quietgnn config: the resolved configuration; run it with "
          "`quietgnn train --config FILE`")
    # through JSON: tuples become lists, which safe_dump writes and --config reads back
    print(yaml.safe_dump(json.loads(json.dumps(cfg.to_dict())), sort_keys=False,
                         default_flow_style=False).rstrip())
    return 0


def _help_epilog(argv: list[str]) -> str:
    """``train --help`` / ``config --help``: every section, key, default and meaning, generated
    from the config dataclasses (for the strategy named by ``--strategy``, else the default)."""
    from .config import SHORTCUTS, load_config
    from .confdoc import config_help
    strategy = None
    for i, tok in enumerate(argv[:-1]):
        if tok == "--strategy":
            strategy = argv[i + 1]
    try:
        cfg = load_config(None, {"strategy": strategy} if strategy else {})
    except ValueError:
        cfg = load_config(None, {})
    return config_help(cfg, SHORTCUTS)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the launcher waits so that it stops its workers on the way out."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


#: what an extra command's "interrupted" line adds: the runs (a probe's) each have a process
#: group of their own, which analysis/runner.py kills on the way out of the KeyboardInterrupt
_STOPPED = {"bench": "; the running run was stopped; finished runs are kept, rerun the same "
                     "command to continue (it skips them)",
            "advise": "; the probe was stopped"}


def _extra(name: str, argv: list[str]) -> int:
    """An extra command, stopped by SIGTERM as by Ctrl-C: without the handler SIGTERM ended
    this process alone, and its running run, in its own session, went on without it."""
    module = importlib.import_module(EXTRA_COMMANDS[name])
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(module.cli_main(argv) or 0)
    except KeyboardInterrupt as exc:
        term = isinstance(exc, Terminated)
        print(f"quietgnn {name}: interrupted ({'SIGTERM' if term else 'SIGINT'})"
              f"{_STOPPED.get(name, '')}", file=sys.stderr)
        return 143 if term else 130
    finally:
        signal.signal(signal.SIGTERM, old)


#: commands with their own argument parsers, imported only when run (the report pulls in
#: plotting, the advisor the strategies' probes); an import error is a broken install and is
#: raised, not hidden behind "invalid choice"
EXTRA_COMMANDS = {"bench": "quietgnn.analysis.bench", "report": "quietgnn.analysis.report",
                  "advise": "quietgnn.analysis.advise.cli"}


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in EXTRA_COMMANDS:
        return _extra(argv[0], argv[1:])
    from . import __version__
    ap = argparse.ArgumentParser(prog="quietgnn", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"quietgnn {__version__}")
    sub = ap.add_subparsers(dest="cmd")
    wants_help = bool(argv) and argv[0] in ("train", "config") and \
        ("-h" in argv or "--help" in argv)
    for name, help_ in (("train", "train a GNN with a communication strategy"),
                        ("config", "print the resolved config of a command line or recipe "
                                   "as YAML (takes train's arguments)"),
                        ("prepare", "partition a graph and write it as memory-mapped parts "
                                    "(train on it with --data DIR)"),
                        ("partition", "the same as prepare"),
                        ("predict", "class probabilities or embeddings of a run's model on a "
                                    "graph"),
                        ("datasets", "list the built-in datasets"),
                        ("strategies", "list the registered strategies")):
        p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=_help_epilog(argv) if wants_help and name == argv[0] else
                           "Any config key: --section.key value (e.g. --model.hidden 128)")
        if name == "strategies":
            p.add_argument("name", nargs="?", help="a strategy: list its options")
        if name in ("train", "config", "partition", "prepare"):
            p.add_argument("--config", help="YAML recipe (see configs/)")
            p.add_argument("--strategy", help="strategy name (quietgnn strategies)")
        if name in ("partition", "prepare"):
            p.description = ("quietgnn prepare [SOURCE] ...: SOURCE (out of core) is "
                             "`synthetic` (with --edges N) or an edge table (Parquet/CSV, "
                             "columns src, dst; with --nodes); without SOURCE, --dataset NAME. "
                             "Under torchrun each rank prepares its own part from its own "
                             "slice: EDGES and NODES with {rank} in the path")
            p.add_argument("--edges", help="synthetic: undirected edges to draw (e.g. 1e9)")
            p.add_argument("--nodes", help="the node table for an edge table (columns id, y, "
                           "split, features)")
            p.add_argument("--directed", action="store_true",
                           help="take the edge table's edges one way only")
            p.add_argument("--memory-budget", default="4GiB",
                           help="peak memory of the out-of-core prepare (default 4GiB)")
            p.add_argument("--out", help="output directory of the prepared graph")
            p.add_argument("--overwrite", action="store_true",
                           help="replace a prepared graph already at --out (it stays until the "
                                "new one is complete)")
            p.add_argument("--x-dtype", default="float32",
                           help="feature storage: float32 (default) or float16")
        if name == "predict":
            p.epilog = None
            p.add_argument("--run", help="the run directory (holds model.json, model.pt)")
            p.add_argument("--dataset", help="dataset name or graph file to predict on "
                           "(synthetic: the run's own synthetic graph, as its config.json "
                           "records it; --synthetic.KEY VALUE builds another, as train does)")
            p.add_argument("--root", help="where the dataset's files are")
            p.add_argument("--out", help="output file, .npy (default "
                           "<run>/predict-<dataset>.npy) or .parquet; an existing one is "
                           "refused unless --overwrite")
            p.add_argument("--overwrite", action="store_true",
                           help="replace the --out file if it exists")
            p.add_argument("--embed", action="store_true",
                           help="write the last hidden layer instead of class probabilities")
    for name in EXTRA_COMMANDS:
        sub.add_parser(name, help=f"see `quietgnn {name} --help`")
    # prepare's optional SOURCE is taken by hand: as an argparse positional it would swallow
    # the value of an option argparse does not know (`prepare --dataset cora` -> "cora")
    source = None
    if len(argv) > 1 and argv[0] in ("prepare", "partition") and not argv[1].startswith("-"):
        source = argv.pop(1)
    args, rest = ap.parse_known_args(argv or ["train"])
    args.source = source
    cmds = {"train": cmd_train, "config": cmd_config, "partition": cmd_prepare,
            "prepare": cmd_prepare, "predict": cmd_predict, "datasets": cmd_datasets,
            "strategies": cmd_strategies}
    if args.cmd is None:
        args, rest = ap.parse_known_args(["train"] + argv)
    if not _under_torchrun():
        # What batch schedulers send: stop every worker as Ctrl-C does (torchrun's workers
        # keep torch's own handling: the agent stops them with SIGTERM).
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return cmds[args.cmd](args, rest)
    except (ValueError, TypeError) as exc:
        print(f"quietgnn: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print("quietgnn: terminated (SIGTERM); all workers stopped", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("quietgnn: interrupted; all workers stopped", file=sys.stderr)
        return 130
    except OSError as exc:   # a file the launcher writes (disk full, read-only): one line
        print(f"quietgnn: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # LaunchError, CommError: already say which rank and why
        from .runtime.launcher import LaunchError
        if isinstance(exc, LaunchError):
            print(f"quietgnn: run failed: {exc}", file=sys.stderr)
            return 2 if exc.input_error else 1
        if is_explained(exc):
            # under torchrun the worker runs in this process: its one line names rank,
            # operation and epoch (or the residency or authentication refusal); the
            # traceback adds nothing (torchrun restarts or reports)
            print(f"quietgnn: run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        raise


def entry() -> None:
    """The ``quietgnn`` command and ``python -m quietgnn``: :func:`main`, then exit with its
    code. A rank (under torchrun, or started by hand with its variables) leaves through
    ``os._exit`` once its output is flushed, as the local launcher's workers do: gloo's worker
    threads can outlive ``destroy_process_group`` and race the interpreter's finalisation,
    which then aborts a run that succeeded ('terminate called without an active exception',
    exit 134). Only the commands that join a process group (train, prepare); any other runs
    its exit handlers as usual, wherever it runs."""
    try:
        code: Any = main()
    except SystemExit as exc:       # argparse's usage errors, --help, --version
        code = exc.code
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    code = 0 if code is None else int(code)
    args = [a for a in sys.argv[1:2] if not a.startswith("-")]
    if _under_torchrun() and (args or ["train"])[0] in ("train", "prepare", "partition"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
