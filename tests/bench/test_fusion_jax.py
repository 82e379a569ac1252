"""The JAX versions of the fusion workloads (what `polytile bench --fusion` times under
jax.jit) agree with the NumPy oracle; without jax the column is n/a, never a crash."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from polytile.bench.fusion import FusionRow, _jax_call, _tuple, table
from polytile.bench.fusion_workloads import fusion_set, logreg
from polytile.bench.workload import Workload

QUICK = fusion_set(quick=True)


def _strided(a: object) -> object:
    """The same values in a non-contiguous array (every other element of a wider one)."""
    if not isinstance(a, np.ndarray) or a.ndim == 0:
        return a
    wide = np.repeat(a, 2, axis=-1)
    view = wide[..., ::2]
    assert not view.flags.c_contiguous or a.shape[-1] == 1
    return view


@pytest.mark.parametrize("workload", QUICK, ids=[w.name for w in QUICK])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_jax_version_agrees_with_numpy(workload: Workload, layout: str) -> None:
    pytest.importorskip("jax", reason="jax is not installed (the optional `jax` extra); "
                                      "the bench's jax column is n/a without it")
    args = workload.make_inputs(np.random.default_rng(3))
    assert all(np.std(a) > 0 for a in args if isinstance(a, np.ndarray) and a.size > 1)
    if layout == "strided":
        args = tuple(_strided(a) for a in args)
    call = _jax_call(workload, args)
    assert call is not None
    got = call()
    assert all(d.platform == "cpu" for v in (got if isinstance(got, tuple) else (got,))
               for d in v.devices())
    expected = _tuple(workload.numpy(*args))
    got_arrays = _tuple(tuple(np.asarray(v) for v in (got if isinstance(got, tuple) else (got,))))
    assert len(got_arrays) == len(expected)
    for g, e in zip(got_arrays, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=workload.rtol, atol=workload.atol)


def test_without_jax_the_call_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jax", None)      # `import jax` raises ImportError
    w = logreg(5, 3)
    assert _jax_call(w, w.make_inputs(np.random.default_rng(0))) is None


def test_table_has_jax_column_and_geomeans() -> None:
    times = (("numpy", 2e-3), ("polytile rows", 1e-3), ("polytile plan", 5e-4),
             ("torch eager", 1e-3), ("torch.compile", 7.5e-4))
    rows = [FusionRow(logreg(37, 11), ops=8, kernels=(5, 3), groups=((0, 1, 2), (3,)),
                      times=times + (("jax.jit", 1e-3),)),
            FusionRow(logreg(41, 11), ops=8, kernels=(5, 3), groups=((0, 1, 2), (3,)),
                      times=times)]
    head, (first, second, geomean) = table(rows)
    assert dict(zip(head, first))["jax ms"] == "1.000"
    assert dict(zip(head, first))["plan vs jax"] == "2.00x"
    assert dict(zip(head, second))["plan vs jax"] == "n/a"
    cells = dict(zip(head, geomean))
    assert cells["workload"] == "geomean" and len(geomean) == len(head)
    assert cells["plan vs torch"] == "2.00x" and cells["plan vs inductor"] == "1.50x"
    assert cells["plan vs jax"] == "2.00x (of 1)"


def test_table_sets_the_models_saving_beside_the_measured_one() -> None:
    row = FusionRow(logreg(37, 11), ops=8, kernels=(5, 3, 9), groups=((0, 1, 2), (3,)),
                    objective=40e-6, times=(("numpy", 2e-3), ("polytile rows", 1e-3),
                                            ("polytile plan", 5e-4), ("polytile none", 6e-4)))
    head, (body,) = table([row])
    cells = dict(zip(head, body))
    assert cells["none ms"] == "0.600"
    assert cells["saved ms: model / measured"] == "0.040 / 0.100"
