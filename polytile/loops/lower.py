"""Scheduled Stripe IR -> loop IR: the blocks' schedules applied, views folded to offsets.

    lower(fn) -> Kernel

* An index with range > 1 is a loop (`polytile.loops.space`); a passed index is that
  affine of the parent's loop variables. Constraints fold into loop bounds or become an
  `If` around the block.
* Addresses are folded to one flat offset per access: a view's origin is its parent's
  origin + sum(access_d * stride_d) (`polytile.loops.views`).
* The schedule (`BlockSchedule`, set by passes) gives each loop its kind: `parallel` names
  the index whose loop runs in threads (ignored inside another parallel loop, and without
  `threads`); `simd` marks the innermost loop when its iterations write disjoint
  elements and it cannot fail; `gpu` maps indices to grid and thread loops; `micro`
  lowers the block to vector code (`polytile.loops.vector`; `transpose`:
  `polytile.loops.transpose`); `stage` lowers a GPU thread tile with its reduction staged
  through local memory, `across` a reduction shared by a work-group
  (`polytile.loops.gpu_tile`); `rows` a fused row block a row per work-group
  (`polytile.loops.gpu_rows`); `stitch` makes a block's phases one parallel region
  (`polytile.loops.region`).
* Local buffers: up to `stack_bytes` on the stack; a larger top-level one from a kept
  pool, a larger nested one from the heap per iteration (private to it). A float local
  starts as NaN and another as 0, unless the first top-level statement that touches it
  writes all of it without reading it (`polytile.analysis.overwrite`).
* Names are generated: `b0` params, `l0` locals, `i0` loops, `s0` scalars, `d0` checked
  subscripts, `v0` vectors; source names appear only in comments, reduced to
  [A-Za-z0-9_]. A scalar that nothing reads is not computed.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from polytile import dtypes
from polytile.analysis.overwrite import overwritten_first
from polytile.errors import IRError, UnsupportedError
from polytile.ir.nodes import (
    AGG_OPS,
    Affine,
    Block,
    Constant,
    Dim,
    Function,
    Intrinsic,
    Load,
    LoadIndex,
    Refinement,
    Special,
    Statement,
    Store,
)
from polytile.loops import nodes as L
from polytile.loops.fence import fenced
from polytile.loops.space import IterationSpace, iteration_space
from polytile.loops.views import (
    Scope,
    View,
    child_view,
    extent,
    resolve,
    root_view,
    safe,
    writes_disjoint,
)

INT64 = L.VType(dtypes.INT64)


@dataclass(frozen=True)
class LowerOptions:
    stack_bytes: int = 32768      # local buffers up to this size live on the stack
    threads: bool = True          # honor the schedules' parallel and simd


def lower(fn: Function, options: LowerOptions | None = None) -> L.Kernel:
    """The loop IR of `fn`."""
    return fenced(Lowering(fn, options or LowerOptions()).kernel())


def read_scalars(block: Block) -> set[str]:
    names: set[str] = set()
    for st in block.stmts:
        if isinstance(st, Block):
            names |= read_scalars(st)
        elif isinstance(st, Store):
            names.add(st.value)
            names.update(d for d in st.dynamic if d is not None)
        elif isinstance(st, Intrinsic):
            names.update(st.inputs)
        elif isinstance(st, Load):
            names.update(d for d in st.dynamic if d is not None)
            if st.offset is not None:
                names.add(st.offset)
    return names


def _vector_width(block: Block) -> int:
    """Lanes of the first block whose schedule has a vector index."""
    if block.schedule.vector is not None:
        return block.schedule.vector.lanes
    return next((w for st in block.stmts if isinstance(st, Block)
                 for w in (_vector_width(st),) if w), 0)


def may_fail(stmts: tuple[L.Stmt, ...] | list[L.Stmt]) -> bool:
    """True if running `stmts` can fail: a check, or a heap allocation."""
    for st in stmts:
        if isinstance(st, L.Check):
            return True
        if isinstance(st, L.Alloc) and (any(b.placement == "heap" for b in st.buffers)
                                        or may_fail(st.body)):
            return True
        if isinstance(st, (L.Loop, L.Alloc, L.Kept, L.Region, L.Single)) and may_fail(st.body):
            return True
        if isinstance(st, L.If) and (may_fail(st.then) or may_fail(st.else_)):
            return True
        if isinstance(st, L.Switch) and any(may_fail(body) for _, body in st.cases):
            return True
    return False


class Lowering:
    """Lowers one function; holds the name counters."""

    def __init__(self, fn: Function, options: LowerOptions):
        self.fn = fn
        self.options = options
        self.counters: dict[str, int] = defaultdict(int)
        self.read = read_scalars(fn.body)
        # One vector width per function: the width of its vectorized blocks (the
        # transposes of pack copies follow it), else set by whichever vector code runs.
        self.vector_lanes = _vector_width(fn.body)
        # The sizes of each top-level buffer (parameters and locals), by loop IR name:
        # the bounds a staged copy (polytile.loops.gpu_tile) checks its reads against.
        self.sizes: dict[str, tuple[int, ...]] = {}
        # Top-level locals a lowering of a nested block keeps between calls (`L.Kept`).
        self.kept: list[L.Buffer] = []
        # Each loop variable's range, [0, range): the vector code's lane counts that the
        # ranges of the loops around it decide are constants (`vector._lanes`).
        self.loop_ranges: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        number = self.counters[prefix]
        self.counters[prefix] += 1
        return f"{prefix}{number}"

    # ------------------------------------------------------------ function

    def kernel(self) -> L.Kernel:
        fn, top = self.fn, self.fn.body
        if len(set(fn.params)) != len(fn.params):
            raise IRError(f"function {fn.name!r} lists a parameter twice")
        refs = {r.into: r for r in top.refs}
        params: list[L.Buffer] = []
        views: dict[str, View] = {}
        for p, name in enumerate(fn.params):
            ref = refs.get(name)
            if ref is None or ref.from_ or ref.dir == "none":
                raise IRError(f"parameter {name!r} is not an in/out/inout refinement of the "
                              f"top-level block")
            params.append(L.Buffer(f"b{p}", ref.shape.dtype, 0, param=p,
                                   writable=ref.dir != "in", label=describe(ref)))
            views[name] = root_view(ref, f"b{p}", p)
            self.sizes[f"b{p}"] = ref.shape.sizes
        local_refs = [r for r in top.refs if r.into not in fn.params]
        for ref in local_refs:
            if ref.from_ or ref.dir != "none":
                raise IRError(f"top-level refinement {ref.into!r} is neither a parameter nor "
                              f"a local buffer (direction 'none')")
        local_buffers = self.locals(local_refs, views, top_level=True)
        body = self.block(top, Scope({}, views, {}, False), root=True)
        return L.Kernel(safe(fn.name), tuple(params), local_buffers + tuple(self.kept),
                        tuple(body))

    def locals(self, refs: list[Refinement], views: dict[str, View], top_level: bool = False,
               owner: Block | None = None) -> tuple[L.Buffer, ...]:
        """Local buffers (see the module docstring for where they live and how they start);
        `owner`: the block that allocates them in each of its iterations."""
        overwritten = (overwritten_first(self.fn.body) if top_level
                       else overwritten_first(owner, nested=True) if owner is not None and refs
                       else frozenset())
        buffers = []
        for ref in refs:
            name = self.fresh("l")
            views[ref.into] = root_view(ref, name, -1)
            if top_level:
                self.sizes[name] = ref.shape.sizes
            count = max(1, extent(ref.shape.dims, ref.into))
            dt = ref.shape.dtype
            on_stack = count * dt.numpy.itemsize <= self.options.stack_bytes
            placement = "stack" if on_stack else "pool" if top_level else "heap"
            init = "" if ref.into in overwritten else "nan" if dt.is_float else "zero"
            buffers.append(L.Buffer(name, dt, count, placement,
                                    "global" if top_level else "private", init,
                                    label=describe(ref)))
        return tuple(buffers)

    # ------------------------------------------------------------ blocks

    def block(self, blk: Block, outer: Scope, root: bool = False) -> list[L.Stmt]:
        if blk.schedule.folded is not None:     # analysis.fold: a contraction writes it
            return [L.Comment(f"block {safe(blk.name)}: made by the first writes of "
                              f"{safe(blk.schedule.folded)}")]
        if blk.schedule.stitch is not None:
            from polytile.loops import region
            return region.lower_block(self, blk, outer)
        if blk.schedule.tensorize is not None:
            from polytile.loops import tensorize
            return tensorize.lower_block(self, blk, outer)
        if blk.schedule.tiles is not None:
            from polytile.loops import tiles
            return tiles.lower_block(self, blk, outer)
        if blk.schedule.mma is not None:
            from polytile.loops import warp_mma
            return warp_mma.lower_block(self, blk, outer)
        if blk.schedule.stage is not None:
            from polytile.loops import gpu_tile
            return gpu_tile.lower_block(self, blk, outer)
        if blk.schedule.across is not None:
            from polytile.loops import gpu_tile
            return gpu_tile.lower_across(self, blk, outer)
        if blk.schedule.rows is not None:
            from polytile.loops import gpu_rows
            return gpu_rows.lower_block(self, blk, outer)
        if blk.schedule.micro and not root:
            from polytile.loops import transpose, vector
            lowered = (transpose.lower_block(self, blk, outer) if blk.schedule.transpose
                       else vector.lower_block(self, blk, outer))
            if lowered is not None:
                return lowered
        title = L.Comment(f"block {safe(blk.name)}")
        space = iteration_space(blk, outer.idx, lambda: self.fresh("i"))
        if isinstance(space, str):
            return [title, L.Comment(f"empty: {space}")]
        self.loop_ranges.update((v, space.bounds.hi[v][0]) for v in space.loops)
        views, private = self.views(blk, outer, space.idx, root)
        written = [views[r.into] for r in blk.refs if root or r.from_]
        notes: list[L.Stmt] = []
        par_k = self.parallel_loop(blk, outer, space)
        scope = Scope(space.idx, views, dict(outer.scalars), outer.parallel or par_k is not None)
        body = self.body(blk, scope, private)
        simd_k = None
        if blk.schedule.simd and self.options.threads and space.loops:
            nested = any(isinstance(st, Block) for st in blk.stmts)
            if not nested and not may_fail(body) and writes_disjoint(space.loops[-1], set(),
                                                                     written):
                simd_k = len(space.loops) - 1
            else:
                notes.append(L.Comment("schedule simd ignored: the inner loop has checks, "
                                       "nested blocks or shared writes"))
        kinds = {space.idx[i].terms[0][0]: kind for i, kind in blk.schedule.gpu
                 if space.idx[i].terms}
        stmts = body
        for k in reversed(range(len(space.loops))):
            var = space.loops[k]
            lo, hi = space.bounds.range_of(var)
            kind = "parallel" if k == par_k else kinds.get(var, "serial")
            spans = self.accumulated(blk, views) if k == par_k else ()
            stmts = [L.Loop(var, lo, hi, tuple(stmts), kind, simd=k == simd_k,
                            accumulate=spans)]
        if space.guards:
            stmts = [L.If(tuple(space.guards), tuple(stmts))]
        return [title, *notes, *stmts]

    def views(self, blk: Block, outer: Scope, idx: dict[str, Affine],
              root: bool) -> tuple[dict[str, View], list[Refinement]]:
        """The block's views of its parent's buffers, and its private local buffers."""
        if root:    # the top-level refinements are the function's buffers
            return dict(outer.views), []
        views: dict[str, View] = {}
        private: list[Refinement] = []
        for ref in blk.refs:
            if not ref.from_:
                if ref.dir != "none":
                    raise IRError(f"refinement {ref.into!r} of block {blk.name!r} names no "
                                  f"parent buffer")
                private.append(ref)
                continue
            parent = outer.views.get(ref.from_)
            if parent is None:
                raise IRError(f"refinement {ref.into!r} of block {blk.name!r} refers to "
                              f"{ref.from_!r}, which its parent does not declare")
            views[ref.into] = child_view(ref, parent, idx)
        return views, private

    def accumulated(self, blk: Block, views: dict[str, View]) -> tuple[L.Span, ...]:
        """The spans of the buffers the schedule's parallel loop combines."""
        spans = []
        for name in blk.schedule.combine:
            view = views[name]
            if view.offset.terms:
                raise IRError(f"block {blk.name!r} combines {name}, whose place moves with "
                              f"the loops {list(view.offset.names)}")
            reach = [(d.size - 1) * d.stride for d in view.dims]
            low = view.offset.const + sum(r for r in reach if r < 0)
            spans.append(L.Span(view.ptr, low, 1 + sum(abs(r) for r in reach)))
        return tuple(spans)

    def parallel_loop(self, blk: Block, outer: Scope, space: IterationSpace) -> int | None:
        """The position of the loop the schedule runs in threads (None inside another
        parallel loop, where threads would nest, and without threads)."""
        index = blk.schedule.parallel
        if index is None or not self.options.threads or outer.parallel:
            return None
        var = space.idx[index].terms[0][0] if space.idx[index].terms else None
        return space.loops.index(var) if var in space.loops else None

    def body(self, blk: Block, scope: Scope, private: list[Refinement]) -> list[L.Stmt]:
        """One iteration: this block's private local buffers, then its statements."""
        views = dict(scope.views)
        buffers = self.locals(private, views, owner=blk)
        inner = Scope(scope.idx, views, scope.scalars, scope.parallel)
        lines: list[L.Stmt] = []
        for st in blk.stmts:
            lines += self.stmt(st, inner)
        return [L.Alloc(buffers, tuple(lines))] if buffers else lines

    # ------------------------------------------------------------ statements

    def stmt(self, st: Statement, scope: Scope) -> list[L.Stmt]:
        if isinstance(st, Block):
            return self.block(st, scope)
        if isinstance(st, Load):
            return self.load(st, scope)
        if isinstance(st, Store):
            return self.store(st, scope)
        if isinstance(st, LoadIndex):
            value = resolve(st.value, scope.idx, f"index value {st.into!r}")
            return self.define(scope, st.into, dtypes.INT64, L.IntValue(value))
        if isinstance(st, Constant):
            return self.define(scope, st.into, st.dtype, L.Lit(st.value))
        if isinstance(st, Intrinsic):
            args = tuple(self.scalar(scope, name)[0] for name in st.inputs)
            return self.define(scope, st.into, st.dtype, L.Op(st.op, args, st.dtype))
        if isinstance(st, Special):
            return self.special(st, scope)
        raise IRError(f"unknown statement {type(st).__name__}")

    def define(self, scope: Scope, name: str, dt: dtypes.DType, value: L.Expr) -> list[L.Stmt]:
        var = self.fresh("s")
        scope.scalars[name] = (var, dt)
        return [L.Let(var, L.VType(dt), value)] if name in self.read else []

    def scalar(self, scope: Scope, name: str) -> tuple[str, dtypes.DType]:
        if name not in scope.scalars:
            raise IRError(f"scalar {name!r} is used before it is assigned")
        return scope.scalars[name]

    def convert(self, name: str, src: dtypes.DType, dst: dtypes.DType, prefix: str,
                out: list[L.Stmt]) -> str:
        """`name` as a value of `dst` (a new Let when the types differ)."""
        if src == dst:
            return name
        var = self.fresh(prefix)
        out.append(L.Let(var, L.VType(dst), L.Op("cast", (name,), dst)))
        return var

    def view(self, scope: Scope, name: str) -> View:
        if name not in scope.views:
            raise IRError(f"buffer {name!r} is not declared in this block",
                          hint="a block reaches a parent's buffer through a refinement")
        return scope.views[name]

    def address(self, view: View, st: Load | Store,
                value: Callable[[str], tuple[str, dtypes.DType]],
                out: list[L.Stmt], checked: dict | None = None) -> Affine:
        """The flat offset `st` reads: the view's origin, its checked data-dependent
        subscripts and its pointer increment. `value(name)` gives a scalar's loop IR name
        and dtype; `checked` remembers subscripts already checked in `out` (unrolled
        copies of one load check once)."""
        checked = {} if checked is None else checked
        if st.dynamic and len(st.dynamic) != len(view.dims):
            raise IRError(f"access of {st.ref!r} has {len(st.dynamic)} subscripts for "
                          f"{len(view.dims)} dimensions")
        address = view.offset
        for d, name in enumerate(st.dynamic):
            if name is None:
                continue
            src, dt = value(name)
            key = (src, view.dims[d].size, view.param, d)
            if key not in checked:
                checked[key] = self.fresh("d")
                out.append(L.Let(checked[key], INT64, L.Op("cast", (src,), dtypes.INT64)))
                out.append(L.Check(checked[key], view.dims[d].size, view.param, d))
            address = address + Affine.index(checked[key]).scale(view.dims[d].stride)
        if isinstance(st, Load) and st.offset is not None:   # in the view by construction
            src, dt = value(st.offset)
            address = address + Affine.index(self.convert(src, dt, dtypes.INT64, "d", out))
        return address

    def load(self, st: Load, scope: Scope) -> list[L.Stmt]:
        view = self.view(scope, st.ref)
        lines: list[L.Stmt] = []
        address = self.address(view, st, lambda n: self.scalar(scope, n), lines)
        return lines + self.define(scope, st.into, view.dtype, L.Read(view.ptr, address))

    def store(self, st: Store, scope: Scope) -> list[L.Stmt]:
        view = self.view(scope, st.ref)
        if not view.writable:
            raise IRError(f"store to {st.ref!r}, which is read-only")
        if view.agg not in AGG_OPS:
            raise IRError(f"unknown aggregation {view.agg!r} on {st.ref!r}")
        lines: list[L.Stmt] = []
        address = self.address(view, st, lambda n: self.scalar(scope, n), lines)
        value = self.convert(*self.scalar(scope, st.value), view.dtype, "s", lines)
        return lines + [L.Store(view.ptr, address, value, view.agg)]

    # ------------------------------------------------------------ specials

    def special(self, st: Special, scope: Scope) -> list[L.Stmt]:
        """`zero` writes 0 to every element of its outputs, `copy` copies inputs[0] to
        outputs[0] with conversion; both through the output's aggregation, as in the
        interpreter."""
        if st.name == "zero":
            lines: list[L.Stmt] = []
            for name in st.outputs:
                view = self._writable(scope, name)
                zero = self.fresh("s")
                loops, address = self._element_loops(view.dims, view.offset)
                lines += [L.Let(zero, L.VType(view.dtype), L.Lit(0)),
                          *_nest(loops, [L.Store(view.ptr, address, zero, view.agg)])]
            return lines
        if st.name == "copy":
            if len(st.inputs) != 1 or len(st.outputs) != 1:
                raise IRError("special copy takes one input and one output")
            src, dst = self.view(scope, st.inputs[0]), self._writable(scope, st.outputs[0])
            if tuple(d.size for d in src.dims) != tuple(d.size for d in dst.dims):
                raise IRError(f"special copy from {st.inputs[0]!r} to {st.outputs[0]!r}: "
                              f"shapes differ")
            loops, dst_addr = self._element_loops(dst.dims, dst.offset)
            src_addr = src.offset
            for (var, _), d in zip(loops, src.dims):
                src_addr = src_addr + Affine.index(var).scale(d.stride)
            value = self.fresh("s")
            body: list[L.Stmt] = [L.Let(value, L.VType(src.dtype), L.Read(src.ptr, src_addr))]
            value = self.convert(value, src.dtype, dst.dtype, "s", body)
            return _nest(loops, [*body, L.Store(dst.ptr, dst_addr, value, dst.agg)])
        raise UnsupportedError(f"special {safe(st.name)!r} has no loop form",
                               hint="the specials are zero and copy")

    def _writable(self, scope: Scope, name: str) -> View:
        view = self.view(scope, name)
        if not view.writable:
            raise IRError(f"special writes {name!r}, which is read-only")
        return view

    def _element_loops(self, dims: tuple[Dim, ...], offset: Affine
                       ) -> tuple[list[tuple[str, int]], Affine]:
        loops = []
        for d in dims:
            var = self.fresh("i")
            loops.append((var, d.size))
            offset = offset + Affine.index(var).scale(d.stride)
        return loops, offset


def _nest(loops: list[tuple[str, int]], body: list[L.Stmt]) -> list[L.Stmt]:
    for var, size in reversed(loops):
        body = [L.Loop(var, Affine.constant(0), Affine.constant(size), tuple(body))]
    return body


def describe(ref: Refinement) -> str:
    sizes = "x".join(str(s) for s in ref.shape.sizes) or "scalar"
    kind = "local" if ref.dir == "none" else ref.dir
    return f"{safe(ref.into)}: {kind} {ref.shape.dtype} {sizes}"
