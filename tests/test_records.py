"""The record contract (``quietgnn/runtime/records.py``): what the trainer writes has exactly
the documented keys, with values of the documented types, in memory and in the files."""

from __future__ import annotations

import json
import types
import typing

import pytest

from quietgnn.comm import Communicator
from quietgnn.config import load_config
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.records import EpochRecord, RunSummary, SetupRecord
from quietgnn.runtime.spawn import spawn_function
from quietgnn.runtime.trainer import train_on

from helpers import small_graph


def _keys(td) -> tuple[set[str], set[str]]:
    return set(td.__required_keys__), set(td.__optional_keys__)


def _conforms(value, hint) -> bool:
    """A JSON value against a field's annotation (containers by their outer type)."""
    origin = typing.get_origin(hint)
    if origin is typing.NotRequired:
        return _conforms(value, typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is typing.Any:
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    outer = origin or hint
    if typing.is_typeddict(outer):
        return isinstance(value, dict)
    return isinstance(value, outer)


def _check(record: dict, td) -> None:
    required, optional = _keys(td)
    assert required <= set(record), f"{td.__name__}: missing {sorted(required - set(record))}"
    assert set(record) <= required | optional, \
        f"{td.__name__}: undocumented {sorted(set(record) - required - optional)}"
    hints = typing.get_type_hints(td, include_extras=True)
    for key, value in record.items():
        assert _conforms(value, hints[key]), f"{td.__name__}.{key} = {value!r}: {hints[key]}"


def _run(comm, graph, parts, tmp, strategy):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    cfg = load_config(None, {"strategy": strategy, "partition": {"parts": comm.world_size},
                             "model": {"hidden": 8}, "runtime": {"progress": False},
                             "train": {"epochs": 3, "eval_every": 2}})
    t = train_on(comm, part, cfg, f"{tmp}/{strategy}", keep_records=True)
    files = [json.loads(line) for line in
             (t.run_dir / "metrics" / f"rank-{comm.rank}.jsonl").read_text().splitlines()]
    summary = json.loads((t.run_dir / "summary.json").read_text()) if comm.rank == 0 else None
    return t.records, files, t.summary if comm.rank == 0 else None, summary


@pytest.mark.parametrize("strategy", ["halo", "tma"])
def test_what_the_trainer_writes_is_the_contract(strategy, tmp_path):
    """halo (exact evaluation every other epoch), tma (a strategy report in the summary)."""
    graph = small_graph()
    parts = partition_nodes(graph, "metis", 2, seed=0)
    for records, files, summary, summary_file in spawn_function(
            _run, 2, args=(graph, parts, str(tmp_path), strategy)):
        assert records == files                      # what the files hold, key for key
        _check(records[0], SetupRecord)
        # three passes: three trainer epochs for halo, one averaging period for tma
        assert [r["epoch"] for r in records] == list(range(-1, len(records) - 1))
        assert sum(r["work"] for r in records[1:]) == pytest.approx(3)
        for r in records[1:]:
            _check(r, EpochRecord)
        if strategy == "halo":   # evaluated locally: the last epoch checks its pick exactly
            assert records[-1].get("selected") is not None
        if summary is not None:
            _check(summary, RunSummary)
            assert json.loads(json.dumps(summary)) == summary_file
