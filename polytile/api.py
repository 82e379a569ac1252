"""define() and the Module object: the one place that wires the layers together.

    mod = polytile.define(src)
    y = mod.fcrelu(x, w, b)              # NumPy in, NumPy out
    y = mod.fcrelu(x, w, b, out=y)       # write into caller-provided buffers
    y = mod.fcrelu(x, w, b, tune=True)   # autotune for these shapes first (polytile.tune)
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import index
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from polytile import dtypes
from polytile.config import Config, load_config, parse_sanitizers
from polytile.deep import SHALLOW, call_deep
from polytile.errors import ArgumentError, PolytileError
from polytile.interop import device
from polytile.interop.adapters import NUMPY, Adapter, AdapterError, adapter_for
from polytile.lang.parser import parse
from polytile.runtime import dispatch
from polytile.sema import program as P
from polytile.sema import reference
from polytile.sema.analyze import analyze
from polytile.sema.specialize import Specialized, specialize
from polytile.targets.target import Target, select_target

if TYPE_CHECKING:
    from polytile.compile import CompiledFunction, Compiler, TunedLookup, TuningKey
    from polytile.tune.tuner import TuneResult

BACKENDS = ("c", "interp")


def define(source: str, backend: str = "c", name: str = "<tc>", target: str | None = None,
           config: Config | None = None, sanitize: str | Sequence[str] | None = None
           ) -> "Module":
    """Parse and check TC source; the returned Module has one callable per `def`.

    backend "c" (default) compiles each function to native code on its first call with
    a new set of shapes; "interp" runs the NumPy reference interpreter. `sanitize`
    ("address,undefined", or a list) builds the kernels with those sanitizers
    (polytile.runtime.sanitize), overriding POLYTILE_SANITIZE.
    """
    if backend not in BACKENDS:
        raise ArgumentError(f"unknown backend {backend!r}", hint=f"use one of {BACKENDS}")
    program = analyze(parse(source, name))
    config = config or load_config()
    if sanitize is not None:
        config = replace(config, sanitize=parse_sanitizers(sanitize))
    compiled = None
    if backend == "c":
        from polytile.compile import Compiler
        compiled = Compiler(config, select_target(target or config.target),
                            tuned=tuned_lookup(config))
    return Module(source, program, backend, compiled)


def tuned_lookup(config: Config) -> "TunedLookup | None":
    """Compiler(tuned=...): the tuning database's best options for a key (None when
    config.ignore_tuned)."""
    if config.ignore_tuned:
        return None

    def lookup(key: "TuningKey") -> dict[str, Any] | None:
        from polytile.tune.database import lookup as find
        return find(config, key)
    return lookup


@dataclass
class Module:
    source: str
    program: P.Program
    backend: str
    compiler: "Compiler | None" = None
    _functions: dict[str, "TCFunction"] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for fn in self.program.functions:
            self._functions[fn.name] = TCFunction(fn, self.backend, self.compiler)
            # An instance attribute, so `mod.name` does not go through __getattr__.
            self.__dict__.setdefault(fn.name, self._functions[fn.name])

    @property
    def target(self) -> Target | None:
        return self.compiler.target if self.compiler else None

    def __getattr__(self, name: str) -> "TCFunction":
        functions = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"this TC source defines no function {name!r}; it defines "
                             f"{', '.join(functions) or 'nothing'}")

    def __getitem__(self, name: str) -> "TCFunction":
        """For names that are not Python identifiers, e.g. mod["2LUT"]."""
        try:
            return self._functions[name]
        except KeyError:
            raise ArgumentError(f"this TC source defines no function {name!r}") from None

    def __dir__(self) -> list[str]:
        return list(self._functions) + list(super().__dir__())


@dataclass
class TCFunction:
    fn: P.Function
    backend: str
    compiler: "Compiler | None" = None
    _specs: dict[tuple, Specialized] = field(default_factory=dict)
    _kernels: dict[tuple, "CompiledFunction"] = field(default_factory=dict)
    # The kernels' native call path (polytile.runtime.dispatch); None: the Python one
    # (and `_dispatch_generation` is dispatch.generation when a dispatcher was asked for).
    _dispatch: Any = None
    _dispatch_generation: int = -1

    def __post_init__(self) -> None:
        params = self.fn.params
        self._tensor_pos = tuple(k for k, p in enumerate(params) if p.kind == "input")
        self._int_pos = tuple(k for k, p in enumerate(params)
                              if p.kind == "scalar" and p.dtype.is_integral)
        # Expressions too deep for the caller's stack compile and run on a deep one.
        self._deep = max((P.depth(s.rhs) for s in self.fn.statements), default=0) > SHALLOW

    @property
    def name(self) -> str:
        return self.fn.name

    def __call__(self, *args: Any, out: Any = None, tune: Any = False, **unknown: Any) -> Any:
        """Run on NumPy arrays. `tune=True` (or a budget like "30s", or a dict of
        settings for polytile.tune) tunes for these shapes first."""
        if self._dispatch is not None and not unknown and tune is False:
            result = self._dispatch(args, out)
            if result is not NotImplemented:
                return result
        if unknown:
            raise self._unknown_keywords(unknown)
        if tune is not False and tune is not None:
            settings = ({} if tune is True else dict(tune) if isinstance(tune, dict)
                        else {"budget": tune})
            self.tune(*args, out=out, **settings)
        elif self._kernels:
            result = self._fast_call(args, out)
            if result is not None:
                return result
        if self._deep:
            return call_deep(self._checked_call, args, out)
        return self._checked_call(args, out)

    def _checked_call(self, args: tuple[Any, ...], out: Any) -> Any:
        """Bind and check the arguments, specialize and compile on a new shape, run."""
        if device.on_device(args, out):
            return self._device_call(args, out)
        inputs, scalars, adapter = self._bind_inputs(args)
        key, spec = self._specialized(inputs, scalars)
        outputs, results = self._bind_outputs(spec, out, adapter)
        if self.compiler is None:
            reference.run(spec, {**inputs, **scalars}, outputs)
        else:
            self._compiled(key, spec).run(inputs, scalars, outputs)
        return results[0] if len(results) == 1 else tuple(results)

    def _specialized(self, inputs: dict[str, Any], scalars: dict[str, Any]
                     ) -> tuple[tuple, Specialized]:
        """The key and specialization of bound arguments (anything with a shape)."""
        key = self._bound_key(inputs, scalars)
        spec = self._specs.get(key)
        if spec is None:
            shapes = {p.name: tuple(inputs[p.name].shape) for p in self.fn.params
                      if p.kind == "input"}
            spec = self._specs[key] = specialize(self.fn, shapes, scalars)
        return key, spec

    def _compiled(self, key: tuple, spec: Specialized) -> CompiledFunction:
        assert self.compiler is not None
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self.compiler.compile(spec)
            self._dispatch_kernels()
        return kernel

    def _dispatch_kernels(self) -> None:
        """Give the native call path the kernels compiled so far (all of them again, so
        one dropped by tune() goes too)."""
        assert self.compiler is not None
        if self._dispatch is None:
            self._dispatch_generation = dispatch.generation
            self._dispatch = dispatch.new_dispatcher(self.compiler.config)
            if self._dispatch is None:
                return
        self._dispatch.clear()
        for (_, ints), kernel in self._kernels.items():
            entry = kernel.dispatch_entry(ints)
            if entry is not None:
                try:
                    self._dispatch.add(*entry)
                except (OverflowError, ValueError, TypeError):
                    pass        # a value the C side does not hold: the Python path runs it

    def _device_call(self, args: tuple[Any, ...], out: Any) -> Any:
        """A call on CUDA device memory (polytile.interop.device): the tensors passed by
        pointer, outputs allocated on the inputs' device unless given with out=."""
        if len(args) != len(self.fn.params):
            self._bind_inputs(args)         # raises the arity error
        call = device.bind(self.fn, args, _out_mapping(self.fn, out), _scalar)
        runs = self.host_runner()
        if runs is not None:
            name, tensor = next(iter(call.inputs.items()))
            raise device.refused(self.name, name, tensor.where, runs, self.fn.loc)
        key, spec = self._specialized(call.inputs, call.scalars)
        kernel = self._compiled(key, spec)
        gpu = kernel.device
        assert gpu is not None, "a cuda target's kernel knows its device"
        outputs: dict[str, Any] = {}
        results: list[Any] = []
        for o, cleared, (shape, dtype) in zip(self.fn.outputs, kernel.cleared,
                                             kernel.output_types):
            given = call.outputs.get(o.name)
            if given is None:
                self._check_not_inout(o)
                native, given = device.allocate(call.first, gpu, shape, dtype, cleared)
            elif given.shape != shape:
                raise ArgumentError(f"out= for {o.name} must have shape {shape}, got "
                                    f"{given.shape}", o.loc)
            else:
                native = given.owner
            outputs[o.name] = given.buffer()
            results.append(native)
        kernel.run_device({n: t.buffer() for n, t in call.inputs.items()}, call.scalars,
                          outputs)
        return results[0] if len(results) == 1 else tuple(results)

    def host_runner(self) -> str | None:
        """None when this function runs on CUDA device memory (a cuda target), else
        what runs it on host memory, in words ("target x86-avx2", "backend interp")."""
        if self.compiler is None:
            return f"backend {self.backend}"
        target = self.compiler.target
        return None if target.backend == "cuda" else f"target {target.name}"

    def _unknown_keywords(self, unknown: dict[str, Any]) -> ArgumentError:
        params = ", ".join(p.name for p in self.fn.params)
        return ArgumentError(f"{self.name} got unknown keyword argument(s) "
                             f"{', '.join(sorted(unknown))}", self.fn.loc,
                             f"pass its parameters ({params}) by position; the keywords are "
                             "out= and tune=")

    def tune(self, *args: Any, out: Any = None, **settings: Any) -> "TuneResult":
        """Autotune this function for the shapes of `args` and store the best options;
        later calls (in any process) with these shapes use them. Settings: see
        polytile.tune.tuner.TuneSettings.of (budget="60s", strategy="genetic", ...)."""
        from polytile.tune.tuner import TuneSettings, tune_spec
        if self.compiler is None:
            raise ArgumentError("tuning needs the C backend", self.fn.loc,
                                "define the module with backend='c'")
        options = TuneSettings.of(**settings)
        inputs, scalars, adapter = self._bind_inputs(args)
        shapes = {p.name: inputs[p.name].shape for p in self.fn.params if p.kind == "input"}
        spec = specialize(self.fn, shapes, scalars)
        outputs, _ = self._bind_outputs(spec, out, adapter)
        sizes = ",".join(f"{k}={v}" for k, v in spec.env)
        result = tune_spec(self.compiler, spec, inputs, scalars, outputs, options,
                           label=f"{self.name} {sizes}")
        # The next call compiles again, which now finds the tuned options.
        self._kernels.pop(self._bound_key(inputs, scalars), None)
        if self._dispatch is not None:
            self._dispatch_kernels()
        return result

    def _bound_key(self, inputs: dict[str, np.ndarray], scalars: dict[str, Any]) -> tuple:
        """The key of bound arguments (views of any adapted array)."""
        return self._key([inputs[p.name] if p.kind == "input" else scalars[p.name]
                          for p in self.fn.params], int)     # checked scalars (np.bool_ too)

    def _key(self, args: Sequence[Any], to_int: Callable[[Any], int] = index) -> tuple:
        """Shapes of the tensors and values of the integer scalars: one compiled kernel each."""
        # Runs on every call: list comprehensions (a generator costs a microsecond), and no
        # tuple built when there are no integer scalars. On raw arguments operator.index
        # takes ints only (a float or complex raises TypeError: the checked path judges it).
        shapes = tuple([args[k].shape for k in self._tensor_pos])
        return shapes, (tuple([to_int(args[k]) for k in self._int_pos]) if self._int_pos
                        else ())

    def compiled(self, args: Sequence[Any]) -> "CompiledFunction | None":
        """The kernel already compiled for these arguments' shapes (and integer scalars),
        or None; compiles nothing and checks nothing else."""
        if (self._dispatch is None and self._kernels
                and self._dispatch_generation != dispatch.generation):
            self._dispatch_kernels()            # the native call path was built meanwhile
        try:
            return self._kernels.get(self._key(args))
        except (AttributeError, TypeError, ValueError, OverflowError):
            return None

    def _fast_call(self, args: tuple[Any, ...], out: Any) -> Any:
        """The cached path: arguments already seen with these shapes; None to take the
        checked path (anything unusual, including every error, goes there)."""
        if len(args) != len(self.fn.params):
            return None
        if out is not None and not isinstance(out, np.ndarray) and not (
                isinstance(out, tuple) and len(out) == len(self.fn.outputs)):
            return None
        kernel = self.compiled(args)
        if kernel is None:
            return None
        return kernel.run_fast(args, out)

    # ------------------------------------------------------------ binding
    def _bind_inputs(self, args: tuple[Any, ...]
                     ) -> tuple[dict[str, np.ndarray], dict[str, Any], Adapter]:
        """NumPy views of the tensors, checked scalars, and the adapter that makes the
        outputs: that of the first tensor argument (polytile.interop.adapters)."""
        params = self.fn.params
        if len(args) != len(params):
            names = ", ".join(p.name for p in params)
            plural = "" if len(params) == 1 else "s"
            raise ArgumentError(f"{self.name} takes {len(params)} argument{plural} ({names}), got "
                                f"{len(args)}", self.fn.loc)
        inputs: dict[str, np.ndarray] = {}
        scalars: dict[str, Any] = {}
        first: Adapter | None = None
        for p, value in zip(params, args):
            if p.kind == "scalar":
                scalars[p.name] = _scalar(p, value)
            else:
                adapter, inputs[p.name] = _array(p, value)
                first = first or adapter
        return inputs, scalars, first or NUMPY

    def _bind_outputs(self, spec: Specialized, out: Any, adapter: Adapter
                      ) -> tuple[dict[str, np.ndarray], list[Any]]:
        """NumPy views the kernel writes, and the objects returned to the caller: the
        out= ones, else new ones made by `adapter`."""
        user = _out_mapping(self.fn, out)
        outputs: dict[str, np.ndarray] = {}
        results: list[Any] = []
        for o in self.fn.outputs:
            shape = spec.shape(o.name)
            given = user.get(o.name)
            if given is None:
                self._check_not_inout(o)
                native, outputs[o.name] = adapter.allocate(shape, o.dtype.numpy)
                results.append(native)
                continue
            _, view = _view(o, given, "out= for ")
            if not view.flags.writeable:
                raise ArgumentError(f"out= for {o.name} is read-only", o.loc)
            if view.shape != shape or view.dtype != o.dtype.numpy:
                raise ArgumentError(f"out= for {o.name} must have shape {shape} and dtype "
                                    f"{o.dtype}, got {view.shape} {view.dtype}", o.loc)
            outputs[o.name] = view
            results.append(given)
        return outputs, results


    def _check_not_inout(self, o: P.Tensor) -> None:
        """An output not given with out= must not be read before it is written."""
        if o.name in self.fn.inout:
            raise ArgumentError(
                f"{o.name} is read before it is written (an in/out output): pass its "
                f"initial value with out=", o.loc,
                "or start the reduction from its identity with +=!, *=!, min=!, max=!")


def _out_mapping(fn: P.Function, out: Any) -> dict[str, np.ndarray]:
    if out is None:
        return {}
    if isinstance(out, dict):
        unknown = set(out) - {o.name for o in fn.outputs}
        if unknown:
            raise ArgumentError(f"out= names {sorted(unknown)}, which are not outputs of "
                                f"{fn.name}")
        return dict(out)
    items = out if isinstance(out, (tuple, list)) else (out,)
    if len(items) != len(fn.outputs):
        raise ArgumentError(f"out= must give {len(fn.outputs)} arrays for "
                            f"{', '.join(o.name for o in fn.outputs)}, got {len(items)}")
    return {o.name: a for o, a in zip(fn.outputs, items) if a is not None}


def _view(p: P.Tensor, value: Any, what: str = "") -> tuple[Adapter, np.ndarray]:
    """An array argument's adapter and a NumPy view of its memory."""
    adapter = adapter_for(value)
    if adapter is None:
        raise ArgumentError(f"{what}{p.name} must be an array of {p.dtype} (NumPy, or any "
                            f"object with __dlpack__ or the buffer protocol), got "
                            f"{type(value).__name__}", p.loc)
    try:
        return adapter, adapter.view(value)
    except AdapterError as e:
        raise ArgumentError(f"{what}{p.name}: {e}", p.loc) from None


def _array(p: P.Tensor, value: Any) -> tuple[Adapter, np.ndarray]:
    adapter, array = _view(p, value)
    if array.dtype != p.dtype.numpy:
        raise ArgumentError(f"{p.name} must have dtype {p.dtype}, got {array.dtype}", p.loc,
                            f"convert it with .astype(np.{p.dtype.numpy})")
    return adapter, array


def _scalar(p: P.Tensor, value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    problem = dtypes.scalar_problem(p.dtype, value)
    if problem is not None:
        raise ArgumentError(f"{p.name} {problem[0]}", p.loc, problem[1])
    return p.dtype.numpy.type(value)


def tune(fn: TCFunction, *args: Any, out: Any = None, **settings: Any) -> "TuneResult":
    """polytile.tune(mod.fn, *args, budget="60s"): tune `fn` for these arguments' shapes
    and keep the best options in the tuning database (see TCFunction.tune)."""
    if not isinstance(fn, TCFunction):
        raise ArgumentError(f"polytile.tune takes a function of a defined module (mod.name), "
                            f"got {type(fn).__name__}")
    return fn.tune(*args, out=out, **settings)


__all__ = ["define", "Module", "TCFunction", "PolytileError", "dtypes", "tune"]


def define_like(fn: TCFunction, source: str, name: str) -> Module:
    """`source` defined as `fn`'s module was: same backend, target and configuration."""
    compiler = fn.compiler
    return define(source, backend=fn.backend, name=name,
                  target=compiler.target.name if compiler else None,
                  config=compiler.config if compiler else None)


def grad(fn: TCFunction, saved: bool = False, wrt: Sequence[str] | None = None) -> Module:
    """The gradient of a TC function, as a Module with one function, `<name>_grad`.

    It takes `fn`'s arguments followed by one gradient per floating-point output (with
    `saved=True`, the saved forward values in between: see polytile.autodiff) and
    returns the gradient of each floating-point input (of those named in `wrt`), in
    order. Its TC text is `grad(fn).source`; it compiles, tunes and caches like any TC
    function.
    """
    from polytile.autodiff import backward
    derived = backward(fn.fn, saved=saved, wrt=wrt)
    module = define_like(fn, derived.source, f"<grad of {fn.name}>")
    inner = module._functions[derived.name]
    checked = _SeededFunction(inner.fn, inner.backend, inner.compiler, forward=fn.fn,
                              seeds=tuple(o for o, _ in derived.seeds))
    module._functions[derived.name] = checked
    module.__dict__[derived.name] = checked
    return module


@dataclass
class _SeededFunction(TCFunction):
    """A gradient function: checks that the output gradients it is given have the
    forward outputs' shapes (the TC declares them with sizes of their own) before it runs."""

    forward: P.Function | None = None
    seeds: tuple[str, ...] = ()
    _expected: dict[tuple, tuple[tuple[int, ...], ...]] = field(default_factory=dict)

    def __call__(self, *args: Any, out: Any = None, tune: Any = False, **unknown: Any) -> Any:
        assert self.forward is not None
        n = len(self.forward.params)
        if len(args) == len(self.fn.params):
            shapes = tuple(_shape(a) for a in args[:n])
            expected = self._expected.get(shapes)
            if expected is None:
                tensors = {p.name: s for p, s in zip(self.forward.params, shapes)
                           if p.kind == "input"}
                scalars = {p.name: a for p, a in zip(self.forward.params, args)
                           if p.kind == "scalar"}
                spec = specialize(self.forward, tensors, scalars)
                expected = self._expected[shapes] = tuple(spec.shape(o) for o in self.seeds)
            given = args[len(args) - len(self.seeds):]
            for name, want, arg in zip(self.seeds, expected, given):
                if _shape(arg) != want:
                    raise ArgumentError(
                        f"the gradient of {name} has shape {_shape(arg)}, but "
                        f"{self.forward.name} gives {name} the shape {want}", self.forward.loc)
        return super().__call__(*args, out=out, tune=tune, **unknown)


def _shape(value: Any) -> tuple[int, ...]:
    """An argument's shape without reading its memory (device arrays have no __array__)."""
    shape = getattr(value, "shape", None)
    return tuple(int(d) for d in shape) if shape is not None else tuple(np.shape(value))
