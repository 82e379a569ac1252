"""A lowered kernel as the launches a GPU runs (any GPU backend: OpenCL now, CUDA later).

    launches(kernel) -> tuple[Launch, ...]

Each top-level statement whose loops include grid or thread loops (pass `gpu` mapped them)
is one launch; a run of statements without any is one launch of a single work-item (a
block without loops leaves its scalars at the top level: they are used only by the
statements of that block, which follow them in the same run). The
launches run one after another, each seeing the writes of the ones before (a global
barrier between kernels, which is all the ordering a Stripe program's statements need).

Within a launch, the grid loops nested k deep from the outermost grid loop take index
dimension k of the grid (work-groups), and the thread loops likewise the dimensions of a
work-group (work-items). A dimension's size is the trip count of its loops: grid loops
must have constant bounds; a thread loop's bounds may depend on the grid's variables (the
last tile is cut short), and its size is its constant upper bound (an `IMin` with a
constant). Every work-item then runs the launch's statements with each grid or thread
loop replaced by "my iteration, if it is inside the loop's bounds": the printer binds the
loop variable to `lo + id * step` and guards the body with `var < hi`.
"""
from __future__ import annotations

from dataclasses import dataclass

from polytile.errors import UnsupportedError
from polytile.ir.nodes import Affine
from polytile.loops import nodes as L

GPU_KINDS = ("grid", "thread")
MAX_DIMS = 3


@dataclass(frozen=True)
class Launch:
    name: str
    groups: tuple[int, ...]           # work-groups along each grid dimension (x first)
    threads: tuple[int, ...]          # work-items of a group along each dimension
    dims: tuple[tuple[str, str, int], ...]    # (loop variable, kind, dimension)
    body: tuple[L.Stmt, ...]

    def dimension(self, var: str) -> tuple[str, int] | None:
        """(kind, dimension) of a grid or thread loop variable of this launch."""
        for name, kind, dim in self.dims:
            if name == var:
                return kind, dim
        return None

    def covers(self, loop: L.Loop) -> bool:
        """Whether thread loop `loop` holds every work-item of its group dimension: it
        runs 0, 1, ... up to exactly the dimension's size, so no guard is needed."""
        where = self.dimension(loop.var)
        if where is None or where[0] != "thread" or loop.step != 1 \
                or _constant(loop.lo) != 0:
            return False
        return _constant(loop.hi) == self.threads[where[1]]


def _gpu_loops(stmts: tuple[L.Stmt, ...], depth: dict[str, int], found: list[tuple[L.Loop, int]],
               inside_serial: bool = False, inside_thread: bool = False) -> None:
    """Every grid or thread loop under `stmts`, with its nesting depth among loops of its
    kind; `depth` counts the enclosing ones of each kind."""
    for st in stmts:
        if isinstance(st, L.Loop):
            if st.kind in GPU_KINDS:
                if inside_serial:
                    raise UnsupportedError(f"{st.kind} loop {st.var} is inside a serial loop",
                                           hint="pass gpu maps only a kernel's outer indices")
                if st.kind == "grid" and inside_thread:
                    raise UnsupportedError(f"grid loop {st.var} is inside a thread loop")
                found.append((st, depth[st.kind]))
                inner = dict(depth)
                inner[st.kind] += 1
                _gpu_loops(st.body, inner, found, inside_serial,
                           inside_thread or st.kind == "thread")
            else:
                _gpu_loops(st.body, depth, found, True, inside_thread)
        elif isinstance(st, L.If):
            _gpu_loops(st.then + st.else_, depth, found, inside_serial, inside_thread)
        elif isinstance(st, L.Alloc):
            _gpu_loops(st.body, depth, found, inside_serial, inside_thread)
        elif isinstance(st, L.Switch):
            for _, body in st.cases:
                _gpu_loops(body, depth, found, inside_serial, inside_thread)


def _constant(e: L.IExpr) -> int | None:
    if isinstance(e, Affine) and not e.terms:
        return e.const
    return None


def _upper_bound(e: L.IExpr) -> int | None:
    """A constant upper bound of `e`, where one shows (a constant, or a min with one)."""
    value = _constant(e)
    if value is not None:
        return value
    if isinstance(e, L.IMin):
        bounds = [b for b in (_upper_bound(a) for a in e.args) if b is not None]
        return min(bounds) if bounds else None
    return None


def _size(loop: L.Loop) -> int:
    lo, hi = _constant(loop.lo), _constant(loop.hi)
    if loop.kind == "grid":
        if lo is None or hi is None:
            raise UnsupportedError(f"grid loop {loop.var} has bounds that are not constants")
        return max(0, -(-(hi - lo) // loop.step))
    top = _upper_bound(loop.hi)
    if lo is None or top is None:
        raise UnsupportedError(f"thread loop {loop.var} has no constant bound on its size")
    return max(0, -(-(top - lo) // loop.step))


def _launch(name: str, body: tuple[L.Stmt, ...]) -> Launch:
    found: list[tuple[L.Loop, int]] = []
    _gpu_loops(body, {"grid": 0, "thread": 0}, found)
    sizes: dict[str, list[int]] = {"grid": [], "thread": []}
    dims: list[tuple[str, str, int]] = []
    for loop, depth in found:
        if depth >= MAX_DIMS:
            raise UnsupportedError(f"{loop.kind} loops nest {depth + 1} deep; a GPU has "
                                   f"{MAX_DIMS} dimensions")
        # Nested k deep from the outermost: the innermost of a nest is dimension 0 (x),
        # where neighbouring work-items run; computed once the nest's depth is known.
        kind_sizes = sizes[loop.kind]
        while len(kind_sizes) <= depth:
            kind_sizes.append(1)
        kind_sizes[depth] = max(kind_sizes[depth], _size(loop))
        dims.append((loop.var, loop.kind, depth))
    levels = {kind: len(s) for kind, s in sizes.items()}
    dims = [(var, kind, levels[kind] - 1 - depth) for var, kind, depth in dims]
    # The grid and a work-group have the same number of dimensions (at least one).
    rank = max(1, *levels.values())
    groups = tuple(reversed(sizes["grid"])) + (1,) * (rank - levels["grid"])
    threads = tuple(reversed(sizes["thread"])) + (1,) * (rank - levels["thread"])
    return Launch(name, groups, threads, tuple(dims), body)


def _has_gpu_loop(st: L.Stmt) -> bool:
    found: list[tuple[L.Loop, int]] = []
    _gpu_loops((st,), {"grid": 0, "thread": 0}, found)
    return bool(found)


def launches(kernel: L.Kernel) -> tuple[Launch, ...]:
    """The launches that run `kernel`, in order (see the module docstring)."""
    groups: list[list[L.Stmt]] = []
    pending: list[L.Stmt] = []        # comments wait for the statement they describe
    serial: list[L.Stmt] = []
    for st in kernel.body:
        if isinstance(st, L.Comment):
            pending.append(st)
            continue
        if _has_gpu_loop(st):
            if serial:
                groups.append(serial)
                serial = []
            groups.append(pending + [st])
        else:
            serial += pending + [st]
        pending = []
    if serial or pending:
        groups.append(serial + pending)
    groups = [g for g in groups if not all(isinstance(s, L.Comment) for s in g)]
    return tuple(_launch(f"pt_k{k}", tuple(g)) for k, g in enumerate(groups))
