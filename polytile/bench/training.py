"""`polytile bench --training`: a training step (forward and backward) of layers written
in TC, through polytile.torch.op with its derived gradient, against the same layers in
torch eager, in the same run.

A step is `y = layer(*params); y.backward(seed)` from fresh gradients; both sides get the
same inputs and seed, and the outputs and every gradient are compared with torch's
before anything is timed (a mismatch is WRONG and times nothing). The layers are the
throughput bench's (polytile.bench.workloads), so their TC, inputs and torch versions
are the ones timed there.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytile.bench.contractions import mlp1, mlp3
from polytile.bench.memorybound import layernorm
from polytile.bench.timing import TimingOptions, time_blocks
from polytile.bench.workload import Workload


def training_set(quick: bool) -> list[Workload]:
    if quick:
        return [mlp1(8, 41, 13), mlp3(8, 17, 9, 5, 2), layernorm(33, 67)]
    return [mlp1(128, 2000, 128), mlp3(128, 128, 64, 32, 2),
            mlp3(128, 1024, 1024, 1024, 1024), layernorm(4096, 1024)]


@dataclass(frozen=True)
class TrainingRow:
    workload: Workload
    polytile: float | None = None      # seconds per step (median)
    torch: float | None = None
    first_call: float | None = None    # seconds: compile the forward and the gradient
    status: str = "ok"


def run(workloads: Sequence[Workload], options: TimingOptions,
        progress: Callable[[str], None] = lambda s: None) -> list[TrainingRow]:
    rows = []
    for k, w in enumerate(workloads, 1):
        progress(f"[{k}/{len(workloads)}] {w.name} (training step)")
        rows.append(_run_one(w, options))
    return rows


def _run_one(w: Workload, options: TimingOptions) -> TrainingRow:
    import time

    import torch

    import polytile as pt
    import polytile.torch as ptt

    layer = w.torch
    if layer is None:
        return TrainingRow(w, status="no torch version")
    args = w.make_inputs(np.random.default_rng(0))
    op = ptt.op(pt.define(w.tc)[w.function])
    ours = [leaf(torch, a) for a in args]
    theirs = [leaf(torch, a) for a in args]
    seed = torch.randn(layer(*[t.detach() for t in theirs]).shape,
                       generator=torch.Generator().manual_seed(1))

    def step(layer: Callable[..., Any], leaves: list[Any]) -> Any:
        for t in leaves:
            t.grad = None
        y = layer(*leaves)
        y.backward(seed)
        return y

    start = time.perf_counter()
    try:
        got = step(op, ours)
    except pt.PolytileError as e:
        return TrainingRow(w, status=f"FAILED: {e.message}")
    first = time.perf_counter() - start
    want = step(layer, theirs)
    problem = compare_step([got] + [t.grad for t in ours if t.requires_grad],
                           [want] + [t.grad for t in theirs if t.requires_grad], w)
    if problem:
        return TrainingRow(w, first_call=first, status=f"WRONG: {problem}")
    timings = time_blocks({"polytile": lambda: step(op, ours),
                           "torch": lambda: step(layer, theirs)}, options)
    return TrainingRow(w, timings["polytile"].median, timings["torch"].median, first)


def leaf(torch: Any, array: np.ndarray) -> Any:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.requires_grad_() if tensor.is_floating_point() else tensor


def compare_step(got: list[Any], want: list[Any], w: Workload) -> str:
    """Why the outputs differ from torch's, or "". Errors are measured against each
    tensor's largest magnitude, not per element (harness.compare): a gradient sums many
    terms in another order, so its small elements carry the large ones' rounding."""
    names = ["output"] + [f"gradient {k}" for k in range(len(got) - 1)]
    for name, g, e in zip(names, got, want):
        g, e = g.detach().double().numpy(), e.detach().double().numpy()
        scale = max(float(np.abs(e).max(initial=0)), 1.0)
        error = float(np.abs(g - e).max(initial=0))
        if not error <= 10 * (w.rtol * scale + w.atol):
            return f"{name} differs from torch's by {error:.3g} (scale {scale:.3g})"
    return ""


HEADER = ("workload", "sizes", "polytile ms", "torch ms", "vs torch", "first call s", "check")


def table(rows: Sequence[TrainingRow]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    lines: list[tuple[str, ...]] = []
    for r in rows:
        ratio = (f"{r.torch / r.polytile:.2f}x" if r.polytile and r.torch else "n/a")
        lines.append((r.workload.key, r.workload.size_text, _ms(r.polytile), _ms(r.torch),
                      ratio, f"{r.first_call:.1f}" if r.first_call is not None else "n/a",
                      r.status))
    return HEADER, lines


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f}" if seconds is not None else "n/a"


NOTE = ("One training step: forward, then backward from a fixed output gradient, from "
        "fresh parameter gradients. polytile: `polytile.torch.op` of the layer's TC (the "
        "forward returns what the derived gradient reads; the gradient is another compiled "
        "TC function); torch: the same layer in eager mode. `vs torch` is torch's time "
        "over polytile's (above 1: polytile is faster). Medians over interleaved blocks.")
