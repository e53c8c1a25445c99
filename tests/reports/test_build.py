"""`python -m reports` end to end on fixed results: every report and figure is built, the index links each one with
the command that regenerates it, and missing inputs are one line each, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from reports import figures, table3
from reports.__main__ import main
from reports.inputs import load_budget
from tests.reports.table3_fixture import write_fixture

MODELS = {
    "reference:big": {"causal_mask": "pass", "kv_cache": "pass", "softmax_rows": "pass"},
    "torch-nn": {"causal_mask": "pass", "kv_cache": "not_applicable", "softmax_rows": "fail"},
}
KILLS = {
    "no_causal_mask": {"causal_mask": "fail", "kv_cache": "fail", "softmax_rows": "pass"},
    "no_scale": {"causal_mask": "pass", "kv_cache": "pass", "softmax_rows": "pass"},
}


def write_invariants(folder: Path) -> Path:
    """Invariants reports in the suite's format: <slug>.json and .md per model, and kill_matrix.json."""
    folder.mkdir(parents=True)
    for model, verdicts in MODELS.items():
        properties = [
            {
                "name": name,
                "verdict": v,
                "worst_error": 0.0,
                "tolerance": 1e-9,
                "examples": 10,
                "reason": "no kv cache" if v == "not_applicable" else None,
                "reproduce": f"nox -s invariants -- --model {model} -k {name}",
            }
            for name, v in verdicts.items()
        ]
        report = {
            "model": model,
            "date": "2026-11-22",
            "commit": "abc1234",
            "torch": "2.13.0",
            "properties": properties,
        }
        slug = re.sub(r"[^A-Za-z0-9.-]+", "_", model)
        (folder / f"{slug}.json").write_text(json.dumps(report))
        (folder / f"{slug}.md").write_text(f"# Invariants of {model}\n")
    matrix = {
        "mutants": list(KILLS),
        "properties": list(MODELS["reference:big"]),
        "verdicts": KILLS,
        "command": "python -m invariants --kill-matrix",
    }
    (folder / "kill_matrix.json").write_text(json.dumps(matrix))
    (folder / "kill_matrix.md").write_text("# Kill matrix\n")
    (folder / "mutants").mkdir()
    for mutant, verdicts in KILLS.items():
        properties = [{"name": name, "verdict": v} for name, v in verdicts.items()]
        doc = {"model": f"mutant:{mutant}", "command": "python -m invariants --kill-matrix", "properties": properties}
        (folder / "mutants" / f"mutant-{mutant}.json").write_text(json.dumps(doc))
    return folder


def reports_argv(root: Path, results: str = "results", invariants: str = "invariants") -> list[str]:
    """`python -m reports` on root/<results> and root/<invariants>, into root/out."""
    return ["--results", str(root / results), "--invariants", str(root / invariants), "--out", str(root / "out")]


def build_drawn(
    root: Path, results: str = "results", invariants: str = "invariants", render: bool = True
) -> tuple[int, dict]:
    """A build whose figures are kept by file name, to read back, with what it printed on stderr under "stderr";
    without render, the figures are not written to PNG (most of a build's time; the `built` fixture's build writes
    them)."""
    drawn, save = {}, figures._save if render else (lambda fig, path: figures.plt.close(fig) or fig)
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(io.StringIO()) as err:
        patch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(path.name, save(fig, path)))
        code = main(reports_argv(root, results, invariants))
    drawn["stderr"] = err.getvalue()
    return code, drawn


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build of everything from the fixed results."""
    root = tmp_path_factory.mktemp("build")
    write_fixture(root / "results")
    write_invariants(root / "invariants")
    code, drawn = build_drawn(root)
    return code, root, drawn


@pytest.mark.slow
def test_build_writes_every_table_and_figure(built):
    code, root, _ = built
    out = root / "out"
    assert code == 0
    expected = [
        "table3/smoke.md",
        "table3/smoke.html",
        "table3/smoke.tex",
        "table3/smoke.csv",
        "table3/smoke_by_step.md",
        "table3/smoke_by_step.csv",
        "figures/smoke/agreement_by_step.png",
        "figures/smoke/change_vs_paper.png",
        "figures/smoke/group_changes.png",
        "figures/smoke/params_vs_ppl.png",
        "figures/smoke/curves_loss.png",
        "figures/smoke/curves_dev_ppl.png",
        "figures/smoke/tokens_per_s.png",
        "figures/invariants_verdicts.png",
        "figures/kill_matrix.png",
        "index.html",
        "README.md",
    ]
    for name in expected:
        assert (out / name).stat().st_size > 0, name
    assert (out / "figures/smoke/group_changes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_index_links_every_report_with_its_command(built):
    _, root, _ = built
    out = root / "out"
    page, readme = (out / "index.html").read_text(), (out / "README.md").read_text()
    generated = [
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.is_file() and p.name not in ("index.html", "README.md")
    ]
    for name in generated:
        assert f'href="{name}"' in page and f"]({name})" in readme, name
    for slug, model in (("reference_big", "reference:big"), ("torch-nn", "torch-nn")):  # the invariants reports
        assert f'href="../invariants/{slug}.json"' in page and f'href="../invariants/{slug}.md"' in page
        assert f"`nox -s invariants -- --model {model}`" in readme
    for name in ("kill_matrix.md", "kill_matrix.json", "mutants/mutant-no_scale.json"):  # the mutants' reports too
        assert f"](../invariants/{name}) — `python -m invariants --kill-matrix`" in readme
    assert readme.count("`nox -s report`") >= len(generated)
    assert "PPL 1 of 4 rows agree" in readme  # the table's summary beside its link
    assert "Base dev BLEU 20.4 ± 0.4" in readme and "At the final step" in readme  # the budget's headline


def test_missing_inputs_are_one_line_each_naming_the_command(tmp_path, capsys):
    code = main(reports_argv(tmp_path, results="none", invariants="none"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 2
    assert "nox -s ablations -- run --budget smoke" in err[0] and "nox -s invariants" in err[1]
    assert not (tmp_path / "out").exists()


def test_with_only_invariants_the_rest_is_built_and_the_skip_reported(tmp_path, capsys):
    write_invariants(tmp_path / "invariants")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "bench.md").write_text("# Benchmark\n")  # what `nox -s bench` leaves beside the reports
    code = main(reports_argv(tmp_path, results="none"))
    err = capsys.readouterr().err
    assert code == 0 and "skipped: Table 3" in err and "Traceback" not in err
    assert (tmp_path / "out" / "figures" / "kill_matrix.png").is_file()
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "## Skipped" in readme and "](bench.md) — `nox -s bench`" in readme


def test_group_figure_has_ours_beside_the_papers_for_each_group_and_metric(built):
    _, root, drawn = built
    fig = drawn["group_changes.png"]
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[:4] == [
        "(A) Δ PPL (dev), ours",
        "(A) Δ PPL (dev), paper",
        "(A) Δ BLEU (dev), ours",
        "(A) Δ BLEU (dev), paper",
    ]
    assert len(titles) == 5 * 4 and titles[-1] == "(E) Δ BLEU (dev), paper"
    table = table3.compare(load_budget(root / "results" / "smoke").runs)
    paper_a = fig.axes[1]  # bar heights are the paper's changes for A1..A4
    assert [p.get_height() for p in paper_a.patches] == pytest.approx(
        table.loc[["A1", "A2", "A3", "A4"], "ppl_paper_delta"]
    )
    ours_a = fig.axes[0]  # ours: A1 and A3 ran (+1.0 and +0.1 against base), A2 and A4 did not
    assert [p.get_height() for p in ours_a.patches] == pytest.approx([1.0, 0.1], abs=1e-9)


def test_group_figure_leaves_out_bleu_when_ours_is_zero_everywhere(tmp_path):
    results = load_budget(write_fixture(tmp_path))
    runs = results.runs.assign(bleu=0.0)
    table = table3.compare(runs)
    fig = figures.group_changes(table, runs, tmp_path / "g.png", "t")
    assert fig.axes and not any("BLEU" in ax.get_title() for ax in fig.axes)
    assert len(figures.change_against_change(table, tmp_path / "s.png", "t").axes) == 1  # PPL only


def test_without_attention_data_or_weights_the_attention_figure_is_skipped_in_one_line(built):
    _, root, drawn = built
    assert "Traceback" not in drawn["stderr"]
    lines = [line for line in drawn["stderr"].splitlines() if "attention" in line]
    assert len(lines) == 1 and "no finished base run with weights (model.pt or checkpoint.pt)" in lines[0]
    assert not (root / "out" / "figures" / "smoke" / "attention.png").exists()


def test_agreement_figure_shares_the_step_axis_and_draws_every_scope(built):
    _, _, drawn = built
    share, rho = drawn["agreement_by_step.png"].axes[:2]
    assert share.get_shared_x_axes().joined(share, rho)
    assert [t.get_text() for t in share.get_legend().get_texts()] == ["all rows", "(A)", "(C)", "(E)"]  # D1: 2 seeds
    drawn = {line.get_label() for ax in (share, rho) for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert drawn == {t.get_text() for t in share.get_legend().get_texts()}  # every line of either panel is named
    assert share.get_ylim()[0] < 0 < 1 < share.get_ylim()[1] and rho.get_ylim()[0] < -1 < 1 < rho.get_ylim()[1]


def test_agreement_figure_names_a_group_drawn_only_in_the_spearman_panel(tmp_path):
    nan = float("nan")  # group D: a rho at every step, no row with enough seeds for a share
    progress = pd.DataFrame(
        [
            {"step": step, "scope": scope, "share": share, "spearman": rho}
            for step in (100, 200)
            for scope, share, rho in (("all", 0.5, 0.2), ("D", nan, -0.1))
        ]
    )
    fig = figures.agreement_by_step(progress, tmp_path / "a.png", "t")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["all rows", "(D)"]


def test_scatter_puts_each_judged_row_at_paper_change_and_our_change_coloured_by_verdict(built):
    _, root, drawn = built
    table = table3.compare(load_budget(root / "results" / "smoke").runs)
    ppl = drawn["change_vs_paper.png"].axes[0]
    points = {t.get_text(): t.xy for t in ppl.texts if t.get_text() in table.index}
    assert points["A1"] == pytest.approx((table.loc["A1", "ppl_paper_delta"], table.loc["A1", "ppl_delta"]))
    assert set(points) == {"A1", "A3", "C7", "D1", "E1", "big"}
    quadrants = {t.get_text() for t in ppl.texts} - set(points)
    assert quadrants == {"both worse", "both better", "paper better, ours worse", "paper worse, ours better"}
    colors = {line.get_color() for line in ppl.lines}
    assert {figures.VERDICT_COLOR["yes"], figures.VERDICT_COLOR["no"], figures.VERDICT_COLOR["n.s."]} <= colors


def test_verdict_heatmap_labels_each_cell_with_its_verdict(built):
    _, _, drawn = built
    verdicts = drawn["invariants_verdicts.png"].axes[0]
    assert [t.get_text() for t in verdicts.texts] == [
        "pass",
        "pass",
        "pass",
        "pass",
        "n/a",
        "FAIL",
    ]  # reference:big, torch-nn
    kills = drawn["kill_matrix.png"].axes[0]
    assert [t.get_text() for t in kills.texts] == ["x", "x", "", "", "", ""]
    assert [t.get_text() for t in kills.get_yticklabels()] == ["no_causal_mask (2 fail)", "no_scale (0 fail)"]


def test_a_damaged_invariants_report_is_one_line_naming_it(tmp_path, capsys):
    write_invariants(tmp_path / "invariants")
    (tmp_path / "invariants" / "torch-nn.json").write_text('{"model": "torch-nn", "propert')
    code = main(reports_argv(tmp_path, results="none"))
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "torch-nn.json" in line]
    assert code == 0 and len(err) == 1 and "warning: skipping" in err[0] and "torch-nn.json: damaged" in err[0]


@pytest.mark.slow
def test_two_budgets_that_translate_get_one_figure_of_their_verdicts_side_by_side(tmp_path):
    write_fixture(tmp_path / "results", "cpu")
    write_fixture(tmp_path / "results", "smoke")
    _, drawn = build_drawn(tmp_path, invariants="none", render=False)
    side = drawn["budgets_side_by_side.png"]
    for ax in side.axes:
        columns = [t.get_text().splitlines()[0] for t in ax.get_xticklabels()]
        assert columns == ["cpu", "smoke"]
        assert len(ax.texts) == 2 * len(ax.get_yticklabels())  # one labelled cell per row and budget
    assert "Budgets side by side" in (tmp_path / "out" / "README.md").read_text()


def test_a_damaged_baseline_is_a_warning_and_the_budget_still_loads_unjudged(tmp_path, capsys):
    folder = write_fixture(tmp_path)
    (folder / "baseline.json").write_text('{"unigram_ppl": 440')
    results = load_budget(folder)
    assert results.baseline is None and len(results.runs) > 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "baseline.json is damaged (JSONDecodeError" in err
