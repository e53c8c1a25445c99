"""The pytest plugin: each property one test item named after it, its verdict a pytest outcome, in a user's project.

Each test runs pytest as a user would, in a process of its own, in a temporary project outside the repository, with
`python -m pytest`: that puts the project first on sys.path, where its model.py would hide the harness's `model`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import settings

import pytest_aiayn
import torch
from invariants import device
from invariants import profiles
from invariants.lm.properties import LM_PROPERTIES
from invariants.suite import PROPERTIES
from tests.helpers import doc_block

REPO = Path(__file__).resolve().parents[2]
SMALL = "N=2,d_model=64,h=4,d_k=16,d_v=16,d_ff=128,vocab_size=1000"


def pytest_in(project: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m pytest ARGS` in project, with the suite's default hypothesis profile (none set in the environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE", "PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=project,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_plugin_is_an_entry_point_of_the_installed_package(tmp_path):
    # Asked from a folder of no project: a checkout's own *.egg-info would answer for the checkout, not the install.
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.metadata as m; "
            "print([e.value for e in m.entry_points(group='pytest11', name='aiayn-invariants')])",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.stdout.strip() == "['pytest_aiayn']", listed.stderr


@pytest.mark.slow
def test_the_documented_project_with_the_documented_bug_fails_the_seven_properties_that_catch_it(tmp_path):
    # The same project green, on the reference: tests/test_install.py, by the installed package.
    (tmp_path / "model.py").write_text(doc_block("# model.py, with a bug"))
    (tmp_path / "test_model.py").write_text(doc_block("# test_model.py"))
    red = pytest_in(tmp_path, "-q")
    assert red.returncode == 1 and f"7 failed, {len(PROPERTIES) - 7} passed" in red.stdout, (
        red.stdout[-3000:] + red.stderr[-2000:]
    )
    failure = red.stdout.split(" TestMyTransformer.causal_future_tokens ")[1]
    assert re.search(r"worst error [\d.]+, tolerance <= 0 \(float64; a masked key", failure)  # measured, bound, why
    assert (
        f"replay: aiayn-invariants --model '{tmp_path / 'model.py'}:make,{SMALL}' --only causal_future_tokens"
        in failure
    )


@pytest.mark.slow
def test_transformer_spec_collects_one_item_per_property_named_after_it(tmp_path):
    listed = pytest_in(tmp_path, "--collect-only", "-q", "--transformer-spec", f"reference,{SMALL}")
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    names = [line.rpartition("::")[2] for line in listed.stdout.splitlines() if line.startswith(f"reference,{SMALL}::")]
    assert names == [p.name for p in PROPERTIES]


@pytest.mark.slow
def test_a_decoder_only_model_gets_one_test_per_decoder_only_property(tmp_path):
    (tmp_path / "my_lm.py").write_text(
        "from model.lm.config import LMConfig\nfrom model.lm.reference import DecoderOnly\n\n\n"
        "def build(cfg: LMConfig) -> DecoderOnly:\n    return DecoderOnly(cfg)\n"
    )
    (tmp_path / "test_lm.py").write_text(
        "from pytest_aiayn import TransformerInvariants\n\n\n"
        "class TestMyLM(TransformerInvariants):\n    spec = 'my_lm.py:build'  # beside this file, by its annotation\n\n\n"
        "class TestBuggyLM(TransformerInvariants):\n    spec = 'lm-mutant:last_layer_bidirectional'\n"
    )
    run = pytest_in(tmp_path, "-q", "-k", "causal_future_tokens or softmax_rows")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert f"1 failed, 3 passed, {2 * len(LM_PROPERTIES) - 4} deselected" in run.stdout  # one test per property
    assert "FAILED test_lm.py::TestBuggyLM::causal_future_tokens" in run.stdout
    assert (
        "replay: aiayn-invariants --model 'lm-mutant:last_layer_bidirectional' --only causal_future_tokens"
        in run.stdout
    )


def test_a_decoder_only_model_asked_to_run_off_the_cpu_is_a_one_line_collection_error(monkeypatch):
    monkeypatch.setattr(device, "resolve", lambda text, option: torch.device("cuda"))  # as on a machine with CUDA
    where = SimpleNamespace(
        config=SimpleNamespace(getoption=lambda name: "cuda"), CollectError=pytest.Collector.CollectError
    )
    with pytest.raises(pytest.Collector.CollectError) as refused:
        pytest_aiayn.model_of("lm-reference", Path("."), where)
    assert str(refused.value) == (
        "error: --transformer-device cuda: the decoder-only checks run on the CPU for now; drop --transformer-device"
    )


@pytest.mark.slow
def test_a_fail_fails_not_applicable_skips_an_error_errs_and_k_picks_properties(tmp_path):
    (tmp_path / "broken.py").write_text(
        "from model import Transformer\n\n\nclass NoLoss(Transformer):\n    def loss(self, logits, target):\n"
        "        raise RuntimeError('loss not written yet')\n\n\ndef make(config):\n    return NoLoss(config)\n"
    )
    torch_nn = pytest_in(
        tmp_path,
        "-rs",
        "--transformer-spec",
        f"torch-nn,{SMALL}",
        "-k",
        "fully_padded_rows or cached_decoding or causal_future_tokens",
        "--hypothesis-profile",
        "dev",
        "--hypothesis-seed",
        "7",
    )
    assert f"1 failed, 1 passed, 2 skipped, {len(PROPERTIES) - 4} deselected" in torch_nn.stdout, torch_nn.stdout[
        -3000:
    ]
    assert (
        "cached_decoding not applicable: kv_cache: torch.nn.Transformer has no incremental decoding" in torch_nn.stdout
    )
    assert "--only fully_padded_rows --profile dev --seed 7" in torch_nn.stdout  # the user's profile and seed

    broken = pytest_in(tmp_path, "--transformer-spec", f"broken.py:make,{SMALL}", "-k", "loss_eps_zero_is_nll")
    assert "1 error" in broken.stdout and broken.returncode == 1, broken.stdout[-3000:]
    assert (
        "loss_eps_zero_is_nll broke on" in broken.stdout
        and "raised RuntimeError: loss not written yet" in broken.stdout
    )


@pytest.mark.slow
def test_a_bad_spec_is_a_one_line_collection_error(tmp_path):
    run = pytest_in(tmp_path, "--transformer-spec", "reference,heads=4")
    assert run.returncode == 2 and "error: model spec 'reference,heads=4': unknown config field 'heads'" in run.stdout


@pytest.mark.slow
def test_a_run_without_the_plugins_options_imports_nothing_of_the_harness_and_keeps_the_users_names(tmp_path):
    for package in ("model", "invariants", "reports"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("OURS = True\n")
    (tmp_path / "test_theirs.py").write_text(
        "import sys\n\nimport invariants\nimport model\nimport reports\n\n\n"
        "def test_the_names_are_the_users_and_the_harness_is_not_loaded():\n"
        "    assert model.OURS and invariants.OURS and reports.OURS\n"
        "    assert 'torch' not in sys.modules and 'hypothesis' not in sys.modules\n"
    )
    run = pytest_in(tmp_path, "-q", "-p", "no:hypothesispytest")
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


def test_hypothesis_settings_come_from_the_users_profile_with_the_suites_as_default():
    def config(**options):
        return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))

    settings.register_profile("users_own", max_examples=3, derandomize=False)
    own, label, seed = pytest_aiayn.hypothesis_settings(config(hypothesis_profile="users_own", hypothesis_seed="7"))
    assert (own.max_examples, label, seed) == (3, "dev", 7)  # the replay command names the CLI's profile of its kind
    thorough, label, _ = pytest_aiayn.hypothesis_settings(config(hypothesis_profile="thorough"))
    assert (thorough.max_examples, label) == (profiles.EXAMPLES["thorough"], "thorough")
    default, label, seed = pytest_aiayn.hypothesis_settings(config())
    assert label == profiles.default_name() and default.max_examples == profiles.EXAMPLES[label] and seed is None
