"""The graph each bench run read (``graph_id``, ``graph_path`` of its result): a resumed
study does not skip runs done on another graph than its dataset names now, and a report does
not mix two graphs of one dataset name. In process, on graph files of a few bytes (what a run
read is known from the files' content, without loading them) and fake runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from quietgnn.analysis import report, runner
from quietgnn.analysis.inputs import load_results
from quietgnn.analysis.matrix import build_matrix


def _study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list[str]]:
    """Two runs on ``graph.npz`` as typed (a relative path); runs only record what ran."""
    specs = build_matrix({"datasets": ["graph.npz"], "strategies": ["centralized", "halo"],
                          "parts": [2]})
    ran: list[str] = []

    def fake(spec, out, timeout_s, log, floor_mb=None):
        ran.append(spec.id)
        return {**spec.as_dict(), "status": "ok", "error": None, "run_dir": None}
    monkeypatch.setattr(runner, "_run_one", fake)
    return specs, ran


def _graph(folder: Path, content: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph.npz").write_bytes(content)


def test_a_resumed_study_refuses_runs_done_on_a_graph_rewritten_since(tmp_path, monkeypatch):
    specs, ran = _study(tmp_path, monkeypatch)
    out = tmp_path / "bench"
    _graph(tmp_path / "a", b"graph one")
    monkeypatch.chdir(tmp_path / "a")
    got = runner.run_matrix(specs, out, log=lambda m: None)
    assert len(ran) == 2
    # each result names the graph: a short digest of its content, and where it lies
    assert {r.graph_path for r in got} == {str((tmp_path / "a" / "graph.npz").resolve())}
    first = got[0].graph_id
    assert len(first) == 12 and got[1].graph_id == first
    # rerun as it is: skipped as done, as before
    runner.run_matrix(specs, out, log=lambda m: None)
    assert len(ran) == 2
    # the graph rewritten in place, the same command rerun: refused before any run, in one
    # line naming the runs, the file, what changed and the fix
    (tmp_path / "a" / "graph.npz").write_bytes(b"graph one, edited")
    with pytest.raises(ValueError) as err:
        runner.run_matrix(specs, out, log=lambda m: None)
    msg = str(err.value)
    assert "\n" not in msg and len(ran) == 2
    assert f"2 run(s) done before ({specs[0].id}, {specs[1].id})" in msg
    assert f"{tmp_path / 'a' / 'graph.npz'} changed since they ran (graph {first} then" in msg
    assert "another --out" in msg and "results/<id>.json" in msg
    # a result written before graphs were recorded is skipped as it always was
    for spec in specs:
        path = out / "results" / f"{spec.id}.json"
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                                    if not k.startswith("graph_")}))
    runner.run_matrix(specs, out, log=lambda m: None)
    assert len(ran) == 2


def test_a_study_resumed_from_another_directory_refuses_its_other_graph_npz(tmp_path,
                                                                            monkeypatch, capsys):
    specs, ran = _study(tmp_path, monkeypatch)
    out = tmp_path / "bench"
    _graph(tmp_path / "a", b"graph one")
    _graph(tmp_path / "b", b"another graph")
    monkeypatch.chdir(tmp_path / "a")
    runner.run_matrix(specs[:1], out, log=lambda m: None)
    # from b, where graph.npz is another file: the run done on a's is not skipped
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(ValueError, match=re.escape(
            f"1 run(s) done before ({specs[0].id}) trained on another graph than 'graph.npz' "
            f"is now: it is {tmp_path / 'b' / 'graph.npz'} now, they ran on "
            f"{tmp_path / 'a' / 'graph.npz'}")):
        runner.run_matrix(specs, out, log=lambda m: None)
    assert len(ran) == 1           # not even the run not done yet
    # through the command (a dry run too): exit 2, one line, before anything runs
    from quietgnn.analysis.bench import cli_main as bench_main
    assert bench_main(["--datasets", "graph.npz", "--strategies", "centralized,halo",
                       "--parts", "2", "--out", str(out), "--dry-run"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "trained on another graph than 'graph.npz'" in lines[0]
    # a copy of the same graph elsewhere is the same graph: skipped, the other run runs
    shutil.copy(tmp_path / "a" / "graph.npz", tmp_path / "b" / "graph.npz")
    got = runner.run_matrix(specs, out, log=lambda m: None)
    assert ran == [specs[0].id, specs[1].id] and len({r.graph_id for r in got}) == 1


def _result(rid: str, strategy: str, graph_id: str | None, acc: float) -> dict:
    rows = [{"epoch": e, "work": 1.0, "compute_s": 0.5, "hops": 2, "crit_bytes": 1e6,
             "rounds": 1, "train_bytes": 4e6, "wall_s": 1.0, "comm_s": 0.1, "eval_s": 0.0,
             "test_acc": acc, "val_acc": acc, "train_acc": acc, "peak_rss_mb": 100.0}
            for e in range(3)]
    graph = {"graph_id": graph_id, "graph_path": f"/data/{graph_id}/graph.npz"} \
        if graph_id else {}
    return {"id": rid, "dataset": "graph.npz", "dataset_name": "graph.npz", "model": "gcn",
            "strategy": strategy, "strategy_name": strategy, "parts": 2, "seed": 0,
            "status": "ok", "curve": {"setup": {}, "epochs": rows}, **graph,
            "summary": {"test_acc": acc, "train_bytes_per_epoch": 4e6, "peak_rss_mb": 100.0,
                        "epochs": 3}}


def _folder(tmp_path: Path, name: str, runs: list[dict]) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    return d


def test_a_report_refuses_two_graphs_of_one_dataset_name(tmp_path, capsys):
    a = _folder(tmp_path, "bench_a", [_result("cen", "centralized", "aaaaaaaaaaaa", 0.9),
                                      _result("halo", "halo", "aaaaaaaaaaaa", 0.9)])
    c = _folder(tmp_path, "bench_c", [_result("halo", "halo", "cccccccccccc", 0.4)])
    with pytest.raises(ValueError) as err:
        load_results([a, c])
    msg = str(err.value)
    assert "\n" not in msg and f"{str(a)!r} and {str(c)!r} hold runs of dataset 'graph.npz' " \
        f"on two different graphs" in msg
    assert "/data/aaaaaaaaaaaa/graph.npz" in msg and "/data/cccccccccccc/graph.npz" in msg
    assert "label them apart (matrix datasets: - {name: graph.npz, label: ...}" in msg
    # through the command: exit 2, one line, nothing written
    assert report.cli_main([str(a), str(c), "--out", str(tmp_path / "r"), "--no-plots"]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and "two different graphs" in err_lines[0]
    assert not (tmp_path / "r").exists()
    # within one input too (a study whose graph was rewritten mid-way)
    both = _folder(tmp_path, "mixed", [_result("cen", "centralized", "aaaaaaaaaaaa", 0.9),
                                       _result("halo", "halo", "cccccccccccc", 0.4)])
    with pytest.raises(ValueError, match=re.escape(f"{str(both)!r} holds runs of dataset")):
        load_results([both])
    # one graph (or results that record none): merged as before, the later run replacing
    same = _folder(tmp_path, "same", [_result("halo2", "halo", "aaaaaaaaaaaa", 0.8)])
    got = {r.id: r.summary.test_acc for r in load_results([a, same])}
    assert got == {"cen": 0.9, "halo2": 0.8}          # the later run replaces its cell
    old = _folder(tmp_path, "old", [_result("halo3", "halo", None, 0.7)])
    got = {r.id: r.summary.test_acc for r in load_results([a, old])}
    assert got == {"cen": 0.9, "halo3": 0.7}          # nothing recorded: nothing compared


def test_a_prepared_directory_and_its_files_are_not_compared_and_a_reference_is(tmp_path):
    """One dataset read from its files by some runs and from a prepared directory by others
    has two ids of two kinds: not two graphs. A --reference of another graph sets the target
    of these runs: compared with them like any input."""
    a = _folder(tmp_path, "a", [_result("cen", "centralized", "aaaaaaaaaaaa", 0.9)])
    p = _folder(tmp_path, "p", [_result("halo", "halo", "pbbbbbbbbbbb", 0.9)])
    assert {r.id for r in load_results([a, p])} == {"cen", "halo"}
    c = _folder(tmp_path, "c", [_result("cen2", "centralized", "cccccccccccc", 0.4)])
    with pytest.raises(ValueError, match="two different graphs"):
        load_results([a], check_with=[c])
    assert report.cli_main([str(a), "--reference", str(c), "--out", str(tmp_path / "r"),
                            "--no-plots"]) == 2
