"""A bench matrix of the wrong shape: refused before any run starts, in one line (exit 2)
naming the key, what it holds and what was expected (``quietgnn bench --dry-run``, in
process)."""

from __future__ import annotations

import pytest

from quietgnn.cli import main

HEAD = "datasets: [synthetic]\nstrategies: [halo]\nparts: [2]\n"


def _bench(tmp_path, capsys, text: str, *flags: str) -> tuple[int, str]:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text)
    rc = main(["bench", "--matrix", str(matrix), "--out", str(tmp_path / "out"), *flags,
               "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return rc, err


@pytest.mark.parametrize("text, says", [
    (HEAD + "set: [1, 2]\n", "matrix key 'set' = [1, 2]; expected a mapping of config keys"),
    (HEAD + "set: abc\n", "matrix key 'set' = 'abc'; expected a mapping of config keys"),
    (HEAD + "set: {1: 2}\n", "matrix key 'set': key 1 is not a name; expected a mapping"),
    ("datasets: [{name: synthetic, set: 5}]\nstrategies: [halo]\n",
     "matrix datasets entry 'synthetic': 'set' = 5; expected a mapping of config keys"),
    ("datasets: [synthetic]\nstrategies: [{name: halo, options: [1]}]\n",
     "matrix strategies entry 'halo': 'options' = [1]; expected a mapping of the strategy's"),
    ("datasets: [synthetic]\nstrategies: [{name: halo, set: x}]\n",
     "matrix strategies entry 'halo': 'set' = 'x'; expected a mapping"),
    ("datasets: [synthetic]\nstrategies: [{name: halo, label: [1]}]\n",
     "matrix strategies entry 'halo': label = [1]; expected a string"),
    ("datasets: [{name: synthetic, root: 5}]\nstrategies: [halo]\n",
     "matrix datasets entry 'synthetic': root = 5; expected a string"),
])
def test_a_set_or_options_of_another_type_is_named(tmp_path, capsys, text, says):
    """were TypeError tracebacks, or 'dictionary update sequence element #0 has length 1'"""
    rc, err = _bench(tmp_path, capsys, text)
    assert rc == 2 and says in err, err


def test_a_set_of_another_type_is_named_when_set_flags_are_added(tmp_path, capsys):
    rc, err = _bench(tmp_path, capsys, HEAD + "set: abc\n", "--set", "train.epochs=2")
    assert rc == 2 and "matrix key 'set' = 'abc'" in err, err


@pytest.mark.parametrize("key", ["runtime.out_dir", "runtime.summary_json", "runtime.overwrite",
                                 "runtime.run_name", "runtime.progress", "runtime.resume", "dataset.name", "dataset.root",
                                 "partition.parts", "model.arch", "train.seed"])
def test_a_key_the_runner_sets_is_refused_in_set(tmp_path, capsys, key):
    """runtime.out_dir wrote runs outside 'out' (results.jsonl's run_dir missing),
    runtime.summary_json recorded an ok run as 'finished without a summary'"""
    says = f"{key} is set by quietgnn bench itself for every run"
    rc, err = _bench(tmp_path, capsys, HEAD + f"set: {{{key}: x}}\n")
    assert rc == 2 and f"matrix key 'set' (or --set): {says}" in err, err
    rc, err = _bench(tmp_path, capsys, HEAD, "--set", f"{key}=x")
    assert rc == 2 and says in err, err
    rc, err = _bench(tmp_path, capsys, f"datasets: [{{name: synthetic, set: {{{key}: x}}}}]\n"
                                       f"strategies: [halo]\n")
    assert rc == 2 and f"datasets entry 'synthetic': 'set': {says}" in err, err
    rc, err = _bench(tmp_path, capsys, f"datasets: [synthetic]\n"
                                       f"strategies: [{{name: halo, set: {{{key}: x}}}}]\n")
    assert rc == 2 and f"strategies entry 'halo': 'set': {says}" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, flags, says", [
    (HEAD + "epochs: abc\n", (), "matrix key 'epochs' (or --epochs) = 'abc'; expected an "
                                 "integer >= 1"),
    (HEAD + "epochs: 2.5\n", (), "matrix key 'epochs' (or --epochs) = 2.5; expected"),
    (HEAD, ("--epochs", "0"), "matrix key 'epochs' (or --epochs) = 0; expected"),
    (HEAD + "run_timeout_s: abc\n", (), "the matrix's run_timeout_s = 'abc'; expected a "
                                        "finite number of seconds > 0"),
    (HEAD + "run_timeout_s: -5\n", (), "the matrix's run_timeout_s = -5; expected"),
    (HEAD + "run_timeout_s: .inf\n", (), "the matrix's run_timeout_s = inf; expected"),
    (HEAD + "run_timeout_s: true\n", (), "the matrix's run_timeout_s = True; expected"),
    (HEAD, ("--run-timeout", "0"), "--run-timeout = 0.0; expected a finite number of seconds "
                                   "> 0 before a run is killed (e.g. 1800; there is no 'no "
                                   "limit'"),
    (HEAD + "run_timeout_s: 60\n", ("--run-timeout", "-1"), "--run-timeout = -1.0; expected"),
])
def test_bad_epochs_and_run_timeouts_are_named(tmp_path, capsys, text, flags, says):
    """'invalid literal for int()' named no key; -5 'timed out' every run at once; --run-timeout
    0 silently became an hour"""
    rc, err = _bench(tmp_path, capsys, text, *flags)
    assert rc == 2 and says in err, err


def test_the_run_timeout_reaches_the_runner(tmp_path, monkeypatch):
    from quietgnn.analysis import bench
    seen = {}
    monkeypatch.setattr(bench, "run_matrix", lambda specs, out, **kw: seen.update(kw) or [])
    (tmp_path / "m.yaml").write_text(HEAD + "run_timeout_s: 1e3\nepochs: 2\n")
    assert main(["bench", "--matrix", str(tmp_path / "m.yaml"), "--out",
                 str(tmp_path / "o")]) == 0
    assert seen["timeout_s"] == 1000.0
    assert main(["bench", "--matrix", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "o"),
                 "--run-timeout", "7"]) == 0
    assert seen["timeout_s"] == 7.0
    from quietgnn.analysis.runner import run_matrix
    with pytest.raises(ValueError, match="run timeout -5; expected a finite number"):
        run_matrix([], tmp_path / "o", timeout_s=-5)


@pytest.mark.parametrize("text, says", [
    ("datasets: [{name: synthetic, label: " + "x" * 300 + "}]\nstrategies: [halo]\n",
     "matrix datasets entry 'synthetic': label 'xxx"),
    ("datasets: [synthetic]\nstrategies: [{name: halo, label: " + "é" * 130 + "}]\n",
     "label 'ééé"),
    ("datasets: [synthetic]\nstrategies: [halo]\nmodels: [" + "m" * 250 + "]\n",
     "matrix models entry 'mmm"),
    ("datasets: [{name: synthetic, label: " + "x" * 120 + "}]\nstrategies: [{name: halo, "
     "label: " + "y" * 120 + "}]\n", "run id 'xxx"),
    ("datasets: [synthetic]\nstrategies: [halo]\nseeds: [" + "9" * 240 + "]\n", "run id 'syn"),
])
def test_a_label_too_long_for_a_file_name_is_refused_at_load(tmp_path, capsys, text, says):
    """a label over 255 bytes was an ENAMETOOLONG traceback once its run started"""
    rc, err = _bench(tmp_path, capsys, text)
    assert rc == 2 and says in err and "255 bytes" in err, err
    assert len(err) < 500 and not (tmp_path / "out").exists()


def test_a_label_with_a_nul_is_refused_at_load(tmp_path, capsys):
    """was a ValueError ('embedded null byte') from the runner, mid-study"""
    from quietgnn.analysis.matrix import build_matrix
    rc, err = _bench(tmp_path, capsys, 'datasets: [{name: synthetic, label: "a\\0b"}]\n'
                                       'strategies: [halo]\n')
    assert rc == 2 and "datasets[0].label = 'a\\x00b' holds a NUL character" in err, err
    for m, says in [({"datasets": [{"name": "synthetic", "label": "a\0b"}]},
                     "matrix datasets entry 'synthetic': label 'a\\x00b' holds a NUL"),
                    ({"datasets": ["syn\0"]}, "matrix datasets entry 'syn\\x00' holds a NUL"),
                    ({"datasets": ["synthetic"], "models": ["g\0"]}, "models entry 'g\\x00'")]:
        with pytest.raises(ValueError, match=says.replace("\\", "\\\\").replace("'", ".")):
            build_matrix({"strategies": ["halo"], **m})
    # the longest id that fits is accepted
    from quietgnn.analysis.matrix import MAX_ID_BYTES
    assert MAX_ID_BYTES == 220        # .<id>.summary.json.tmp-<pid>-<8 hex> fits in 255 bytes
    label = "x" * (220 - len("synthetic-gcn--p4-s0-123456"))
    (spec,) = build_matrix({"datasets": ["synthetic"], "strategies": [{"name": "halo",
                                                                        "label": label}]})
    assert len(spec.id.encode()) == 220
    with pytest.raises(ValueError, match="is 221 bytes"):
        build_matrix({"datasets": ["synthetic"], "strategies": [{"name": "halo",
                                                                 "label": label + "y"}]})


def test_values_echoed_by_bench_are_cut(tmp_path, capsys):
    huge = "[" + ", ".join(map(str, range(50_000))) + "]"
    for text, flags in [(HEAD + f"mem_floor_mb: {huge}\n", ()),
                        (HEAD + f"set: {huge}\n", ()),
                        (HEAD, ("--options", "nope.x=" + "y" * 50_000))]:
        rc, err = _bench(tmp_path, capsys, text, *flags)
        assert rc == 2 and len(err) < 300, err


def test_a_seed_out_of_range_is_refused_before_the_first_run():
    """A matrix's seeds reach each run as --seed: `seeds: [-1]` passed the up-front check and
    every run then exited 2 on its own."""
    from quietgnn.analysis.matrix import build_matrix, check_settings
    specs = build_matrix({"datasets": ["synthetic"], "strategies": ["halo"], "seeds": [0, -1]})
    with pytest.raises(ValueError, match=r"train.seed = -1; expected an integer in "):
        check_settings(specs)
