"""`cluster=` mistakes are clear errors before anything starts (no cluster needed)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import polytile
from polytile.config import Config
from polytile.errors import ArgumentError
from polytile.tune.cluster import connect

from .conftest import TMM


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)      # import fails
    with pytest.raises(ArgumentError, match="distributed") as info, connect("local:2"):
        pass
    assert "polytile[cluster]" in (info.value.hint or "")


@pytest.mark.parametrize("spec, message", [("local:0", "at least one worker"),
                                           ("scheduler:8786", "neither local:N nor")])
def test_a_bad_cluster_name_is_refused(spec: str, message: str) -> None:
    pytest.importorskip("distributed", reason="the cluster extra is not installed")
    with pytest.raises(ArgumentError, match=message), connect(spec):
        pass


def test_tune_refuses_a_bad_cluster_before_measuring(
        config: Config, tmm_args: tuple[np.ndarray, np.ndarray]) -> None:
    pytest.importorskip("distributed", reason="the cluster extra is not installed")
    mod = polytile.define(TMM, config=config)
    with pytest.raises(ArgumentError, match="neither local:N nor"):
        polytile.tune(mod.tmm, *tmm_args, cluster="my-laptop", candidates=2, progress=False)
