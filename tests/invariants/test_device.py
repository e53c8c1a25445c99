"""`--device`: the model runs on the user's device, the checks stay on the CPU, and a device torch cannot use is one
line that names the problem and the fix (the CLI and the pytest plugin alike)."""

import json

import pytest
import torch

from invariants import run_suite
from invariants.__main__ import main
from invariants.device import OnDevice, checking, resolve
from invariants.engine import PASS
from model import Transformer
from tests.helpers import few, needs_cuda
from tests.invariants.test_pytest_plugin import pytest_in

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SMALL = "N=1,d_model=16,h=2,d_k=8,d_v=8,d_ff=32,vocab_size=50"
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@NO_CUDA
@pytest.mark.parametrize(
    "device, problem",
    [
        # torch's own reason follows: "Torch not compiled with CUDA enabled" (a CPU build), "Found no NVIDIA driver".
        ("cuda", "torch {version} cannot compute in float64 there ("),
        ("nonsense", "nonsense: not a torch device; name one as torch does (cpu, cuda, cuda:1)"),
        ("meta", "cannot compute in float64 there (Tensor.item() cannot be called on meta tensors)"),
    ],
)
def test_a_device_torch_cannot_use_is_one_line_naming_the_problem_and_the_fix_with_exit_2(
    tmp_path, capsys, device, problem
):
    assert main(["--device", device, "--only", "params_base", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --device {device}") and err.count("\n") == 1
    assert problem.format(version=torch.__version__) in err
    assert "or leave --device out to check on the CPU" in err
    assert not list(tmp_path.iterdir())  # no check ran, no report


def test_device_cpu_checks_as_without_the_option_and_the_report_names_it(tmp_path):
    assert (
        main(["--model", f"reference,{SMALL}", "--device", "cpu", "--only", "eval_determinism", "--out", str(tmp_path)])
        == 0
    )
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["device"] == "cpu" and doc["verdicts"]["pass"] == 1


@pytest.mark.slow
def test_a_model_behind_the_device_wrapper_passes_every_property_of_the_reference():
    def make(cfg):
        return OnDevice(Transformer(cfg), torch.device("cpu"))

    small = dict(N=1, d_model=16, h=2, d_k=8, d_v=8, d_ff=64, vocab_size=50)
    results = run_suite(lambda cfg: make(cfg.replace(**small)), settings=few(2))
    failed = [f"{r.name}: {r.reason}" for r in results if r.verdict != PASS and not r.name.startswith("params_")]
    assert not failed, failed


def test_checking_on_cuda_turns_tf32_off_and_deterministic_algorithms_on_then_puts_them_back():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with checking(torch.device("cuda")):
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.are_deterministic_algorithms_enabled()
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert not torch.are_deterministic_algorithms_enabled()


def test_the_cpu_is_a_device_the_checks_can_use_and_a_bad_one_is_a_value_error_from_the_python_api_too():
    assert resolve("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device nonsense: not a torch device"):
        run_suite(f"reference,{SMALL}", device="nonsense")


@NO_CUDA
@pytest.mark.slow
def test_the_pytest_plugin_reports_a_device_it_cannot_use_as_a_one_line_collection_error(tmp_path):
    run = pytest_in(tmp_path, "--transformer-spec", f"reference,{SMALL}", "--transformer-device", "cuda")
    assert run.returncode == 2 and "error: --transformer-device cuda: torch" in run.stdout, run.stdout[-2000:]
    assert "leave --transformer-device out to check on the CPU" in run.stdout


@needs_cuda
@pytest.mark.parametrize("model", ["reference", "torch-nn", "mutant:no_causal_mask"])
def test_on_cuda_every_property_gets_the_verdict_it_gets_on_the_cpu(model):
    spec = f"{model},{SMALL}"
    on_cpu = {r.name: r.verdict for r in run_suite(spec, settings=few(3))}
    on_cuda = {r.name: r.verdict for r in run_suite(spec, settings=few(3), device="cuda")}
    assert on_cuda == on_cpu
