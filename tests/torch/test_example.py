"""examples/train_mlp.py: the MLP made of polytile ops trains like the same model in torch."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is an optional dependency (pip install polytile[torch])")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def test_loss_decreases_like_the_torch_model() -> None:
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ours = example.train(example.polytile_model, epochs=3)
    theirs = example.train(example.torch_model, epochs=3)
    assert ours[-1] < ours[0] / 5
    assert ours == pytest.approx(theirs, rel=1e-3)
