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
    set: {train.epochs: 200, model.hidden: 64}   # config keys for every run ("{seed}": the
                                                 # run's seed, e.g. dataset.split_seed); a
                                                 # key the runner sets (runtime.out_dir, ...)
                                                 # is refused by name
    links: [uncapped, 100mbit]       # optional: every multi-rank run on emulated hosts
    run_timeout_s: 1800              # seconds (> 0) before a run is killed; default 3600
    mem_floor_mb: 1536               # optional: kill a run when less memory is left (local runs)

Strategy names and options are plain data passed to ``quietgnn train`` (``--options.KEY``),
so a strategy that registers later joins the matrix with no change here. A strategy with
``fixed_parts`` (``centralized``: 1) runs once per dataset x model x seed, whatever ``parts``.

Every run is a subprocess ``python -m quietgnn train ... --summary-json`` with its own run
directory and one compute thread per worker (``runtime.threads 1``). Output under ``--out``::

    results/<id>.json   one per run (a :class:`~quietgnn.analysis.matrix.Result`): spec,
                        command, status (ok | failed), summary, error tail, and the
                        per-epoch curve ``quietgnn report`` reads
                        (:class:`~quietgnn.analysis.projection.Curve`, a list per field)
    results.jsonl       every result of the study: earlier runs kept, this run's in place,
                        rewritten as each run ends
    runs/<id>/          the run directory (metrics/rank-k.jsonl, summary.json, logs/)
    logs/<id>.log       stdout + stderr of the run (on emulated hosts: every host's, at the end)
    logs/<id>.hosts/    on emulated hosts: host-<i>.log, written as the run goes

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
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from ..config import override_value
from ..readyaml import brief
from .matrix import (_SET, _as_list, _entry, _mapping, build_matrix, check_settings,
                     load_matrix)
from .runner import check_resume, run_matrix

__all__ = ["cli_main"]


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
    ap.add_argument("--run-timeout", type=float, help="seconds (> 0) before a run is killed "
                    "and recorded as failed (default: the matrix's run_timeout_s, or 3600)")
    ap.add_argument("--mem-floor", type=float, metavar="MIB", help="kill a run (recorded as "
                    "failed, saying so) when the machine's available memory falls below MIB: "
                    "a matrix of growing graphs finds where each strategy stops fitting "
                    "without taking the machine down (local runs; default: the matrix's "
                    "mem_floor_mb, or none; 0: none)")
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs recorded as failed")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and commands only")
    return ap


def _kv(items: Sequence[str], what: str) -> dict[str, Any]:
    out = {}
    for it in items:
        if "=" not in it:
            raise ValueError(f"{what} {brief(it)}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        # read as train reads --key VALUE (a path or name as typed), but without its aliases
        out[k.strip()] = override_value(k.strip(), v, f"{what} {brief(it)}")
    return out


def _run_timeout(flag: Any, matrix: Any) -> float:
    """Seconds before a run is killed: ``--run-timeout``, else the matrix's ``run_timeout_s``,
    else an hour. Refused unless a finite number > 0: ``-5`` killed every run at once
    ('timed out after -5s') and ``0`` silently became an hour; there is no 'no limit'."""
    where, value = ("--run-timeout", flag) if flag is not None else \
        ("the matrix's run_timeout_s", matrix)
    if value is None:
        return 3600.0
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(f"{where} = {brief(value)}; expected a finite number of seconds > 0 "
                         f"before a run is killed (e.g. 1800; there is no 'no limit': give a "
                         f"large number such as 1e6)")
    return seconds


def _select(entries: Any, names: str, what: str) -> list[Any]:
    """``--datasets cora,cs`` on top of a YAML list: keep the YAML entries of those names
    (with their roots, labels, options) and add plain entries for names it lacks. A name is
    a label first (``grappa``: the entry labelled so, or unlabelled, not ``grappa-lam0``);
    where no entry carries it as its label, every entry of that name (all its variants)."""
    known = [_entry(e, what) for e in _as_list(entries, what)]
    out: list[Any] = []
    for name in _as_list(names, what):
        hit = [e for e in known if e.get("label", e["name"]) == name] or \
            [e for e in known if e["name"] == name]
        out += hit or [name]
    return out


def cli_main(argv: Sequence[str]) -> int:
    # SIGTERM: quietgnn.cli turns it into the KeyboardInterrupt on which run_matrix stops the
    # running run (its own process group), and says so in one line, as for Ctrl-C
    return _main(_parser().parse_args(list(argv)))


def _main(args: argparse.Namespace) -> int:
    try:
        m = load_matrix(args.matrix)
        for key in ("datasets", "strategies", "parts", "models", "seeds", "root", "epochs",
                    "links"):
            v = getattr(args, key)
            if v is not None:
                m[key] = _select(m.get(key), v, key) if key in ("datasets", "strategies") else v
        if args.set:
            m["set"] = {**_mapping(m.get("set"), "matrix key 'set'", _SET),
                        **_kv(args.set, "--set")}
        if args.options:
            opts = _kv(args.options, "--options")
            strategies = [_entry(s, "strategies") for s in _as_list(m.get("strategies"),
                                                                      "strategies")]
            for key, v in opts.items():
                name, _, opt = key.partition(".")
                hit = [s for s in strategies if s["name"] == name]
                if not opt or not hit:
                    raise ValueError(f"--options {brief(f'{key}={v}')}: expected "
                                     f"STRATEGY.KEY=VALUE with a strategy of the matrix "
                                     f"({[s['name'] for s in strategies]})")
                for s in hit:
                    s.setdefault("options", {})[opt] = v
            m["strategies"] = strategies
        out = Path(args.out or m.get("out") or "bench-out")
        timeout = _run_timeout(args.run_timeout, m.get("run_timeout_s"))
        floor = args.mem_floor if args.mem_floor is not None else m.get("mem_floor_mb")
        where = "--mem-floor" if args.mem_floor is not None else "the matrix's mem_floor_mb"
        if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float))
                                  or not floor >= 0):
            raise ValueError(f"{where} = {brief(floor)}: expected MiB >= 0 (e.g. --mem-floor 1536: "
                             f"stop a run when less than 1.5 GiB is left; 0: no floor)")
        floor = floor or None
        specs = build_matrix({k: v for k, v in m.items()
                              if k not in ("out", "run_timeout_s", "mem_floor_mb")})
        check_settings(specs)
        kept = check_resume(specs, out, args.retry_failed)  # done on another graph: refused
        if floor and any(s.link for s in specs):
            raise ValueError(f"{where} = {floor:g} MiB watches local runs, and this matrix runs "
                             f"on emulated hosts (links): leave the links out, or the floor "
                             f"(--mem-floor 0)")
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
    results = run_matrix(specs, out, timeout_s=timeout, retry_failed=args.retry_failed, log=log,
                         mem_floor_mb=floor, kept=kept)
    failed = [r for r in results if r.status != "ok"]
    print(f"quietgnn bench: {len(results) - len(failed)} ok, {len(failed)} failed; results in "
          f"{out / 'results.jsonl'} (next: quietgnn report {out / 'results.jsonl'} --out "
          f"{out / 'report'})", file=sys.stderr)
    for r in failed:
        print(f"  failed: {r.id}: {(r.error or 'unknown error').splitlines()[0]}",
              file=sys.stderr)
    return 0 if not failed else 1
