"""The run plan (issue #22, item 5): the config, the dataset identity, the partition key and
the run directory are resolved once (:mod:`quietgnn.runtime.plan`) and handed to the
launcher, the workers and the CLI, which recompute none of them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from quietgnn.config import load_config
from quietgnn.partition import PartitionBook
from quietgnn.runtime import plan as plan_mod
from quietgnn.runtime.books import cache_dir, partition_key
from quietgnn.runtime.plan import (BOOK_ENV, RunPlan, local_run_dir, plan_local_run, plan_run,
                                   plan_worker, torchrun_run_dir)
from quietgnn.runtime.worker import load_local_partition

SYN = {"nodes": 300, "feature_dim": 8}


def _cfg(**sections):
    sections.setdefault("synthetic", SYN)
    sections.setdefault("partition", {})
    sections["partition"].setdefault("parts", 2)
    return load_config(None, sections)


def _quiet(msg: str) -> None:
    pass


def test_plan_is_deterministic_and_names_the_cached_book(tmp_path):
    cfg = _cfg(partition={"parts": 2, "method": "metis"})
    first = plan_run(cfg, tmp_path / "run", _quiet)
    again = plan_run(_cfg(partition={"parts": 2, "method": "metis"}), tmp_path / "run", _quiet)
    assert first.partition_key == again.partition_key == partition_key(cfg)
    assert first.dataset == again.dataset
    assert first.dataset["name"] == "synthetic" and first.dataset["num_nodes"] == 300
    assert first.book == again.book == \
        cache_dir() / "books" / f"synthetic-metis-p2-{first.partition_key}"
    assert (first.book / "book.json").is_file()
    assert first.book_checked and first.run_dir == tmp_path / "run"
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.run_dir = tmp_path / "other"           # type: ignore[misc]


def test_what_determines_the_assignment_changes_the_key():
    base = partition_key(_cfg())
    assert partition_key(_cfg()) == base
    assert partition_key(_cfg(dataset={"split_seed": 1})) != base
    assert partition_key(_cfg(partition={"parts": 2, "seed": 1})) != base
    assert partition_key(_cfg(partition={"parts": 4})) != base
    assert partition_key(_cfg(synthetic=dict(SYN, nodes=301))) != base
    # the run's own settings (model, training) do not: the same book serves them all
    assert partition_key(_cfg(model={"hidden": 7}, train={"lr": 0.5})) == base


def test_worker_partition_id_equals_the_launchers_book_id(tmp_path, monkeypatch):
    """A checkpoint names the book id of its partition; a worker partitioning in process
    (torchrun without a book) must compute the id the launcher's book carries, or a run
    checkpointed under one could not resume under the other."""
    monkeypatch.delenv(BOOK_ENV, raising=False)
    cfg = _cfg(partition={"parts": 2, "method": "random", "seed": 3})
    launched = plan_run(cfg, tmp_path / "run", _quiet)
    book = PartitionBook.open(launched.book)
    in_process = plan_worker(cfg, tmp_path / "run")
    assert in_process.book is None and not in_process.book_checked
    for rank in range(2):
        part = load_local_partition(in_process, rank, 2)
        assert part.book_id == book.book_id == book.load_part(rank, 2).book_id
    other = plan_worker(_cfg(partition={"parts": 2, "method": "random", "seed": 4}), "run")
    assert load_local_partition(other, 0, 2).book_id != book.book_id


def test_workers_rebuild_the_launchers_plan(tmp_path, monkeypatch):
    cfg = _cfg()
    launched = plan_run(cfg, tmp_path / "run", _quiet)
    for k, v in launched.worker_env().items():
        monkeypatch.setenv(k, v)
    worker = plan_worker(cfg, tmp_path / "run")
    assert (worker.book, worker.dataset, worker.run_dir) == \
        (launched.book, launched.dataset, launched.run_dir)
    assert worker.book_checked                         # the launcher checked it
    monkeypatch.delenv(BOOK_ENV)
    # torchrun with a configured book: each rank checks it itself (without loading)
    given = plan_worker(_cfg(partition={"parts": 2, "book": str(launched.book)}), "run")
    assert given.book == launched.book and not given.book_checked
    assert RunPlan(cfg=cfg, run_dir=Path("r"), dataset={}).worker_env() == {}


def test_a_book_replaced_after_the_launchers_check_is_refused_by_the_worker(tmp_path,
                                                                           monkeypatch):
    """A ``prepare --overwrite`` between the launcher's check and a worker's start: the worker
    would have trained a book nobody checked against the dataset."""
    import shutil
    cfg = _cfg(partition={"parts": 2, "method": "random", "seed": 3})
    launched = plan_run(cfg, tmp_path / "run", _quiet)
    for k, v in launched.worker_env().items():
        monkeypatch.setenv(k, v)
    assert load_local_partition(plan_worker(cfg, tmp_path / "run"), 0, 2).book_id == \
        launched.book_id
    other = plan_run(_cfg(partition={"parts": 2, "method": "random", "seed": 4}),
                     tmp_path / "run2", _quiet)
    shutil.rmtree(launched.book)
    shutil.copytree(other.book, launched.book)
    with pytest.raises(ValueError, match="was replaced after the launcher checked it"):
        load_local_partition(plan_worker(cfg, tmp_path / "run"), 0, 2)


def test_run_directory_names(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_mod.time, "strftime", lambda fmt: "20260101-000000")
    cfg = _cfg(runtime={"out_dir": str(tmp_path / "runs")})
    first = local_run_dir(cfg, _quiet)
    assert first == tmp_path / "runs" / "20260101-000000-halo-synthetic-p2" and first.is_dir()
    # the same second: a directory of its own, never a shared one
    assert local_run_dir(cfg, _quiet) == first.with_name(first.name + "-2")
    assert local_run_dir(cfg, _quiet, label="g").name == "20260101-000000-halo-g-p2"
    named = _cfg(runtime={"out_dir": str(tmp_path / "runs"), "run_name": "mine"})
    assert local_run_dir(named, _quiet) == tmp_path / "runs" / "mine"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    assert torchrun_run_dir(cfg) == tmp_path / "runs" / "job7-halo-synthetic"
    assert torchrun_run_dir(named) == tmp_path / "runs" / "mine"


def test_a_refused_plan_leaves_nothing_behind(tmp_path):
    out = tmp_path / "runs"
    good = plan_run(_cfg(), tmp_path / "r", _quiet)
    # a book of 300 nodes for a run that asks for 301: refused before any worker starts
    cfg = _cfg(synthetic=dict(SYN, nodes=301), runtime={"out_dir": str(out)},
               partition={"parts": 2, "book": str(good.book)})
    staged = []

    def stage(run_dir: Path) -> Path:
        f = run_dir / "g.npz"
        f.write_bytes(b"x")
        staged.append(f)
        return f

    with pytest.raises(ValueError, match=r"num_nodes: book 300, dataset 301"):
        plan_local_run(cfg, _quiet, made=((out, out),), stage=stage)
    assert staged and not staged[0].exists() and not out.exists()
