"""The record contract (``quietgnn/runtime/records.py``): what the trainer writes has exactly
the documented keys, with values of the documented types, in memory and in the files."""

from __future__ import annotations

import dataclasses
import json
import types
import typing

import pytest

from quietgnn.config import load_config
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.records import EpochRecord, RunSummary, SetupRecord
from quietgnn.runtime.spawn import spawn_function
from quietgnn.runtime.trainer import train_on

from helpers import small_graph


def _keys(rec) -> tuple[set[str], set[str]]:
    every = {f.name for f in dataclasses.fields(rec)}
    return rec.required(), every - rec.required()


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


def test_records_read_back_what_they_wrote_and_older_files_too():
    rec = EpochRecord.from_json({"epoch": 3, "rank": 1, "loss": 0.5, "work": 2.0,
                                 "bytes": {"train": {"sent": 7, "recv": 9}},
                                 "test_acc": 0.8, "a_key_from_elsewhere": 1})
    # fields the line lacks (written before they were kept) read None; unknown keys dropped
    assert (rec.epoch, rec.test_acc, rec.cpu_s, rec.selected) == (3, 0.8, None, None)
    assert rec.sent("train") == 7 and rec.sent("eval") == 0 and rec.passes == 2.0
    assert "a_key_from_elsewhere" not in rec.to_json()
    # an optional field is absent from the file when unset, present when set
    assert "selected" not in rec.to_json()
    again = dataclasses.replace(rec, selected={"epoch": 1, "test": 0.7})
    assert EpochRecord.from_json(again.to_json()) == again
    with pytest.raises(TypeError):     # a misspelt field fails where the record is built
        SetupRecord(epoch=-1, rank=0, phase="setup", bytes={}, rounds=[], peak_rss_mb=1.0,
                    setup_seconds=2.0)


def test_a_bench_result_reads_its_summary_and_curve_as_records():
    from quietgnn.analysis.matrix import Result
    from quietgnn.analysis.projection import Curve, Point
    row = {"id": "x", "dataset": "d", "strategy": "halo", "parts": 2, "model": "gcn",
           "seed": 0, "status": "ok", "run_dir": None,
           "summary": {"test_acc": 0.9, "epochs": 2},
           "curve": {"setup": {"hops": 1, "crit_bytes": 2, "rounds": 1, "bytes": 3},
                     "epochs": [{"epoch": 0, "work": 1.0, "test_acc": 0.5}]}}
    res = Result.from_json(row)
    assert isinstance(res.summary, RunSummary) and res.summary.test_acc == 0.9
    assert isinstance(res.curve, Curve) and isinstance(res.curve.epochs[0], Point)
    assert res.curve.setup.bytes == 3 and res.curve.epochs[0].test_acc == 0.5
    assert res.ok and res.name == "halo"
    assert Result.from_json(res.to_json()) == res
