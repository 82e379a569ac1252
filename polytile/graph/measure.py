"""Execution-based scores of fusion patterns (FusionStitching §4.3): compile the function
with the pattern as one kernel and every other op alone, and with every op alone, and
time both on random inputs; the score is the time saved,

    f(P) = t(every op alone) - t(P fused, the rest alone)

which is the paper's sum K(Op_j) + (N - 1) * phi - K(P), each kernel's launch included.
Scores are cached in the cache directory (graph/scores.json), keyed by the program, its
signature, the target and the pattern, so a pattern is timed once per host.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from polytile.config import Config
from polytile.graph.patterns import Pattern
from polytile.runtime.files import atomic_write_bytes, ensure_private_dir, exclusive_lock
from polytile.sema.specialize import Specialized
from polytile.targets.target import Target


def scores_path(config: Config) -> Path:
    return config.cache_dir / "graph" / "scores.json"


def measured_score(spec: Specialized, target: Target, config: Config,
                   pattern: Pattern) -> float:
    key = _key(spec, target, config, pattern)
    path = scores_path(config)
    cached = _read(path).get(key)
    if cached is not None:
        return float(cached)
    score = _time_pattern(spec, target, config, pattern)
    ensure_private_dir(path.parent)
    with exclusive_lock(path.with_suffix(".lock")):
        table = _read(path)
        table[key] = score
        atomic_write_bytes(path, json.dumps(table, indent=1, sort_keys=True).encode())
    return score


def _key(spec: Specialized, target: Target, config: Config, pattern: Pattern) -> str:
    from polytile.compile import Compiler

    tuning = Compiler(config, target).tuning_key(spec)   # program, shapes, target, compiler
    return hashlib.sha256(f"{tuning.digest()} {pattern.key}".encode()).hexdigest()


def _read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _time_pattern(spec: Specialized, target: Target, config: Config,
                  pattern: Pattern) -> float:
    from polytile.bench.timing import TimingOptions, time_blocks
    from polytile.compile import Compiler
    from polytile.graph.ilp import kernel_order
    from polytile.graph.ops import op_graph

    graph = op_graph(spec)
    alone = [frozenset({k}) for k in range(len(graph.ops)) if k not in pattern.ops]
    fused = kernel_order(graph, [pattern.ops, *alone])
    every = [[k] for k in range(len(graph.ops))]
    apart = Compiler(config, target, options={"fuse.groups": every}).compile(spec)
    joined = Compiler(config, target, options={
        "fuse.groups": [sorted(g) for g in fused]}).compile(spec)
    inputs, scalars, outputs = random_arguments(spec)
    timed = time_blocks(
        {"apart": lambda: apart.run(inputs, scalars, outputs),
         "joined": lambda: joined.run(inputs, scalars, outputs)},
        TimingOptions(rounds=3, block_seconds=0.03, settle_seconds=0.02))
    return timed["apart"].median - timed["joined"].median


def random_arguments(spec: Specialized, seed: int = 0
                     ) -> tuple[dict[str, np.ndarray], dict[str, object], dict[str, np.ndarray]]:
    """Random float inputs in [-1, 1); integer tensors (tables) in [0, 2) so that any
    gather stays in bounds of a dimension of 2 or more; scalars from the sizes."""
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    scalars: dict[str, object] = {}
    for p in spec.fn.params:
        if p.kind == "scalar":
            scalars[p.name] = spec.sizes.get(p.name, 1.0 if p.dtype.is_float else 1)
            continue
        shape = spec.shape(p.name)
        if p.dtype.is_float:
            inputs[p.name] = (rng.random(shape) * 2 - 1).astype(p.dtype.numpy)
        else:
            inputs[p.name] = rng.integers(0, 2, shape).astype(p.dtype.numpy)
    outputs = {o.name: np.zeros(spec.shape(o.name), o.dtype.numpy) for o in spec.fn.outputs}
    return inputs, scalars, outputs
