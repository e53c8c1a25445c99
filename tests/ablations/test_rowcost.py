"""python -m ablations.bench.rowcost: a grid's cost per row, before it runs."""

from ablations.bench.rowcost import main


def test_rowcost_prints_each_rows_step_time_relative_to_the_first(capsys):
    assert main(["--budget", "smoke", "--rows", "base,C1", "--steps", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "base" and lines[0].endswith("1.00 x base")
    assert lines[1].split()[0] == "C1" and lines[-1].startswith("all 2 rows:")
