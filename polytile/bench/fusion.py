"""`polytile bench --fusion`: the fusion planner's probe and workloads (issue 17).

First the cost model's probe: M(V) and phi measured on this host and stored in the cache
directory with the target (polytile.graph.cost), so later plans use them. Then, for
every workload of polytile.bench.fusion_workloads: the op count, the plan (its groups,
ILP solve time and rounds), the kernels (top-level loop nests) that pass fuse makes
without a plan (strategy "rows") and with it, every variant checked against NumPy, and
the times of NumPy, PyTorch eager, torch.compile (inductor), jax.jit (on the CPU, when
the optional jax is installed), polytile without the plan and polytile with it, measured
in the same run. The compiled frameworks are timed after their compiling first call, and
only where their result agrees with NumPy.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytile.bench.timing import TimingOptions, time_blocks
from polytile.bench.workload import Workload

# "none" (one kernel per statement) is what the cost model's scores are savings against:
# its time minus the plan's is the measured saving beside the model's objective.
VARIANTS = ("rows", "plan", "none")


@dataclass(frozen=True)
class FusionRow:
    workload: Workload
    ops: int = 0
    kernels: tuple[int, ...] = ()            # per variant
    groups: tuple[tuple[int, ...], ...] = ()
    plan_seconds: float = 0.0                # patterns, scores and ILP
    ilp_seconds: float = 0.0
    ilp_rounds: int = 0
    objective: float = 0.0                   # the model's saving of the plan vs "none", s
    times: tuple[tuple[str, float], ...] = ()    # (implementation, median seconds)
    status: str = "ok"
    same_ir: bool = False       # the plan builds what "rows" builds: their ratio is noise
    # The plan's kernel with the largest bytes moved / inputs + outputs (analysis.traffic)
    traffic: tuple[str, float] | None = None
    # Launches of the CUDA that cuda-sm90 prints with fuse.strategy none and rows (row
    # groups: FusionStitching's block composition), or why it prints none: no GPU needed
    gpu_launches: tuple[str, str] = ("", "")


def run(workloads: Sequence[Workload], options: TimingOptions, use_torch: bool = True,
        progress: Callable[[str], None] = lambda s: None,
        use_compile: bool = False, use_jax: bool = True) -> list[FusionRow]:
    rows = []
    for k, w in enumerate(workloads, 1):
        progress(f"[{k}/{len(workloads)}] {w.name}")
        try:
            rows.append(_run_one(w, options, use_torch, use_compile, use_jax, progress))
        except Exception as e:  # noqa: BLE001 - one workload's failure is a row, not the end
            rows.append(FusionRow(w, status=f"FAILED: {type(e).__name__}: {e}"))
    return rows


def specialized(w: Workload, args: tuple[Any, ...]) -> Any:
    """The workload's TC function specialized to the shapes of `args`."""
    import polytile as pt
    from polytile.sema.specialize import specialize

    fn = pt.define(w.tc)[w.function].fn
    shapes = {p.name: np.shape(a) for p, a in zip(fn.params, args) if p.kind != "scalar"}
    scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
    return specialize(fn, shapes, scalars)


def compiled_call(w: Workload, spec: Any, options: dict[str, Any]
                  ) -> tuple[Callable[..., Any], int, Any]:
    """A NumPy-in, NumPy-out call of the function compiled with `options`, how many
    top-level loop nests (kernels) its optimized IR has, and that IR (ir.nodes.Function).
    The call is a user's (`mod.fn(*args)`: the native call path, outputs from the pool),
    as the main bench's polytile column is: outputs from np.empty at each call made the
    perceptron 0.23 -> 0.30 ms on a Zen 5 host."""
    from polytile.analysis.traffic import kernels
    from polytile.api import Module
    from polytile.compile import Compiler
    from polytile.config import load_config
    from polytile.lang.parser import parse
    from polytile.sema.analyze import analyze
    from polytile.targets.target import select_target

    config = load_config()
    compiler = Compiler(config, select_target(config.target), options=options)
    module = Module(w.tc, analyze(parse(w.tc, w.key)), "c", compiler)
    ir = compiler.ir(spec)
    return getattr(module, w.function), len(kernels(ir)), ir


def gpu_launches(spec: Any, strategy: str, target: str = "cuda-sm90") -> str:
    """How many kernels the CUDA printed for `spec` with `fuse.strategy` = `strategy`
    launches, or the error class where it prints none."""
    from polytile.codegen.cuda import print_cuda
    from polytile.compile import Compiler
    from polytile.config import load_config
    from polytile.errors import PolytileError
    from polytile.loops.lower import lower
    from polytile.targets.target import load_target

    compiler = Compiler(load_config(), load_target(target),
                        options={"fuse.strategy": strategy})
    try:
        return str(len(print_cuda(lower(compiler.ir(spec))).launches))
    except PolytileError as e:
        return type(e).__name__


def _run_one(w: Workload, options: TimingOptions, use_torch: bool, use_compile: bool,
             use_jax: bool, progress: Callable[[str], None]) -> FusionRow:
    from polytile.analysis.traffic import KernelTraffic, kernel_traffic, largest
    from polytile.config import load_config
    from polytile.graph.plan import plan_fusion
    from polytile.ir.printer import format_function
    from polytile.targets.target import select_target

    args = w.make_inputs(np.random.default_rng(0))
    spec = specialized(w, args)
    config = load_config()
    start = time.perf_counter()
    plan = plan_fusion(spec, select_target(config.target), config)
    plan_seconds = time.perf_counter() - start
    calls: dict[str, Callable[[], Any]] = {"numpy": lambda: w.numpy(*args)}
    expected = _tuple(w.numpy(*args))
    kernels, texts = [], []
    heaviest: KernelTraffic | None = None
    options_of: dict[str, dict[str, Any]] = {"rows": {}, "none": {"fuse.strategy": "none"},
                                             "plan": {"fuse.groups": plan.option}}
    for variant in VARIANTS:
        call, count, ir = compiled_call(w, spec, options_of[variant])
        kernels.append(count)
        texts.append(format_function(ir))
        if variant == "plan":
            heaviest = largest(kernel_traffic(ir))
        got = _tuple(call(*args))
        for g, e in zip(got, expected):
            if not np.allclose(g, e, rtol=w.rtol, atol=w.atol):
                worst = float(np.max(np.abs(np.asarray(g, np.float64) - e)))
                return FusionRow(w, len(plan.graph.ops), tuple(kernels), plan.groups,
                                 status=f"WRONG ({variant}: max error {worst:.3g})")
        calls[f"polytile {variant}"] = functools.partial(call, *args)
    if use_torch and w.torch is not None:
        torch_call = _torch_call(w, args, compiled=False)
        if torch_call is not None:
            calls["torch eager"] = torch_call
        if use_compile:
            start = time.perf_counter()
            inductor = _torch_call(w, args, compiled=True)
            if inductor is not None:
                got = _tuple(tuple(_numpy(v) for v in _as_tuple(inductor())))
                if all(np.allclose(g, e, rtol=w.rtol, atol=w.atol)
                       for g, e in zip(got, expected)):
                    calls["torch.compile"] = inductor
                    progress(f"  torch.compile: {time.perf_counter() - start:.1f} s")
                else:
                    progress("  torch.compile: result differs from NumPy, not timed")
    if use_jax and w.jax is not None:
        start = time.perf_counter()
        jitted = _jax_call(w, args)
        if jitted is not None:
            got = _tuple(tuple(np.asarray(v) for v in _as_tuple(jitted())))
            if all(np.allclose(g, e, rtol=w.rtol, atol=w.atol) for g, e in zip(got, expected)):
                calls["jax.jit"] = jitted
                progress(f"  jax.jit: {time.perf_counter() - start:.1f} s")
            else:
                progress("  jax.jit: result differs from NumPy, not timed")
    for c in calls.values():
        c()
    timed = time_blocks(calls, options)
    return FusionRow(w, len(plan.graph.ops), tuple(kernels), plan.groups, plan_seconds,
                     plan.solve_seconds, plan.rounds, plan.objective,
                     tuple((name, t.median) for name, t in timed.items()),
                     same_ir=texts[0] == texts[1],
                     traffic=(heaviest.name, heaviest.ratio) if heaviest else None,
                     gpu_launches=(gpu_launches(spec, "none"), gpu_launches(spec, "rows")))


def _tuple(value: Any) -> tuple[np.ndarray, ...]:
    values = value if isinstance(value, tuple) else (value,)
    return tuple(np.asarray(v, np.float64) for v in values)


def _torch_call(w: Workload, args: tuple[Any, ...],
                compiled: bool) -> Callable[[], Any] | None:
    """The PyTorch version on the same data (eager, or through torch.compile after its
    compiling first call), or None without torch or when torch.compile fails."""
    try:
        import torch
        import torch._dynamo
    except ImportError:
        return None
    tensors = tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) and a.ndim else a
                    for a in args)
    layer = w.torch
    assert layer is not None
    if compiled:
        torch._dynamo.reset()      # a fresh compile per workload: no dynamic-shape reuse
        try:
            layer = torch.compile(layer)
            layer(*tensors)
        except Exception:  # noqa: BLE001 - a missing compiler leaves the column n/a
            return None
    else:
        layer(*tensors)
    return functools.partial(layer, *tensors)


def _jax_call(w: Workload, args: tuple[Any, ...]) -> Callable[[], Any] | None:
    """The JAX version jitted on the CPU, on the same data (placed on the CPU once),
    after its compiling first call; each call waits for its result (JAX dispatches
    asynchronously). None without jax."""
    try:
        import jax
    except ImportError:
        return None
    assert w.jax is not None
    # Computation follows its data: inputs on the CPU device keep the jitted function on
    # the CPU even where JAX has a GPU (polytile is compared on the CPU here).
    cpu = jax.devices("cpu")[0]
    arrays = tuple(jax.device_put(a, cpu) for a in args)
    jitted = jax.jit(w.jax)

    def call() -> Any:
        return jax.block_until_ready(jitted(*arrays))
    call()
    return call


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def _numpy(value: Any) -> Any:
    return value.detach().numpy() if hasattr(value, "detach") else value


def table(rows: Sequence[FusionRow]) -> tuple[list[str], list[list[str]]]:
    head = ["workload", "ops", "kernels rows", "kernels plan", "cuda launches none / rows",
            "max traffic", "plan",
            "ILP ms (solves)", "numpy f64 ms", "torch ms", "inductor ms", "jax ms", "rows ms",
            "plan ms", "plan vs rows", "plan vs torch", "plan vs inductor", "plan vs jax",
            "none ms", "saved ms: model / measured"]
    body = []
    for r in rows:
        if r.status != "ok":
            body.append([r.workload.name, str(r.ops or ""), *(str(k) for k in r.kernels),
                         r.status])
            continue
        t = dict(r.times)
        plan = " ".join("{" + ",".join(map(str, g)) + "}" for g in r.groups)
        torch_ms = t.get("torch eager")
        inductor_ms = t.get("torch.compile")
        jax_ms = t.get("jax.jit")
        body.append([
            r.workload.name, str(r.ops), str(r.kernels[0]), str(r.kernels[1]),
            " / ".join(r.gpu_launches),
            f"{r.traffic[1]:.2f}x ({r.traffic[0]})" if r.traffic else "n/a", plan,
            f"{r.ilp_seconds * 1e3:.1f} ({r.ilp_rounds})", f"{t['numpy'] * 1e3:.3f}",
            f"{torch_ms * 1e3:.3f}" if torch_ms else "n/a",
            f"{inductor_ms * 1e3:.3f}" if inductor_ms else "n/a",
            f"{jax_ms * 1e3:.3f}" if jax_ms else "n/a",
            f"{t['polytile rows'] * 1e3:.3f}", f"{t['polytile plan'] * 1e3:.3f}",
            f"{t['polytile rows'] / t['polytile plan']:.2f}x"
            + (" (same IR)" if r.same_ir else ""),
            f"{torch_ms / t['polytile plan']:.2f}x" if torch_ms else "n/a",
            f"{inductor_ms / t['polytile plan']:.2f}x" if inductor_ms else "n/a",
            f"{jax_ms / t['polytile plan']:.2f}x" if jax_ms else "n/a",
            *_savings(r, t)])
    body += _geomeans(rows)
    return head, body


def _savings(r: FusionRow, t: dict[str, float]) -> list[str]:
    """The time of one kernel per statement, and what the plan saves against it: by the
    cost model (the ILP's objective) and as measured (none - plan)."""
    none_s = t.get("polytile none")
    if none_s is None:
        return ["n/a", f"{r.objective * 1e3:.3f} / n/a"]
    return [f"{none_s * 1e3:.3f}",
            f"{r.objective * 1e3:.3f} / {(none_s - t['polytile plan']) * 1e3:.3f}"]


def _geomeans(rows: Sequence[FusionRow]) -> list[list[str]]:
    """A last row: the geometric mean of each 'plan vs X' column over the workloads that
    have X (n/a where none has; the count is given where some lack it)."""
    ok = [dict(r.times) for r in rows if r.status == "ok"]
    if len(ok) < 2:
        return []
    cells = []
    for name in ("polytile rows", "torch eager", "torch.compile", "jax.jit"):
        ratios = [t[name] / t["polytile plan"] for t in ok if t.get(name)]
        if not ratios:
            cells.append("n/a")
            continue
        mean = float(np.exp(np.mean(np.log(ratios))))
        cells.append(f"{mean:.2f}x" + ("" if len(ratios) == len(ok) else
                                       f" (of {len(ratios)})"))
    return [["geomean", *[""] * 13, *cells, "", ""]]


NOTE = ("Kernels are top-level loop nests of the optimized IR (hoisted initializations "
        "of column sums count); ops are TC statements, what a framework runs as one "
        "kernel each. 'max traffic' is the plan's kernel with the largest ratio of bytes "
        "moved to its inputs + outputs (exact footprints, no caches between a stitched "
        "kernel's phases: polytile.analysis.traffic; issue 17's target is 1.2x). 'rows' "
        "is pass fuse's heuristic without a plan (the default); "
        "'plan' is the ILP plan of polytile.graph. Times are medians of blocks of calls "
        "(polytile.bench.timing); 'plan vs X' > 1 means the plan is faster. Where the plan "
        "builds the same IR as 'rows' (same IR), their ratio is the run's noise. 'numpy "
        "f64' is the float64 oracle, not a tuned NumPy baseline. 'none' is one kernel "
        "per statement, the baseline of the cost model: 'saved' is the plan's saving "
        "against it by the model (the ILP's objective) and as measured. 'inductor' is "
        "torch.compile's default backend, 'jax' jax.jit on the CPU; both are timed after "
        "their compiling call, and n/a where absent, failing or disagreeing with NumPy. "
        "'cuda launches' counts the kernels of the CUDA that cuda-sm90 prints (no GPU "
        "runs it) with one kernel per statement and with fuse.strategy rows, whose fused "
        "rows run as row groups (FusionStitching's block composition); an error class "
        "where it prints none.")
