"""The benchmark runs end to end and writes its report (speed itself is measured by `nox -s bench`, not asserted)."""
import json

from ablations.bench import main
from tests.cli_runs import needs_data

TINY = "N=1,d_model=32,d_ff=64,h=2,d_k=16,d_v=16,vocab_size=8000"


@needs_data
def test_bench_writes_markdown_and_json_for_every_variant(tmp_path):
    out = tmp_path / "bench.md"
    code = main(["--steps", "1", "--warmup", "1", "--batch-tokens", "300", "--decode-sentences", "2",
                 "--config", TINY, "--preset", "multi30k", "--out", str(out), "--runs", str(tmp_path / "runs")])
    assert code == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert [r["variant"] for r in report["training"]] == ["reference (fused SDPA)", "reference (explicit attention)", "torch.nn.Transformer adapter"]
    assert all(r["tgt_tokens_per_s"] > 0 for r in report["training"])
    assert "| reference (explicit attention) |" in out.read_text()


def test_bench_bad_config_is_one_line(tmp_path, capsys):
    assert main(["--config", "d_model=0", "--out", str(tmp_path / "b.md")]) == 2
    assert capsys.readouterr().err.startswith("error: config field d_model=0")
