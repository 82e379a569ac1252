"""IR Function -> readable C99: one C function, nested `for` loops per block.

Calling convention of the generated function (`CSource.symbol`):

    int32_t <symbol>(void **args, int64_t *err);

* `args[p]` is the data pointer of `fn.params[p]`, i.e. of the element at index
  (0, ..., 0) of that top-level buffer. Element `(x0, x1, ...)` is at
  `args[p] + sum(x_d * stride_d)` with the element strides of the refinement's
  `dims` (any sign). A 0-d tensor is a pointer to its one element. Buffers must
  not overlap each other (they are `restrict`), and an output's elements must be
  distinct (no zero strides); the caller copies arguments where that fails.
* The return value is 0 on success. A failed run-time check returns a nonzero
  code and fills `err[0..3]` = (code, position in `fn.params` of the buffer or -1
  for a local one, dimension, offending value); see `polytile.codegen.cabi`.
  `err` must point to 4 int64; it is left untouched on success. Outputs are
  unspecified after a failure, but no code ever reads or writes out of bounds:
  every data-dependent subscript is checked before it is used. Local buffers are
  released on every path.
* The function may be called from several threads at once; the only state it
  keeps between calls is the memory of its temporaries (below). Compile it without
  `-ffast-math` (NaN handling relies on IEEE comparisons); with `-fopenmp`, blocks
  tagged "parallel" run in parallel.

Memory of local buffers (temporaries):

* Up to `COptions.stack_bytes` a local lives on the stack.
* A larger local of the top-level block is allocated once and kept: each has a
  pool of `PT_POOL_SLOTS` (8) cached blocks (`pt_pool_take`/`pt_pool_give` in
  `polytile.codegen.cprelude`). A call takes a cached block, or mallocs one, and
  puts it back when it returns; concurrent calls (any threads) never share one.
  So a kernel holds at most 8 blocks per local, as many as were ever in use at
  once, until the process exits or the shared object is unloaded (a destructor
  frees them); with more callers at once, the extra blocks are freed per call.
  Allocation failure returns PT_ERR_NOMEM as before.
* A larger local of a nested block is private to each iteration: calloc'ed and
  freed per iteration, as it must be when iterations run in parallel threads.
* A float local starts as NaN and another as 0 on every call, so a read before a
  write shows as in the interpreter, unless the first top-level statement that
  touches it writes all of it without reading it (`polytile.analysis.overwrite`):
  then nothing can observe the old content, and the fill is skipped.

How IR maps to C:

* An index with range > 1 is a loop `for (int64_t iN = lo; iN < hi; iN++)`; a
  passed index (one with an affine) is that affine of the parent's loop variables.
  A constraint that involves the block's own loop variables is folded into the
  bounds of the innermost one of them; the others become an `if` around the block.
* Addresses are folded to one affine expression of loop variables per access:
  a view's origin is its parent's origin + sum(access_d * stride_d).
* The block's schedule (`BlockSchedule`, set by passes): `parallel` names the index
  whose loop gets `#pragma omp parallel for` (the pass proved its iterations write
  disjoint elements; inside another parallel loop it is ignored); `simd` puts
  `#pragma omp simd` on the innermost loop where its iterations write disjoint
  elements (else it is ignored, with a comment); `micro` hands the block to the vector
  micro-kernel generator (`transpose`: to the register-transpose copy). Inside a parallel loop a failed check records the error
  (first one wins) and skips the rest of its iteration; the function returns
  after the loop.
* C identifiers are all generated (`b0` params, `l0` locals, `i0` loops, `s0`
  scalars, `d0` checked subscripts); source names appear only in comments, reduced
  to [A-Za-z0-9_].
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from polytile import dtypes
from polytile.analysis.overwrite import overwritten_first
from polytile.codegen import cexpr
from polytile.codegen.vmath import vector_math
from polytile.codegen.cloops import IterationSpace, iteration_space
from polytile.codegen.cscope import (
    Scope,
    Target,
    View,
    c_affine,
    child_view,
    extent,
    resolve,
    root_view,
    safe,
    writes_disjoint,
)
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

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_INDENT = "    "


@dataclass(frozen=True)
class COptions:
    symbol: str | None = None     # exported name; default "pt_" + the sanitized function name
    stack_bytes: int = 32768      # local buffers up to this size live on the stack
    openmp: bool = True           # honor the schedules' parallel and simd


@dataclass(frozen=True)
class CSource:
    text: str
    symbol: str


def generate_c(fn: Function, options: COptions | None = None) -> CSource:
    """The C99 source of `fn` (see the module docstring for the calling convention)."""
    options = options or COptions()
    symbol = f"pt_{safe(fn.name)}" if options.symbol is None else options.symbol
    if not _SYMBOL.fullmatch(symbol):
        raise IRError(f"{symbol!r} is not a valid C function name")
    return CSource(_FunctionWriter(fn, options).write(symbol), symbol)


def _indent(lines: list[str]) -> list[str]:
    return [_INDENT + line if line else line for line in lines]


def _read_scalars(block: Block) -> set[str]:
    names: set[str] = set()
    for st in block.stmts:
        if isinstance(st, Block):
            names |= _read_scalars(st)
        elif isinstance(st, Store):
            names.add(st.value)
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


class _FunctionWriter:
    """Generates one function; holds the name counters and the helpers used."""

    def __init__(self, fn: Function, options: COptions):
        self.fn = fn
        self.options = options
        self.needs = cexpr.Needs()
        self.counters: dict[str, int] = defaultdict(int)
        self.used_ptrs: set[str] = set()
        self.read = _read_scalars(fn.body)
        self.jumps = 0
        # One vector type per function: the width of its vectorized blocks (the
        # transposes of pack copies follow it), else set by whichever vector code runs.
        self.vector_lanes = _vector_width(fn.body)
        self.pools: list[tuple[str, str]] = []   # (pool, comment) per kept top-level local

    def fresh(self, prefix: str) -> str:
        number = self.counters[prefix]
        self.counters[prefix] += 1
        return f"{prefix}{number}"

    # ------------------------------------------------------------ function

    def write(self, symbol: str) -> str:
        fn, top = self.fn, self.fn.body
        if len(set(fn.params)) != len(fn.params):
            raise IRError(f"function {fn.name!r} lists a parameter twice")
        refs = {r.into: r for r in top.refs}
        decls: list[str] = []
        views: dict[str, View] = {}
        for p, name in enumerate(fn.params):
            ref = refs.get(name)
            if ref is None or ref.from_ or ref.dir == "none":
                raise IRError(f"parameter {name!r} is not an in/out/inout refinement of the "
                              f"top-level block")
            q = "const " if ref.dir == "in" else ""
            ct = ref.shape.dtype.c_name
            decls.append(f"{q}{ct} *restrict b{p} = ({q}{ct} *)args[{p}];  "
                         f"/* {_describe(ref)} */")
            views[name] = root_view(ref, f"b{p}", p)
        cleanup = Target("pt_cleanup")
        local_refs = [r for r in top.refs if r.into not in fn.params]
        for ref in local_refs:
            if ref.from_ or ref.dir != "none":
                raise IRError(f"top-level refinement {ref.into!r} is neither a parameter nor "
                              f"a local buffer (direction 'none')")
        local_lines, releases = self.locals(local_refs, views, cleanup, top_level=True)
        scope = Scope({}, views, {}, cleanup, False)
        body = self.block(top, scope, root=True)

        unused = [f"(void)b{p};" for p in range(len(fn.params)) if f"b{p}" not in self.used_ptrs]
        if not fn.params:
            unused.append("(void)args;")
        if "fail" not in self.needs.names:
            unused.append("(void)err;")
        lines = decls + unused + ["int32_t pt_status = 0;"] + local_lines + [""] + body
        if cleanup.used:
            lines += ["", "pt_cleanup:"]
        lines += releases + ["return pt_status;"]
        head = (f"/* Generated by polytile from function {safe(fn.name)}; do not edit.\n"
                f" * int32_t {symbol}(void **args, int64_t *err): args[p] is the data of\n"
                f" * parameter p; returns 0, or an error code with err[0..3] = (code, param,\n"
                f" * dimension, value). */\n")
        vector_prelude = vector_math(self.vector_lanes) if self.vector_lanes else ""
        return (head + "\n" + self.needs.prelude() + vector_prelude + "\n" + self.pool_statics()
                + f"int32_t {symbol}(void **args, int64_t *err)\n{{\n"
                + "\n".join(_indent(lines)) + "\n}\n")

    def locals(self, refs: list[Refinement], views: dict[str, View], fail: Target,
               top_level: bool = False) -> tuple[list[str], list[str]]:
        """Declarations of local buffers; returns them and the statements that release
        them (see "Memory of local buffers" in the module docstring).

        Floats start as NaN and other types as 0, as in the interpreter, so a read
        before a write shows, except top-level locals that are overwritten first. Heap
        pointers are all set to NULL before the first allocation, so that the cleanup
        after a failed one can release every one of them.
        """
        overwritten = overwritten_first(self.fn.body) if top_level else frozenset()
        stack: list[str] = []
        heap: list[str] = []
        allocs: list[str] = []
        fills: list[str] = []
        releases: list[str] = []
        for ref in refs:
            ptr = self.fresh("l")
            views[ref.into] = root_view(ref, ptr, -1)
            count = max(1, extent(ref.shape.dims, ref.into))
            dt = ref.shape.dtype
            ct = dt.c_name
            nbytes = count * dt.numpy.itemsize
            on_stack = nbytes <= self.options.stack_bytes
            kept = top_level and not on_stack      # reused: holds the last call's data
            fill = ref.into not in overwritten
            if fill and dt.is_float:
                var = self.fresh("i")
                fills.append(f"for (int64_t {var} = 0; {var} < {count}; {var}++) "
                             f"{ptr}[{var}] = {cexpr.nan_storage(dt)};")
            elif fill and kept:
                fills.append(f"memset({ptr}, 0, {count} * sizeof({ct}));")
            if on_stack:
                init = " = {0}" if fill and not dt.is_float else ""
                stack.append(f"{ct} {ptr}[{count}]{init};  /* {_describe(ref)} */")
                continue
            heap.append(f"{ct} *restrict {ptr} = NULL;  /* {_describe(ref)} */")
            if kept:
                pool = f"pt_pool_{ptr}"
                self.pools.append((pool, _describe(ref)))
                self.needs.use("pool")
                allocs.append(f"{ptr} = ({ct} *)pt_pool_take({pool}, {count}, sizeof({ct}));")
                releases.append(f"pt_pool_give({pool}, {ptr});")
            else:
                allocs.append(f"{ptr} = ({ct} *)calloc({count}, sizeof({ct}));")
                releases.append(f"free({ptr});")
            allocs += [f"if ({ptr} == NULL) {{",
                       *_indent(self.fail(fail, "PT_ERR_NOMEM", -1, -1, str(nbytes))), "}"]
        return stack + heap + allocs + fills, releases

    def pool_statics(self) -> str:
        """The pools of the kept top-level locals, and the destructor that frees their
        blocks when the shared object is unloaded."""
        if not self.pools:
            return ""
        slots = [f"static void *{pool}[PT_POOL_SLOTS];  /* {what} */" for pool, what in self.pools]
        drains = [f"    pt_pool_drain({pool});" for pool, _ in self.pools]
        return "\n".join([*slots, "",
                          "__attribute__((destructor)) static void pt_pools_release(void)",
                          "{", *drains, "}", "", ""])

    def fail(self, target: Target, code: str, param: int, dim: int, value: str) -> list[str]:
        self.needs.use("fail")
        self.jumps += 1
        return [f"pt_fail(&pt_status, err, {code}, {param}, {dim}, {value});"] + target.jump()

    def jump(self, target: Target) -> list[str]:
        self.jumps += 1
        return target.jump()

    # ------------------------------------------------------------ blocks

    def block(self, blk: Block, outer: Scope, root: bool = False) -> list[str]:
        if blk.schedule.gpu:
            raise UnsupportedError(f"block {safe(blk.name)} maps indices to a GPU grid or "
                                   "threads, which the C backend cannot run",
                                   hint="compile for a GPU target")
        if blk.schedule.micro and not root:
            from polytile.codegen import transpose, vector
            lines = (transpose.emit(self, blk, outer) if blk.schedule.transpose
                     else vector.emit(self, blk, outer))
            if lines is not None:
                return lines
        title = f"/* block {safe(blk.name)} */"
        space = iteration_space(blk, outer.idx, lambda: self.fresh("i"), self.needs)
        if isinstance(space, str):
            return [title, f"/* empty: {space} */"]
        views, private = self.views(blk, outer, space.idx, root)
        written = [views[r.into] for r in blk.refs if root or r.from_]
        notes: list[str] = []
        par_k = self.parallel_loop(blk, outer, space)
        par_target = None
        if par_k is not None:
            par_target = Target(self.fresh("pt_next_"))
        scope = Scope(space.idx, views, dict(outer.scalars), par_target or outer.fail,
                      outer.parallel or par_k is not None)
        jumps_before = self.jumps
        body = self.body(blk, scope, private)
        simd_k = None
        if blk.schedule.simd and self.options.openmp and space.loops:
            nested = any(isinstance(st, Block) for st in blk.stmts)
            if (not nested and self.jumps == jumps_before
                    and writes_disjoint(space.loops[-1], set(), written)):
                simd_k = len(space.loops) - 1
            else:
                notes.append("/* schedule simd ignored: the inner loop has checks, nested "
                             "blocks or shared writes */")
        lines = self.loop_nest(space, body, par_k, simd_k, par_target, outer.fail)
        if space.guards:
            cond = " && ".join(f"{c_affine(g)} >= 0" for g in space.guards)
            lines = [f"if ({cond}) {{", *_indent(lines), "}"]
        elif not space.loops and not root:
            lines = ["{", *_indent(lines), "}"]
        return [title, *notes, *lines]

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

    def parallel_loop(self, blk: Block, outer: Scope, space: IterationSpace) -> int | None:
        """The position of the loop the schedule runs in threads (None inside another
        parallel loop, where OpenMP would nest, and without OpenMP)."""
        index = blk.schedule.parallel
        if index is None or not self.options.openmp or outer.parallel:
            return None
        var = space.idx[index].terms[0][0] if space.idx[index].terms else None
        return space.loops.index(var) if var in space.loops else None

    def loop_nest(self, space: IterationSpace, body: list[str], par_k: int | None,
                  simd_k: int | None, par_target: Target | None, fail: Target) -> list[str]:
        """`body` inside the block's loops, with OpenMP pragmas where chosen.

        A failed check in a parallel loop jumps to the end of its iteration (it
        cannot leave the loop); the error is returned after the loop.
        """
        lines = body
        for k in reversed(range(len(space.loops))):
            var = space.loops[k]
            lo, hi = space.bounds.range_of(var)
            inner, pre, post = lines, [], []
            pragma = None
            if k == par_k:
                assert par_target is not None
                pragma = "omp parallel for simd" if k == simd_k else "omp parallel for"
                if par_target.used:
                    inner = [*inner, f"{par_target.label}: ;"]
                    post = ["if (pt_status != 0) {", *_indent(self.jump(fail)), "}"]
            elif k == simd_k:
                pragma = "omp simd"
            if pragma:
                pre = ["#ifdef _OPENMP", f"#pragma {pragma}", "#endif"]
            head = f"for (int64_t {var} = {lo}; {var} < {hi}; {var}++) {{"
            lines = [*pre, head, *_indent(inner), "}", *post]
        return lines

    def body(self, blk: Block, scope: Scope, private: list[Refinement]) -> list[str]:
        """One iteration: this block's private local buffers, then its statements."""
        views = dict(scope.views)
        label = self.fresh("pt_free_")
        heap_target = Target(label, label.replace("pt_free_", "pt_bad_"))
        pre, releases = self.locals(private, views, heap_target)
        inner = Scope(scope.idx, views, scope.scalars, heap_target if releases else scope.fail,
                      scope.parallel)
        lines: list[str] = []
        for st in blk.stmts:
            if isinstance(st, Block) and lines:
                lines.append("")
            lines += self.stmt(st, inner)
        if not releases:
            return pre + lines
        return ([f"int {heap_target.flag} = 0;"] + pre + lines
                + [f"{heap_target.label}:"] + releases
                + [f"if ({heap_target.flag}) {{", *_indent(self.jump(scope.fail)), "}"])

    # ------------------------------------------------------------ statements

    def stmt(self, st: Statement, scope: Scope) -> list[str]:
        if isinstance(st, Block):
            return self.block(st, scope)
        if isinstance(st, Load):
            return self.load(st, scope)
        if isinstance(st, Store):
            return self.store(st, scope)
        if isinstance(st, LoadIndex):
            value = resolve(st.value, scope.idx, f"index value {st.into!r}")
            return self.define(scope, st.into, dtypes.INT64, c_affine(value))
        if isinstance(st, Constant):
            return self.define(scope, st.into, st.dtype, cexpr.literal(st.value, st.dtype))
        if isinstance(st, Intrinsic):
            args = [self.scalar(scope, name) for name in st.inputs]
            expr = cexpr.intrinsic(st.op, args, st.dtype, self.needs)
            return self.define(scope, st.into, st.dtype, expr)
        if isinstance(st, Special):
            return self.special(st, scope)
        raise IRError(f"unknown statement {type(st).__name__}")

    def define(self, scope: Scope, name: str, dt: dtypes.DType, expr: str) -> list[str]:
        var = self.fresh("s")
        scope.scalars[name] = (var, dt)
        line = f"const {cexpr.scalar_type(dt)} {var} = {cexpr.strip(expr)};"
        return [line] if name in self.read else [line, f"(void){var};"]

    def scalar(self, scope: Scope, name: str) -> cexpr.Typed:
        if name not in scope.scalars:
            raise IRError(f"scalar {name!r} is used before it is assigned")
        return scope.scalars[name]

    def view(self, scope: Scope, name: str) -> View:
        if name not in scope.views:
            raise IRError(f"buffer {name!r} is not declared in this block",
                          hint="a block reaches a parent's buffer through a refinement")
        return scope.views[name]

    def element(self, view: View, address: Affine) -> str:
        self.used_ptrs.add(view.ptr)
        return f"{view.ptr}[{c_affine(address)}]"

    def load(self, st: Load, scope: Scope) -> list[str]:
        view = self.view(scope, st.ref)
        if st.dynamic and len(st.dynamic) != len(view.dims):
            raise IRError(f"load from {st.ref!r} has {len(st.dynamic)} subscripts for "
                          f"{len(view.dims)} dimensions")
        lines: list[str] = []
        address = view.offset
        for d, name in enumerate(st.dynamic):
            if name is None:
                continue
            expr, dt = self.scalar(scope, name)
            var = self.fresh("d")
            lines.append(f"const int64_t {var} = "
                         f"{cexpr.strip(cexpr.convert(expr, dt, dtypes.INT64, self.needs))};")
            lines.append(f"if ({var} < 0 || {var} >= {view.dims[d].size}) {{")
            lines += _indent(self.fail(scope.fail, "PT_ERR_INDEX", view.param, d, var))
            lines.append("}")
            address = address + Affine.index(var).scale(view.dims[d].stride)
        if st.offset is not None:       # a pointer increment: in the view by construction
            address = address + Affine.index(self.scalar(scope, st.offset)[0])
        value = cexpr.load(self.element(view, address), view.dtype, self.needs)
        return lines + self.define(scope, st.into, view.dtype, value)

    def store(self, st: Store, scope: Scope) -> list[str]:
        view = self.view(scope, st.ref)
        if not view.writable:
            raise IRError(f"store to {st.ref!r}, which is read-only")
        if view.agg not in AGG_OPS:
            raise IRError(f"unknown aggregation {view.agg!r} on {st.ref!r}")
        expr, dt = self.scalar(scope, st.value)
        return [self.assign(view, view.offset, cexpr.convert(expr, dt, view.dtype, self.needs),
                            view.agg)]

    def assign(self, view: View, address: Affine, value: str, agg: str) -> str:
        """The statement that aggregates scalar `value` (of the view's dtype) into an element."""
        element = self.element(view, address)
        dt = view.dtype
        if agg in ("add", "mul") and dt in (dtypes.FLOAT32, dtypes.FLOAT64):
            return f"{element} {'+' if agg == 'add' else '*'}= {cexpr.strip(value)};"
        if agg != "assign":
            acc = cexpr.load(element, dt, self.needs)
            value = cexpr.combine(agg, acc, value, dt, self.needs)
        return f"{element} = {cexpr.strip(cexpr.store(value, dt, self.needs))};"

    # ------------------------------------------------------------ specials

    def special(self, st: Special, scope: Scope) -> list[str]:
        """`zero` writes 0 to every element of its outputs, `copy` copies inputs[0] to
        outputs[0] with conversion; both through the output's aggregation, as in the
        interpreter."""
        if st.name == "zero":
            lines: list[str] = []
            for name in st.outputs:
                view = self._writable(scope, name)
                loops, address = self._element_loops(view.dims, view.offset)
                value = cexpr.literal(0, view.dtype)
                lines += _nest(loops, [self.assign(view, address, value, view.agg)])
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
            for var, d in zip([_loop_var(h) for h in loops], src.dims):
                src_addr = src_addr + Affine.index(var).scale(d.stride)
            value = cexpr.load(self.element(src, src_addr), src.dtype, self.needs)
            value = cexpr.convert(value, src.dtype, dst.dtype, self.needs)
            return _nest(loops, [self.assign(dst, dst_addr, value, dst.agg)])
        raise UnsupportedError(f"special {safe(st.name)!r} is not supported by the C backend",
                               hint="the C backend implements the specials zero and copy")

    def _writable(self, scope: Scope, name: str) -> View:
        view = self.view(scope, name)
        if not view.writable:
            raise IRError(f"special writes {name!r}, which is read-only")
        return view

    def _element_loops(self, dims: tuple[Dim, ...], offset: Affine) -> tuple[list[str], Affine]:
        loops = []
        for d in dims:
            var = self.fresh("i")
            loops.append(f"for (int64_t {var} = 0; {var} < {d.size}; {var}++) {{")
            offset = offset + Affine.index(var).scale(d.stride)
        return loops, offset


def _loop_var(head: str) -> str:
    return head.split()[2]


def _nest(heads: list[str], body: list[str]) -> list[str]:
    for head in reversed(heads):
        body = [head] + _indent(body) + ["}"]
    return body


def _describe(ref: Refinement) -> str:
    sizes = "x".join(str(s) for s in ref.shape.sizes) or "scalar"
    kind = "local" if ref.dir == "none" else ref.dir
    return f"{safe(ref.into)}: {kind} {ref.shape.dtype} {sizes}"
