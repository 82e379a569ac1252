"""The tuning evaluation (benchmarks/tune_all.py): its table and summary on made-up rows,
and one smoke run on quick sizes with a tiny budget (slow). No timing assertions."""
from __future__ import annotations

from pathlib import Path

import pytest

from polytile.bench import tuning
from polytile.bench.machine import BLAS_ENV_VARS
from polytile.bench.tuning import Tuned, TuningRow, summary, tuning_markdown, tuning_table

MS = 1e-3


def _rows() -> list[TuningRow]:
    return [
        TuningRow("tmm 1024x1024x1024", 10 * MS, 5 * MS,
                  {"genetic": Tuned("genetic", "ok", seconds=5 * MS, candidates=80,
                                    options="s0: vec=i2x16x1", tuner_speedup=1.9),
                   "random": Tuned("random", "ok", seconds=8 * MS, candidates=95)}),
        TuningRow("softmax 4096x4096", 40 * MS, 30 * MS,
                  {"genetic": Tuned("genetic", "ok", seconds=40 * MS, candidates=20),
                   "random": Tuned("random", "WRONG", "output 0: 3 elements off",
                                   seconds=20 * MS, candidates=21)}),
        TuningRow("tbmm 500x26x72x26", 1 * MS, 1 * MS,
                  {"genetic": Tuned("genetic", "ok", seconds=0.5 * MS, candidates=50),
                   "random": Tuned("random", "FAILED", "BuildError: ...")}),
    ]


def test_table_has_speedups_numpy_ratios_candidates_and_checks() -> None:
    header, lines = tuning_table(_rows(), tuning.STRATEGIES)
    assert all(len(line) == len(header) for line in lines)
    tmm = dict(zip(header, lines[0]))
    assert tmm["default ms"] == "10.0" and tmm["genetic ms"] == "5.00"
    assert tmm["genetic speedup"] == "2.00x" and tmm["random speedup"] == "1.25x"
    assert tmm["default vs NumPy"] == "0.50x" and tmm["genetic vs NumPy"] == "1.00x"
    assert tmm["genetic candidates"] == "80" and tmm["check"] == "ok"
    softmax = dict(zip(header, lines[1]))
    assert softmax["check"] == "random WRONG"
    tbmm = dict(zip(header, lines[2]))
    assert tbmm["random ms"] == "FAILED" and tbmm["random speedup"] == ""
    only = tuning_table(_rows(), ("genetic",))[0]
    assert not any("random" in h for h in only)


def test_summary_states_median_speedups_the_comparison_and_the_targets() -> None:
    lines = summary(_rows(), tuning.STRATEGIES)
    assert lines[0].startswith("genetic: median speedup over the default 2.00x over 3 ")
    assert lines[1].startswith("random: median speedup over the default 1.62x over 2 ")
    assert lines[2] == ("genetic against random at equal budget, 2 workload(s): faster on 1, "
                        "within 3% on 0, slower on 1")
    assert lines[3] == ("options other than the default won the tuner's confirmation: "
                        "genetic on 1, random on 0")
    assert "tmm 1024x1024x1024: best tuned kernel 1.00x NumPy's speed, target >= 0.6x: met" \
        in lines
    assert "tbmm 500x26x72x26: best tuned kernel 2.00x NumPy's speed, target >= 1x: met" \
        in lines
    assert summary([], ("random",)) == ["random: no workload tuned and timed"]


def test_markdown_section_has_the_command_options_and_failures(tmp_path: Path) -> None:
    text = tuning_markdown(_rows(), tuning.STRATEGIES, budget="2m", facts={"CPU": "x"},
                           command="python benchmarks/tune_all.py --budget=2m", date="today",
                           title="Tuning")
    assert "- command: `python benchmarks/tune_all.py --budget=2m`" in text
    assert "median speedup over the default 2.00x" in text
    assert "`s0: vec=i2x16x1`" in text and "tuner's confirmation 1.90x" in text
    assert "softmax 4096x4096 (random):" in text and "BuildError" in text
    path = tmp_path / "RESULTS.md"
    tuning.write_section(path, "tuning", text)
    tuning.write_section(path, "tuning", text)          # replaced, not appended
    written = path.read_text()
    assert written.count("<!-- polytile-bench:tuning:begin -->") == 1


def test_command_text_is_the_normalized_invocation() -> None:
    args = tuning.parse_args(["--quick", "--only", "tmm,softmax", "--budget", "10s"])
    assert tuning.command_text(args) == ("python benchmarks/tune_all.py --budget=10s "
                                         "--strategy=both --quick --only=tmm,softmax")


@pytest.mark.slow
def test_quick_run_tunes_checks_times_and_writes_the_section(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in BLAS_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    status = tuning.main(["--quick", "--only", "tmm,softmax", "--budget", "10",
                          "--repeats", "1", "--quiet"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "tmm 37x19x53" in out and "softmax 33x101" in out
    text = (tmp_path / "benchmarks" / "RESULTS.md").read_text()
    assert "<!-- polytile-bench:tuning-quick-partial:begin -->" in text
    assert "--quick --only=tmm,softmax" in text
    assert "INCOMPLETE" not in text       # the section written after tmm was replaced
    rows = [line for line in text.splitlines() if line.startswith(("| tmm ", "| softmax "))]
    assert len(rows) == 2 and all(row.rstrip(" |").endswith("ok") for row in rows)
