"""Extended einsum (Tillet, "Extending Tensor Contractions"): NumPy's einsum with affine
and table-driven index functions, compiled through TC.

    y = polytile.einsum("nc(h+r)(w+s),ckrs->nkhw", x, w)                 # 3x3 convolution
    y = polytile.einsum("nc(h+1+sh[c])(w+1+sw[c]),ck->nkhw", x, w, sh=sh, sw=sw)  # shift conv

A spec is parsed once (`spec.parse_spec`), lowered to one TC function per operand and
table types (`lower.lower`), and defined as a polytile Module, which compiles a kernel
per set of shapes; both are cached, so a repeated call costs a dictionary look-up and
the Module's own call. Operands go to the Module unchanged, so every kind of array its
adapters accept works, and the outputs are of the first operand's kind; torch tensors
that require grad go through polytile.torch.op, so the result is differentiable.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from polytile import dtypes
from polytile.einsum.lower import FUNCTION, Lowered, extent_value, lower
from polytile.einsum.spec import Spec, parse_spec
from polytile.errors import ArgumentError, RangeInferenceError
from polytile.interop.adapters import AdapterError, adapter_for

if TYPE_CHECKING:
    import numpy as np

    from polytile.api import Module
    from polytile.tune.tuner import TuneResult

__all__ = ["EinsumProgram", "clear_cache", "compile_einsum", "einsum", "einsum_tc", "parse_spec"]


def einsum(spec: str, *operands: Any, **tables: Any) -> Any:
    """Evaluate `spec` on `operands`; tables named in the spec are passed by keyword."""
    views = [_view(x, f"operand {k}") for k, x in enumerate(operands)]
    table_views = {name: _view(t, f"table {name}") for name, t in tables.items()}
    program = compile_einsum(spec, tuple(_type_name(v, f"operand {k}") for k, v in enumerate(views)),
                             tuple(sorted((n, _type_name(v, f"table {n}"))
                                          for n, v in table_views.items())))
    return program.call(operands, tables, views, table_views)


def einsum_tc(spec: str, operand_types: Sequence[str], table_types: dict[str, str] | None = None,
              names: Sequence[str] | None = None) -> str:
    """The TC source `spec` lowers to (what `polytile einsum` prints)."""
    return lower(parse_spec(spec), tuple(operand_types), dict(table_types or {}), names).tc


@dataclass(frozen=True)
class EinsumProgram:
    """A lowered spec and the Module that runs its TC."""

    lowered: Lowered
    module: Module

    @property
    def spec(self) -> Spec:
        return self.lowered.spec

    @property
    def tc(self) -> str:
        return self.lowered.tc

    def __call__(self, *operands: Any, **tables: Any) -> Any:
        return self.call(operands, tables,
                         [_view(x, f"operand {k}") for k, x in enumerate(operands)],
                         {n: _view(t, f"table {n}") for n, t in tables.items()})

    def call(self, operands: Sequence[Any], tables: dict[str, Any],
             views: Sequence[np.ndarray], table_views: dict[str, np.ndarray]) -> Any:
        args = self.arguments(operands, tables, views, table_views)
        if _wants_gradients(operands):          # torch tensors that require grad
            import numpy
            import torch

            import polytile.torch as ptt
            args = [torch.from_numpy(a) if isinstance(a, numpy.ndarray) else a for a in args]
            return ptt.op(self.module[FUNCTION])(*args)
        return self.module[FUNCTION](*args)

    def tune(self, *operands: Any, tables: dict[str, Any] | None = None,
             **settings: Any) -> TuneResult:
        """Autotune the kernel for these operands and tables (settings as
        `polytile.tune`: budget="60s", strategy=...); later calls with these shapes, in
        any process, use the best options. The tuner runs on these very values, so a
        table's lookups stay in range."""
        tables = dict(tables or {})
        args = self.arguments(operands, tables,
                              [_view(x, f"operand {k}") for k, x in enumerate(operands)],
                              {n: _view(t, f"table {n}") for n, t in tables.items()})
        return self.module[FUNCTION].tune(*args, **settings)

    def arguments(self, operands: Sequence[Any], tables: dict[str, Any],
                  views: Sequence[np.ndarray], table_views: dict[str, np.ndarray]
                  ) -> list[Any]:
        """The TC function's arguments: operands, tables, then the sizes computed from
        the tables; checked against the spec."""
        spec = self.lowered.spec
        if len(operands) != len(spec.operands):
            raise ArgumentError(f"the spec has {len(spec.operands)} operand(s), the call "
                                f"gives {len(operands)}")
        for k, (view, op) in enumerate(zip(views, spec.operands)):
            if view.ndim != len(op.subscripts):
                raise ArgumentError(f"operand {k} has {view.ndim} dimension(s), its "
                                    f"subscripts name {len(op.subscripts)}", op.loc)
        for term in spec.tables:
            if term.table not in table_views:
                raise ArgumentError(f"the spec reads table {term.table}, which the call does "
                                    "not pass", term.loc, f"pass it by keyword: {term.table}=array")
            if table_views[term.table].ndim != len(term.args):
                raise ArgumentError(f"table {term.table} has {table_views[term.table].ndim} "
                                    f"dimension(s), the spec looks it up with "
                                    f"{len(term.args)}", term.loc)
        shapes = [tuple(v.shape) for v in views]
        sizes = [extent_value(e, shapes, table_views) for e in self.lowered.extents]
        return [*operands, *(tables[key] for key, _ in self.lowered.tables), *sizes]


def compile_einsum(spec: str, operand_types: tuple[str, ...],
                   table_types: tuple[tuple[str, str], ...] = (), backend: str = "c",
                   names: tuple[str, ...] | None = None) -> EinsumProgram:
    """The program of `spec` for these TC type names; cached per (spec, types, table
    names, backend), so a repeated call neither parses nor defines. Like a Module
    defined once, it reads the configuration (POLYTILE_* variables) when first made;
    `clear_cache()` forgets every program."""
    return _program(spec, tuple(operand_types), tuple(sorted(table_types)), backend,
                    None if names is None else tuple(names))


@lru_cache(maxsize=256)
def _program(spec: str, operand_types: tuple[str, ...], table_types: tuple[tuple[str, str], ...],
             backend: str, names: tuple[str, ...] | None) -> EinsumProgram:
    from polytile.api import define

    lowered = lower(parse_spec(spec), operand_types, dict(table_types), names)
    try:
        module = define(lowered.tc, backend=backend, name="<einsum>")
    except RangeInferenceError as e:    # shown in the TC; the TC's hint (`where`) is not for einsum
        raise RangeInferenceError(e.message, e.loc, "an index needs a size: give it a plain "
                                  "subscript in some operand (the filter's r in 'ckrs')") from None
    return EinsumProgram(lowered, module)


def _wants_gradients(operands: Sequence[Any]) -> bool:
    """Autograd should see this call (torch is never imported here for it)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in operands)


def clear_cache() -> None:
    _program.cache_clear()


def _view(value: Any, what: str) -> np.ndarray:
    adapter = adapter_for(value)
    if adapter is None:
        raise ArgumentError(f"{what} is a {type(value).__name__}, not an array",
                            hint="pass NumPy arrays (or DLPack / buffer-protocol objects)")
    try:
        return adapter.view(value)
    except AdapterError as e:
        raise ArgumentError(f"{what}: {e}") from None


def _type_name(view: np.ndarray, what: str) -> str:
    name = _tc_type(view.dtype)
    if name is None:
        raise ArgumentError(f"{what} has dtype {view.dtype}, which polytile does not support")
    return name


@lru_cache(maxsize=64)
def _tc_type(dtype: np.dtype) -> str | None:
    """The TC type name of a NumPy dtype (cached: a call looks up each operand's)."""
    found = dtypes.from_numpy(dtype)
    return found.name if found is not None else None
