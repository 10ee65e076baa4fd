"""The emulated cluster (``quietgnn/runtime/netcluster.py``): hosts in network namespaces on a
bridge, rate-capped links, torchrun's multi-host path over them, and ``quietgnn bench`` runs on
it. Needs root and iproute2."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from quietgnn.runtime.netcluster import Cluster, available  # noqa: E402

WHY = available()
# emulated hosts (root, namespaces): the slow tier (pytest -m slow), which .ci/run runs too
pytestmark = [pytest.mark.skipif(WHY is not None, reason=f"emulated cluster unavailable: {WHY}"),
              pytest.mark.slow]

SYN = ["--dataset", "synthetic", "--synthetic.nodes", "300", "--synthetic.feature_dim", "8"]
TRAIN = ["--strategy", "halo", "--epochs", "2", "--hidden", "8", "--runtime.progress", "false",
         "--runtime.timeout_s", "60"]


def _quietgnn(*args):
    return subprocess.run([sys.executable, "-m", "quietgnn", *args], capture_output=True,
                          text=True, timeout=300)


def test_a_bench_matrix_on_emulated_hosts_trains_as_the_local_launcher_does(tmp_path):
    """``quietgnn bench --links``: each run on two emulated hosts (torchrun over their capped
    links) gives the local run's loss, bytes and accuracy, and its report measures it."""
    from quietgnn.analysis import bench, report
    matrix = tmp_path / "m.yaml"
    matrix.write_text("datasets: [{name: synthetic, set: {synthetic.nodes: 300, "
                      "synthetic.feature_dim: 8}}]\nstrategies: [halo]\nparts: [2]\n"
                      "set: {train.epochs: 2, model.hidden: 8}\n")
    assert bench.cli_main(["--matrix", str(matrix), "--out", str(tmp_path / "local")]) == 0
    assert bench.cli_main(["--matrix", str(matrix), "--out", str(tmp_path / "emu"),
                           "--links", "100mbit"]) == 0
    local, emu = (json.loads((tmp_path / d / "results.jsonl").read_text())
                  for d in ("local", "emu"))
    assert emu["link"] == "100mbit" and emu["host_cores"] >= 1 and "link" not in local
    assert "torch.distributed.run" in emu["command"]     # what ran: torchrun on each host
    assert (tmp_path / "emu" / "logs" / f"{emu['id']}.hosts" / "host-1.log").is_file()
    assert "--- host 1 (100mbit) ---" in (tmp_path / "emu" / "logs" / f"{emu['id']}.log") \
        .read_text()
    a, b = local["summary"], emu["summary"]
    assert b["final_loss"] == pytest.approx(a["final_loss"], rel=1e-6)
    assert b["train_bytes"] == a["train_bytes"] and b["test_acc"] == a["test_acc"]
    out = tmp_path / "emu" / "report"
    assert report.cli_main([str(tmp_path / "emu"), "--out", str(out), "--no-plots"]) == 0
    assert "| halo | 2 | 100mbit |" in (out / "report.md").read_text()


def test_a_capped_link_limits_a_transfer_to_its_rate():
    rate, nbytes = 20e6, 3_000_000          # 1.2 s at 20 Mbit/s
    with Cluster(2, rate="20mbit") as c:
        server = c.popen(1, [sys.executable, "-c", f"""
import socket, time
s = socket.socket(); s.bind(('{c.addrs[1]}', 5001)); s.listen(1)
conn, _ = s.accept(); n = 0; t0 = None
while True:
    b = conn.recv(1 << 16)
    if not b: break
    t0 = t0 or time.perf_counter(); n += len(b)
print(n, time.perf_counter() - t0)
"""], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        client = c.popen(0, [sys.executable, "-c", f"""
import socket, time
for _ in range(50):
    try:
        s = socket.create_connection(('{c.addrs[1]}', 5001)); break
    except OSError:
        time.sleep(0.1)
s.sendall(b'x' * {nbytes}); s.close()
"""])
        assert client.wait(timeout=60) == 0
        out, _ = server.communicate(timeout=60)
    n, secs = out.split()
    measured = 8 * int(n) / float(secs)
    assert int(n) == nbytes
    assert 0.8 * rate <= measured <= 1.2 * rate, f"{measured / 1e6:.1f} Mbit/s on a 20 Mbit/s cap"


def test_teardown_leaves_nothing_behind_even_after_a_failure():
    c = Cluster(3, rate="10mbit")
    with pytest.raises(RuntimeError, match="boom"):
        with c:
            p = c.popen(0, ["sleep", "300"])
            assert c.leftovers()        # namespaces and links exist while it runs
            raise RuntimeError("boom")
    assert c.leftovers() == []
    assert p.poll() is not None        # the process in the namespace is gone


def test_a_slow_link_is_shaped_and_one_below_what_tc_can_shape_is_refused():
    """`--links 8kbit` passed the up-front check, then every run failed with tc's '"rate" is
    required' (the acknowledgement class took the whole rate); 0.5bit likewise."""
    from quietgnn.runtime.netcluster import rate_bps
    with Cluster(1, rate="8kbit") as c:
        out = subprocess.run(["ip", "netns", "exec", c.names[0], "tc", "class", "show", "dev",
                              "eth0"], capture_output=True, text=True).stdout
    assert "rate 4Kbit" in out, out            # acknowledgements and data: half each
    for bad in ("0.5bit", "1kbit"):
        with pytest.raises(ValueError, match="below 2kbit, which tc cannot shape"):
            rate_bps(bad)


def test_a_killed_cluster_leaves_no_process_and_its_namespaces_are_swept():
    """`quietgnn bench` SIGKILLed during a run on emulated hosts left its namespaces, torchrun
    agents and trainers running (no close() runs on SIGKILL). The hosts' processes now die
    with the process that started them, and the next cluster deletes the empty namespaces."""
    import os

    from quietgnn.runtime.netcluster import sweep_stale
    code = ("import sys, time\n"
            "from quietgnn.runtime.netcluster import Cluster\n"
            "c = Cluster(2).__enter__()\n"
            "p = c.popen(1, ['sleep', '300'])\n"
            "print(c.prefix, p.pid, flush=True)\n"
            "time.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    prefix, pid = owner.stdout.readline().split()
    owner.kill()
    owner.wait()

    def gone():
        try:
            os.kill(int(pid), 0)
            return False
        except ProcessLookupError:
            return True
    assert _until(gone, 10), "the host's process outlived the killed cluster"
    swept = sweep_stale()       # (and any other killed cluster's on this host)
    assert {f"{prefix}-br", f"{prefix}-h0", f"{prefix}-h1"} <= set(swept)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in listed


def _until(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.5)
    return False


def _parses(path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError):
        return False


def logs_of(tmp_path) -> str:
    return (tmp_path / "host-0.log").read_text(errors="replace")[-3000:]


@pytest.mark.parametrize("strategy", ["halo", "tma"])
def test_a_host_that_disappears(tmp_path, strategy):
    """Host 2's link goes down mid-run: `halo` stops on every rank within the timeout (each
    rank's one-line error names the operation and says a peer died or is stuck; the survivors
    name host 2 by its address, host 2 says it lost its link); `tma`
    finishes on the survivors. The vanished host's own torchrun agent is not waited for: it can
    no longer reach the rendezvous, and its host is gone."""
    d = tmp_path / "d"
    assert _quietgnn("prepare", *SYN, "--parts", "3", "--out", str(d)).returncode == 0
    extra = (["--options.period_epochs", "1", "--options.fail_timeout_s", "10"]
             if strategy == "tma" else [])
    args = ["-m", "quietgnn", "train", "--data", str(d), "--strategy", strategy,
            "--epochs", "400", "--hidden", "8", "--runtime.progress", "true",
            "--runtime.timeout_s", "20", "--out", str(tmp_path), "--run-name", "r",
            "--summary-json", str(tmp_path / "s.json"), *extra]
    with Cluster(3, rate="100mbit") as c:
        addrs = c.addrs
        procs = c.torchrun(args, run_id="gone", log_dir=tmp_path)
        metrics = tmp_path / "r" / "metrics" / "rank-2.jsonl"
        assert _until(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) > 3,
                      240), logs_of(tmp_path)
        c.link(2, up=False)
        t0 = time.monotonic()
        if strategy == "tma":
            # the survivors finish the run and rank 0 writes the summary; the torchrun agents
            # then wait in torchrun's exit barrier for the vanished agent (its own timeout,
            # 300 s, not ours), so the run's end is the summary, not the agents' exit
            assert _until(lambda: _parses(tmp_path / "s.json"), 240), logs_of(tmp_path)
        else:
            codes = c.wait(procs[:2], timeout=180)
        took = time.monotonic() - t0
        if strategy != "tma":   # host 2's rank (not waited for) writes its error after its own
            # check of the store times out, seconds after the survivors': let it, before the
            # cluster (and that rank) is torn down
            errs = [tmp_path / "r" / "logs" / f"rank-{i}.error" for i in range(3)]
            _until(lambda: all(f.is_file() and "CommError" in f.read_text() for f in errs), 30)
    logs = [(tmp_path / f"host-{i}.log").read_text(errors="replace") for i in range(3)]
    if strategy == "tma":
        rep = json.loads((tmp_path / "s.json").read_text())["strategy_report"]
        assert [x["rank"] for x in rep["lost"]] == [2] and rep["survivors"] == 2
        assert not (tmp_path / "r" / "logs" / "rank-1.error").exists()   # 1 trained to the end
    else:
        assert codes == [1, 1], (codes, logs[0][-2000:])     # nobody hangs or "succeeds"
        assert took < 20 + 60                               # the timeout, plus shutdown
        for i in range(3):                                  # the vanished host's rank too
            err = (tmp_path / "r" / "logs" / f"rank-{i}.error").read_text()
            assert f"CommError: rank {i}: " in err and "peer rank probably died" in err
            if i < 2:   # the survivors name the host whose heartbeat stopped, by address
                assert "rank 2 on " in err and f"({addrs[2]})" in err, err[-1500:]
                assert "rank 1 on" not in err.splitlines()[-1].split("Silent")[-1]
            else:       # the vanished host cannot reach the store: it says so
                assert "this host lost its link" in err, err[-1500:]
