"""What a fuzz case must satisfy.

Front end (`check_front_end`): `polytile.define` returns a Module or raises a
PolytileError, nothing else; for an accepted program the syntax tree prints back to
TC that parses to the same text, and the checked Program prints.

Compiled code (`check_compiled`): for an accepted program, each function (up to two)
is called with sizes and inputs drawn from `seed` through the C backend and through
the reference interpreter; both raise a PolytileError, or both return, with equal
results (integers and bools exactly, floats to the tolerance of the narrowest float
type the function holds a value in: the compiled code sums in another order and its
math functions differ in the last bits), and neither modifies its inputs; results
that differ only where a float reduction overflowed in one order and not in the
other are "overflowed", not a mismatch. Inputs are never all zeros; floats are
mostly small multiples of 1/4 (sometimes all of one sign), which most arithmetic
computes exactly, so that a comparison or a cast of a float does not flip between
the two; some arrays are passed as strided or Fortran-ordered views.
"""
from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

import polytile
from polytile.config import Config
from polytile.errors import PolytileError
from polytile.lang.parser import parse
from polytile.lang.printer import format_module
from polytile.sema import program as P
from polytile.sema.analyze import analyze
from polytile.sema.printer import format_program
from polytile.sema.specialize import specialize

# Largest |got - want| as a fraction of max(1, |want|, the output's largest |value|).
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}
MAX_FUNCTIONS = 2
SIZE_ATTEMPTS = 3


@dataclass(frozen=True)
class Outcome:
    """kind: front end "accepted" | "rejected" | "error"; compiled "compared" |
    "rejected" | "raised" (both backends raised at the call) | "overflowed" | "mismatch"
    | "error" (a non-Polytile exception) | "crash" | "timeout". detail: the error class
    for "rejected" and "raised", else what went wrong."""

    kind: str
    detail: str = ""


def check_front_end(source: str) -> Outcome:
    try:
        module = polytile.define(source, backend="interp")
    except PolytileError as err:
        return Outcome("rejected", type(err).__name__)
    except Exception:  # noqa: BLE001 - what the fuzzer is looking for
        return Outcome("error", traceback.format_exc())
    try:
        text = format_module(parse(source))
        again = format_module(parse(text))
        if again != text:
            return Outcome("error", f"the printed program prints differently once parsed:\n"
                           f"{text}\n---\n{again}")
        format_program(module.program)
    except Exception:  # noqa: BLE001
        return Outcome("error", "printing the accepted program failed:\n"
                       + traceback.format_exc())
    return Outcome("accepted")


def check_compiled(source: str, seed: int, config: Config | None = None,
                   options: Mapping[str, Any] | None = None) -> Outcome:
    """`options`: pass options for the compiled side (`fuse.strategy: rows`, ...)."""
    try:
        compiled = polytile.define(source, config=config)
        reference = polytile.define(source, backend="interp", config=config)
    except PolytileError as err:
        return Outcome("rejected", type(err).__name__)
    if options and compiled.compiler is not None:
        compiled.compiler.options = dict(options)
    rng = np.random.default_rng(seed)
    outcomes = []
    for fn in reference.program.functions[:MAX_FUNCTIONS]:
        for attempt in range(SIZE_ATTEMPTS):
            outcome = _compare_call(compiled[fn.name], reference[fn.name], fn, rng, attempt)
            if outcome.kind != "raised":
                break
        if outcome.kind in ("mismatch", "error"):
            return Outcome(outcome.kind, f"function {fn.name}: {outcome.detail}")
        outcomes.append(outcome)
    if any(o.kind == "compared" for o in outcomes):
        return Outcome("compared")
    return outcomes[0]


def check_gradient(source: str, seed: int, config: Config | None = None,
                   options: Mapping[str, Any] | None = None) -> Outcome:
    """The gradient of an accepted program's first function (`polytile.autodiff.backward`)
    is a TC program of its own: "rejected" where the function has none (no float input
    or output, an op without a derivative); a derived program the front end refuses is
    a mismatch (autodiff must write valid TC); otherwise `check_compiled` of it."""
    from polytile.autodiff import backward
    try:
        derived = backward(analyze(parse(source)).functions[0])
    except PolytileError as err:
        return Outcome("rejected", type(err).__name__)
    try:
        analyze(parse(derived.source, "<gradient>"))
    except PolytileError as err:
        return Outcome("mismatch", f"the front end rejects the derived gradient: {err}\n"
                                   f"{derived.source}")
    outcome = check_compiled(derived.source, seed, config, options)
    if outcome.kind in ("mismatch", "error"):
        return Outcome(outcome.kind, f"{outcome.detail}\nthe derived gradient:\n"
                                     f"{derived.source}")
    return outcome


def _compare_call(compiled: Any, reference: Any, fn: P.Function, rng: np.random.Generator,
                  attempt: int) -> Outcome:
    sizes = {name: int(rng.integers(1, 5 + 4 * attempt)) for name in fn.sizes}
    args = tuple(_argument(p, sizes, rng) for p in fn.params)
    shown = f"sizes {sizes}"
    try:
        out = _initial_outputs(fn, args, rng)
    except PolytileError as err:
        return Outcome("raised", type(err).__name__)
    saved = [np.array(a, copy=True) for a in args]
    results: list[tuple[Any, ...] | PolytileError] = []
    for backend in (reference, compiled):
        try:
            result = backend(*args, out={k: v.copy() for k, v in out.items()} or None)
            results.append(result if isinstance(result, tuple) else (result,))
        except PolytileError as err:
            results.append(err)
        except Exception:  # noqa: BLE001
            return Outcome("error", f"{backend.backend} backend, {shown}:\n"
                           + traceback.format_exc())
        for a, before in zip(args, saved):
            if not np.array_equal(np.asarray(a), before, equal_nan=True):
                return Outcome("mismatch", f"the {backend.backend} backend modified an input "
                               f"({shown})")
    want, got = results
    if isinstance(want, PolytileError) or isinstance(got, PolytileError):
        if isinstance(want, PolytileError) and isinstance(got, PolytileError):
            return Outcome("raised", type(want).__name__)
        which, raised = (("reference", want) if isinstance(want, PolytileError)
                         else ("compiled", got))
        return Outcome("mismatch", f"only the {which} backend raised ({shown}): {raised}")
    floor = narrowest_tolerance(fn)
    for o, g, w in zip(fn.outputs, got, want):
        problem = difference(np.asarray(g), np.asarray(w), floor)
        if problem:
            if overflowed(fn, got, want, floor):
                return Outcome("overflowed", f"output {o.name} ({shown}): {problem}")
            return Outcome("mismatch", f"output {o.name} ({shown}): {problem}")
    return Outcome("compared")


def overflowed(fn: P.Function, got: tuple[Any, ...], want: tuple[Any, ...],
               floor: float) -> bool:
    """Whether the outputs agree wherever both are finite, in a function that sums or
    multiplies floats over reduction indices: where one backend's reduction overflowed
    (inf, then NaN from inf * 0) and the other's, in another order, did not, the
    language's unordered reduction makes both right (the seed 14 find: the reference
    takes the product of large int32 values before multiplying it into a 0)."""
    if not any(st.reduction_indices and st.op in ("+=", "*=")
               and fn.tensor(st.tensor).dtype.is_float for st in fn.statements):
        return False
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        if g.dtype.kind in "biu":
            if not np.array_equal(g, w):
                return False
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(g64) & np.isfinite(w64)
        if difference(g[finite], w[finite], floor):
            return False
    return True


def _argument(p: P.Tensor, sizes: dict[str, int], rng: np.random.Generator) -> Any:
    dtype = np.dtype(p.dtype.numpy)
    if p.kind == "scalar":
        return _values(dtype, (), rng, scalar=True)[()]
    shape = tuple(int(d.evaluate(sizes)) for d in p.shape)
    return _layout(_values(dtype, shape, rng), rng)


def _values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator,
            scalar: bool = False) -> np.ndarray:
    values: np.ndarray
    if dtype == np.bool_:
        values = rng.random(shape) < 0.5
    elif dtype.kind in "iu":
        if scalar or rng.random() < 0.7:    # small: gathers stay in range
            values = rng.integers(0, 3 if scalar else 4, shape)
        else:
            info = np.iinfo(dtype)
            values = rng.integers(max(info.min, -(1 << 40)), min(info.max, 1 << 40),
                                  shape, endpoint=True)
    else:
        mode = rng.random()
        if mode < 0.6:
            values = rng.integers(-8, 9, shape) / 4
        elif mode < 0.8:     # one sign: the start of max=!/min=!, the domain of sqrt and log
            values = rng.integers(1, 9, shape) / (4 if mode < 0.7 else -4)
        else:
            values = 2 * rng.standard_normal(shape)
    array = np.asarray(values).astype(dtype)
    if array.size and not array.any():
        array.flat[0] = 1
    return array


def _layout(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The same values, sometimes as a Fortran-ordered or a strided view."""
    kind = rng.integers(0, 4)
    if a.ndim == 0 or kind >= 2:
        return a
    if kind == 0 and a.ndim >= 2:
        return np.asfortranarray(a)
    big = np.zeros(tuple(2 * s + 1 for s in a.shape), dtype=a.dtype)
    view = big[tuple(slice(1, 2 * s + 1, 2) for s in a.shape)]
    view[...] = a
    return view


def _initial_outputs(fn: P.Function, args: tuple[Any, ...], rng: np.random.Generator
                     ) -> dict[str, np.ndarray]:
    """Starting values of the outputs read before written (passed with out=)."""
    if not fn.inout:
        return {}
    shapes = {p.name: np.shape(a) for p, a in zip(fn.params, args) if p.kind == "input"}
    scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
    spec = specialize(fn, shapes, scalars)
    return {o.name: _values(np.dtype(o.dtype.numpy), spec.shape(o.name), rng)
            for o in fn.outputs if o.name in fn.inout}


def narrowest_tolerance(fn: P.Function) -> float:
    """The tolerance of the narrowest float type `fn` holds a value in (a tensor, a
    literal, an operation's result): a float64 output of float32 `expf` carries
    float32's error, and NumPy's float32 exp is off by an ulp where libm's is not."""
    names = {t.dtype.name for t in fn.params + fn.outputs + fn.temps}
    stack: list[Any] = [st.rhs for st in fn.statements]
    while stack:
        e = stack.pop()
        names.add(e.dtype.name)
        stack.extend(getattr(e, "args", ()) + getattr(e, "indices", ()))
    return max((TOLERANCE[n] for n in names if n in TOLERANCE), default=0.0)


def difference(got: np.ndarray, want: np.ndarray, floor: float = 0.0) -> str:
    """'' when got equals want (to the tolerance of their dtype, at least `floor`), else
    what differs."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
    name = want.dtype.name if want.dtype != ml_dtypes.bfloat16 else "bfloat16"
    if name not in TOLERANCE:
        bad = got != want
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        finite = np.isfinite(w)
        scale = max(1.0, float(np.abs(w[finite]).max())) if finite.any() else 1.0
        with np.errstate(invalid="ignore"):
            close = np.abs(g - w) <= max(TOLERANCE[name], floor) * np.maximum(np.abs(w),
                                                                             scale)
        same = (np.isnan(g) & np.isnan(w)) | (g == w)      # NaN and inf in the same places
        bad = ~(same | (finite & close))
    if not bad.any():
        return ""
    where = tuple(int(x) for x in np.argwhere(bad)[0])
    return (f"{int(bad.sum())} of {bad.size} elements differ, first at {where}: got "
            f"{got[where]!r}, expected {want[where]!r}")
