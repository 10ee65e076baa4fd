"""An emulated cluster on one machine: P "hosts", each a Linux network namespace with its own
address and network stack, joined by veth pairs to a bridge in a namespace of its own, each
host's egress capped by an ``htb`` class (acknowledgements first, see :meth:`Cluster.cap`).
One ``torchrun`` agent per host joins a c10d rendezvous over the bridge addresses: quietgnn's
multi-host path, over real TCP links.

    with Cluster(hosts=4, rate="100mbit") as c:
        procs = c.torchrun(["-m", "quietgnn", "train", "--data", "d", ...], run_id="x")
        c.wait(procs, timeout=600)

Needs root (``ip netns``, ``tc``) and ``iproute2``; :func:`available` says why not otherwise.
Latency is not emulated (the ``netem`` qdisc is absent on these machines): a measured epoch
has the link's bandwidth and the kernel's real (sub-millisecond) latency; the projection's
latency term is left out of the measured side (the report projects the link without it).

Every name the cluster creates carries its prefix (``qg<pid>``), addresses are in
10.213.0.0/24 inside its own namespaces only, and :meth:`Cluster.close` (run on exit, on an
exception and on SIGINT/SIGTERM) kills its processes and deletes its namespaces, which takes
their veth ends with them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Optional, Sequence

from .supervise import die_with_parent

SUBNET = "10.213.0"
#: set in every emulated host's environment: its "hosts" are one machine, one disk
EMULATED_ENV = "QUIETGNN_EMULATED_HOSTS"


def available() -> Optional[str]:
    """None when an emulated cluster can be built here, else the reason it cannot."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces and tc need root (run as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    probe = f"qgprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: Optional[str] = None) -> None:
    cmd = (["ip", "-n", ns] if ns else ["ip"]) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")


def _in(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


class Cluster:
    """``hosts`` namespaces on a bridge, each host's egress capped at ``rate`` (a tc rate:
    ``100mbit``, ``1gbit``; None: uncapped)."""

    def __init__(self, hosts: int, rate: Optional[str] = None, prefix: Optional[str] = None):
        if not isinstance(hosts, int) or not 1 <= hosts <= 200:
            raise ValueError(f"hosts = {hosts!r}; expected an int in 1..200")
        self.hosts, self.rate = hosts, rate
        self.prefix = prefix or f"qg{os.getpid() % 100000}"
        self.bridge = f"{self.prefix}-br"
        self.names = [f"{self.prefix}-h{i}" for i in range(hosts)]
        self.addrs = [f"{SUBNET}.{i + 1}" for i in range(hosts)]
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []
        self._logs: list[IO[str]] = []
        self._old: dict[int, object] = {}

    # -------------------------------------------------------------------------- set-up
    def __enter__(self) -> "Cluster":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._on_signal)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.close()
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

    def _build(self) -> None:
        sweep_stale()
        _ip("netns", "add", self.bridge)
        self._made.append(self.bridge)
        _ip("link", "add", "br0", "type", "bridge", ns=self.bridge)
        _ip("link", "set", "br0", "up", ns=self.bridge)
        for i, (ns, addr) in enumerate(zip(self.names, self.addrs)):
            _ip("netns", "add", ns)
            self._made.append(ns)
            host_end, br_end = f"{self.prefix}h{i}", f"{self.prefix}b{i}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", br_end)
            _ip("link", "set", host_end, "netns", ns)
            _ip("link", "set", br_end, "netns", self.bridge)
            _ip("link", "set", host_end, "name", "eth0", ns=ns)
            _ip("addr", "add", f"{addr}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "set", br_end, "master", "br0", ns=self.bridge)
            _ip("link", "set", br_end, "up", ns=self.bridge)
            if self.rate:
                self.cap(i, self.rate)

    def cap(self, host: int, rate: str) -> None:
        """(Re)cap ``host``'s egress at ``rate``: an ``htb`` class of that rate, in which
        TCP's bare acknowledgements (IP packets under 128 bytes) go first and everything else
        waits in a FIFO of about 100 ms of the rate.

        Why not one FIFO (a ``tbf``, as before): a host that sends and receives at once then
        queues the acknowledgements of what it receives behind its own data, and its peers'
        flows stall on them, which no real host does: Linux's default qdisc (``fq_codel``,
        absent on these machines) lets such sparse flows pass; an acknowledgement class is the
        nearest this kernel offers. The burst is 10 ms of the rate (at least 32 KiB) so the
        cap holds over any window longer than a few milliseconds."""
        bps = rate_bps(rate)
        burst = str(max(32 * 1024, int(bps / 8 * 0.010)))
        packets = str(max(16, int(bps / 8 * 0.100 / 1514)))
        ns = self.names[host]
        subprocess.run(_in(ns, "tc", "qdisc", "del", "dev", "eth0", "root"), capture_output=True)
        # guaranteed to the acknowledgements (both classes may use all of it); at most half
        # the rate, so that a slow link (64kbit) keeps a data class with a rate of its own
        acks = min(max(8000, int(bps // 20)), int(bps // 2))
        steps = [
            ["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "20"],
            ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb",
             "rate", rate, "burst", burst, "cburst", burst],
            ["class", "add", "dev", "eth0", "parent", "1:1", "classid", "1:10", "htb",
             "rate", f"{acks}bit", "ceil", rate, "burst", burst, "cburst", burst, "prio", "0"],
            ["class", "add", "dev", "eth0", "parent", "1:1", "classid", "1:20", "htb",
             "rate", f"{int(bps) - acks}bit", "ceil", rate, "burst", burst, "cburst", burst,
             "prio", "1"],
            ["qdisc", "add", "dev", "eth0", "parent", "1:20", "pfifo", "limit", packets],
            # IPv4, protocol TCP, total length < 128: a segment without payload
            ["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1",
             "u32", "match", "ip", "protocol", "6", "0xff",
             "match", "u16", "0x0000", "0xff80", "at", "2", "flowid", "1:10"],
        ]
        for step in steps:
            r = subprocess.run(_in(ns, "tc", *step), capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"tc {' '.join(step)} on {ns}: {r.stderr.strip()}")

    def link(self, host: int, up: bool) -> None:
        """Take ``host``'s link down (a host that disappears) or back up."""
        _ip("link", "set", "eth0", "up" if up else "down", ns=self.names[host])

    # -------------------------------------------------------------------------- running
    def popen(self, host: int, cmd: Sequence[str], **kw: object) -> subprocess.Popen:
        """Run ``cmd`` inside ``host``'s namespace (own process group: close kills it)."""
        env = dict(os.environ, **kw.pop("env", {}))  # type: ignore[arg-type]
        env[EMULATED_ENV] = "1"     # the hosts share one machine's disk (worker.py reads it)
        # dies with this process even when it is SIGKILLed (the agent's workers then see
        # their agent gone: worker.watch_parent); close() is for every other ending
        p = subprocess.Popen(_in(self.names[host], *cmd), env=env, start_new_session=True,
                             preexec_fn=die_with_parent, **kw)  # type: ignore[arg-type]
        self.procs.append(p)
        return p

    def torchrun_command(self, host: int, args: Sequence[str], run_id: str,
                         nproc_per_host: int = 1, port: int = 29500) -> list[str]:
        """The ``torchrun`` agent's command on ``host``: c10d rendezvous at host 0's address,
        ``args`` after torchrun's own options (e.g. ``["-m", "quietgnn", "train", ...]``)."""
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(self.hosts),
                "--nproc-per-node", str(nproc_per_host), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{self.addrs[0]}:{port}", "--rdzv-id", run_id,
                "--local-addr", self.addrs[host], "--max-restarts", "0",
                # torch guesses whether this agent hosts the rendezvous store from the
                # machine's hostname, which every namespace shares: say it
                "--rdzv-conf", f"is_host={int(host == 0)}", *args]

    def torchrun(self, args: Sequence[str], run_id: str, nproc_per_host: int = 1,
                 port: int = 29500, log_dir: Optional[Path] = None,
                 env: Optional[dict[str, str]] = None) -> list[subprocess.Popen]:
        """One torchrun agent per host (:meth:`torchrun_command`), its output in
        ``log_dir/host-<i>.log`` (written as it runs: kept whatever ends the run)."""
        out = []
        for i in range(self.hosts):
            e = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
                 "PYTHONUNBUFFERED": "1", **(env or {})}
            log = open(log_dir / f"host-{i}.log", "w") if log_dir else subprocess.DEVNULL
            if log is not subprocess.DEVNULL:
                self._logs.append(log)      # closed with the cluster
            out.append(self.popen(i, self.torchrun_command(i, args, run_id, nproc_per_host,
                                                           port),
                                  env=e, stdout=log, stderr=subprocess.STDOUT))
        return out

    @staticmethod
    def wait(procs: Sequence[subprocess.Popen], timeout: float, grace_s: float = 150.0,
             failures: Optional[list[int]] = None) -> list[Optional[int]]:
        """Exit codes (None: still running at the deadline, then killed). Once one process
        has failed, the others have ``grace_s`` more to end, not the whole ``timeout``: a
        host that crashed while the rest wait for it reads as the crash, not as a run that
        timed out (give the ranks' own ``runtime.timeout_s`` and some: within it they see
        the peer gone and write why). ``failures`` gets the failed processes' indices in the
        order their exits were seen: the first is the likeliest cause, the others' failures
        may be their reaction to it."""
        deadline = time.monotonic() + timeout
        seen = failures if failures is not None else []
        while True:
            codes = [p.poll() for p in procs]
            first_failure = not seen
            seen += [i for i, c in enumerate(codes) if c and i not in seen]
            if all(c is not None for c in codes) or time.monotonic() >= deadline:
                break
            if seen and first_failure:   # the rest get the grace from the first failure on
                deadline = min(deadline, time.monotonic() + grace_s)
            time.sleep(0.2)
        for p, c in zip(procs, codes):
            if c is None:
                _kill(p)
        return codes

    # -------------------------------------------------------------------------- teardown
    def close(self) -> None:
        for p in self.procs:
            _kill(p)
        self.procs.clear()
        for f in self._logs:
            f.close()
        self._logs.clear()
        for ns in reversed(self._made):
            # processes left inside (none should be) would keep the namespace's devices
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old.clear()

    def leftovers(self) -> list[str]:
        """Namespaces or links of this cluster's prefix that still exist (for tests)."""
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        return [ln.split()[0] for ln in ns.splitlines() if ln.startswith(self.prefix)] + \
            [ln.split(":")[1].strip() for ln in links.splitlines() if self.prefix in ln]


def sweep_stale() -> list[str]:
    """Delete the namespaces a killed cluster left (``qg<pid>-…`` whose creating process is
    gone and none of which holds a process): SIGKILL runs no :meth:`Cluster.close`, and its
    hosts' processes die with it (``die_with_parent``) but namespaces are files, not
    processes. A cluster is judged whole: its bridge never holds a process, its hosts do while
    it runs (one built from another PID namespace looks creator-less). Returns the names
    deleted."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    alive = {int(d) % 100000 for d in os.listdir("/proc") if d.isdigit()}
    clusters: dict[str, list[str]] = {}
    for ns in (ln.split()[0] for ln in listed.splitlines() if ln.strip()):
        m = re.fullmatch(r"qg(\d+)-(br|h\d+)", ns)
        if m is not None and int(m.group(1)) not in alive:
            clusters.setdefault(m.group(1), []).append(ns)
    gone = []
    for names in clusters.values():
        if any(subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True).stdout.split() for ns in names):
            continue        # something still runs in it: not ours to judge
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        gone += names
    return gone


def run_on_hosts(args: Sequence[str], hosts: int, rate: Optional[str], run_id: str,
                 log: IO[str], timeout_s: float, log_dir: Optional[Path] = None,
                 grace_s: float = 150.0) -> tuple[Optional[int], list[str]]:
    """Run ``args`` (``["-m", "quietgnn", "train", ...]``) on ``hosts`` emulated hosts, one
    rank each, their links capped at ``rate`` (None: uncapped), built for this run and torn
    down after it. Each host's output goes to ``log_dir/host-<i>.log`` as it runs (a
    temporary folder if None), and is appended to ``log`` at the end, the host that failed
    first (or else hung) last, where a reader of the log's tail looks. ``grace_s``: see
    :meth:`Cluster.wait`. Returns the exit status (:func:`exit_status`) and host 0's
    command, for the record."""
    with contextlib.ExitStack() as stack:
        folder = Path(log_dir) if log_dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="quietgnn-hosts-")))
        folder.mkdir(parents=True, exist_ok=True)
        failures: list[int] = []
        with Cluster(hosts, rate=rate) as c:
            command = c.torchrun_command(0, args, run_id)
            codes = c.wait(c.torchrun(args, run_id=run_id, log_dir=folder), timeout_s,
                           grace_s, failures)
        last = failures[0] if failures else next(
            (i for i, code in enumerate(codes) if code is None), None)
        for i in sorted(range(hosts), key=lambda i: i == last):
            log.write(f"--- host {i} ({'uncapped' if rate is None else rate}) ---\n")
            log.write((folder / f"host-{i}.log").read_text(errors="replace"))
    log.flush()
    return exit_status(codes, failures), command


def exit_status(codes: Sequence[Optional[int]],
                failures: Sequence[int] = ()) -> Optional[int]:
    """The run's status from its hosts' exit codes: the code of the failure seen first
    (``failures``, as :meth:`Cluster.wait` fills it; else the lowest-numbered failed host's),
    else None if a host had to be killed at the deadline, else 0."""
    first = next((codes[i] for i in failures if codes[i]), None)
    if first is None:
        first = next((c for c in codes if c), None)
    if first is not None or any(c is None for c in codes):
        return first
    return 0


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def rate_bps(rate: str) -> float:
    """Bits per second of a tc rate (``10mbit``, ``1.5gbit``): a positive number and a unit."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", str(rate).strip().lower())
    bps = float(m.group(1)) * {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)] \
        if m else 0.0
    if not bps > 0:
        raise ValueError(f"rate {rate!r}: expected a positive tc rate such as 10mbit, 100mbit "
                         f"or 1gbit")
    if bps < 2000:      # tc shapes whole bits per second, and the link is split in two classes
        raise ValueError(f"rate {rate!r}: below 2kbit, which tc cannot shape; expected at "
                         f"least 2kbit (e.g. 64kbit, 10mbit)")
    return bps
