"""torch.autograd.gradcheck (double precision, fast mode) on every differentiable
program of the conformance corpus, through polytile.torch.op on the reference
interpreter (the compiled gradients are compared with the interpreter's in
tests/autodiff)."""
from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional dependency "
                            "(pip install polytile[torch])")

from autodiff.test_corpus import DIFFERENTIABLE, _smooth
from conformance.programs import Case

import polytile as pt
import polytile.torch as ptt


def _argument(value):  # type: ignore[no-untyped-def]
    if isinstance(value, np.ndarray):
        tensor = torch.from_numpy(value.astype(np.float64) if value.dtype.kind == "f"
                                  else value)
        return tensor.requires_grad_() if tensor.is_floating_point() else tensor
    return value.item() if isinstance(value, np.generic) else value


@pytest.mark.parametrize("case", [c for c in DIFFERENTIABLE if _smooth(c)],
                         ids=lambda c: c.name)
def test_gradcheck(case: Case) -> None:
    source = re.sub(r"\bfloat(32)?\b", "double", case.source)
    op = ptt.op(pt.define(source, backend="interp")[case.function])

    def floating(*args):  # type: ignore[no-untyped-def]
        outs = op(*args)
        return tuple(o for o in (outs if isinstance(outs, tuple) else (outs,))
                     if o.is_floating_point())

    args = tuple(_argument(a) for a in case.make_inputs(np.random.default_rng(5)))
    assert torch.autograd.gradcheck(floating, args, fast_mode=True, atol=1e-6, rtol=1e-5)
