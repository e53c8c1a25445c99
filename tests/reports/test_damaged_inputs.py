"""`python -m reports` skips a damaged input with one warning naming the file, and keeps every section it can build."""

import json

import pytest

from invariants import report
from invariants.engine import PASS, Result
from reports import glance
from reports import inputs as inputs_module
from reports.__main__ import main
from reports.inputs import load_invariants

DAMAGES = {
    "truncated": b'{"model": "hf-bart", "verdicts": {"pass": 3',
    "a list": b"[]",
    "not UTF-8": b'{"model": "\xff\xfe"}',
    "foreign JSON object": b'{"model": "x", "properties": 5}',
}


def invariants_folder(tmp_path, damage: bytes, kill_matrix: bytes | None = None):
    """A folder with one good report (reference), one damaged one (hf-bart), a partial run, and a kill matrix."""
    folder = tmp_path / "invariants"
    results = [Result("params_base", "5 parameters", "", PASS, 0.0, 0.0, "at_most", "", 1)]
    report.write(report.document("reference", results, "ci", "python -m invariants", 1.0), folder)
    report.write(
        report.document("reference", results, "ci", "replay", 1.0, partial="1 of 37 properties (--only)"), folder
    )
    (folder / "hf-bart.json").write_bytes(damage)
    matrix = {"mutants": ["m"], "properties": ["params_base"], "verdicts": {"m": {"params_base": "fail"}}}
    (folder / "kill_matrix.json").write_bytes(kill_matrix if kill_matrix is not None else json.dumps(matrix).encode())
    return folder


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(inputs_module, "_WARNED", set())


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_a_damaged_report_is_one_warning_and_the_other_models_stay(tmp_path, capsys, damage):
    folder = invariants_folder(tmp_path, damage)
    inv = load_invariants(folder)
    rows = glance.invariants_rows(folder, tmp_path)
    assert [r.model for r in inv.models] == ["reference"] and len(inv.kills) == 1  # the partial run is not a model
    assert len(rows) == 1 and "`reference`" in rows[0]
    err = capsys.readouterr().err
    assert err.count("warning: skipping") == 1 and "hf-bart.json" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "damage", [b'{"mutants": ["m"], "prop', b"[]", b"\xff\xfe"], ids=["truncated", "list", "bytes"]
)
def test_a_damaged_kill_matrix_is_one_warning_and_the_models_stay(tmp_path, capsys, damage):
    folder = invariants_folder(tmp_path, b'{"model": "hf-bart", "verdicts": {}, "properties": []}', damage)
    inv = load_invariants(folder)
    assert len(inv.kills) == 0 and [r.model for r in inv.models] == ["hf-bart", "reference"]
    assert glance.kill_matrix_row(folder, tmp_path) is None
    err = capsys.readouterr().err
    assert err.count("warning: skipping") == 1 and "kill_matrix.json" in err


def test_the_index_keeps_the_invariants_section_when_one_report_is_damaged(tmp_path, capsys):
    folder = invariants_folder(tmp_path, DAMAGES["truncated"])
    out = tmp_path / "reports"
    assert main(["--results", str(tmp_path / "none"), "--invariants", str(folder), "--out", str(out)]) == 0
    index = (out / "README.md").read_text()
    assert "Invariants" in index and "reference (Markdown)" in index and "hf-bart" not in index
    assert capsys.readouterr().err.count("hf-bart.json") == 1
