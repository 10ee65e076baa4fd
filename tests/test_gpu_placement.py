"""Every strategy and model on a GPU, proven on a CPU-only machine: each trains on the stand-in
device of ``fakecuda`` (which raises where a real GPU raises: a CPU tensor in a device op, a
host generator for device noise), and its run equals the same run on the CPU — losses,
accuracies, and every communicator record, byte for byte."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from quietgnn.comm import Communicator
from quietgnn.config import load_config
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.runtime.trainer import train_on

from fakecuda import fake_cuda, tensors_on_device, to_host
from helpers import small_graph
from test_gpu_real import RUNS

STRATEGIES = ["centralized", "halo", "adaqp", "grappa", "tma", "retexo", "minibatch", "bns",
              "pipegcn", "sancus", "llcg"]
ARCHS = ["gcn", "sage", "gat", "gin"]
EPOCHS = 2


def _cfg(strategy: str, parts: int, arch: str = "gcn", **options):
    return load_config(None, {"strategy": strategy, "partition": {"parts": parts},
                              "model": {"hidden": 8, "arch": arch}, "options": options,
                              "train": {"epochs": EPOCHS, "eval_every": 1, "eval_mode": "exact"},
                              "runtime": {"progress": False}})


def _run(comm_on, part, cfg, run_dir, device):
    """One run; (per-epoch essentials, where the trained parameters live)."""
    t = train_on(comm_on, part, cfg, run_dir, device=device, keep_records=True)
    params = [q for _, q in t.strategy.model.named_parameters()] \
        if hasattr(t.strategy, "model") else [q for q in t.strategy.layers.parameters()]
    essence = [(r["epoch"], r.get("loss"), r["bytes"], r.get("bytes_by_kind"),
                r.get("val_acc"), r.get("test_acc")) for r in t.records]
    return essence, tensors_on_device(params), to_host([q.detach() for q in params])


def _same(cpu, gpu):
    (e_cpu, _, p_cpu), (e_gpu, on_dev, p_gpu) = cpu, gpu
    assert on_dev, "the model's parameters are not on the device"
    assert len(e_cpu) == len(e_gpu)
    for a, b in zip(e_cpu, e_gpu):
        assert a[0] == b[0] and a[2] == b[2] and a[3] == b[3], (a, b)   # every byte alike
        assert (a[1] is None and b[1] is None) or a[1] == pytest.approx(b[1], rel=1e-4, abs=1e-6)
        assert a[4] == b[4] and a[5] == b[5]
    for x, y in zip(p_cpu, p_gpu):
        assert torch.allclose(x, y, atol=1e-5)


def _same_on_both(part, cfg, tmp_path):
    """One rank: the run on the stand-in device equals the run on the CPU."""
    cpu = _run(Communicator(0, 1), part, cfg, tmp_path / "cpu", torch.device("cpu"))
    with fake_cuda():
        gpu = _run(Communicator(0, 1, device="cuda:0"), part, cfg, tmp_path / "gpu",
                   torch.device("cuda", 0))
    _same(cpu, gpu)


def test_every_registered_strategy_is_proven_on_the_device():
    """A strategy added later is listed here (P = 1) and in ``P2`` (its own device paths),
    and in test_gpu_real and bench_gpu, or the GPU half of its proof is missing."""
    import ast
    from pathlib import Path
    from quietgnn.strategies.base import available_strategies
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"
    bench = next(ast.literal_eval(n.value) for n in ast.parse(script.read_text()).body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "STRATEGIES")
    names = set(available_strategies())
    assert set(STRATEGIES) == names
    assert {s.split("-")[0] for s in P2} == names
    assert {s.split("-")[0] for s in RUNS} == names
    assert set(bench) == names


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_and_model_trains_on_the_device_as_on_the_cpu(strategy, arch, tmp_path):
    graph = small_graph()
    cfg = _cfg(strategy, 1, arch)
    part = build_partitions(graph, partition_nodes(graph, cfg.partition_method, 1, seed=0),
                            ranks=[0])[0]
    _same_on_both(part, cfg, tmp_path)


def test_a_gpu_runs_peak_device_memory_reaches_its_records_summary_report_and_cli(tmp_path,
                                                                                  capsys):
    """On a GPU each rank records the most its tensors held there (``peak_gpu_mb``): in every
    metrics line, the summary, the curve and the report's memory cell; a CPU run records
    none (its records are as they were)."""
    import json
    from quietgnn.analysis.projection import epoch_curve
    from quietgnn.analysis.report import build_report
    from quietgnn.analysis.tables import markdown
    from quietgnn.cli import print_summary
    from quietgnn.runtime.metrics import read_metrics
    graph = small_graph()
    cfg = _cfg("halo", 1)
    part = build_partitions(graph, partition_nodes(graph, "metis", 1, seed=0), ranks=[0])[0]
    cpu = train_on(Communicator(0, 1), part, cfg, tmp_path / "cpu", device=torch.device("cpu"))
    with fake_cuda():
        torch.cuda.max_memory_allocated = lambda d=None: 3 * 2 ** 20   # restored on exit
        gpu = train_on(Communicator(0, 1, device="cuda:0"), part, cfg, tmp_path / "gpu",
                       device=torch.device("cuda", 0))
    assert "peak_gpu_mb" not in cpu.summary
    assert "peak_gpu_mb" not in (tmp_path / "cpu" / "metrics" / "rank-0.jsonl").read_text()
    assert gpu.summary["peak_gpu_mb"] == 3.0
    lines = [json.loads(x) for x in
             (tmp_path / "gpu" / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    assert [x["peak_gpu_mb"] for x in lines] == [3.0] * (EPOCHS + 1)     # set-up + epochs
    assert {p.peak_gpu_mb for p in epoch_curve(read_metrics(tmp_path / "gpu")).epochs} == {3.0}
    results = [{"id": d, "status": "ok", "dataset": "g", "strategy": "halo", "parts": 1,
                "model": "gcn", "summary": t.summary,
                "curve": epoch_curve(read_metrics(tmp_path / d)).to_json()}
               for d, t in (("cpu", cpu), ("gpu", gpu))]
    assert "(GPU 3 MiB)" in markdown(build_report(results[1:], {}), [], {})
    assert "GPU" not in markdown(build_report(results[:1], {}), [], {})
    print_summary(gpu.summary)
    print_summary(cpu.summary)
    gpu_line, cpu_line = [x for x in capsys.readouterr().out.splitlines() if "peak memory" in x]
    assert gpu_line.endswith(", GPU 3 MiB/rank") and "GPU" not in cpu_line


def test_dropout_masks_on_the_device_are_the_cpus_in_one_slice_per_few_million_entries():
    """On a GPU a keyed dropout mask is hashed a few million entries at a time (on a CPU 64k,
    for the cache): the same bits, in one kernel per hash step rather than a launch-bound
    train of them (a 13,752 x 64 layer was 14 slices)."""
    from collections import Counter
    from torch.utils._python_dispatch import TorchDispatchMode
    from quietgnn.nn import keyed

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    ids = torch.randperm(300000, generator=torch.Generator().manual_seed(0))[:13752]
    with Count() as cpu_ops:
        want = keyed.row_keep_mask(ids, 64, 0.5, 12345)
    with fake_cuda():
        with Count() as dev_ops:
            got = keyed.row_keep_mask(ids.to("cuda"), 64, 0.5, 12345)
        assert tensors_on_device(got) and torch.equal(to_host(got), want)
    assert cpu_ops.ops["ge"] == 14 and dev_ops.ops["ge"] == 1      # the threshold, per slice


def test_a_blocks_weights_are_built_on_the_device_without_reading_it_back():
    """A mini-batch builds its blocks every step: their GCN and mean weights, within one
    slice, come without a read of the device (each read is a sync on a GPU) and equal the
    CPU's."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from quietgnn.nn import SparseAdj
    from fakecuda import on_device

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == "_local_scalar_dense" and on_device(args[0]):
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    g = small_graph()
    cpu = SparseAdj(g.indptr, g.indices, g.num_nodes, src_degree=g.indptr[1:] - g.indptr[:-1])
    want = (cpu.gcn_norm(), cpu.mean_norm())
    with fake_cuda():
        dev = cpu.to("cuda")
        with Reads():
            got = (dev.gcn_norm(), dev.mean_norm())
        assert tensors_on_device(got)
        got = to_host(got)
    assert Reads.n == 0
    assert all(torch.equal(a, b) for a, b in zip((*want[0], want[1]), (*got[0], got[1])))


def test_on_a_gpu_compute_is_synchronised_wall_time_not_the_threads_cpu(tmp_path, monkeypatch):
    """A thread waiting for its GPU may sleep through the kernels (here: a thread CPU clock
    that never moves): on the device ``compute_s`` is wall seconds once the device is
    synchronised, less communication's; on a CPU thread CPU seconds, as before."""
    import time
    graph = small_graph()
    cfg = _cfg("halo", 1)
    part = build_partitions(graph, partition_nodes(graph, "metis", 1, seed=0), ranks=[0])[0]
    monkeypatch.setattr(time, "thread_time", lambda: 0.0)
    cpu = train_on(Communicator(0, 1), part, cfg, tmp_path / "cpu", device=torch.device("cpu"),
                   keep_records=True)
    syncs = []
    with fake_cuda():
        torch.cuda.synchronize = lambda d=None: syncs.append(d)        # restored on exit
        gpu = train_on(Communicator(0, 1, device="cuda:0"), part, cfg, tmp_path / "gpu",
                       device=torch.device("cuda", 0), keep_records=True)
    epochs = [[r for r in t.records if r["epoch"] >= 0] for t in (cpu, gpu)]
    assert all(r["compute_s"] == 0 == r["eval_compute_s"] for r in epochs[0])
    assert all(0 < r["compute_s"] <= r["wall_s"] and r["eval_compute_s"] > 0 for r in epochs[1])
    assert len(syncs) >= 4 * EPOCHS       # around training and evaluation, every epoch


def test_on_a_gpu_an_exchange_in_flight_behind_compute_is_not_taken_off_it():
    """An exchange waited for later (pipegcn, adaqp's overlap) spans the compute it flew
    behind: a GPU epoch's compute takes off only the seconds the caller was blocked in it."""
    from quietgnn.comm import OpRecord
    from quietgnn.runtime.clock import ComputeClock

    def op(seconds, cpu, blocked=None):
        return OpRecord(round=0, op="all_to_all", kind="halo_fwd", phase="train", epoch=0,
                        bytes_sent=8, bytes_recv=8, messages=1, hops=1, seconds=seconds,
                        cpu_seconds=cpu, blocked_s=blocked)
    recs = [op(0.9, 0.01, blocked=0.05), op(0.2, 0.1)]     # in flight 0.9 s; waited at once
    assert ComputeClock("cuda:0").less_comm(1.0, recs) == pytest.approx(0.75)
    assert ComputeClock("cpu").less_comm(1.0, recs) == pytest.approx(0.89)


# the options that take other device paths at P = 1: full-graph and sampled modes, sampled
# evaluation, the lean forward (activation checkpointing), another sampler
VARIANTS = [("grappa", {"mode": "full"}), ("grappa", {"eval_nodes": 50}),
            ("minibatch", {"eval_nodes": 50}), ("minibatch", {"sampler": "ladies",
                                                             "fanouts": [20, 20]}),
            ("halo", {"lean": True}), ("adaqp", {"lean": True}), ("retexo", {"lean": True}),
            ("tma", {"mode": "full"}), ("halo", {"cache_inputs": False})]


@pytest.mark.parametrize("stored", [False, True], ids=["in-memory", "stored"])
@pytest.mark.parametrize("strategy,options", VARIANTS, ids=[
    f"{s}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for s, o in VARIANTS])
def test_each_variant_trains_on_the_device_as_on_the_cpu(strategy, options, stored, tmp_path):
    """``stored``: the part as a prepared directory holds it (memory-mapped int32 edges,
    float16 features), where the strategy reads it so."""
    from quietgnn.partition import make_book
    graph = small_graph()
    cfg = _cfg(strategy, 1, **options)
    if stored:
        book = make_book(tmp_path / "d", graph, "random", 1, x_dtype="float16")
        part = book.load_part(0, 1, stored=cfg.strategy_cls.reads_stored_part(cfg.options))
    else:
        part = build_partitions(graph, partition_nodes(graph, cfg.partition_method, 1, seed=0),
                                ranks=[0])[0]
    _same_on_both(part, cfg, tmp_path)


# options that take each strategy's own device paths at P = 2: quantized messages and
# gradients, adaptive widths (from a tier, not timed: the CPU and device runs must agree),
# low-rank gradients, mini-batches that fetch rows, the averaging hub
P2 = {"centralized": {}, "halo": {}, "adaqp": {"bits": 4}, "grappa": {"grad_rank": 2},
      "tma": {"period_epochs": 1.0}, "retexo": {"grad_bits": 8}, "minibatch": {"grad_bits": 8},
      "bns": {"p": 0.5}, "adaqp-adaptive": {"time_model": "lan", "assign_cycle": 1},
      "pipegcn": {"smoothing": 0.5}, "sancus": {"bound": 0.05, "max_stale": 2},
      "llcg": {"period": 1},
      # mostly-zero features: fetched, joined and kept sparse (halo's inputs, grappa's
      # chunks, tma's evaluation graph, minibatch's fetched and cached rows)
      "halo-sparse": {}, "grappa-sparse": {}, "tma-sparse": {"period_epochs": 1.0},
      "minibatch-sparse": {"eval_nodes": 50}}


def _both(comm, graph, parts, tmp):
    """Every strategy at P = 2 on the CPU, then on one stand-in GPU shared by both ranks (gloo:
    collectives staged through host memory), in one process group."""
    torch.set_num_threads(1)
    keep = torch.rand(graph.x.shape, generator=torch.Generator().manual_seed(3)) < 0.1
    sparse = dataclasses.replace(graph, x=torch.where(keep, graph.x, 0.0))
    part_of = {g is sparse: build_partitions(g, parts, ranks=[comm.rank])[0]
               for g in (graph, sparse)}
    out = {}
    for strategy, options in P2.items():
        if strategy == "centralized":
            continue
        part = part_of[strategy.endswith("-sparse")]
        cfg = _cfg(strategy.split("-")[0], 2, **options)
        cpu = _run(comm, part, cfg, f"{tmp}/{strategy}-cpu", torch.device("cpu"))
        with fake_cuda(devices=1):
            comm.device = torch.device("cuda", 0)
            try:
                gpu = _run(comm, part, cfg, f"{tmp}/{strategy}-gpu", comm.device)
            finally:
                comm.device = torch.device("cpu")
        out[strategy] = (cpu, gpu)
    return out


def test_two_ranks_on_one_gpu_train_as_on_the_cpu_with_the_same_records(tmp_path):
    graph = small_graph()
    parts = partition_nodes(graph, "metis", 2, seed=0)
    # fresh processes: a kept worker may have run a backward before the stand-in existed
    for rank_result in spawn_function(_both, 2, args=(graph, parts, str(tmp_path)),
                                      reuse=False):
        assert sorted(rank_result) == sorted(s for s in P2 if s != "centralized")
        for strategy, (cpu, gpu) in rank_result.items():
            try:
                _same(cpu, gpu)
            except AssertionError as exc:
                raise AssertionError(f"{strategy}: {exc}") from None


# ---------------------------------------------------------------- ranks, devices, backends
def _gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_ranks_take_gpus_in_turn_and_auto_picks_nccl_only_with_a_gpu_each(monkeypatch):
    from quietgnn.runtime.devices import place
    _gpus(monkeypatch, 2)
    got = [place("cuda", "auto", r, 4) for r in range(4)]
    assert [str(p.device) for p in got] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert {p.backend for p in got} == {"gloo"} and "share 2 GPU(s)" in got[0].why
    assert [p.backend for p in (place("cuda", "auto", r, 2) for r in range(2))] == ["nccl"] * 2
    assert place("cuda", "gloo", 1, 2).backend == "gloo"
    with pytest.raises(ValueError, match="NCCL refuses two ranks on one GPU.*at most 2 ranks"):
        place("cuda", "nccl", 0, 3)
    with pytest.raises(ValueError, match="needs runtime.device cuda"):
        place("cpu", "nccl", 0, 1)
    assert place("cpu", "auto", 0, 4).backend == "gloo"


def test_cuda_without_a_gpu_is_one_line_and_exit_2_before_anything_starts(tmp_path, capsys,
                                                                           monkeypatch):
    from quietgnn.cli import main
    _gpus(monkeypatch, 0)
    assert main(["train", "--runtime.device", "cuda", "--parts", "2", "--out",
                 str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device is visible" in err[0]
    assert "--runtime.device cpu" in err[0]
    assert not (tmp_path / "runs").exists()      # no run directory left behind


def test_large_arrays_cross_to_the_device_a_slice_at_a_time(monkeypatch, tmp_path):
    """Past rows.STAGE_BYTES an array goes to the GPU in slices through pinned buffers (a
    mapped part is never faulted in whole); the copy equals the array, and a lean strategy
    trained from a stored part so equals its CPU run."""
    import fakecuda
    from quietgnn import rows
    from quietgnn.partition import make_book
    monkeypatch.setattr(rows, "STAGE_BYTES", 64)            # 8 rows of 4 float16 a slice
    copies = []
    monkeypatch.setattr(fakecuda._Event, "record", lambda self, stream=None: copies.append(1))
    x = torch.arange(1000, dtype=torch.float16).reshape(250, 4)
    with fake_cuda():
        y = rows.to_device(x, "cuda")
        assert fakecuda.on_device(y) and torch.equal(to_host(y), x)
    assert len(copies) == 32                                # ceil(250 / 8) slices
    graph = small_graph()
    book = make_book(tmp_path / "d", graph, "random", 1, x_dtype="float16")
    cfg = _cfg("halo", 1, lean=True)
    _same_on_both(book.load_part(0, 1, stored=True), cfg, tmp_path)


@pytest.mark.slow
def test_the_prepared_gpu_benchmark_runs_end_to_end_in_its_dry_run(tmp_path):
    """``bench_gpu.py`` is what a lent GPU's few minutes run: its dry run (the 'GPU' cells on
    the CPU) goes through every strategy at P = 1 and 2, the prepared graph and the table, so
    the script cannot rot between the rare sessions that have a GPU."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_gpu.py"),
                           "--dry-run", "--graphs", "cora", "--epochs", "2",
                           "--big-edges", "2e4", "--big-epochs", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "gpu.json").read_text())["rows"]
    assert not [r for r in rows if "error" in r]
    cells = {(r["strategy"], r["parts"], r["role"]) for r in rows if r["graph"] == "cora"}
    assert cells == {(s, P, role) for s in STRATEGIES for P in (1, 2) for role in ("gpu", "cpu")
                     if P == 1 or s != "centralized"}
    big = [r for r in rows if r["source"] == "prepared"]
    assert {r["strategy"] for r in big} == {"halo", "minibatch"}
    assert all(r["bytes_per_epoch"] > 0 for r in big)
    table = (tmp_path / "gpu.md").read_text()
    assert "DIFFER" not in table and "| llcg | 2 | gloo |" in table


# ---------------------------------------------------------------- what the runs above miss
def test_sancus_reads_every_peers_decision_back_in_one_read():
    """SANCUS's decisions cross as one flag per peer and layer, every epoch; on a GPU each read
    of the device is a sync, so the P flags come back in one read (they were P - 1, one per
    peer). A run at P = 2 reads one flag either way: a stand-in communicator of 4 ranks."""
    from types import SimpleNamespace
    from torch.utils._python_dispatch import TorchDispatchMode
    from fakecuda import on_device
    from quietgnn.strategies.sancus import SancusOptions, SkipExchange

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            where = (kwargs or {}).get("device")
            to_host = name == "_to_copy" and where is not None and \
                torch.device(where).type == "cpu"
            if (name == "_local_scalar_dense" or to_host) and on_device(args[0]):
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    peers = [True, False, True, True]       # what each rank decided (this one is rank 0)

    def all_to_all(send, kind, counts, carries=None):
        assert len(send) == 4 and all(on_device(s) for s in send)
        return [s.clone() if j == 0 else torch.full_like(s, int(peers[j]))
                for j, s in enumerate(send)]
    comm = SimpleNamespace(world_size=4, rank=0, all_to_all=all_to_all)
    with fake_cuda():
        ex = SimpleNamespace(comm=comm, halo_ids=torch.zeros(0, dtype=torch.int64,
                                                               device="cuda"))
        se = SkipExchange(ex, torch.zeros(0, dtype=torch.int64, device="cuda"),
                          SancusOptions(bound=0.1))
        rows = torch.ones(3, 2, device="cuda")
        with Reads():
            first = se._decide(rows, 0)         # nothing sent yet: fresh, no drift to read
        assert first == peers and Reads.n == 1
        se.sent[0], se.age[0] = rows, 0
        Reads.n = 0
        with Reads():
            later = se._decide(rows, 0)         # unchanged rows: the drift read, then flags
        assert later == [False, False, True, True] and Reads.n == 2


def test_a_gpu_runs_model_is_checked_against_the_hosts_memory_as_one_copy_a_rank(
        tmp_path, monkeypatch):
    """Before launch the host's ranks together are checked against its memory: four copies of
    the weights a rank on the CPU (weights, gradients, Adam's moments), one on a GPU, where
    the host holds the model only while it is built (the worker's own rule). A GPU run was
    refused by the CPU's count: a model that trains was called too large for the host."""
    from quietgnn.config import load_config
    from quietgnn.runtime.plan import plan_local_run
    monkeypatch.setattr("quietgnn.heap.mem_available_mb", lambda: 1000.0)
    _gpus(monkeypatch, 2)
    # one copy (64 x 10**6 floats, 0.25 GiB) on each of 2 ranks fits; four copies do not
    cfg = {"partition": {"parts": 2}, "model": {"hidden": 10**6},
           "synthetic": {"nodes": 300, "feature_dim": 64}}
    with pytest.raises(ValueError, match=r"^model.hidden = 1000000: .* on each of the 2 ranks"):
        plan_local_run(load_config(None, {**cfg, "runtime": {"out_dir": str(tmp_path / "c")}}),
                       lambda m: None)
    gpu = load_config(None, {**cfg, "runtime": {"out_dir": str(tmp_path / "g"),
                                                "device": "cuda"}})
    plan = plan_local_run(gpu, lambda m: None)
    assert plan.cfg.runtime.backend == "nccl"


def test_deterministic_runs_on_a_gpu_fix_cublas_workspace_first(monkeypatch):
    """``runtime.deterministic`` on a GPU: cuBLAS refuses deterministic mode at the first
    matmul unless ``CUBLAS_WORKSPACE_CONFIG`` is set; a CPU run sets nothing, and a value the
    user chose is kept."""
    from quietgnn.runtime.worker import use_deterministic
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        use_deterministic(torch.device("cpu"))
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        assert torch.are_deterministic_algorithms_enabled()
        use_deterministic(torch.device("cuda", 1))
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        use_deterministic(torch.device("cuda", 0))
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)
