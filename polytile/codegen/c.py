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
  keeps between calls is the memory of its temporaries (below), some of which keep
  their contents (`Kept`: packed weights, with the copy they were packed from). Compile it without
  `-ffast-math` (NaN handling relies on IEEE comparisons); with `-fopenmp`, parallel
  loops run in threads.

Memory of local buffers (temporaries), as the lowering places them
(`polytile.loops.lower`):

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

The loop IR (polytile.loops) maps to C one node to one construct; the printer decides
nothing:

* `Loop` is `for (int64_t i0 = lo; i0 < hi; i0 += step)`; kind "parallel" gets
  `#pragma omp parallel for` (and `simd` adds `simd`; alone, `#pragma omp simd`). Inside
  a parallel loop a failed check records the error (first one wins) and skips the rest
  of its iteration; the function returns after the loop. Grid and thread loops (GPU
  kinds) are refused.
* `Region` is `#pragma omp parallel` around its body: a "workshare" loop gets
  `#pragma omp for schedule(static) nowait` (with its reduction), a `Single`
  `#pragma omp single nowait`, a `Barrier("global")` `#pragma omp barrier`. A failed
  check inside records the error and skips the rest of its iteration (or single); the
  function returns after the region.
* Scalars are C scalars (`cexpr`, 16-bit floats held in a `float`); vectors are GCC
  vector extensions (`pt_vf`, float32, one width per function, `vmath`). Each op's C form
  is its row in `cops.C_OPS`.
* Loop IR names are the C identifiers (`b0` params, `l0` locals, `i0` loops, `s0`
  scalars); labels are `pt_*`. Source names appear only in comments, already reduced to
  [A-Za-z0-9_] by the lowering.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from polytile import dtypes
from polytile.codegen import cexpr
from polytile.codegen.cops import C_OPS, MASK_OPS, VECTOR_IDENTITIES, Lanewise
from polytile.codegen.vmath import vector_math
from polytile.errors import IRError, UnsupportedError
from polytile.ir.nodes import Affine, Function
from polytile.loops import nodes as L
from polytile.loops.instructions import instruction
from polytile.loops.lower import LowerOptions, lower

BACKEND = "c-x86"             # the name instruction forms are registered under
# The header of each architecture's intrinsics, by the name of its instruction forms: the
# printer is one C printer, and an instruction's form says which architecture it is for.
INTRINSICS = {"c-x86": "immintrin.h", "c-arm64": "arm_neon.h"}
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_OPERAND = re.compile(r"\{((?:out|in)\d+)\}")
_INDENT = "    "
_REDUCE = {"add": "pt_vhsum", "max": "pt_vhmax", "min": "pt_vhmin", "mul": "pt_vhprod"}


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
    kernel = lower(fn, LowerOptions(options.stack_bytes, options.openmp))
    return print_c(kernel, options.symbol)


def print_c(kernel: L.Kernel, symbol: str | None = None, forms: str = BACKEND) -> CSource:
    """The C99 source of a loop IR kernel; its instructions take their `forms` form
    ("c-x86", or "c-arm64" for an AArch64 compiler)."""
    symbol = f"pt_{kernel.name}" if symbol is None else symbol
    if not _SYMBOL.fullmatch(symbol):
        raise IRError(f"{symbol!r} is not a valid C function name")
    if forms not in INTRINSICS:
        raise IRError(f"no C instruction forms called {forms!r}",
                      hint=f"use one of {', '.join(INTRINSICS)}")
    return CSource(_Printer(kernel, forms).write(symbol), symbol)


def _indent(lines: list[str]) -> list[str]:
    return [_INDENT + line if line else line for line in lines]


def c_affine(a: Affine) -> str:
    """`a` as a C int64 expression, e.g. `13*i0 + i1 - 1`."""
    parts: list[str] = []
    terms = sorted(a.terms, key=lambda t: _natural(t[0]))
    if a.const > 0 and terms and terms[0][1] < 0:     # `13 - 4*i0`, not `-4*i0 + 13`
        parts.append(str(a.const))
        a = Affine(a.terms, 0)
    for name, coeff in terms:
        mag = abs(coeff)
        term = name if mag == 1 else f"{mag}*{name}"
        if not parts:
            parts.append(f"-{term}" if coeff < 0 else term)
        else:
            parts.append(f"{'-' if coeff < 0 else '+'} {term}")
    if a.const or not parts:
        if parts:
            parts.append(f"{'-' if a.const < 0 else '+'} {abs(a.const)}")
        else:
            parts.append(str(a.const))
    return " ".join(parts)


def _natural(name: str) -> tuple[str, int]:
    """Sort key that puts i9 before i10 (outer loops come first in addresses)."""
    head = name.rstrip("0123456789")
    return head, int(name[len(head):] or -1)


class _Target:
    """Where a failed run-time check jumps: a label, and a flag to set on the way if
    the code after that label must tell a failure from a normal fall-through."""

    def __init__(self, label: str, flag: str | None = None):
        self.label = label
        self.flag = flag
        self.used = False

    def jump(self) -> list[str]:
        self.used = True
        return ([f"{self.flag} = 1;"] if self.flag else []) + [f"goto {self.label};"]


class _Printer:
    """Prints one kernel; holds the types of its names and the helpers used."""

    def __init__(self, kernel: L.Kernel, forms: str = BACKEND):
        self.kernel = kernel
        self.forms = forms
        self.needs = cexpr.Needs()
        self.types: dict[str, L.VType] = {}
        self.buffers = {b.name: b for b in kernel.params}
        self.used_buffers: set[str] = set()
        self.vector: L.VType | None = None
        self.counters: dict[str, int] = defaultdict(int)
        self.pools: list[tuple[str, str]] = []   # (pool, comment) per kept top-level local
        self.typedefs: dict[str, str] = {}       # vector types other than pt_vf
        self.intrinsics = False                  # an instruction's form may use them
        self.streams = False                     # streaming stores or fences printed

    def label(self, prefix: str) -> str:
        number = self.counters[prefix]
        self.counters[prefix] += 1
        return f"{prefix}{number}"

    # ------------------------------------------------------------ function

    def write(self, symbol: str) -> str:
        k = self.kernel
        decls = []
        for b in k.params:
            q = "" if b.writable else "const "
            ct = b.dtype.c_name
            decls.append(f"{q}{ct} *restrict {b.name} = ({q}{ct} *)args[{b.param}];  "
                         f"/* {_comment(b.label)} */")
        cleanup = _Target("pt_cleanup")
        local_lines, releases = self.locals(k.locals, cleanup, top_level=True)
        body = self.stmts(k.body, cleanup)
        unused = [f"(void){b.name};" for b in k.params if b.name not in self.used_buffers]
        if not k.params:
            unused.append("(void)args;")
        if "fail" not in self.needs.names:
            unused.append("(void)err;")
        lines = decls + unused + ["int32_t pt_status = 0;"] + local_lines + [""] + body
        if cleanup.used:
            lines += ["", "pt_cleanup:"]
        lines += releases + ["return pt_status;"]
        head = (f"/* Generated by polytile from function {k.name}; do not edit.\n"
                f" * int32_t {symbol}(void **args, int64_t *err): args[p] is the data of\n"
                f" * parameter p; returns 0, or an error code with err[0..3] = (code, param,\n"
                f" * dimension, value). */\n")
        if self.streams and self.vector is None:
            raise IRError("a fence or streaming store in a kernel without float32 vectors")
        vector_prelude = (vector_math(self.vector.lanes, self.streams) if self.vector
                          else "")
        if self.typedefs or self.intrinsics:
            vector_prelude += "\n".join([f"#include <{INTRINSICS[self.forms]}>",
                                          *self.typedefs.values()]) + "\n"
        return (head + "\n" + self.needs.prelude() + vector_prelude + "\n" + self.pool_statics()
                + f"int32_t {symbol}(void **args, int64_t *err)\n{{\n"
                + "\n".join(_indent(lines)) + "\n}\n")

    def locals(self, buffers: tuple[L.Buffer, ...], fail: _Target, top_level: bool = False
               ) -> tuple[list[str], list[str]]:
        """Declarations of local buffers; returns them and the statements that release
        them. Heap pointers are all set to NULL before the first allocation, so that the
        cleanup after a failed one can release every one of them."""
        stack: list[str] = []
        heap: list[str] = []
        allocs: list[str] = []
        fills: list[str] = []
        releases: list[str] = []
        for b in buffers:
            if b.space == "shared":
                raise UnsupportedError(f"local buffer {b.name} is in shared memory, which "
                                       "the C backend does not have")
            self.buffers[b.name] = b
            ptr, ct, count = b.name, b.dtype.c_name, b.size
            what = _comment(b.label)
            if b.init == "nan":
                fills.append(f"for (int64_t pt_j = 0; pt_j < {count}; pt_j++) "
                             f"{ptr}[pt_j] = {cexpr.nan_storage(b.dtype)};")
            elif b.init == "zero" and b.placement == "pool":
                fills.append(f"memset({ptr}, 0, {count} * sizeof({ct}));")
            if b.placement == "stack":
                init = " = {0}" if b.init == "zero" else ""
                stack.append(f"{ct} {ptr}[{count}]{init};  /* {what} */")
                continue
            heap.append(f"{ct} *restrict {ptr} = NULL;  /* {what} */")
            if b.placement == "pool":
                if not top_level:
                    raise IRError(f"local buffer {ptr} is pooled but not at the top level")
                pool = f"pt_pool_{ptr}"
                self.pools.append((pool, what))
                self.needs.use("pool")
                allocs.append(f"{ptr} = ({ct} *)pt_pool_take({pool}, {count}, sizeof({ct}));")
                releases.append(f"pt_pool_give({pool}, {ptr});")
            else:        # calloc: zeroed, as init "zero" asks
                allocs.append(f"{ptr} = ({ct} *)calloc({count}, sizeof({ct}));")
                releases.append(f"free({ptr});")
            nbytes = count * b.dtype.numpy.itemsize
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

    def fail(self, target: _Target, code: str, param: int, dim: int, value: str) -> list[str]:
        self.needs.use("fail")
        return [f"pt_fail(&pt_status, err, {code}, {param}, {dim}, {value});"] + target.jump()

    # ------------------------------------------------------------ statements

    def stmts(self, stmts: tuple[L.Stmt, ...], fail: _Target) -> list[str]:
        lines: list[str] = []
        for st in stmts:
            if isinstance(st, L.Comment) and st.text.startswith("block") and lines \
                    and not lines[-1].startswith("/*"):
                lines.append("")
            lines += self.stmt(st, fail)
        return lines

    def stmt(self, st: L.Stmt, fail: _Target) -> list[str]:
        if isinstance(st, L.Comment):
            return [f"/* {_comment(st.text)} */"]
        if isinstance(st, (L.Let, L.Var)):
            return self.define(st)
        if isinstance(st, L.Assign):
            return [f"{st.name} = {cexpr.strip(self.expr(st.value, self.types[st.name]))};"]
        if isinstance(st, L.Store):
            return self.store(st)
        if isinstance(st, L.Loop):
            return self.loop(st, fail)
        if isinstance(st, L.If):
            cond = " && ".join(f"{self.iexpr(c)} >= 0" for c in st.conds)
            lines = [f"if ({cond}) {{", *_indent(self.stmts(st.then, fail))]
            if st.else_:
                lines += ["} else {", *_indent(self.stmts(st.else_, fail))]
            return lines + ["}"]
        if isinstance(st, L.Switch):
            lines = [f"switch ({self.iexpr(st.value)}) {{"]
            for value, body in st.cases:
                lines += [f"case {value}: {{", *_indent(self.stmts(body, fail)), "    break;",
                          "}"]
            return ["{", *_indent(lines + ["default: break;", "}"]), "}"]
        if isinstance(st, L.Check):
            buf = st.value
            return [f"if ({buf} < 0 || {buf} >= {st.size}) {{",
                    *_indent(self.fail(fail, "PT_ERR_INDEX", st.param, st.dim, buf)), "}"]
        if isinstance(st, L.Alloc):
            return self.alloc(st, fail)
        if isinstance(st, L.Kept):
            return self.kept(st, fail)
        if isinstance(st, L.Instruction):
            return self.instruction(st)
        if isinstance(st, L.Prefetch):
            write = ", 1" if st.write else ""
            return [f"__builtin_prefetch(&{self.element(st.buffer, st.offset)}{write});"]
        if isinstance(st, L.Fence):
            self.streams = True
            return ["pt_sfence();"]
        if isinstance(st, L.Region):
            return self.region(st, fail)
        if isinstance(st, L.Single) or (isinstance(st, L.Barrier) and st.space == "global"):
            raise IRError(f"a {type(st).__name__} is outside a parallel region")
        raise UnsupportedError(f"the C backend cannot print {type(st).__name__} nodes",
                               hint="barriers are for GPU backends")

    def define(self, st: L.Let | L.Var) -> list[str]:
        self.types[st.name] = st.type
        if self.typed(st.type):
            return self.define_typed(st)
        if st.type.lanes > 1:
            self.use_vector(st.type)
            op = st.value if isinstance(st.value, L.Op) else None
            form = C_OPS[op.op].vector if op is not None and op.op in C_OPS else None
            if op is not None and isinstance(form, Lanewise):
                (x,) = op.args
                return [f"pt_vf {st.name};",
                        f"for (int pt_l = 0; pt_l < {st.type.lanes}; pt_l++) "
                        f"{st.name}[pt_l] = {form.template.format(f'{x}[pt_l]')};"]
            ctype = "pt_vi" if st.type.dtype == dtypes.BOOL else "pt_vf"
        else:
            ctype = cexpr.scalar_type(st.type.dtype)
        value = cexpr.strip(self.expr(st.value, st.type))
        if isinstance(st, L.Let) and st.held and st.type.lanes > 1:
            return [f"{ctype} {st.name} = {value};", f"PT_HOLD({st.name});"]
        const = "const " if isinstance(st, L.Let) else ""
        return [f"{const}{ctype} {st.name} = {value};"]

    def typed(self, t: L.VType) -> bool:
        """Whether `t` is a vector outside the function's float32 vector type (`pt_vf`,
        which has the vector math, at most a 512-bit register): those are declared as
        `pt_v_<dtype>x<lanes>` and only loaded and stored (whole or their first lanes),
        filled with a literal, shuffled and passed to instructions (an AMX tile is a 1 KiB
        one)."""
        return t.lanes > 1 and not (t.dtype in (dtypes.FLOAT32, dtypes.BOOL) and t.lanes <= 16
                                    and self.vector in (None, _float32(t)))

    def typed_name(self, t: L.VType) -> str:
        name = f"pt_v_{t.dtype.name}x{t.lanes}"
        self.typedefs[name] = (f"typedef {t.dtype.c_name} {name} __attribute__((vector_size("
                               f"{t.lanes * t.dtype.bits // 8})));")
        return name

    def define_typed(self, st: L.Let | L.Var) -> list[str]:
        t, name = st.type, self.typed_name(st.type)
        v = st.value
        if isinstance(v, L.Read) and v.lanes == t.lanes:
            element = self.element(v.buffer, v.offset)
            if v.count is None:
                return [f"{name} {st.name};",
                        f"__builtin_memcpy(&{st.name}, &{element}, sizeof {st.name});"]
            return [f"{name} {st.name} = {{0}};",
                    f"__builtin_memcpy(&{st.name}, &{element}, ({self.iexpr(v.count)}) * "
                    f"sizeof({t.dtype.c_name}));"]
        small = self.types.get(v.a) if isinstance(v, L.Shuffle) else None
        if isinstance(v, L.Shuffle) and small is not None and v.a == v.b \
                and small.lanes * small.dtype.bits in (16, 32, 64) \
                and v.lanes == tuple(range(small.lanes)) * (t.lanes // small.lanes):
            # A small vector repeated: one broadcast of it as a word (gcc lowers the
            # general shuffle of a 4-byte vector through the stack).
            bits = small.lanes * small.dtype.bits
            unsigned = {16: dtypes.UINT16, 32: dtypes.UINT32, 64: dtypes.UINT64}[bits]
            word = self.typed_name(L.VType(unsigned, t.lanes * t.dtype.bits // bits))
            return [f"uint{bits}_t {st.name}_w;",
                    f"__builtin_memcpy(&{st.name}_w, &{v.a}, sizeof {st.name}_w);",
                    f"{name} {st.name} = ({name})(({word}){{}} + {st.name}_w);"]
        if isinstance(v, L.Shuffle) and self.types.get(v.a) == self.types.get(v.b) \
                and len(v.lanes) == t.lanes:
            return [f"{name} {st.name} = __builtin_shufflevector({v.a}, {v.b}, "
                    f"{', '.join(map(str, v.lanes))});"]
        if isinstance(v, L.Lit) and t.dtype.name != "bfloat16":
            literal = cexpr.literal(v.value, t.dtype)
            return [f"{name} {st.name} = ({name}){{}} + ({t.dtype.c_name}){literal};"]
        if isinstance(v, L.Name) and self.types.get(v.name) == t:
            return [f"{name} {st.name} = {v.name};"]
        if isinstance(v, L.Combine):
            return [f"{name} {st.name} = {self.typed_combine(v, t)};"]
        raise UnsupportedError(f"the C backend loads, stores and passes {t} vectors to "
                               f"instructions, but cannot compute {type(v).__name__} on them")

    def typed_combine(self, e: L.Combine, t: L.VType) -> str:
        """An aggregation step on typed vectors (a result of an instruction without an
        accumulator operand, added into the accumulator). Integers add and multiply as
        unsigned vectors: they wrap, as the interpreter's do, where signed overflow
        would be undefined in C."""
        if e.agg not in ("add", "mul") or self.types.get(e.acc) != t \
                or self.types.get(e.value) != t:
            raise UnsupportedError(f"the C backend adds and multiplies {t} vectors, not "
                                   f"{e.agg} of {self.types.get(e.acc)} and "
                                   f"{self.types.get(e.value)}")
        op = "+" if e.agg == "add" else "*"
        if t.dtype in (dtypes.FLOAT32, dtypes.FLOAT64, *UNSIGNED.values()):
            return f"{e.acc} {op} {e.value}"
        if t.dtype.kind != "i":       # bfloat16 and float16 are stored as bits
            raise UnsupportedError(f"the C backend cannot add {t} vectors")
        name = self.typed_name(t)
        unsigned = self.typed_name(L.VType(UNSIGNED[t.dtype.bits], t.lanes))
        return f"({name})(({unsigned}){e.acc} {op} ({unsigned}){e.value})"

    def instruction(self, st: L.Instruction) -> list[str]:
        """The instruction's C form for this printer (`forms["c-x86"]` or
        `forms["c-arm64"]`), after declaring its outputs."""
        definition = instruction(st.name)
        form = definition.forms.get(self.forms)
        if form is None:
            raise UnsupportedError(f"instruction {st.name} has no {self.forms} form for the C "
                                   "backend", hint=f"its forms: {', '.join(definition.forms)}")
        lines = []
        for name, t in zip(st.outputs, definition.outputs):
            self.types[name] = t
            if self.typed(t):
                ctype = self.typed_name(t)
            elif t.lanes > 1:
                self.use_vector(t)
                ctype = "pt_vf"
            else:
                ctype = cexpr.scalar_type(t.dtype)
            lines.append(f"{ctype} {name};")
        self.intrinsics = True
        operands = {f"out{k}": n for k, n in enumerate(st.outputs)}
        operands.update({f"in{k}": n for k, n in enumerate(st.inputs)})
        # Only {outK} and {inK} are placeholders: a form's own braces (a C block) stay.
        def operand(m: re.Match[str]) -> str:
            if m.group(1) not in operands:
                raise IRError(f"the C form of instruction {st.name} names {m.group(0)}, which "
                              f"it does not have ({', '.join(operands)})")
            return operands[m.group(1)]
        return lines + [_OPERAND.sub(operand, form)]

    def use_vector(self, t: L.VType) -> None:
        t = _float32(t)                 # a mask is a pt_vi of the same lanes
        if t.dtype != dtypes.FLOAT32:
            raise UnsupportedError(f"the C backend has float32 vectors only, not {t}")
        if self.vector is not None and self.vector != t:
            raise UnsupportedError(f"the C backend uses one vector width per function: "
                                   f"{self.vector} and {t}")
        self.vector = t

    def region(self, st: L.Region, fail: _Target) -> list[str]:
        """One parallel region; its phases skip to their end on a failure, and the
        function returns after the region."""
        lines: list[str] = []
        failed = False
        for s in st.body:
            if isinstance(s, L.Comment):
                lines += self.stmt(s, fail)
            elif isinstance(s, L.Loop) and s.kind == "workshare":
                inner = _Target(self.label("pt_next_"))
                lines += self.loop(s, inner, in_region=True)
                failed = failed or inner.used
            elif isinstance(s, L.Single):
                inner = _Target(self.label("pt_done_"))
                body = self.stmts(s.body, inner)
                if inner.used:
                    body.append(f"{inner.label}: ;")
                    failed = True
                lines += [*_omp("omp single nowait"), "{", *_indent(body), "}"]
            elif isinstance(s, L.Barrier) and s.space == "global":
                lines += _omp("omp barrier")
            elif isinstance(s, L.Fence):
                lines += self.stmt(s, fail)
            else:
                raise IRError(f"a parallel region holds a {type(s).__name__} (only workshare "
                              "loops, singles, fences, global barriers and comments)")
        post = ["if (pt_status != 0) {", *_indent(fail.jump()), "}"] if failed else []
        return [*_omp("omp parallel"), "{", *_indent(lines), "}", *post]

    def loop(self, st: L.Loop, fail: _Target, in_region: bool = False) -> list[str]:
        if (st.kind == "workshare") != in_region:
            raise IRError(f"a {st.kind} loop {st.var} is {'in' if in_region else 'outside'} a "
                          "parallel region (its loops are workshare loops)")
        if st.kind in ("grid", "thread"):
            raise UnsupportedError(f"loop {st.var} runs on a GPU {st.kind}, which the C "
                                   "backend cannot run", hint="compile for a GPU target")
        post: list[str] = []
        pragma = "omp simd" if st.simd else None
        inner_fail = fail
        if st.kind in ("parallel", "workshare"):
            pragma = "omp parallel for" if st.kind == "parallel" else "omp for"
            pragma += " simd" if st.simd else ""
            pragma += " schedule(static) nowait" if st.kind == "workshare" else ""
            for s in st.accumulate:
                if s.buffer not in self.buffers:
                    raise IRError(f"buffer {s.buffer} is not declared")
                self.used_buffers.add(s.buffer)
                pragma += f" reduction(+: {s.buffer}[{s.offset}:{s.count}])"
            # In a region, `fail` is already the iteration's end (see region).
            inner_fail = fail if st.kind == "workshare" else _Target(self.label("pt_next_"))
        body = self.stmts(st.body, inner_fail)
        if st.kind == "workshare" and fail.used:
            body.append(f"{fail.label}: ;")
        if inner_fail is not fail and inner_fail.used:
            body.append(f"{inner_fail.label}: ;")
            post = ["if (pt_status != 0) {", *_indent(fail.jump()), "}"]
        pre = _omp(pragma) if pragma else []
        step = f"{st.var}++" if st.step == 1 else f"{st.var} += {st.step}"
        head = (f"for (int64_t {st.var} = {self.iexpr(st.lo)}; {st.var} < {self.iexpr(st.hi)}; "
                f"{step}) {{")
        return [*pre, head, *_indent(body), "}", *post]

    def alloc(self, st: L.Alloc, fail: _Target) -> list[str]:
        """Private local buffers of one iteration, released on every path."""
        label = self.label("pt_free_")
        target = _Target(label, label.replace("pt_free_", "pt_bad_"))
        pre, releases = self.locals(st.buffers, target)
        lines = self.stmts(st.body, target if releases else fail)
        if not releases:
            return pre + lines
        return ([f"int {target.flag} = 0;"] + pre + lines + [f"{label}:"] + releases
                + [f"if ({target.flag}) {{", *_indent(fail.jump()), "}"])

    def kept(self, st: L.Kept, fail: _Target) -> list[str]:
        """The fill of a kept block, skipped when its source holds the values it was last
        filled from (the block's state: a header byte, 1 once filled, and their copy)."""
        kept = self.buffers.get(st.buffer)
        if kept is None or kept.placement != "pool":
            raise IRError(f"kept buffer {st.buffer} is not a pooled top-level local")
        source = self.element(st.source, st.offset)
        nbytes = f"{st.count} * sizeof({self.buffers[st.source].dtype.c_name})"
        state = f"pt_kept_{st.buffer}"
        copy = f"{state} + {L.KEPT_HEADER}"
        same = f"{state}_same"
        if st.threads:      # chunks of L.KEPT_CHUNK bytes, compared by the threads
            compare = [
                f"    int {same} = {state}[0] == 1;",
                f"    if ({same}) {{",
                f"        const unsigned char *{same}_a = {copy};",
                f"        const unsigned char *{same}_b = (const unsigned char *)&{source};",
                f"        const int64_t {same}_n = (int64_t)({nbytes});",
                *_indent(_indent(_omp(f"omp parallel for reduction(&&:{same})"))),
                (f"        for (int64_t {same}_c = 0; {same}_c < {same}_n; "
                 f"{same}_c += {L.KEPT_CHUNK}) {{"),
                (f"            int64_t {same}_k = {same}_n - {same}_c < {L.KEPT_CHUNK} ? "
                 f"{same}_n - {same}_c : {L.KEPT_CHUNK};"),
                (f"            {same} = {same} && memcmp({same}_a + {same}_c, {same}_b + "
                 f"{same}_c, (size_t){same}_k) == 0;"),
                "        }",
                "    }"]
        else:
            compare = [(f"    int {same} = {state}[0] == 1 && "
                        f"memcmp({copy}, &{source}, {nbytes}) == 0;")]
        return [(f"/* {st.buffer} is kept between calls: filled again only where "
                 f"{st.source} differs from the copy it was filled from */"),
                "{",
                f"    unsigned char *{state} = (unsigned char *)&{st.buffer}[{st.state}];",
                *compare,
                f"    if (!{same}) {{",
                f"        {state}[0] = 0;",
                *_indent(_indent(self.stmts(st.body, fail))),
                f"        memcpy({copy}, &{source}, {nbytes});",
                f"        {state}[0] = 1;",
                "    }",
                "}"]

    def element(self, buffer: str, offset: Affine) -> str:
        if buffer not in self.buffers:
            raise IRError(f"buffer {buffer} is not declared")
        self.used_buffers.add(buffer)
        return f"{buffer}[{c_affine(offset)}]"

    def store(self, st: L.Store) -> list[str]:
        b = self.buffers.get(st.buffer)
        if b is not None and not b.writable:
            raise IRError(f"store to {st.buffer}, which is read-only")
        t = self.types[st.value]
        element = self.element(st.buffer, st.offset)
        if t.dtype != self.buffers[st.buffer].dtype:
            raise IRError(f"store of {t} {st.value} to a {self.buffers[st.buffer].dtype} buffer")
        if st.stream and (t.lanes == 1 or self.typed(t) or st.agg != "assign"
                          or st.count is not None):
            raise UnsupportedError(f"the C backend streams whole float32 vectors it assigns, "
                                   f"not a store of {t} {st.value} (agg {st.agg})")
        if st.stream:
            self.streams = True
            return [f"pt_vstream(&{element}, {st.value});"]
        if self.typed(t):
            if st.agg != "assign":
                raise UnsupportedError(f"the C backend stores {t} vectors without aggregation")
            size = (f"sizeof {st.value}" if st.count is None
                    else f"({self.iexpr(st.count)}) * sizeof({t.dtype.c_name})")
            return [f"__builtin_memcpy(&{element}, &{st.value}, {size});"]
        if t.lanes == 1:
            return [self.assign(element, st.value, st.agg, t.dtype)]
        value, addr = st.value, f"&{element}"
        n = None if st.count is None else self.iexpr(st.count)
        if st.agg != "assign":
            load = f"pt_vload({addr})" if n is None else f"pt_vload_n({addr}, {n})"
            value = _vcombine(st.agg, load, value)
        if n is None:
            return [f"pt_vstore({addr}, {value});"]
        return [f"pt_vstore_n({addr}, {value}, {n});"]

    def assign(self, element: str, value: str, agg: str, dt: dtypes.DType) -> str:
        """The statement that aggregates scalar `value` (of dtype `dt`) into an element."""
        if agg in ("add", "mul") and dt in (dtypes.FLOAT32, dtypes.FLOAT64):
            return f"{element} {'+' if agg == 'add' else '*'}= {value};"
        if agg != "assign":
            acc = cexpr.load(element, dt, self.needs)
            value = cexpr.combine(agg, acc, value, dt, self.needs)
        return f"{element} = {cexpr.strip(cexpr.store(value, dt, self.needs))};"

    # ------------------------------------------------------------ expressions

    def expr(self, e: L.Expr, t: L.VType) -> str:
        vec = t.lanes > 1
        if isinstance(e, L.Lit):
            return f"pt_vsplat({cexpr.literal(e.value, t.dtype)})" if vec \
                else cexpr.literal(e.value, t.dtype)
        if isinstance(e, L.Name):
            return e.name
        if isinstance(e, L.IntValue):
            return f"({self.iexpr(e.value)})"
        if isinstance(e, L.Read):
            element = self.element(e.buffer, e.offset)
            if not vec:
                return cexpr.load(element, t.dtype, self.needs)
            if e.count is None:
                return f"pt_vload(&{element})"
            return f"pt_vload_n(&{element}, {self.iexpr(e.count)})"
        if isinstance(e, L.Op):
            if not vec:
                args = [(a, self.types[a].dtype) for a in e.args]
                return cexpr.intrinsic(e.op, args, e.dtype, self.needs)
            if e.op in VECTOR_IDENTITIES:
                return e.args[0]
            form = MASK_OPS[e.op][1] if e.op in MASK_OPS else \
                C_OPS[e.op].vector if e.op in C_OPS else None
            if not isinstance(form, str):
                raise UnsupportedError(f"op {e.op!r} has no vector form in the C backend")
            return form.format(*e.args)
        if isinstance(e, L.Broadcast):
            if t.dtype == dtypes.BOOL:      # all ones where the bool (0 or 1) is true
                return f"((pt_vi){{}} - (int32_t){e.value})"
            return f"pt_vsplat({e.value})"
        if isinstance(e, L.Combine):
            if self.typed(t):
                return self.typed_combine(e, t)
            if vec:
                return _vcombine(e.agg, e.acc, e.value)
            return cexpr.combine(e.agg, e.acc, e.value, t.dtype, self.needs)
        if isinstance(e, L.Reduce):
            return f"{_REDUCE[e.agg]}({e.value})"
        if isinstance(e, L.Mask):
            fill = cexpr.literal(e.fill, t.dtype)
            return (f"pt_vsel(pt_viota() < {self.iexpr(e.count)}, {e.value}, "
                    f"pt_vsplat({fill}))")
        if isinstance(e, L.Shuffle):
            return f"__builtin_shufflevector({e.a}, {e.b}, {', '.join(map(str, e.lanes))})"
        raise IRError(f"unknown loop IR expression {type(e).__name__}")

    def iexpr(self, e: L.IExpr) -> str:
        if isinstance(e, Affine):
            return c_affine(e)
        if isinstance(e, (L.IMin, L.IMax)):
            self.needs.use("bounds")
            pick = "min" if isinstance(e, L.IMin) else "max"
            result = self.iexpr(e.args[0])
            for arg in e.args[1:]:
                result = f"pt_{pick}_i64({result}, {self.iexpr(arg)})"
            return result
        if isinstance(e, L.IDiv):
            self.needs.use("bounds")
            return f"pt_{'ceil' if e.ceil else 'floor'}div_i64({c_affine(e.num)}, {e.den})"
        raise IRError(f"unknown integer expression {type(e).__name__}")


UNSIGNED = {8: dtypes.UINT8, 16: dtypes.UINT16, 32: dtypes.UINT32, 64: dtypes.UINT64}


def _float32(t: L.VType) -> L.VType:
    """The float32 vector type of mask type `t` (`pt_vi` has `pt_vf`'s lanes)."""
    return L.VType(dtypes.FLOAT32, t.lanes) if t.dtype == dtypes.BOOL else t


def _vcombine(agg: str, acc: str, value: str) -> str:
    if agg == "add":
        return f"{acc} + {value}"
    if agg == "mul":
        return f"{acc} * {value}"
    if agg == "assign":
        return value
    return f"pt_v{agg}_nan({acc}, {value})"


def _omp(pragma: str) -> list[str]:
    return ["#ifdef _OPENMP", f"#pragma {pragma}", "#endif"]


def _comment(text: str) -> str:
    return text.replace("*/", "* /")
