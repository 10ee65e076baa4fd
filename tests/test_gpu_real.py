"""Every strategy on a real GPU, where one is: each run equals the same run on the CPU in its
bytes, and comes close in its losses and accuracies (the stand-in tests of
``test_gpu_placement`` prove the placement on any machine; these see what only a GPU shows:
CUDA kernels, streams, NCCL, memory).

The runs happen in fresh processes: a process that has imported ``fakecuda`` (pytest does, to
collect the stand-in tests) registers a second device with autograd, whose engine then fails
on real CUDA streams ("opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED"). Not
exact: a GPU sums in another order, and device noise (stochastic rounding, sampling) comes
from the device's generator, so the runs share their bytes and start, not every digit."""

from __future__ import annotations

import pytest
import torch

from quietgnn.config import load_config
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.runtime.trainer import train_on

from helpers import small_graph

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason=(
    "no CUDA device here: test_gpu_placement's stand-in device proves the placement on a CPU; "
    "these run where a GPU is (benchmarks/bench_gpu.py measures it)"))

# each strategy's own device paths at P = 2 (as in test_gpu_placement)
RUNS = {"centralized": {}, "halo": {}, "adaqp": {"bits": 4},
        "adaqp-adaptive": {"time_model": "lan", "assign_cycle": 1}, "grappa": {"grad_rank": 2},
        "tma": {"period_epochs": 1.0}, "retexo": {"grad_bits": 8},
        "minibatch": {"grad_bits": 8}, "bns": {"p": 0.5}, "pipegcn": {"smoothing": 0.5},
        "sancus": {"bound": 0.05, "max_stale": 2}, "llcg": {"period": 1}}


def _train(comm, graph, parts, tmp, names):
    """On this rank's device: ``{name: (per-epoch (epoch, loss, bytes, test_acc), the
    devices of the trained parameters, the peak GPU MiB recorded)}``, or the error a run
    raised."""
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = {}
    for name in names:
        cfg = load_config(None, {"strategy": name.split("-")[0], "options": RUNS[name],
                                 "partition": {"parts": comm.world_size},
                                 "model": {"hidden": 8}, "runtime": {"progress": False},
                                 "train": {"epochs": 3, "eval_every": 1, "eval_mode": "exact"}})
        try:
            t = train_on(comm, part, cfg, f"{tmp}/{name}-{comm.device.type}", device=comm.device,
                         keep_records=True)
        except Exception as exc:  # noqa: BLE001 - the test names every failing strategy
            out[name] = f"{type(exc).__name__}: {exc}"
            continue
        model = t.strategy.model if hasattr(t.strategy, "model") else t.strategy.layers
        out[name] = ([(r["epoch"], r.get("loss"), r["bytes"], r.get("test_acc"))
                      for r in t.records], {q.device.type for q in model.parameters()},
                     max(r.get("peak_gpu_mb") or 0.0 for r in t.records))
    return out


def _compare(cpu: dict, gpu: dict) -> list[str]:
    bad = []
    for name, g in gpu.items():
        c = cpu[name]
        if isinstance(g, str) or isinstance(c, str):
            bad.append(f"{name}: {g if isinstance(g, str) else c}")
            continue
        if g[1] != {"cuda"}:
            bad.append(f"{name}: parameters on {g[1]}")
        if not g[2] > 0 or c[2] != 0:
            bad.append(f"{name}: peak GPU memory recorded {g[2]} MiB on the GPU, {c[2]} on "
                       f"the CPU")
        for a, b in zip(c[0], g[0]):
            if a[0] != b[0] or a[2] != b[2]:
                bad.append(f"{name}: epoch {a[0]} bytes {a[2]} on the CPU, {b[2]} on the GPU")
            elif a[1] is not None and b[1] is not None and abs(a[1] - b[1]) > 0.05 * abs(a[1]):
                bad.append(f"{name}: epoch {a[0]} loss {a[1]:.5f} on the CPU, {b[1]:.5f} on "
                           f"the GPU")
            elif a[3] is not None and b[3] is not None and abs(a[3] - b[3]) > 0.1:
                bad.append(f"{name}: epoch {a[0]} test acc {a[3]:.3f} vs {b[3]:.3f}")
        if len(c[0]) != len(g[0]):
            bad.append(f"{name}: {len(c[0])} records on the CPU, {len(g[0])} on the GPU")
    return bad


@pytest.mark.parametrize("P", [1, 2])
def test_every_strategy_on_a_real_gpu_runs_as_on_the_cpu(P, tmp_path):
    """P = 1: one rank on GPU 0 (NCCL); P = 2: two ranks sharing it (gloo, staged)."""
    graph = small_graph()
    parts = partition_nodes(graph, "metis", P, seed=0)
    names = [n for n in RUNS if P == 1 or n != "centralized"]
    args = (graph, parts, str(tmp_path), names)
    cpu = spawn_function(_train, P, args=args, reuse=False)
    gpu = spawn_function(_train, P, args=args, reuse=False, device="cuda")
    bad = [f"rank {r}: {m}" for r in range(P) for m in _compare(cpu[r], gpu[r])]
    assert not bad, "\n".join(bad)


def _twice_deterministic(comm, graph, parts, tmp, names):
    """Every run twice under ``runtime.deterministic``'s settings, on this rank's device."""
    from quietgnn.runtime.worker import use_deterministic
    use_deterministic(comm.device)
    return [_train(comm, graph, parts, f"{tmp}/{i}", names) for i in range(2)]


def test_deterministic_runs_repeat_to_the_bit_on_a_real_gpu(tmp_path):
    """``runtime.deterministic`` on a GPU: no strategy meets an operation without a
    deterministic CUDA kernel (torch would raise naming it), and a run repeats exactly."""
    graph = small_graph()
    names = list(RUNS)
    first, second = spawn_function(_twice_deterministic, 1, reuse=False, device="cuda", args=(
        graph, partition_nodes(graph, "metis", 1, seed=0), str(tmp_path), names))[0]
    bad = [f"{n}: {first[n] if isinstance(first[n], str) else second[n]}" for n in names
           if isinstance(first[n], str) or isinstance(second[n], str)]
    bad += [f"{n}: the second run's records differ" for n in names
            if n not in " ".join(bad) and first[n][0] != second[n][0]]
    assert not bad, "\n".join(bad)
