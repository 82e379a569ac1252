"""benchmarks/option_ab.py: a side's options split into pipeline options and pass
constants, which are set only while that side compiles."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from polytile.passes import autotile

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "option_ab.py"


def load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("option_ab", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_pass_constant_is_set_for_one_side_and_restored() -> None:
    option_ab = load()
    default = autotile.PANEL_THREADS_MARGIN
    opts = option_ab.options("autotile.PANEL_THREADS_MARGIN=0,fold.enabled=false")
    with option_ab.constants(opts) as pipeline:
        assert pipeline == {"fold.enabled": False}
        assert autotile.PANEL_THREADS_MARGIN == 0
    assert autotile.PANEL_THREADS_MARGIN == default


def test_an_unknown_constant_is_refused() -> None:
    option_ab = load()
    with pytest.raises(SystemExit, match="no constant NO_SUCH"), \
            option_ab.constants({"autotile.NO_SUCH": 1}):
        pass
