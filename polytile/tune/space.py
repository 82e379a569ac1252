"""The tuning space of one specialized program on one target (TC §6.2 "tuning space
dimensions and admissible values").

    space = build_space(lowered_ir, target)
    space.genes            # (Gene("fuse.strategy", ("rows", "none")), Gene("s0.tile.i0", (1, 2, ...)), ...)
    space.fixed            # ("pack.enabled", ...): choices that build one program whatever their value
    space.default          # the heuristics' Options; space.default_point encodes it
    space.decode(point)    # Options, or None for a point pruned before compiling
    space.predefined()     # more starting points: the heuristics under other pipeline choices

A point is one value index per gene, the genetic algorithm's chromosome. The genes:

* pipeline choices, for the passes the target runs: fusion strategy (TC §6.2's max,
  preserve-parallelism and min: the fuse pass's "max", "rows" and "none"; see
  polytile/passes/fuse.py; and "plan", the graph level's fusion plan, when the caller
  passes its groups), packing on/off, pointer increments on/off; on a GPU target
  (pass gpu) the work-items per work-group, the staged reduction tile (0: no local
  memory), how many indices are mapped, the register tile of a staged reduction and the
  work-items sharing a reduction across a group (0: none), the padding of staged rows,
  the work-items sharing a fused row (row groups, 0: a row per work-item). Only the
  choices that change this program are genes, with only the values that build programs
  of their own (polytile/tune/choices.py decides, by running the passes): with no kernel
  to fuse, nothing to pack or no fused row loop, a choice would only add copies of the
  same kernels;
* `lanes`: vector width, the target's full width or half of it (one for the function:
  the generated C declares one vector type);
* per kernel block (names are stable: they come from the lowered program; the phases
  of a stitched kernel are kernel blocks too):
  `vector` (which index runs across SIMD lanes, from autotile.typed_vector_candidates),
  `vectors` (vectors per register tile along a parallel vector index),
  `unroll.<index>` (register tile factor of each parallel index), `prefetch` (how many
  lookups ahead a gathering block prefetches its rows, 0 for none),
  `tile.<index>` (cache tile: powers of two and ceil-divisors of the extent, so a
  tile size can avoid a tail tile, TC §6.2 footnote), `order` (loop order of the
  cache tiles: every permutation of up to three loops, else the block's order, each
  loop moved to the front and the reverse), `parallel` (OpenMP on the outermost tile
  loop whose iterations write disjoint elements). Members of a fused block get a
  register tile only, as in autotile.

The loop order inside a cache tile is not a gene: the vector generator orders a
micro-kernel's loops by the layout of its largest input and the reorder pass puts the
smallest stride innermost in scalar code.

A gene that does not apply to a point (the tile of a block that is fused, the
vectors of a reduction vector index) is ignored when decoding. Decoding repairs
what it can: a cache tile rounds up to a multiple of the register tile along its
index (a register tile cut by the cache tile would run scalar boundary code), and a
tile at least as large as the extent means no tiling. It prunes what would not pay
to compile: register tiles whose accumulators exceed the target's vector registers
minus a few for operands.
"""
from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from polytile.ir import nodes as N
from polytile.passes.autotile import choose_schedule, scheduled_blocks, typed_vector_candidates
from polytile.passes.schedule import Schedule, _is_parallel, full_lanes, gathers, panel_index
from polytile.targets.target import Target
from polytile.tune.choices import (
    PIPELINE_CHOICES,
    Choice,
    Programs,
    offered_choices,
    pipeline_choices,
)
from polytile.tune.options import Options

UNROLL_FACTORS = (1, 2, 3, 4, 5, 6, 8)
VECTORS = (1, 2, 3, 4)
PREFETCH_DISTANCES = (0, 4, 8, 16)
# Full and half vector width (half: 8 lanes on cpu-avx512, 4 on cpu-avx2), which
# wastes fewer lanes on short rows and boundary tiles.
LANE_DIVISORS: tuple[int, ...] = (1, 2)
CEIL_DIVISORS = range(1, 17)
RESERVED_REGISTERS = 4      # operands and broadcasts next to the accumulators


@dataclass(frozen=True)
class Gene:
    name: str
    values: tuple[Any, ...]
    same: tuple[tuple[Any, Any], ...] = ()   # a pipeline choice's value -> the kept value
                                             # that builds the same program (Choice.same)

    def index(self, wanted: Any) -> int:
        """The index of `wanted`, of the value that builds the same program, or of the
        nearest value."""
        return _nearest(self.values, dict(self.same).get(wanted, wanted))


@dataclass(frozen=True)
class KernelBlock:
    """A block autotile schedules, in one pipeline variant."""

    block: N.Block
    member: bool          # inside a fused block: register tile only
    default: Schedule

    @property
    def name(self) -> str:
        return self.block.name

    @property
    def loops(self) -> dict[str, int]:
        return {i.name: i.range for i in self.block.idxs if i.affine is None}

    @property
    def looped(self) -> list[str]:
        """The loops that iterate (extent above 1), in the block's order."""
        return [n for n, extent in self.loops.items() if extent > 1]

    @property
    def parallel(self) -> list[str]:
        return [n for n in self.loops if _is_parallel(self.block, n)]

    def vectors(self) -> list[str]:
        return typed_vector_candidates(self.block)

    def lanes(self, target: Target) -> int:
        return full_lanes(self.block, target)


@dataclass(frozen=True)
class Variant:
    """The kernel blocks autotile sees under one setting of the pipeline choices."""

    passes: tuple[tuple[str, Any], ...]
    blocks: tuple[KernelBlock, ...]


@dataclass(frozen=True)
class Space:
    target: Target
    genes: tuple[Gene, ...]
    variants: tuple[Variant, ...]
    default: Options
    default_point: tuple[int, ...]
    fixed: tuple[str, ...] = ()     # pipeline choices whose every value builds one program

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(g.values) for g in self.genes)

    def value(self, point: Sequence[int], name: str, fallback: Any = None) -> Any:
        k = self._index.get(name)
        return fallback if k is None else self.genes[k].values[point[k]]

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {g.name: k for k, g in enumerate(self.genes)}

    @functools.cached_property
    def _variants(self) -> dict[tuple[tuple[str, Any], ...], Variant]:
        return {v.passes: v for v in self.variants}

    def variant_of(self, options: Options) -> Variant:
        """The variant whose program `options` build: each pipeline gene at the value the
        options give (or one that builds the same program), else at the default's."""
        return self._variants[self._passes(self.encode(Options(passes=options.passes)))]

    def _passes(self, point: Sequence[int]) -> tuple[tuple[str, Any], ...]:
        return tuple((g.name, g.values[p]) for g, p in zip(self.genes, point)
                     if g.name in PIPELINE_CHOICES)

    def canonical(self, point: Sequence[int]) -> str | None:
        """Identity of the point's Options (equal text, equal program), None if pruned."""
        options = self.decode(point)
        return None if options is None else options.text()

    def decode(self, point: Sequence[int]) -> Options | None:
        if tuple(point) == self.default_point:
            return self.default
        passes = self._passes(point)
        variant = self._variants[passes]
        divisor = self.value(point, "lanes", 1)
        schedules = {}
        for kb in variant.blocks:
            schedule = _decode_block(self, point, kb, divisor)
            if schedule is None:
                return None
            schedules[kb.name] = schedule
        return Options.of(schedules, dict(passes))

    def encode(self, options: Options) -> tuple[int, ...]:
        """The point nearest to `options` (exact when every value is a gene value); a
        gene the options say nothing about (a block they do not name) takes the
        default's value. Options of the same program at other sizes land here too."""
        wanted = {**_gene_values(self.default, self), **_gene_values(options, self)}
        return tuple(g.index(wanted.get(g.name, g.values[0])) for g in self.genes)

    def predefined(self) -> list[tuple[int, ...]]:
        """TC §6.2's "predefined strategies": the heuristics' schedules under every
        other setting of the pipeline choices, then each of those and the default at
        half vector width. Pruned points are left out."""
        # Each variant with its own blocks' schedules: a block of the same name may be
        # another kernel there (a GEMM of its own in rows, a row loop's member in a plan).
        points = [self.encode(Options.of({kb.name: kb.default for kb in v.blocks},
                                         dict(v.passes))) for v in self.variants[1:]]
        if "lanes" in self._index:
            k = self._index["lanes"]
            half = self.genes[k].values.index(2) if 2 in self.genes[k].values else None
            if half is not None:
                points += [p[:k] + (half,) + p[k + 1:]
                           for p in [self.default_point, *points]]
        return [p for p in dict.fromkeys(points) if self.decode(p) is not None]

    def random_point(self, rng: random.Random) -> tuple[int, ...]:
        return tuple(rng.randrange(len(g.values)) for g in self.genes)

    def summary(self) -> str:
        """One line: the pipeline genes with their values, the choices that are not
        genes of this program, the count of schedule genes."""
        pipeline = [f"{g.name}={'/'.join(map(str, g.values))}" for g in self.genes
                    if g.name in PIPELINE_CHOICES]
        schedule = len(self.genes) - len(pipeline)
        fixed = f"; not genes here: {', '.join(self.fixed)}" if self.fixed else ""
        return (f"pipeline genes {' '.join(pipeline) or 'none'}; {schedule} schedule genes"
                f"{fixed}")

    def describe(self) -> str:
        count = math.prod(self.sizes)
        lines = [f"{len(self.genes)} genes, {count:.3g} points before pruning"]
        lines += [f"  {g.name}: {', '.join(map(str, g.values))}" for g in self.genes]
        if self.fixed:
            lines.append(f"  not genes (one program whatever their value): "
                         f"{', '.join(self.fixed)}")
        return "\n".join(lines)


def build_space(lowered: N.Function, target: Target, extra: Sequence[Options] = (),
                plan: Sequence[Sequence[int]] | None = None) -> Space:
    """The space for `lowered` (the IR before any pass) on `target`; `extra` options
    (seeds: the best of similar programs) add their values to the genes. `plan` (the
    fusion plan's groups, polytile.graph) makes "plan" a value of fuse's strategy: the
    graph level's choice of which statements share a kernel is then one more variant
    the tuner times against the row fusion and none (FusionStitching §4.3's
    execution-based scores, for the whole plan)."""
    groups = None if plan is None else tuple(tuple(g) for g in plan)
    choices, variants = pipeline_variants(lowered, target, groups)
    default_variant = variants[0]
    default = Options.of({kb.name: kb.default for kb in default_variant.blocks},
                         dict(default_variant.passes))
    genes = [Gene(c.name, c.values, c.same) for c in choices if len(c.values) > 1]
    genes += _schedule_genes(variants, target, [default, *extra])
    space = Space(target, tuple(genes), variants, default, (),
                  tuple(c.name for c in choices if len(c.values) == 1))
    return replace(space, default_point=space.encode(default))


@functools.lru_cache(maxsize=64)
def pipeline_variants(lowered: N.Function, target: Target,
                      plan: tuple[tuple[int, ...], ...] | None
                      ) -> tuple[tuple[Choice, ...], tuple[Variant, ...]]:
    """The pipeline choices of `lowered` on `target` (polytile.tune.choices: only those
    that change this program are genes) and a variant for every setting of the genes,
    the default first; kept per program, as a tuning run, `cache inject` and the tests
    build the same program's space more than once."""
    programs = Programs(lowered, target, plan)
    choices = pipeline_choices(programs, offered_choices(target, plan is not None))
    genes = [c for c in choices if len(c.values) > 1]
    variants = []
    for combo in itertools.product(*(c.values for c in genes)):
        passes = tuple(zip((c.name for c in genes), combo))
        # A target without autotile schedules no block: its variants are only settings.
        blocks = kernel_blocks(programs.program(dict(passes))[0], target) if any(
            name == "autotile" for name, _ in target.passes) else []
        variants.append(Variant(passes, tuple(blocks)))
    return choices, tuple(variants)


def kernel_blocks(fn: N.Function, target: Target) -> list[KernelBlock]:
    """The blocks autotile schedules, with its default schedules (none on a target
    without autotile: a GPU target's decisions are all pipeline choices)."""
    if "autotile" not in {name for name, _ in target.passes}:
        return []
    return [KernelBlock(b, member, choose_schedule(b, target, member))
            for s in fn.body.stmts for b, member in scheduled_blocks(s)]


def tile_sizes(extent: int) -> list[int]:
    """Powers of two below the extent and its ceil-divisors (TC §6.2)."""
    sizes = {1 << k for k in range(extent.bit_length()) if 1 << k <= extent}
    sizes |= {-(-extent // d) for d in CEIL_DIVISORS}
    return sorted(sizes)


def _schedule_genes(variants: Sequence[Variant], target: Target,
                    known: Sequence[Options]) -> list[Gene]:
    values: dict[str, list[Any]] = {}

    def add(name: str, items: Sequence[Any]) -> None:
        slot = values.setdefault(name, [])
        slot.extend(v for v in items if v not in slot)

    by_name: dict[str, list[KernelBlock]] = {}
    for v in variants:
        for kb in v.blocks:
            by_name.setdefault(kb.name, []).append(kb)
    vectorized = False
    for name, kbs in by_name.items():
        first = kbs[0]
        vectors = [c for kb in kbs for c in [kb.default.vector, *kb.vectors()] if c is not None]
        if vectors:
            vectorized = True
            add(f"{name}.vector", vectors)
            add(f"{name}.vectors", VECTORS)
            if any(gathers(kb.block) for kb in kbs):
                add(f"{name}.prefetch", PREFETCH_DISTANCES)
            for kb in kbs:
                for n in kb.parallel:
                    add(f"{name}.unroll.{n}", UNROLL_FACTORS)
        if any(not kb.member for kb in kbs):
            for kb in kbs:
                if kb.member:
                    continue
                for n, extent in kb.loops.items():
                    if extent > 1:
                        add(f"{name}.tile.{n}", tile_sizes(extent))
                if len(kb.looped) > 1:
                    add(f"{name}.order", loop_orders(kb.looped))
            add(f"{name}.parallel", (first.default.parallel, not first.default.parallel))
    if vectorized and len(LANE_DIVISORS) > 1:
        add("lanes", LANE_DIVISORS)
    for options in known:
        for name, value in _gene_values(options, None).items():
            if name in values:
                add(name, [value])
    return [Gene(name, tuple(sorted(vs) if _numeric(vs) else vs))
            for name, vs in values.items()]


def loop_orders(loops: Sequence[str]) -> list[tuple[str, ...]]:
    """Orders of a block's cache tile loops to try, the block's own first."""
    if len(loops) <= 3:
        return list(itertools.permutations(loops))
    moved = [(n, *(m for m in loops if m != n)) for n in loops]
    return list(dict.fromkeys([tuple(loops), *moved, tuple(reversed(loops))]))


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _gene_values(options: Options, space: Space | None) -> dict[str, Any]:
    """Gene name -> value that `options` implies (genes it says nothing about are absent)."""
    out: dict[str, Any] = dict(options.passes)
    for name, s in options.schedules:
        if s.vector is not None:
            out[f"{name}.vector"] = s.vector
            out[f"{name}.vectors"] = s.vectors
            out[f"{name}.prefetch"] = s.prefetch
            if space is not None:
                kb = _block(space, name)
                if kb is not None:
                    out.setdefault("lanes", max(1, kb.lanes(space.target) // max(1, s.lanes)))
        for n, f in s.unroll:
            out[f"{name}.unroll.{n}"] = f
        tiles = dict(s.tiles)
        for n, t in tiles.items():
            out[f"{name}.tile.{n}"] = t
        out[f"{name}.parallel"] = s.parallel
        if space is not None:
            kb = _block(space, name)
            if kb is not None:
                for n in kb.parallel:
                    out.setdefault(f"{name}.unroll.{n}", 1)
                if not kb.member:
                    for n, extent in kb.loops.items():
                        out.setdefault(f"{name}.tile.{n}", extent)
                    out[f"{name}.order"] = s.order + tuple(n for n in kb.looped
                                                           if n not in s.order)
    return out


def _block(space: Space, name: str) -> KernelBlock | None:
    for v in space.variants:
        for kb in v.blocks:
            if kb.name == name:
                return kb
    return None


def _nearest(values: tuple[Any, ...], wanted: Any) -> int:
    if wanted in values:
        return values.index(wanted)
    if _numeric(values) and isinstance(wanted, int):
        return min(range(len(values)), key=lambda k: (abs(values[k] - wanted), k))
    return 0


def _decode_block(space: Space, point: Sequence[int], kb: KernelBlock,
                  divisor: int) -> Schedule | None:
    name, loops, parallel = kb.name, kb.loops, kb.parallel
    candidates = kb.vectors()
    vector = space.value(point, f"{name}.vector")
    if vector not in candidates:
        vector = kb.default.vector if kb.default.vector in candidates else (
            candidates[0] if candidates else None)
    lanes = max(1, kb.lanes(space.target) // divisor) if vector is not None else 1
    vector_parallel = vector in parallel
    vectors = 1
    if vector is not None and vector_parallel:
        # Split into panels (pass pack), the index runs over all of them: a schedule of
        # more vectors than one panel holds makes pack cut wider panels.
        extent = loops[vector] * loops.get(panel_index(vector), 1)
        vectors = min(space.value(point, f"{name}.vectors", 1), -(-extent // lanes))
    unroll: dict[str, int] = {}
    if vector is not None:
        for n in parallel:
            f = min(space.value(point, f"{name}.unroll.{n}", 1), loops[n])
            if n != vector and f > 1:
                unroll[n] = f
    accumulators = math.prod(unroll.values()) * vectors
    if accumulators > space.target.vector_registers - RESERVED_REGISTERS:
        return None
    prefetch = space.value(point, f"{name}.prefetch", 0) if (
        vector is not None and gathers(kb.block)) else 0
    if kb.member:
        return Schedule(vector, lanes, tuple(sorted(unroll.items())), vectors, (), False,
                        prefetch=prefetch)
    tiles: dict[str, int] = {}
    for n, extent in loops.items():
        size = space.value(point, f"{name}.tile.{n}", extent)
        step = unroll.get(n, 1)
        if n == vector:
            step = lanes * vectors
        size = -(-size // step) * step
        if size < extent:
            tiles[n] = size
    run_parallel = bool(space.value(point, f"{name}.parallel", kb.default.parallel)) and any(
        n in parallel for n in tiles)
    order = tuple(n for n in space.value(point, f"{name}.order", ()) if n in tiles)
    if len(order) < 2 or order == tuple(tiles):     # tiles are in the block's order
        order = ()
    return Schedule(vector, lanes, tuple(sorted(unroll.items())), vectors,
                    tuple(sorted(tiles.items())), run_parallel, order, prefetch)
