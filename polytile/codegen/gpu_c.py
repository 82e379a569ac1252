"""Loop IR -> the C of a GPU kernel language, one kernel per launch (polytile.loops.launch):
what OpenCL C (polytile.codegen.opencl) and CUDA C++ (polytile.codegen.cuda) share. It
prints; every decision (which loops run on the grid and on threads, their sizes, what is
staged in shared memory, where the barriers are) was made before.

Kernel arguments, the same for every launch of a kernel:

    T *b0, ...          the function's parameters in order (scalars as 1-element buffers)
    T *l0, ...          the top-level local buffers (they outlive a launch)
    int *pt_flag        nonzero once a run-time check failed
    int64 *pt_err       (code, parameter, dimension, value) of the first failure

A grid loop is this thread's group (block) along its dimension, a thread loop its id in
the group: `const long i0 = lo + get_group_id(d) * step; if (i0 < hi) { ... }`. The
statements inside print as C does (polytile.codegen.c: one printer for the scalar
language), over each dialect's header. A failed check records the first failure (an
atomic flag) and ends the thread; later launches see the flag and do nothing. Nested
local buffers are private arrays of each thread; shared buffers are the group's, declared
at the kernel's top. Vector code (the CPU micro-kernels) is not printed: pass `gpu` makes
none.

A `Dialect` holds the spellings that differ, and nothing else:

    OpenCL C:  __kernel void k(__global float *restrict b0, ...)  get_group_id(0)
               get_local_id(1)  __local float l0[272];  barrier(CLK_LOCAL_MEM_FENCE);
    CUDA C++:  extern "C" __global__ void k(float *__restrict__ b0, ...)  blockIdx.x
               threadIdx.y  __shared__ float l0[272];  __syncthreads();
"""
from __future__ import annotations

from dataclasses import dataclass

from polytile.codegen import cexpr, cprelude, warp
from polytile.codegen.c import _comment, _indent, _Printer, _Target
from polytile.errors import UnsupportedError
from polytile.loops import nodes as L
from polytile.loops.launch import Launch, launches


@dataclass(frozen=True)
class Dialect:
    """How one GPU kernel language spells the constructs the loop IR's GPU nodes need."""

    name: str               # for messages: "OpenCL", "CUDA"
    language: str           # for the file's head comment: "OpenCL C", "CUDA C++"
    header: str             # the types, macros and pt_fail the statements use
    kernel: str             # what comes before a kernel's name
    address: str            # the address space of a kernel's buffer arguments ("__global ")
    restrict: str           # C's `restrict`
    int64: str              # the 64-bit integer type of loop variables
    group_id: str           # this group's index along dimension {dim} ({axis}: x, y, z)
    local_id: str           # this thread's index in its group along dimension {dim}
    shared: str             # qualifier of the group's shared arrays
    barrier: tuple[tuple[str, str], ...]    # (memory space, statement) of a Barrier
    units: tuple[str, str]  # what the comments call groups and threads
    form: str = ""          # the key of a warp-level instruction's template ("cuda")
    # A warp shuffle (L.WarpXor) of {value} with the thread at this one's place xor
    # {mask}; "": the language has none.
    shuffle_xor: str = ""


@dataclass(frozen=True)
class GPUSource:
    text: str
    launches: tuple[Launch, ...]


_AXES = "xyz"


class _KernelPrinter(_Printer):
    """The C printer with GPU loops, a GPU's failure handling and no vector code."""

    def __init__(self, kernel: L.Kernel, launch: Launch, needs: cexpr.Needs, dialect: Dialect):
        super().__init__(kernel)
        self.launch = launch
        self.needs = needs
        self.dialect = dialect
        self.buffers.update({b.name: b for b in kernel.locals})

    def fail(self, target: _Target, code: str, param: int, dim: int, value: str) -> list[str]:
        return [f"pt_fail(pt_flag, pt_err, {code}, {param}, {dim}, {value});", "return;"]

    def use_vector(self, t: L.VType) -> None:
        name = self.dialect.name
        raise UnsupportedError(f"the {name} backend prints no vector code ({t})",
                               hint=f"the {name.lower()} targets' passes make none")

    def typed(self, t: L.VType) -> bool:
        if t.lanes > 1:
            self.use_vector(t)
        return False

    def locals(self, buffers: tuple[L.Buffer, ...], fail: _Target, top_level: bool = False
               ) -> tuple[list[str], list[str]]:
        """A thread's private arrays (the lowering placed every nested local on the
        stack); filled as the C printer fills them. Shared buffers are declared at the
        kernel's top (OpenCL allows them nowhere else)."""
        lines = []
        for b in buffers:
            self.buffers[b.name] = b
            if b.space == "shared":
                continue
            if b.placement != "stack":
                raise UnsupportedError(f"local buffer {b.name} ({b.placement}, {b.space}) has "
                                       f"no {self.dialect.name} form yet",
                                       hint="a buffer too large for a work-item (such as "
                                            "a fused row's intermediates that the group's "
                                            "shared memory does not hold): set "
                                            "fuse.strategy to none")
            init = " = {0}" if b.init == "zero" else ""
            lines.append(f"{b.dtype.c_name} {b.name}[{b.size}]{init};  /* {_comment(b.label)} */")
            if b.init == "nan":
                lines.append(f"for (long pt_j = 0; pt_j < {b.size}; pt_j++) "
                             f"{b.name}[pt_j] = {cexpr.nan_storage(b.dtype)};")
        return lines, []

    def stmt(self, st: L.Stmt, fail: _Target) -> list[str]:
        if isinstance(st, L.Barrier):
            return [dict(self.dialect.barrier)[st.space]]
        if warp.is_warp(st):
            return warp.print_warp(self, st, self.dialect.form, self.dialect.name)
        if isinstance(st, L.WarpXor):
            if not self.dialect.shuffle_xor:
                raise UnsupportedError(f"{self.dialect.name} has no warp shuffles",
                                       hint="a target without gpu.warp combines partial "
                                            "results in local memory")
            self.types[st.name] = st.type
            shuffled = self.dialect.shuffle_xor.format(value=st.value, mask=st.mask)
            return [f"const {cexpr.scalar_type(st.type.dtype)} {st.name} = {shuffled};"]
        return super().stmt(st, fail)

    def loop(self, st: L.Loop, fail: _Target) -> list[str]:
        if st.kind == "parallel":
            st = L.Loop(st.var, st.lo, st.hi, st.body, "serial", st.step, st.simd)
        if st.kind not in ("grid", "thread"):
            return super().loop(L.Loop(st.var, st.lo, st.hi, st.body, st.kind, st.step), fail)
        where = self.launch.dimension(st.var)
        if where is None:
            raise UnsupportedError(f"{st.kind} loop {st.var} is not part of launch "
                                   f"{self.launch.name}")
        kind, dim = where
        d = self.dialect
        ident = (d.group_id if kind == "grid" else d.local_id).format(dim=dim, axis=_AXES[dim])
        step = "" if st.step == 1 else f" * {st.step}"
        head = f"const {d.int64} {st.var} = {self.iexpr(st.lo)} + ({d.int64}){ident}{step};"
        body = self.stmts(st.body, fail)
        if self.launch.covers(st) and _barrier_in_loop(st.body):
            # No guard that is always true around a barrier in a loop (a staged
            # reduction's): PoCL 3.1's kernel compiler aborts on it ("Could not find a
            # dominating alternative variable"). Elsewhere the guard stays: without it
            # PoCL 3.1 computes row groups wrongly (the CUDA emulation, whose barriers
            # are real, runs both forms right).
            return ["{", *_indent([head, *body]), "}"]
        return ["{", *_indent([head, f"if ({st.var} < {self.iexpr(st.hi)}) {{",
                               *_indent(body), "}"]), "}"]

    def write_launch(self) -> str:
        k, d = self.kernel, self.dialect
        args = []
        for b in (*k.params, *k.locals):
            const = "const " if not b.writable else ""
            args.append(f"{d.address}{const}{b.dtype.c_name} *{d.restrict} {b.name}")
        args += [f"{d.address}int *pt_flag", f"{d.address}{d.int64} *pt_err"]
        body = self.stmts(self.launch.body, _Target("pt_unused"))
        size = " x ".join(map(str, self.launch.groups))
        threads = " x ".join(map(str, self.launch.threads))
        groups, items = d.units
        head = (f"/* {self.launch.name}: {size} {groups} of {threads} {items} */\n"
                f"{d.kernel} {self.launch.name}(" + ",\n    ".join(args) + ")\n{\n")
        shared = [f"{d.shared} {b.dtype.c_name} {b.name}[{max(1, b.size)}];  "
                  f"/* {_comment(b.label)} */" for b in _shared(self.launch.body)]
        lines = [*shared, "if (*pt_flag != 0)", "    return;  /* an earlier launch failed */",
                 *body]
        return head + "\n".join(_indent(lines)) + "\n}\n"


def _shared(stmts: tuple[L.Stmt, ...]) -> list[L.Buffer]:
    """The shared (group) buffers allocated anywhere in `stmts`."""
    found: list[L.Buffer] = []
    for st in stmts:
        if isinstance(st, L.Alloc):
            found += [b for b in st.buffers if b.space == "shared"]
        for body in _bodies(st):
            found += _shared(body)
    return found


def _bodies(st: L.Stmt) -> list[tuple[L.Stmt, ...]]:
    if isinstance(st, (L.Loop, L.Alloc)):
        return [st.body]
    if isinstance(st, L.If):
        return [st.then, st.else_]
    if isinstance(st, L.Switch):
        return [body for _, body in st.cases]
    return []


def print_gpu(kernel: L.Kernel, dialect: Dialect) -> GPUSource:
    """The program of `kernel` in `dialect`, and the launches that run it."""
    needs = cexpr.Needs()
    plan = launches(kernel)
    texts = [_KernelPrinter(kernel, launch, needs, dialect).write_launch() for launch in plan]
    helpers = cprelude.helpers(needs.names - {"fail", "pool"}, needs.int_types)
    head = (f"/* Generated by polytile from function {kernel.name}; do not edit.\n"
            f" * {dialect.language}: {len(plan)} kernel(s), run in order. */\n")
    return GPUSource(head + dialect.header + (helpers + "\n" if helpers else "") + "\n"
                     + "\n".join(texts), plan)


def _barrier_in_loop(stmts: tuple[L.Stmt, ...], inside: bool = False) -> bool:
    """Whether a barrier sits in a serial loop under `stmts`."""
    for st in stmts:
        if isinstance(st, L.Barrier) and inside:
            return True
        if isinstance(st, L.Loop) and _barrier_in_loop(st.body, inside or st.kind == "serial"):
            return True
        if isinstance(st, L.If) and _barrier_in_loop(st.then + st.else_, inside):
            return True
        if isinstance(st, L.Alloc) and _barrier_in_loop(st.body, inside):
            return True
    return False
