"""`quietgnn report` on input that is not what it should be: one line naming the file, the
line and the field, or the option, and exit 2 (never a traceback nor a wrong table)."""

from __future__ import annotations

import json
import shutil

import pytest

from quietgnn.analysis import report


def _row(**over):
    row = {"id": "a", "dataset": "d", "model": "gcn", "strategy": "halo",
           "strategy_name": "halo", "parts": 2, "status": "ok", "seed": 0,
           "summary": {"test_acc": 0.5, "epochs": 2, "train_bytes_per_epoch": 100.0}}
    for k, v in over.items():
        if k.startswith("summary."):
            row["summary"][k.split(".", 1)[1]] = v
        else:
            row[k] = v
    return row


def _err(capsys) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("field,value,says", [
    ("parts", "two", "field 'parts' is str \"two\", expected an integer"),
    ("parts", 2.5, "field 'parts' is float 2.5, expected an integer"),
    ("summary.test_acc", "high", "field 'summary.test_acc' is str \"high\", expected a number"),
    ("summary", "x", "field 'summary' is str \"x\", expected a mapping"),
    ("summary.bytes_sent_by_class", {"features": "a lot"},
     "field 'summary.bytes_sent_by_class.features' is str \"a lot\", expected an integer"),
])
def test_a_result_line_of_another_type_is_named_by_file_line_and_field(tmp_path, capsys, field,
                                                                       value, says):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(_row(id="ok")) + "\n" + json.dumps(_row(**{field: value})) + "\n")
    assert report.cli_main([str(tmp_path), "--no-plots"]) == 2
    err = _err(capsys)
    assert f"{str(path)!r} line 2: {says}; correct or remove that line" in err
    assert not (tmp_path / "report").exists()
    # the good line alone is reported; an integral float is an integer (a JSON writer's 4e6)
    path.write_text(json.dumps(_row(parts=2.0)) + "\n\n")
    assert report.cli_main([str(tmp_path), "--no-plots"]) == 0


def test_lines_that_are_no_json_object_are_named_by_line(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    for text, says in (('{"id": \n', "line 1 is not JSON"),
                       (json.dumps(_row()) + "\n[1, 2]\n", "line 2 holds a list, expected a "
                                                           "JSON object")):
        path.write_text(text)
        assert report.cli_main([str(path), "--out", str(tmp_path / "r"), "--no-plots"]) == 2
        assert f"{str(path)!r} {says}" in _err(capsys)
        assert not (tmp_path / "r").exists()          # no --out folder left made, empty


def test_report_names_what_is_wrong_with_its_options(tmp_path, capsys):
    """A missing input is named as missing (not as a missing --out); --target-acc is an
    accuracy; --out naming a file is refused before anything is written."""
    assert report.cli_main([str(tmp_path / "nonexistent")]) == 2
    assert f"results path {str(tmp_path / 'nonexistent')!r} does not exist" in _err(capsys)
    study = tmp_path / "study"
    study.mkdir()
    (study / "results.jsonl").write_text(json.dumps(_row()) + "\n")
    for bad in ("5", "0", "-0.5", "nan"):
        assert report.cli_main([str(study), "--target-acc", bad, "--no-plots"]) == 2
        assert "expected a test accuracy in (0, 1]" in _err(capsys)
    assert report.cli_main([str(study), "--target-acc", "0.4", "--no-plots"]) == 0
    capsys.readouterr()
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert report.cli_main([str(study), "--out", str(afile), "--no-plots"]) == 2
    assert f"--out {str(afile)!r} is a file; expected a folder" in _err(capsys)
    assert afile.read_text() == "mine"
    shutil.rmtree(study / "report")
    (study / "report").write_text("mine")                    # inside the input folder
    assert report.cli_main([str(study), "--no-plots"]) == 2
    assert f"{str(study / 'report')!r} is a file, expected a folder" in _err(capsys)
    assert (study / "report").read_text() == "mine"


def test_a_report_that_could_not_be_written_leaves_no_folder_it_made(tmp_path, capsys,
                                                                     monkeypatch):
    """On a full disk the report left its new --out folder behind, with the files it had
    written; one that existed keeps what it held."""
    from quietgnn.safefiles import WriteError, write_below
    (tmp_path / "results.jsonl").write_text(json.dumps(_row()) + "\n")

    def full_at_json(root, parts, fix=""):
        if parts[-1] == "report.json":
            raise WriteError(28, f"could not write 'report.json': No space left on device{fix}")
        return write_below(root, parts, fix)

    monkeypatch.setattr(report, "write_below", full_at_json)
    out = tmp_path / "new" / "deeper"
    assert report.cli_main([str(tmp_path), "--out", str(out), "--no-plots"]) == 1
    assert "No space left on device" in _err(capsys) and not (tmp_path / "new").exists()
    out.mkdir(parents=True)
    (out / "mine.txt").write_text("x")
    assert report.cli_main([str(tmp_path), "--out", str(out), "--no-plots"]) == 1
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt", "report.md"]
