"""`polytile bench --fusion`: the probe is stored, every workload is checked and its
kernels, plan and times are tabled."""
from __future__ import annotations

from pathlib import Path

import pytest

from polytile import cli
from polytile.bench import command
from polytile.bench.fusion import FusionRow, table
from polytile.bench.fusion_workloads import logreg
from polytile.config import load_config
from polytile.graph.cost import DEFAULT, load_cost_model
from polytile.targets.target import select_target


def test_table_shows_kernels_plan_and_ratios() -> None:
    row = FusionRow(logreg(37, 11), ops=8, kernels=(5, 3), groups=((0, 1, 2), (3,)),
                    plan_seconds=0.1, ilp_seconds=0.004, ilp_rounds=2,
                    times=(("numpy", 2e-3), ("polytile rows", 1e-3),
                           ("polytile plan", 5e-4), ("torch eager", 1.5e-3)),
                    traffic=("stitched_0", 1.254), gpu_launches=("11", "4"))
    head, (body,) = table([row])
    cells = dict(zip(head, body))
    assert cells["kernels rows"] == "5" and cells["kernels plan"] == "3"
    assert cells["cuda launches none / rows"] == "11 / 4"
    assert cells["max traffic"] == "1.25x (stitched_0)"
    assert cells["plan"] == "{0,1,2} {3}" and cells["ILP ms (solves)"] == "4.0 (2)"
    assert cells["plan vs rows"] == "2.00x" and cells["plan vs torch"] == "3.00x"
    assert cells["inductor ms"] == "n/a" and cells["plan vs inductor"] == "n/a"


def test_cuda_launches_count_the_printed_kernels() -> None:
    """The multi-interests motif: a kernel per statement, one row group with rows."""
    import numpy as np

    from polytile.bench.fusion import gpu_launches, specialized
    from polytile.bench.fusion_workloads import interests
    w = interests(3, 2, 7, 5)
    spec = specialized(w, w.make_inputs(np.random.default_rng(0)))
    assert (gpu_launches(spec, "none"), gpu_launches(spec, "rows")) == ("17", "1")


def test_failed_row_says_why() -> None:
    _, (body,) = table([FusionRow(logreg(3, 2), status="FAILED: X")])
    assert "FAILED: X" in body


@pytest.mark.slow
def test_cli_bench_fusion_probes_stores_and_tables(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(command, "BLAS_ENV_VARS", ())   # never re-run in a child here
    results = tmp_path / "RESULTS.md"
    assert cli.main(["bench", "--fusion", "--quick", "--only", "logreg", "--no-compile",
                     f"--write={results}"]) == 0
    out = capsys.readouterr().out
    assert "phi (one more kernel)" in out and "logreg 37x11" in out
    config = load_config()
    model = load_cost_model(config, select_target(config.target))
    assert model != DEFAULT and model.source.startswith("measured on")
    assert [v for v, _ in model.points] == sorted(v for v, _ in model.points)
    assert "## Fusion plans (quick smoke run, small sizes)" in results.read_text()
