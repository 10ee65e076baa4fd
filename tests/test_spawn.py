"""spawn_function's kept workers: each call sees a fresh start, and a failure leaves none behind."""

import os

import pytest
import torch

from quietgnn.runtime.launcher import LaunchError
from quietgnn.runtime.spawn import spawn_function


def _state(comm, set_slice):
    from quietgnn.nn import lean
    seen = {"pid": os.getpid(), "slice": lean._SLICE, "env": os.environ.get("QG_SPAWN_PROBE"),
            "draw": torch.rand(3), "threads": torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled()}
    if set_slice:
        lean._SLICE = 7                      # a rebinding the next call must not see
        lean._left_behind = True             # a new global, likewise
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(123)
    comm.barrier()
    return seen


def _fail(comm):
    if comm.rank == 1:
        raise RuntimeError("planted failure")
    comm.barrier()


def test_kept_workers_start_each_call_afresh(monkeypatch):
    monkeypatch.setenv("QG_SPAWN_PROBE", "first")
    a = spawn_function(_state, 2, args=(True,), reuse=True)
    monkeypatch.setenv("QG_SPAWN_PROBE", "second")
    b = spawn_function(_state, 2, args=(False,), reuse=True)
    fresh = spawn_function(_state, 2, args=(False,), reuse=False)
    assert [r["pid"] for r in a] == [r["pid"] for r in b]           # the same processes
    assert {r["pid"] for r in fresh}.isdisjoint(r["pid"] for r in b)
    for r, r0, f in zip(b, a, fresh):
        assert r["env"] == "second"                                  # the caller's environment now
        assert r["slice"] == f["slice"] != 7                         # the rebinding was undone
        assert torch.equal(r["draw"], r0["draw"])                    # the worker's first seed again
        assert r["threads"] == 1 and not r["deterministic"]
    assert spawn_function(_has_left_behind, 2, reuse=True) == [False, False]   # no new global


def _has_left_behind(comm):
    from quietgnn.nn import lean
    return hasattr(lean, "_left_behind")


def test_a_failed_call_retires_the_kept_workers():
    before = spawn_function(_state, 2, args=(False,), reuse=True)
    with pytest.raises(LaunchError, match="planted failure"):
        spawn_function(_fail, 2, reuse=True, comm_timeout_s=10)
    after = spawn_function(_state, 2, args=(False,), reuse=True)
    assert {r["pid"] for r in before}.isdisjoint(r["pid"] for r in after)
