"""The inputs of ``quietgnn report`` (:mod:`quietgnn.analysis.report`): bench results
(``results.jsonl``, ``results/*.json``), a run's ``summary.json``, a bench folder or a run
directory, read as :class:`~quietgnn.analysis.matrix.Result` s. A line that is not what a
result holds (not JSON, not an object, a field of another type such as ``"parts": "two"``) is
refused in one ``ValueError`` line naming the file, the line and the field."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Sequence

from ..runtime.records import RunSummary
from ..serial import json_excerpt, loads_json
from .matrix import Result
from .projection import epoch_curve

__all__ = ["load_results", "with_curve"]


def _from_summary(s: RunSummary) -> Result:
    return Result(id=Path(s.run_dir or "run").name, dataset=s.dataset, strategy=s.strategy,
                  strategy_name=s.strategy, parts=s.parts, model=s.model, seed=s.seed or 0,
                  status="ok", summary=s, run_dir=s.run_dir)


class _RowError(ValueError):
    """A line of a result file that is not what a result holds (names the file and line)."""


def _load_file(p: Path) -> list[Result]:
    if p.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append((f" line {n}", loads_json(line)))
                except json.JSONDecodeError as exc:
                    raise _RowError(f"{str(p)!r} line {n} is not JSON ({exc.msg}); correct "
                                    f"or remove that line") from None
    else:
        rows = [("", loads_json(p.read_text()))]
    out = []
    for where, row in rows:
        if not isinstance(row, dict):
            raise _RowError(f"{str(p)!r}{where} holds a {type(row).__name__}, expected a JSON "
                            f"object (a bench result or a run's summary)")
        res = Result.from_json(row)
        # a bench result names its status; a run's summary.json does not
        res = res if res.status else _from_summary(RunSummary.from_json(row))
        # a value of another type ("parts": "two") would stop the report with a traceback
        # far from here, or be compared as a string: named here, with its line
        why = _wrong_type(res, Result, "")
        if why:
            raise _RowError(f"{str(p)!r}{where}: {why}; correct or remove "
                            f"{'that line' if where else 'the file'}")
        missing = [k for k in ("dataset", "strategy", "parts", "model")
                   if getattr(res, k) is None]
        if missing:
            raise ValueError(f"a line has no {', '.join(missing)}")
        out.append(res)
    return out


_KINDS: dict[Any, tuple[Any, str]] = {
    int: (lambda v: (isinstance(v, int) or isinstance(v, float) and v.is_integer())
          and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
    bool: (lambda v: isinstance(v, bool), "true or false")}


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _wrong_type(v: Any, hint: Any, name: str) -> str:
    """Why ``v``, read into a record's field ``name`` declared ``hint``, is not of that type
    ("" when it is, or is None: absent)."""
    if v is None or hint is Any:
        return ""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _wrong_type(v, inner[0], name) if len(inner) == 1 else ""
    shown = f"field {name!r} is {type(v).__name__} {json_excerpt(v)}"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(v, hint):
            return f"{shown}, expected a mapping"
        for f in dataclasses.fields(hint):
            why = _wrong_type(getattr(v, f.name), _field_hints(hint)[f.name],
                              f"{name}.{f.name}" if name else f.name)
            if why:
                return why
        return ""
    if origin in (list, dict):
        if not isinstance(v, origin):
            return f"{shown}, expected a {'list' if origin is list else 'mapping'}"
        items = [(f"{name}[{i}]", x) for i, x in enumerate(v)] if origin is list else \
            [(f"{name}.{k}", x) for k, x in v.items()]
        for sub, x in items:
            why = _wrong_type(x, args[-1] if args else Any, sub)
            if why:
                return why
        return ""
    kind = _KINDS.get(hint)
    return f"{shown}, expected {kind[1]}" if kind and not kind[0](v) else ""


def _cell(r: Result) -> tuple:
    return (r.dataset, r.strategy, r.parts, r.model, r.seed, r.link)


def load_results(paths: Sequence[str | Path],
                 check_with: Sequence[str | Path] = ()) -> list[Result]:
    """Results from files and bench folders; the last result of an id wins; a result whose
    curve was not stored reads it from its run directory's metrics where they are.

    A later input's finished run replaces an earlier input's results of the same cell
    (dataset, strategy label, P, model, seed, link) whatever their ids: a rerun study passed
    after the study it updates (``quietgnn report headline headline-tma``) supersedes its
    runs, as a rerun of the same matrix would, even where the rerun's settings (so its ids)
    changed; a failed rerun replaces nothing. So does a later finished run of a cell within one
    input (a second matrix written into the same folder, other settings under the same labels;
    the later by ``finished_at``): two settings of one seed are not two seeds of one setting.
    Each run so left out is named on stderr.

    Results of two graphs under one dataset name (two files ``graph.npz`` from two
    directories, or one file rewritten between runs) are refused (:func:`_check_graphs`)
    before any of this: they would share, or replace each other's, cells."""
    loaded = [(str(raw), _load_path(Path(raw))) for raw in paths]
    # (``check_with``: the report's --reference, whose centralized sets the target)
    _check_graphs(loaded + [(str(raw), _load_path(Path(raw))) for raw in check_with])
    by_id: dict[str, Result] = {}
    for _, new in loaded:
        cells = {_cell(r) for r in new.values() if r.ok}    # a failed rerun erases nothing
        by_id = {rid: r for rid, r in by_id.items() if rid in new or _cell(r) not in cells}
        by_id.update(new)
    # the last to finish of each cell (its file order where a result has no time)
    latest: dict[tuple, tuple[str, int, str]] = {}
    for i, (rid, r) in enumerate(by_id.items()):
        if r.ok:
            latest[_cell(r)] = max(latest.get(_cell(r), ("", -1, "")),
                                   (r.finished_at or "", i, rid))
    dropped = [rid for rid, r in by_id.items() if r.ok and latest[_cell(r)][2] != rid]
    if dropped:
        print(f"quietgnn report: {len(dropped)} run(s) left out, each a cell (dataset, "
              f"strategy, P, model, seed, link) run again later with other settings: "
              f"{', '.join(dropped[:5])}{' ...' if len(dropped) > 5 else ''}", file=sys.stderr)
    return [r for rid, r in by_id.items() if rid not in dropped]


def _check_graphs(loaded: list[tuple[str, dict[str, Result]]]) -> None:
    """One line refusing results of one dataset (label) that ran on different graphs (their
    recorded ``graph_id``), whichever inputs they come from: a report would put them in one
    cell, or let one replace the other there. A result without a graph (written before they
    were recorded, a run's summary.json, synthetic) is not compared."""
    seen: dict[str, dict[str, tuple[str, Result]]] = {}
    for where, results in loaded:
        for r in results.values():
            if not r.graph_id:
                continue
            # a prepared directory's id ("p...") is compared with its own kind only
            graphs = seen.setdefault(f"{r.dataset}\0{r.graph_id.startswith('p')}", {})
            graphs.setdefault(r.graph_id, (where, r))
            if len(graphs) < 2:
                continue
            (w1, r1), (w2, r2) = graphs.values()
            inputs = f"{w1!r} holds" if w1 == w2 else f"{w1!r} and {w2!r} hold"
            raise ValueError(
                f"{inputs} runs of dataset {r.dataset!r} on two different graphs "
                f"({r1.graph_path} as graph {r1.graph_id}, run {r1.id}; {r2.graph_path} as "
                f"graph {r2.graph_id}, run {r2.id}): one report would mix them in one cell; "
                f"label them apart (matrix datasets: - {{name: {r.dataset_name or r.dataset}, "
                f"label: ...}}, then rerun) or report each graph's runs separately")


def _load_path(p: Path) -> dict[str, Result]:
    """One input's results by id (a file, a bench folder or a run directory)."""
    by_id: dict[str, Result] = {}
    run_dir = p if p.is_dir() and (p / "summary.json").is_file() else None
    if run_dir:
        files = [p / "summary.json"]
    elif p.is_dir():
        files = [p / "results.jsonl"] if (p / "results.jsonl").is_file() else \
            sorted((p / "results").glob("*.json"))
        if not files:
            raise ValueError(f"{str(p)!r} holds no summary.json, results.jsonl or "
                             f"results/*.json; pass a run directory, the output folder of "
                             f"`quietgnn bench` or result files")
    elif p.is_file():
        files = [p]
    else:
        raise ValueError(f"results path {str(p)!r} does not exist")
    for f in files:
        try:
            for r in _load_file(f):
                if run_dir:    # where the run is now (its summary names where it ran)
                    r = dataclasses.replace(r, run_dir=str(run_dir))
                by_id[r.id or f"{f}:{len(by_id)}"] = with_curve(r)
        except _RowError:
            raise
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError,
                ValueError) as exc:
            raise ValueError(f"{str(f)!r} is not a bench result / run summary file: "
                             f"{exc}") from exc
    return by_id


def with_curve(res: Result) -> Result:
    if res.curve is not None or not res.ok:
        return res
    run_dir = res.run_dir or res.summary.run_dir
    if run_dir and (Path(run_dir) / "metrics").is_dir():
        from ..runtime.metrics import read_metrics
        try:
            return dataclasses.replace(res, curve=epoch_curve(read_metrics(run_dir)))
        except ValueError:
            return res
    return res
