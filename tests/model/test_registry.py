"""Model specs: registered names, presets, overrides, user adapters, and one-line errors."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from model import ModelSpec, SpecError, TransformerConfig, load_model, parse_spec
from model.adapters.torch_nn import TorchTransformer
from model.protocol import Seq2SeqModel
from tests.helpers import REPO

SMALL = "N=1,d_model=16,d_ff=32,h=2,d_k=8,d_v=8,vocab_size=40"


def test_registered_preset_and_overrides_resolve():
    with torch.device("meta"):
        model = load_model("reference:big,N=2,P_drop=0.2")
    assert (model.config.d_model, model.config.N, model.config.P_drop) == (1024, 2, 0.2)


def test_a_spec_is_parsed_once_into_typed_overrides_and_prints_back_as_it_parses():
    spec = parse_spec("reference:big, N=2, share_embeddings=false, P_drop=0.2")
    assert spec == ModelSpec("reference", "big", {"N": 2, "share_embeddings": False, "P_drop": 0.2})
    assert parse_spec(str(spec)) == spec


def test_a_model_loaded_at_a_config_has_every_field_of_it_whatever_the_spec_overrides():
    cfg = TransformerConfig(N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=8, vocab_size=40)
    with torch.device("meta"):
        for spec in ("reference:big,N=5,pe=learned", "torch-nn", "mutant:no_causal_mask,N=3"):
            assert load_model(spec, config=cfg).config == cfg, spec


def test_torch_adapter_satisfies_the_protocol():
    model = load_model(f"torch-nn:base,{SMALL}")
    assert isinstance(model, TorchTransformer) and isinstance(model, Seq2SeqModel)
    assert "kv_cache" in model.unsupported


def test_user_adapter_from_a_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        textwrap.dedent("""
        from model import Transformer
        def make(config):
            return Transformer(config.replace(N=1))
    """)
    )
    model = load_model(f"{path}:make,d_model=16,d_ff=32,h=2,d_k=8,d_v=8,vocab_size=40")
    assert model.config.N == 1 and model.config.d_model == 16


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "unknown model 'nope'; registered: reference"),
        ("missing_file.py:make", "no file missing_file.py"),
        ("model.config:no_such_factory", "has no factory 'no_such_factory'"),
        ("reference:huge", "unknown preset 'huge'"),
        ("reference:base,heads=4", "unknown config field 'heads'"),
        ("reference:base,N", "'N' is not key=value"),
        ("reference:base,N=two", "N='two' is not a valid int"),
        ("reference:base,d_model=0", "d_model=0 must be a positive integer"),
        ("torch-nn:base,d_k=16", "needs h\\*d_k == h\\*d_v == d_model"),
    ],
)
def test_bad_spec_is_one_clear_line(spec, message):
    with pytest.raises(SpecError, match=message) as info:
        load_model(spec)
    assert "\n" not in str(info.value)


def test_factory_that_raises_or_returns_a_non_model_is_named(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def boom(config):\n    raise RuntimeError('no GPU')\ndef plain(config):\n    return object()\n")
    with pytest.raises(SpecError, match="factory boom raised RuntimeError: no GPU"):
        load_model(f"{path}:boom")
    with pytest.raises(SpecError, match="lacks protocol members config, unsupported, forward"):
        load_model(f"{path}:plain")


def test_factory_that_does_not_take_the_config_is_told_its_signature(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("def make():\n    return object()\ndef two(config, device):\n    return object()\nname = 'mine'\n")
    for name in ("make", "two"):
        with pytest.raises(SpecError, match=f"factory {name} must take one argument, the config: def {name}\\(cfg"):
            load_model(f"{path}:{name}")
    with pytest.raises(SpecError, match="name is a str, not a factory"):
        load_model(f"{path}:name")


def test_a_factory_wrapped_by_a_decorator_that_supplies_its_arguments_is_accepted(tmp_path):
    path = tmp_path / "wrapped.py"
    path.write_text(
        "import functools\nfrom model import Transformer\n\n"
        "def with_defaults(build):\n    @functools.wraps(build)\n"
        "    def factory(config):\n        return build(config, 'cpu')\n    return factory\n\n"
        "@with_defaults\ndef make(config, device):\n    return Transformer(config.replace(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8))\n"
    )
    assert load_model(f"{path}:make").config.N == 1


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model", *args], capture_output=True, text=True)


def test_info_json_reports_config_and_integer_params(capsys):
    # In this process: `python -m model info ... --json` as a process of its own is run by tests/test_install.py (the
    # installed wheel) and the entry point's exit status and one-line error by the next test.
    from model.__main__ import main

    assert main(["info", "reference:base,N=2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["N"] == 2
    assert isinstance(info["params"], int)
    assert info["params"] == sum(info["params_by_part"].values())
    assert set(info["params_by_part"]) == {"embeddings", "encoder", "decoder"}


@pytest.mark.slow
def test_info_bad_spec_exits_2_with_one_line():
    result = run_cli("info", "nope")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: unknown model")


def test_documented_worked_adapter_loads_and_runs(tmp_path):
    page = (REPO / "docs" / "plugging-in.md").read_text()
    example = next(block for block in page.split("```python")[1:] if "def make(" in block).split("```")[0]
    (tmp_path / "mine.py").write_text(example)
    model = load_model(f"{tmp_path / 'mine.py'}:make,{SMALL}").eval()
    src, tgt = torch.randint(1, 40, (2, 5)), torch.randint(1, 40, (2, 4))
    pad_s, pad_t = torch.zeros(2, 5, dtype=torch.bool), torch.zeros(2, 4, dtype=torch.bool)
    assert model(src, tgt, pad_s, pad_t).shape == (2, 4, 40)
    assert set(model.unsupported) == {"kv_cache", "attention_probs"}


def test_an_adapter_file_is_imported_once_however_many_models_it_builds(tmp_path):
    log = tmp_path / "imports.log"
    path = tmp_path / "counted.py"
    path.write_text(
        f"from model import Transformer\nwith open({str(log)!r}, 'a') as f:\n    f.write('imported\\n')\n"
        "def make(config):\n    return Transformer(config)\n"
    )
    with torch.device("meta"):
        for n in (1, 2, 3):
            load_model(f"{path}:make,{SMALL.replace('N=1,', '')},N={n}")
    assert log.read_text().splitlines() == ["imported"]


def test_a_name_registered_twice_is_an_error():
    from model.registry import REGISTRY, register_model

    register_model("test-once", "registered by a test")(lambda config: None)
    try:
        with pytest.raises(ValueError, match="model name 'test-once' is already registered"):
            register_model("test-once", "again")(lambda config: None)
    finally:
        del REGISTRY["test-once"]


def test_protocol_members_are_read_from_the_protocol_class():
    from model.protocol import MEMBERS

    methods = {name for name, value in vars(Seq2SeqModel).items() if callable(value) and not name.startswith("_")}
    assert set(MEMBERS) == {"config", "unsupported"} | methods and len(MEMBERS) == len(set(MEMBERS))
    assert {"forward", "encode", "decode", "parameter_groups", "train"} <= set(MEMBERS)


@pytest.mark.slow
def test_mutants_are_registered_by_the_invariants_not_named_by_the_model_layer():
    code = (
        "import sys; sys.modules['transformers'] = None  # the hf adapter is skipped (it registers no mutant)\n"
        "from model.registry import registered\nassert 'mutant' not in registered()\n"
        "import invariants\nfrom model import load_model\nload_model('mutant:no_causal_mask,N=1,d_model=16,d_ff=32,h=2,d_k=8,d_v=8,vocab_size=40')\n"
        "print(registered()['mutant'].build.__module__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "invariants.mutants"


def test_model_list_prints_the_shipped_adapters(capsys):
    from model.__main__ import main

    assert main(["list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names[:2] == ["reference", "torch-nn"] and "mutant" not in names[:5]
