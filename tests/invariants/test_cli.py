"""`python -m invariants`: reports on disk, the terminal table, exit status, and one-line errors."""

import json
import re
import subprocess
import sys

import pytest

from invariants.__main__ import main
from tests.helpers import REPO

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SMALL = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50"


def test_a_failing_model_exits_1_and_its_report_names_the_failure_and_its_replay(tmp_path, capsys):
    spec = f"mutant:no_causal_mask,{SMALL}"
    status = main(["--model", spec, "--only", "causal_future_tokens,loss_pad_normalisation", "--out", str(tmp_path)])
    assert status == 1
    doc = json.loads(
        (tmp_path / f"mutant-no_causal_mask-{SMALL.replace(',', '-').replace('=', '-')}.partial.json").read_text()
    )
    assert doc["model"] == spec and doc["torch"] and doc["commit"] and doc["date"]
    (leak, loss) = doc["properties"]
    assert (leak["name"], leak["verdict"], loss["verdict"]) == ("causal_future_tokens", "fail", "pass")
    assert leak["worst_error"] > leak["tolerance"] == 0.0 and leak["examples"] >= 1
    assert "--only causal_future_tokens" in leak["reproduce"]
    md = next(tmp_path.glob("*.md")).read_text()
    assert re.search(r"\| 1 +\| `causal_future_tokens` +\| FAIL", md) and "replay:" in md
    out = capsys.readouterr().out
    assert "causal_future_tokens" in out and "FAIL" in out and "1 pass, 1 fail" in out


def test_a_passing_model_exits_0(tmp_path):
    assert (
        main(
            [
                "--model",
                f"reference,{SMALL}",
                "--only",
                "pe_exact_values,params_tied_embeddings",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )


def test_without_out_every_model_is_reported_under_runs_never_among_the_published_reports(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("from model import Transformer\n\ndef build(cfg):\n    return Transformer(cfg)\n")
    assert main(["--model", f"mine.py:build,{SMALL}", "--only", "pe_exact_values"]) == 0
    assert "report runs/invariants/mine" in capsys.readouterr().out
    assert main(["--model", f"reference,{SMALL}", "--only", "pe_exact_values"]) == 0
    assert "report runs/invariants/reference" in capsys.readouterr().out
    assert {p.parent.name for p in tmp_path.rglob("*.md")} == {"invariants"}
    assert not (tmp_path / "reports").exists()  # published reports change only with --out reports/invariants


def test_strict_makes_not_applicable_exit_1_and_the_summary_line_says_why(tmp_path, capsys):
    args = [
        "--model",
        f"reference,{SMALL},P_drop=0.0",
        "--only",
        "dropout_active,params_tied_embeddings",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    assert "1 not applicable" in capsys.readouterr().out
    assert main([*args, "--strict"]) == 1
    assert (
        "not applicable: dropout_active (config P_drop=0.0: there is no dropout to observe)" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "nope"], "unknown model 'nope'"),
        (["--only", "no_such_property"], "unknown property no_such_property; valid: causal_future_tokens"),
        (["--only", "dropout_every_sublayer"], "dropout_every_sublayer: renamed dropout_sites"),
        (["--only", "lr_schedule"], "lr_schedule: not a property of the model: eq. (3) is the trainer's"),
        (["--replay", "garbage", "--only", "params_base"], "is not a line @reproduce_failure"),
        (["--seed", "3", "--profile", "ci"], "--seed has no effect under the derandomized profile ci"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.slow
def test_module_entry_point_reports_a_bad_spec_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "invariants", "--model", "mutant:nope"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: model spec 'mutant:nope': unknown mutant 'nope'; valid mutants:")
    assert proc.stderr.count("\n") == 1


def test_ctrl_c_is_one_line_exit_130_and_writes_no_report(tmp_path, capsys):
    plugin = tmp_path / "stops.py"
    # Ctrl-C while the model loads: a real SIGINT, which the run handles whatever its parent (nox) left in place
    plugin.write_text("import os, signal\n\ndef make(cfg):\n    os.kill(os.getpid(), signal.SIGINT)\n")
    assert main(["--model", f"{plugin}:make", "--out", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err == "stopped by SIGINT: no report written; run the same command again\n"
    assert not (tmp_path / "out").exists()


def test_a_report_folder_it_cannot_write_is_one_line_before_any_check_runs(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["--out", str(blocker / "reports")]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: --out {blocker / 'reports'}: cannot write there ({blocker} is not a writable folder)"
    )


def test_the_invariants_dependency_group_pins_what_the_package_and_its_extras_pin():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    listed = [*project["dependencies"], *(pin for pins in project["optional-dependencies"].values() for pin in pins)]
    pins = dict(pin.split("==") for pin in listed if "==" in pin)
    group = dict(pin.split("==") for pin in pyproject["dependency-groups"]["invariants"])
    assert group and all(pins[name] == version for name, version in group.items())


@pytest.mark.slow
def test_the_checks_import_nothing_beyond_the_invariants_dependency_group(tmp_path):
    # nox -s invariants installs only that group: a check importing the ablations' or the tests' libraries breaks it.
    code = (
        "import sys\nfrom invariants.__main__ import main\n"
        f"main(['--model', 'reference,{SMALL}', '--only', 'causal_future_tokens,ffn_relu', '--out', {str(tmp_path)!r}])\n"
        "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    loaded = set(proc.stdout.split("\n")[-2].split())
    assert "torch" in loaded and "hypothesis" in loaded, proc.stderr[-2000:]
    elsewhere = {"pandas", "matplotlib", "seaborn", "sacrebleu", "sentencepiece", "jinja2", "transformers", "pytest"}
    assert not loaded & (elsewhere | {"submitit"})
