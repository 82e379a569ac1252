"""The cost model of fusion patterns (FusionStitching §4.3).

    model = load_cost_model(config, target)       # measured on this host, else DEFAULT
    model.memory_seconds(1 << 20)                 # M(V): moving 1 MiB
    score = model_score(graph, pattern, model)    # f(P) = M'(V) + (N - 1) * phi

M(V) is the time to stream V bytes (read and write, consecutive), interpolated in
log-log space between measured points and extrapolated at the last point's bandwidth;
phi is what one more kernel costs (on the CPU: one more OpenMP region and loop nest,
with its fork and join). The score uses M'(V) = M(V) minus M's fixed part (its line
through the first two points at V = 0), since phi already counts what a kernel costs
by itself; with M's fixed part, splitting a pattern in two would gain it twice. V is what the pattern saves: the reads of values produced
inside it, the writes of temporaries used only inside it, and the second and later
reads of an input its members share; M' is applied to each avoided transfer.

`polytile bench --fusion` measures both on the host (`probe_cost_model`) and stores
them in the cache directory under the target's identity; until then DEFAULT is used,
which is documented in docs/fusion.md.
"""
from __future__ import annotations

import bisect
import datetime
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from polytile.config import Config
from polytile.graph.ops import OpGraph
from polytile.graph.patterns import Pattern
from polytile.runtime.files import atomic_write_bytes, ensure_private_dir
from polytile.targets.target import Target


@dataclass(frozen=True)
class CostModel:
    points: tuple[tuple[int, float], ...]   # (bytes moved, seconds), bytes increasing
    phi: float                              # seconds per kernel
    source: str                             # "default" or "measured on HOST at DATE"

    def memory_seconds(self, v: float) -> float:
        if v <= 0:
            return 0.0
        xs = [b for b, _ in self.points]
        if v <= xs[0]:
            return self.points[0][1] * v / xs[0]
        if v >= xs[-1]:
            return self.points[-1][1] * v / xs[-1]
        k = bisect.bisect_right(xs, v)
        (x0, t0), (x1, t1) = self.points[k - 1], self.points[k]
        w = (math.log(v) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))

    @property
    def intercept(self) -> float:
        """M's fixed part: the first two points' line at V = 0 (a kernel's own cost,
        which phi counts)."""
        if len(self.points) < 2:
            return 0.0
        (x0, t0), (x1, t1) = self.points[0], self.points[1]
        return max(0.0, t0 - x0 * (t1 - t0) / (x1 - x0))

    def transfer_seconds(self, v: float) -> float:
        """M(V) without its fixed part: what moving V more bytes costs. (M itself would
        pay the fixed part once per pattern, so two small patterns would outscore the
        one that contains both.)"""
        if v <= 0:
            return 0.0
        x0, t0 = self.points[0]
        if v < x0:
            return (t0 - self.intercept) * v / x0
        return max(0.0, self.memory_seconds(v) - self.intercept)

    def to_json(self) -> dict[str, object]:
        return {"points": [list(p) for p in self.points], "phi": self.phi,
                "source": self.source}

    @staticmethod
    def from_json(data: dict[str, object]) -> CostModel:
        points = tuple((int(b), float(t)) for b, t in data["points"])  # type: ignore[union-attr, attr-defined]
        return CostModel(points, float(data["phi"]), str(data["source"]))  # type: ignore[arg-type]


# Used when the host was not probed: 20 GB/s streaming (about one DDR4 channel, what two
# cores of this class reach), 1 microsecond of fixed cost per transfer, and 3
# microseconds per kernel (an OpenMP fork and join on two cores).
DEFAULT = CostModel(((4096, 1e-6 + 4096 / 20e9), (1 << 30, 1e-6 + (1 << 30) / 20e9)), 3e-6,
                    "default (not measured: run `polytile bench --fusion`)")


def cost_path(config: Config, target: Target) -> Path:
    digest = hashlib.sha256(target.identity.encode()).hexdigest()[:16]
    return config.cache_dir / "graph" / f"cost-{digest}.json"


def load_cost_model(config: Config, target: Target) -> CostModel:
    path = cost_path(config, target)
    try:
        data = json.loads(path.read_text())
        if data.get("target") != target.identity:
            return DEFAULT
        return CostModel.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT


def store_cost_model(config: Config, target: Target, model: CostModel) -> Path:
    path = cost_path(config, target)
    ensure_private_dir(path.parent)
    data = {"target": target.identity, **model.to_json()}
    atomic_write_bytes(path, json.dumps(data, indent=1).encode())
    return path


def saved_transfers(graph: OpGraph, pattern: Pattern) -> list[int]:
    """Bytes of each memory transfer a kernel of the pattern avoids: a read of a value
    produced inside it, a second read of an input another member read, the write of a
    temporary used only inside it."""
    members = pattern.ops
    saved = []
    first_read: set[str] = set()
    for k in sorted(members):
        op = graph.ops[k]
        for tensor, size in zip(op.reads, op.read_bytes):
            produced = any(graph.ops[p].writes == tensor for p in graph.producers(k)
                           if p in members)
            if produced or tensor in first_read:
                saved.append(size)
            first_read.add(tensor)
        first_read.add(op.writes)
    for k in sorted(members):
        t = graph.ops[k].writes
        users = {j for j, op in enumerate(graph.ops) if t in op.reads or op.writes == t}
        if t in graph.temps and users <= members:
            saved.append(graph.ops[k].write_bytes)
    return saved


def saved_bytes(graph: OpGraph, pattern: Pattern) -> int:
    return sum(saved_transfers(graph, pattern))


def model_score(graph: OpGraph, pattern: Pattern, model: CostModel) -> float:
    """Seconds a kernel of the pattern saves over its ops run one kernel each: M' of
    each avoided transfer (each was a pass over its tensor of its own), plus phi per
    kernel saved. Summing per transfer keeps the score of a union at least the sum of
    its parts' scores, so the ILP never prefers splitting a pattern for M's curvature."""
    saved = sum(model.transfer_seconds(v) for v in saved_transfers(graph, pattern))
    return saved + (len(pattern.ops) - 1) * model.phi


def complex_pattern(graph: OpGraph, pattern: Pattern) -> bool:
    """The paper's patterns that the model scores poorly: column or scalar reductions
    with other reductions, or contractions with reductions."""
    kinds = {graph.ops[k].kind for k in pattern.ops}
    reductions = kinds & {"row-reduction", "column-reduction", "scalar-reduction"}
    return bool((kinds & {"column-reduction", "scalar-reduction"} and len(reductions) > 1)
                or ("contraction" in kinds and reductions))


# ------------------------------------------------------------------ the probe
COPY = "def copy(float(N) X) -> (Y) { Y(i) = X(i) }"
PHI_KERNELS = 8


def probe_cost_model(config: Config, target: Target, quick: bool = False) -> CostModel:
    """Measure M(V) with a compiled copy kernel at sizes from 8 KiB to 32 MiB moved, and
    phi as the time one more kernel adds: the larger of (t8 - t1) / 7 for 8 tiny
    independent statements run as 8 kernels and as one (tiny kernels run on one thread)
    and the fixed part of the copies large enough to run in threads (a fork and join)."""
    import numpy as np

    from polytile.bench.timing import TimingOptions, time_blocks
    from polytile.compile import Compiler
    from polytile.lang.parser import parse
    from polytile.sema.analyze import analyze
    from polytile.sema.specialize import specialize

    options = (TimingOptions(rounds=3, block_seconds=0.03, settle_seconds=0.02) if quick
               else TimingOptions(rounds=5, block_seconds=0.1, settle_seconds=0.05))
    copy = analyze(parse(COPY, "<probe>")).functions[0]
    sizes = [8 << 10 << (2 * k) for k in range(7)]   # 8 KiB .. 32 MiB
    if quick:      # two serial and two threaded copies: both fixed parts are measured
        sizes = [sizes[k] for k in (0, 1, 3, 4)]
    calls = {}
    for v in sizes:
        n = v // 8                            # read 4 bytes, write 4 bytes per element
        spec = specialize(copy, {"X": (n,)}, {})
        fn = Compiler(config, target).compile(spec)
        x = np.random.default_rng(0).random(n, dtype=np.float32)
        y = np.empty(n, np.float32)
        fn.run({"X": x}, {}, {"Y": y})
        calls[str(v)] = (lambda fn=fn, x=x, y=y: fn.run({"X": x}, {}, {"Y": y}))
    timed = time_blocks(calls, options)
    # The 10th percentile: the model is of the machine, not of whatever else shares the
    # cores; and moving more bytes never takes less time.
    points: list[tuple[int, float]] = []
    for v in sizes:
        points.append((v, max(timed[str(v)].p10, points[-1][1] if points else 0.0)))
    phi = max(_probe_phi(config, target, options), _threaded_intercept(points))
    host = target.identity
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return CostModel(tuple(points), phi, f"measured on {host} at {date}")


def _threaded_intercept(points: list[tuple[int, float]]) -> float:
    """The fixed cost of a kernel that runs in threads (an OpenMP fork and join): the
    line through the first two copy points large enough to be threaded, at V = 0."""
    from polytile.passes.autotile import PARALLEL_MIN_WORK

    threaded = [(v, t) for v, t in points if v // 8 >= PARALLEL_MIN_WORK]
    if len(threaded) < 2:
        return 0.0
    (x0, t0), (x1, t1) = threaded[:2]
    return max(0.0, t0 - x0 * (t1 - t0) / (x1 - x0))


def _probe_phi(config: Config, target: Target, options: object) -> float:
    import numpy as np

    from polytile.bench.timing import time_blocks
    from polytile.compile import Compiler
    from polytile.lang.parser import parse
    from polytile.sema.analyze import analyze
    from polytile.sema.specialize import specialize

    outs = ", ".join(f"Y{k}" for k in range(PHI_KERNELS))
    body = "\n".join(f"  Y{k}(i) = X(i) + {k}.0" for k in range(PHI_KERNELS))
    source = f"def many(float(N) X) -> ({outs}) {{\n{body}\n}}"
    fn = analyze(parse(source, "<probe>")).functions[0]
    spec = specialize(fn, {"X": (64,)}, {})
    apart = Compiler(config, target, options={"fuse.strategy": "none"}).compile(spec)
    joined = Compiler(config, target, options={
        "fuse.groups": [list(range(PHI_KERNELS))]}).compile(spec)
    x = np.random.default_rng(0).random(64, dtype=np.float32)
    ys = {f"Y{k}": np.empty(64, np.float32) for k in range(PHI_KERNELS)}
    timed = time_blocks({"apart": lambda: apart.run({"X": x}, {}, ys),
                         "joined": lambda: joined.run({"X": x}, {}, ys)},
                        options)  # type: ignore[arg-type]
    return max(0.0, (timed["apart"].p10 - timed["joined"].p10) / (PHI_KERNELS - 1))
