"""Running a study's cells, each an isolated ``quietgnn train`` subprocess (or ``torchrun``
on emulated hosts), resumably: a cell whose result file exists is skipped (one that ran on
another graph than its dataset names now is refused); every result is written whole (a
temporary file, then moved) as soon as its run ends, and so is ``results.jsonl``, so a study
stopped at any moment keeps what it measured."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from ..heap import mem_available_mb
from ..safefiles import atomic_write
from ..serial import loads_json
from .matrix import UNCAPPED, Result, RunSpec

__all__ = ["run_matrix", "check_resume", "graph_identity"]


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _group(pgid: int) -> Iterator[tuple[Path, str]]:
    """``/proc/<pid>`` and the state letter of every process in process group ``pgid`` (a
    run's launcher and its workers: the run starts its own group)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            state, _, pg = (d / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue     # gone between the listing and the read
        if int(pg) == pgid:
            yield d, state


def _group_rss_mb(pgid: int) -> list[float]:
    """Resident MiB of every process in process group ``pgid``."""
    out = []
    for d, _ in _group(pgid):
        try:
            out += [int(x.split()[1]) / 1024.0 for x in (d / "status").read_text().splitlines()
                    if x.startswith("VmRSS:")]
        except (OSError, ValueError, IndexError):
            continue     # gone since
    return out


def _stop_group(proc: subprocess.Popen) -> None:
    """Kill a run's process group and wait until none of it is left: the launcher is its
    child, but its workers die after it, and the caller then removes or reuses what they
    write into (advise's temporary directory, the run directory of a rerun)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:      # all of it had ended (a stop just after the run's end)
        pass
    proc.wait()
    deadline = time.monotonic() + 10.0
    while _group_left(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _group_left(pgid: int) -> int:
    """Processes of group ``pgid`` not yet dead (a zombie, dead and not yet reaped by its new
    parent, is not counted; one still exiting is, though its memory is already gone)."""
    return sum(state not in ("Z", "X") for _, state in _group(pgid))


def _wait(proc: subprocess.Popen, timeout_s: float, floor_mb: Optional[float]
          ) -> tuple[Optional[int], Optional[str], float]:
    """Wait for a run; (exit code or None when killed, why it was killed, the largest
    process's resident MiB seen). With ``floor_mb``, every half second: when the machine's
    available memory falls below it, the run's whole group is killed, so a run past what the
    machine holds is stopped and measured instead of taking the machine (and the study) down."""
    deadline, peak = time.monotonic() + timeout_s, 0.0
    while True:
        try:
            return proc.wait(timeout=0.5 if floor_mb else timeout_s), None, peak
        except subprocess.TimeoutExpired:
            pass
        why = None
        if time.monotonic() >= deadline:
            why = f"timed out after {timeout_s:g}s"
        elif floor_mb:
            sizes = _group_rss_mb(proc.pid)
            peak = max([peak, *sizes])
            avail = mem_available_mb()
            if avail < floor_mb:
                why = (f"stopped by the memory floor: {avail:.0f} MiB available, below "
                       f"--mem-floor {floor_mb:g} MiB; the run's {len(sizes)} process(es), "
                       f"the largest having reached {peak:.0f} MiB resident")
        if why:
            _stop_group(proc)
            return None, why, peak


def _run_one(spec: RunSpec, out: Path, timeout_s: float, log: Any,
             floor_mb: Optional[float] = None) -> dict[str, Any]:
    """The run's result, as its file will hold it."""
    run_dir = out / "runs" / spec.id
    summary_path = run_dir / "summary.json"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a previous, unfinished attempt
    summary_copy = out / "runs" / f"{spec.id}.summary.json"
    cmd = spec.command(run_dir, summary_copy)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log_path = out / "logs" / f"{spec.id}.log"
    t0 = time.perf_counter()
    status, error, killed, peak = "ok", None, None, 0.0
    with open(log_path, "w") as lf:
        lf.write((f"# on {spec.parts} emulated hosts, link {spec.link}; each host's torchrun "
                  f"agent runs: " if spec.link else "") + " ".join(cmd) + "\n")
        lf.flush()
        if spec.link:
            from ..runtime.netcluster import run_on_hosts
            try:   # each host's output kept beside the log as it runs (a stop keeps it)
                rc, cmd = run_on_hosts(spec.train_args(run_dir, summary_copy), spec.parts,
                                       None if spec.link == UNCAPPED else spec.link, spec.id,
                                       lf, timeout_s, out / "logs" / f"{spec.id}.hosts",
                                       # a failed host's peers: their own timeout to see it
                                       grace_s=float(spec.overrides.get(
                                           "runtime.timeout_s", 120.0)) + 30.0)
            except (RuntimeError, OSError) as exc:   # the hosts could not be built: this
                lf.write(f"emulated hosts: {exc}\n")  # run fails, the matrix goes on
                rc = 1
        else:   # own process group: a timeout kills the launcher and all its workers
            proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                rc, killed, peak = _wait(proc, timeout_s, floor_mb)
            except KeyboardInterrupt:   # Ctrl-C, and SIGTERM (quietgnn.cli raises it)
                _stop_group(proc)
                raise
    elapsed = time.perf_counter() - t0
    output = log_path.read_text(errors="replace")
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "")
    if rc is None:
        why = killed or f"timed out after {timeout_s:g}s"
        status, error = "failed", f"{why}\n{_tail(output)}"
    elif rc != 0:
        status, error = "failed", f"exit code {rc}: {last[:300]}\n{_tail(output)}"
    elif not summary_copy.is_file():
        status, error = "failed", f"finished without a summary\n{_tail(output)}"
    res: dict[str, Any] = {**spec.as_dict(), "status": status, "error": error,
                           "command": cmd, "elapsed_s": round(elapsed, 2),
                           "run_dir": str(run_dir), "finished_at": time.strftime("%FT%TZ",
                                                                                  time.gmtime())}
    if spec.link:
        res["host_cores"] = len(os.sched_getaffinity(0))
    if peak:
        res["peak_rss_seen_mb"] = round(peak, 1)
    if status == "ok":
        res["summary"] = loads_json(summary_copy.read_text())
        summary_copy.unlink()
        try:
            from .projection import epoch_curve
            from ..runtime.metrics import read_metrics
            res["curve"] = epoch_curve(read_metrics(run_dir)).to_json()
        except (ValueError, OSError, KeyError, TypeError, AttributeError) as exc:
            res["curve_error"] = f"{type(exc).__name__}: {exc}"
    elif summary_path.is_file():
        res["summary"] = loads_json(summary_path.read_text())
    log(f"  {status} in {elapsed:.1f}s" + ("" if status == "ok" else f": "
                                           f"{(error or '').splitlines()[0]}  (log: {log_path})"))
    return res


def run_matrix(specs: Sequence[RunSpec], out: str | Path, *, timeout_s: float = 3600.0,
               retry_failed: bool = False, log: Any = print,
               mem_floor_mb: Optional[float] = None,
               kept: Optional[dict[str, dict[str, Any]]] = None) -> list[Result]:
    """Run every spec not already done; returns all results (old and new) in matrix order.
    Each new result records the graph its run read (:func:`graph_identity`); a ValueError
    before any run starts refuses to skip runs done before on another graph than their
    dataset names now (:func:`check_resume`; ``kept``: what a caller's own call of it
    returned, not read again).
    ``mem_floor_mb``: a local run is killed (and recorded as failed, saying so) when the
    machine's available memory falls below it (:func:`_wait`).
    ``results.jsonl`` gains each new result as its run ends, and at the end every result of
    the matrix (one kept from before is written back as it was read)."""
    if not 0 < timeout_s < float("inf"):     # -5 'timed out' every run at once
        raise ValueError(f"run timeout {timeout_s!r}; expected a finite number of seconds > 0")
    out = Path(out)
    for sub in ("results", "runs", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    if kept is None:
        kept = check_resume(specs, out, retry_failed)     # before any run
    results = []
    for i, spec in enumerate(specs):
        old = kept.get(spec.id)
        if old is not None:
            log(f"[{i + 1}/{len(specs)}] {spec.id}: done before ({old['status']}), skipped")
            results.append((spec.id, old))
            continue
        log(f"[{i + 1}/{len(specs)}] {spec.id}")
        graph = graph_identity(spec)    # as the run starts (the file may change mid-study)
        res = _run_one(spec, out, timeout_s, log, mem_floor_mb)
        graph = graph or graph_identity(spec)    # a run that downloaded its dataset first
        if graph is not None:
            res.update(graph_id=graph[0], graph_path=graph[1])
        # atomic: a result file is either whole or absent (and never written through a link)
        atomic_write(out / "results" / f"{spec.id}.json",
                     json.dumps(res, separators=(",", ":"), default=str).encode())
        results.append((spec.id, res))
        _write_jsonl(out / "results.jsonl", results)   # a stop keeps it current
    _write_jsonl(out / "results.jsonl", results)
    return [Result.from_json(r) for _, r in results]


def check_resume(specs: Sequence[RunSpec], out: str | Path,
                 retry_failed: bool = False) -> dict[str, dict[str, Any]]:
    """The results under ``out`` that :func:`run_matrix` skips as done, by run id; a
    ValueError (one line) when one of them trained on another graph than its dataset names
    now (:func:`_check_graphs`): skipped, it would sit in one study beside runs on the new
    graph. Cheap (a ``stat`` per graph file once hashed): a command calls it with its other
    checks, before any run starts."""
    out = Path(out)
    kept = {spec.id: old for spec in specs
            if (old := _done_before(out / "results" / f"{spec.id}.json", retry_failed))}
    _check_graphs(specs, kept, out)
    return kept


def _done_before(path: Path, retry_failed: bool) -> Optional[dict[str, Any]]:
    """The result at ``path`` when its run is skipped as done (ok, or failed without
    ``retry_failed``); None when it is to be run (absent, torn by a crash while written)."""
    if not path.is_file():
        return None
    try:
        old = loads_json(path.read_text())
    except json.JSONDecodeError:
        return None
    status = Result.from_json(old).status if isinstance(old, dict) else None
    return old if status is not None and (status == "ok" or not retry_failed) else None


def graph_identity(spec: RunSpec) -> Optional[tuple[str, str]]:
    """(a 12-hex digest of the graph a run of ``spec`` reads, the file or folder it is read
    from), known without loading the graph: the sha256 of every file it is read from, taken
    from the stat-keyed table the partition cache keeps (``<cache>/file-hashes.json``: one
    ``stat`` per file once hashed, and the run itself hashes them for its book's key anyway),
    or a prepared directory's recorded fingerprint. The digest leaves the path out: a copy of
    the graph elsewhere is the same graph. None where nothing is read from files (synthetic:
    its settings are in the run's id) or the files are not there (the run says so itself)."""
    from ..datasets import dataset_files
    from ..runtime.books import _content_sha256
    prepared = spec.overrides.get("dataset.prepared")
    try:
        if prepared is not None:
            where = Path(str(prepared)).expanduser().resolve()
            book = loads_json((where / "book.json").read_text())
            graph = book.get("graph") or {}
            # its features too (the fingerprint holds structure, labels and split only)
            digests = [str(graph.get("fingerprint") or book["book_id"]),
                       str(graph.get("features_digest"))]
        else:
            files = dataset_files(spec.dataset, spec.root)
            if not files:
                return None
            digests = [_content_sha256(f) for f in files]
            first = files[0].resolve()
            # a graph file is itself; a named dataset (cora) is its root's
            where = first if first.name == Path(spec.dataset).name else \
                Path(spec.root or first.parent).expanduser().resolve()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    digest = hashlib.sha256(json.dumps(digests).encode()).hexdigest()
    # a prepared directory's id ("p...") and a graph file's are of two kinds: one graph read
    # both ways has two ids, which a report compares only kind with kind
    return ("p" + digest[:11] if prepared is not None else digest[:12]), str(where)


def _check_graphs(specs: Sequence[RunSpec], kept: dict[str, dict[str, Any]], out: Path) -> None:
    """Refuse, in one line, to skip finished runs that trained on another graph than the one
    their dataset names now (the file rewritten since, or another file of that name from
    another directory): skipped, they would sit in one study beside runs on the new graph. A
    result written before graphs were recorded, or whose graph cannot be read now, is skipped
    as it always was."""
    now_of: dict[str, Optional[tuple[str, str]]] = {}
    stale: dict[tuple[Any, ...], list[str]] = {}
    failed = False
    for spec in specs:
        old = kept.get(spec.id) or {}
        then = old.get("graph_id")
        if not isinstance(then, str):
            continue
        key = json.dumps([spec.dataset, spec.root, spec.overrides.get("dataset.prepared")],
                         default=str)
        if key not in now_of:       # one look per graph, not per run
            now_of[key] = graph_identity(spec)
        now = now_of[key]
        if now is None or now[0] == then:
            continue
        stale.setdefault((spec.dataset, old.get("graph_path"), then, *now), []).append(spec.id)
        failed = failed or old.get("status") != "ok"
    if not stale:
        return
    said = []
    for (name, then_path, then_id, now_id, now_path), ids in stale.items():
        what = f"{now_path} changed since they ran" if then_path == now_path else \
            f"it is {now_path} now, they ran on {then_path}"
        said.append(f"{len(ids)} run(s) done before ({', '.join(ids[:3])}"
                    f"{', ...' if len(ids) > 3 else ''}) trained on another graph than "
                    f"{name!r} is now: {what} (graph {then_id} then, {now_id} now)")
    raise ValueError(f"{'; '.join(said)}; skipping them as done would mix two graphs in "
                     f"{str(out)!r}: give another --out, or delete their results/<id>.json "
                     f"to rerun them on this graph"
                     f"{' (--retry-failed reruns the failed ones)' if failed else ''}")


def _write_jsonl(path: Path, results: list[tuple[str, dict[str, Any]]]) -> None:
    """``results.jsonl``: what it held before, each of ``results`` in its run's place (new
    runs after), so that a run of part of a matrix (``--strategies``, ``--datasets``) adds to
    the study instead of replacing it; written whole to a temporary file, then moved."""
    lines: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rid = loads_json(line).get("id")    # the id alone: no curve parsed
            except (json.JSONDecodeError, AttributeError):
                continue        # a torn or foreign line: the result files are the record
            if rid:
                lines[rid] = line
    for rid, r in results:
        lines[rid] = json.dumps(r, separators=(",", ":"), default=str)
    atomic_write(path, "".join(line + "\n" for line in lines.values()).encode())
