"""Run loop IR on NumPy arrays: the meaning of the loop IR, and the oracle its lowering is
tested with (against the IR interpreter, polytile.ir.interp).

    run(fn, {"A": a, "B": b, "C": c})            # lowers fn; c is updated in place
    run(fn, buffers, kernel=lower(fn, options))  # a given kernel of fn

One iteration at a time, in Python: meant for small sizes. Every buffer is a flat array
laid out by its refinement's strides (parameters, as the IR interpreter binds them) or
by its size (locals). Beyond the C backend's semantics it checks what C cannot:

* every element read or written lies inside its buffer (an access outside is an
  IRError: a lowering bug that C would turn into memory corruption);
* parallel, grid and thread loops run their iterations in reverse order, so a result
  that depends on their order shows;
* a local whose `init` is "" (the lowering proved the body writes it before reading it)
  starts as NaN or a poison integer, so a wrong proof shows;
* a thread loop whose body has barriers runs its threads in lock-step, the last thread
  first: each runs up to its next barrier before the next thread starts, so a thread that
  reads what another wrote without a barrier in between reads a stale or NaN value; each
  has its own variables and private buffers, and all must reach the same barriers;
* a warp-level instruction (Tensor Cores) runs on whole tiles: each thread holds every
  element of a `Fragment` (the description's layout says which a GPU thread holds), and
  the warp's threads, holding the same tiles, compute the same result (computed once);
* a parallel region runs as `threads` (default 2) threads taking turns, the last thread
  first: between two barriers each thread runs its part of every phase (its share of a
  workshare loop, split as OpenMP's static schedule splits it; a `Single` is thread 0's)
  before the next thread starts, so a phase that reads what another thread wrote
  without a barrier in between reads a stale or NaN value and the result shows it.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from polytile import dtypes
from polytile.errors import ArgumentError, IRError, KernelError, UnsupportedError
from polytile.ir import intrinsics
from polytile.ir.interp import bind
from polytile.ir.nodes import Affine, Function
from polytile.loops import nodes as L
from polytile.loops.instructions import instruction
from polytile.loops.lower import lower

_AGGREGATE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
_POISON = 0x5A


def run(fn: Function, buffers: Mapping[str, np.ndarray], kernel: L.Kernel | None = None,
        threads: int = 2) -> None:
    """Execute the loop IR of `fn` on `buffers` (by top-level refinement name; scalars as
    0-d arrays). `out`/`inout` arrays are updated in place when the run succeeds."""
    kernel = lower(fn) if kernel is None else kernel
    layouts = bind(fn, buffers)
    memory = {}
    for b in kernel.params:
        view, _ = layouts[fn.params[b.param]]
        memory[b.name] = (view.storage, int(view.base[0]))
    _Machine(memory, threads).kernel(kernel)
    for ref in fn.body.refs:
        if ref.into in layouts and ref.dir in ("out", "inout"):
            view, offsets = layouts[ref.into]
            buffers[ref.into][...] = view.storage[offsets].reshape(buffers[ref.into].shape)


def run_kernel(kernel: L.Kernel, arrays: Sequence[np.ndarray], threads: int = 2) -> None:
    """Execute `kernel` on flat memory: `arrays[p]` is parameter p's, a C-contiguous array
    whose first element is the kernel's offset 0 (outputs are written in place)."""
    if len(arrays) != len(kernel.params):
        raise ArgumentError(f"kernel {kernel.name} takes {len(kernel.params)} arrays, "
                            f"got {len(arrays)}")
    memory = {}
    for b in kernel.params:
        array = arrays[b.param]
        if not isinstance(array, np.ndarray) or array.dtype != b.dtype.numpy \
                or not array.flags.c_contiguous:
            raise ArgumentError(f"parameter {b.param} of kernel {kernel.name} needs a "
                                f"C-contiguous {b.dtype} array")
        memory[b.name] = (array.reshape(-1), 0)
    _Machine(memory, threads).kernel(kernel)


class _Machine:
    def __init__(self, memory: dict[str, tuple[np.ndarray, int]], threads: int = 2) -> None:
        if threads < 1:
            raise ArgumentError(f"a parallel region needs at least one thread, not {threads}")
        self.threads = threads
        self.memory = memory                                   # buffer -> (storage, origin)
        self.values: dict[str, np.ndarray] = {}
        self.types: dict[str, L.VType] = {}
        self.ints: dict[str, int] = {}                         # loop variables, int64 values
        self.barriers: dict[int, bool] = {}                    # id(statement) -> has one
        self.warp_results: dict[tuple, tuple[np.ndarray, ...]] = {}
        self.shuffled: dict[int, dict[int, np.ndarray]] = {}   # id(WarpXor) -> place: value

    def kernel(self, kernel: L.Kernel) -> None:
        self.alloc(kernel.locals)
        self.stmts(kernel.body)

    # ------------------------------------------------------------ memory

    def alloc(self, buffers: tuple[L.Buffer, ...]) -> None:
        for b in buffers:
            fill = 0 if b.init == "zero" else np.nan if b.dtype.is_float else _POISON
            self.memory[b.name] = (np.full(b.size, fill, b.dtype.numpy), 0)

    def span(self, buffer: str, offset: Affine, lanes: int) -> tuple[np.ndarray, slice]:
        storage, origin = self.memory[buffer]
        start = origin + self.i(offset)
        if lanes and (start < 0 or start + lanes > storage.size):
            raise IRError(f"loop IR accesses elements {start - origin}..{start - origin + lanes - 1}"
                          f" of {buffer} (origin {origin}), outside its {storage.size} elements")
        return storage, slice(start, start + lanes)

    # ------------------------------------------------------------ integers

    def i(self, e: L.IExpr) -> int:
        if isinstance(e, Affine):
            return e.const + sum(c * self.ints[n] for n, c in e.terms)
        if isinstance(e, L.IMin):
            return min(self.i(a) for a in e.args)
        if isinstance(e, L.IMax):
            return max(self.i(a) for a in e.args)
        num = self.i(e.num)
        return -(-num // e.den) if e.ceil else num // e.den

    # ------------------------------------------------------------ statements

    def stmts(self, stmts: tuple[L.Stmt, ...]) -> None:
        for st in stmts:
            self.stmt(st)

    def stmt(self, st: L.Stmt) -> None:
        if isinstance(st, (L.Let, L.Var)):
            self.types[st.name] = st.type
            self.set(st.name, self.expr(st.value, st.type))
        elif isinstance(st, L.Assign):
            self.set(st.name, self.expr(st.value, self.types[st.name]))
        elif isinstance(st, L.Store):
            self.store(st)
        elif isinstance(st, L.Loop):
            if st.kind == "workshare":
                raise IRError(f"workshare loop {st.var} is outside a parallel region")
            self.loop(st, range(self.i(st.lo), self.i(st.hi), st.step))
        elif isinstance(st, L.Region):
            self.region(st)
        elif isinstance(st, L.Single):
            raise IRError("a single is outside a parallel region")
        elif isinstance(st, L.If):
            self.stmts(st.then if all(self.i(c) >= 0 for c in st.conds) else st.else_)
        elif isinstance(st, L.Switch):
            value = self.i(st.value)
            self.stmts(next((body for case, body in st.cases if case == value), ()))
        elif isinstance(st, L.Check):
            value = self.ints[st.value]
            if not 0 <= value < st.size:
                where = f"parameter {st.param}" if st.param >= 0 else "a temporary buffer"
                raise KernelError(f"index {value} is out of range for dimension {st.dim} of "
                                  f"{where} (size {st.size})")
        elif isinstance(st, L.Alloc):
            self.alloc(st.buffers)
            self.stmts(st.body)
            for b in st.buffers:
                del self.memory[b.name]
        elif isinstance(st, L.Kept):
            self.stmts(st.body)
        elif isinstance(st, L.Instruction):
            self.instruction(st)
        elif isinstance(st, L.FragmentStore):
            self.store(L.Store(st.buffer, st.offset, st.value))
        elif not isinstance(st, (L.Comment, L.Prefetch, L.Fence)):
            raise UnsupportedError(f"the loop IR interpreter cannot run {type(st).__name__} "
                                   "nodes here (GPU barriers: issue 15; global barriers "
                                   "only directly in a parallel region)")

    def loop(self, st: L.Loop, values: range) -> None:
        if st.kind == "thread" and self.has_barrier(st.body):
            self.lockstep(st, values)
            return
        for v in (reversed(values) if st.kind != "serial" else values):
            self.ints[st.var] = v
            self.stmts(st.body)

    def has_barrier(self, stmts: tuple[L.Stmt, ...]) -> bool:
        """Whether `stmts` reach a shared barrier (inside serial loops, ifs, allocs)."""
        found = False
        for st in stmts:
            key = id(st)
            if key not in self.barriers:
                if isinstance(st, L.Barrier):
                    self.barriers[key] = st.space in L.GROUP_BARRIERS
                elif isinstance(st, L.WarpXor):
                    self.barriers[key] = True
                elif isinstance(st, (L.Loop, L.Alloc)):
                    self.barriers[key] = self.has_barrier(st.body)
                elif isinstance(st, L.If):
                    self.barriers[key] = self.has_barrier(st.then + st.else_)
                else:
                    self.barriers[key] = False
            found = found or self.barriers[key]
        return found

    def lockstep(self, st: L.Loop, values: range) -> None:
        """The threads of a group between barriers, one after another, the last first."""
        saved = (self.memory, self.values, self.types, self.ints)
        running = []
        for ints, body in self.group(st, values):
            context = (dict(self.memory), dict(self.values), dict(self.types), ints)
            running.append((context, self.steps(body)))
        try:
            while running:
                waiting = []
                for context, steps in running:
                    self.memory, self.values, self.types, self.ints = context
                    if next(steps, None) is not None:
                        waiting.append((context, steps))
                if waiting and len(waiting) != len(running):
                    raise IRError(f"threads of loop {st.var} reach different barriers: some "
                                  "ended while others wait at one")
                running = waiting
        finally:
            self.memory, self.values, self.types, self.ints = saved

    def group(self, st: L.Loop, values: range) -> list[tuple[dict[str, int], tuple[L.Stmt, ...]]]:
        """The threads of a group: the iterations of `st` and of the thread loops nested
        directly in it (one per dimension of the group), last first, each with its loop
        variables and the body it runs."""
        threads = []
        for v in reversed(values):
            ints = {**self.ints, st.var: v}
            inner = st.body[0] if len(st.body) == 1 else None
            if isinstance(inner, L.Loop) and inner.kind == "thread":
                saved, self.ints = self.ints, ints
                try:
                    threads += self.group(inner, range(self.i(inner.lo), self.i(inner.hi),
                                                       inner.step))
                finally:
                    self.ints = saved
            else:
                threads.append((ints, st.body))
        return threads

    def steps(self, stmts: tuple[L.Stmt, ...]) -> Iterator[bool]:
        """Run `stmts` as one thread, yielding at each shared barrier."""
        for st in stmts:
            if isinstance(st, L.Barrier) and st.space in L.GROUP_BARRIERS:
                yield True
            elif isinstance(st, L.WarpXor):
                yield from self.warp_xor(st)
            elif not self.has_barrier((st,)):
                self.stmt(st)
            elif isinstance(st, L.Loop) and st.kind == "serial":
                for v in range(self.i(st.lo), self.i(st.hi), st.step):
                    self.ints[st.var] = v
                    yield from self.steps(st.body)
            elif isinstance(st, L.If):
                yield from self.steps(st.then if all(self.i(c) >= 0 for c in st.conds)
                                      else st.else_)
            elif isinstance(st, L.Alloc):
                self.alloc(st.buffers)
                yield from self.steps(st.body)
                for b in st.buffers:
                    del self.memory[b.name]
            else:
                raise IRError(f"a barrier inside a {st.kind if isinstance(st, L.Loop) else ''} "
                              f"{type(st).__name__} of a thread loop")

    def warp_xor(self, st: L.WarpXor) -> Iterator[bool]:
        """A warp shuffle as two lock-step rounds: every thread posts its value, then
        each takes its partner's (see L.WarpXor)."""
        posted = self.shuffled.setdefault(id(st), {})
        place = self.i(st.place)
        posted[place] = self.values[st.value]
        yield True
        partner = place ^ st.mask
        if partner not in posted:
            raise IRError(f"warp shuffle {st.name}: thread {place} has no partner {partner} "
                          "in its group")
        self.types[st.name] = st.type
        self.set(st.name, posted[partner].copy())
        yield True

    def region(self, st: L.Region) -> None:
        """The threads take turns between barriers, the last thread first."""
        segments: list[list[L.Stmt]] = [[]]
        for s in st.body:
            if isinstance(s, L.Barrier) and s.space == "global":
                segments.append([])
            elif isinstance(s, (L.Comment, L.Single, L.Fence)) or (
                    isinstance(s, L.Loop) and s.kind == "workshare"):
                segments[-1].append(s)
            else:
                raise IRError(f"a parallel region holds a {type(s).__name__} (only workshare "
                              "loops, singles, fences, global barriers and comments)")
        for segment in segments:
            for thread in reversed(range(self.threads)):
                for s in segment:
                    if isinstance(s, L.Single) and thread == 0:
                        self.stmts(s.body)
                    elif isinstance(s, L.Loop):
                        values = range(self.i(s.lo), self.i(s.hi), s.step)
                        self.loop(s, static_share(values, thread, self.threads))

    def instruction(self, st: L.Instruction) -> None:
        """Run an instruction's registered meaning on its inputs, checking the types."""
        definition = instruction(st.name)
        if len(st.inputs) != len(definition.inputs) or \
                len(st.outputs) != len(definition.outputs):
            raise IRError(f"instruction {st.name} takes {len(definition.inputs)} inputs and "
                          f"{len(definition.outputs)} outputs")
        for name, want in zip(st.inputs, definition.inputs):
            if self.types[name] != want:
                raise IRError(f"instruction {st.name} takes {want}, not {self.types[name]} "
                              f"{name}")
        inputs = [self.values[n] for n in st.inputs]
        if definition.warp:     # every thread of a warp runs it on the same tiles
            key = (st.name, *(v.tobytes() for v in inputs))
            if key not in self.warp_results:
                if len(self.warp_results) > 256:
                    self.warp_results.clear()
                self.warp_results[key] = definition.meaning(*inputs)
            results = self.warp_results[key]
        else:
            results = definition.meaning(*inputs)
        for name, t, value in zip(st.outputs, definition.outputs, results):
            self.types[name] = t
            shape = () if t.lanes == 1 else (t.lanes,)
            self.set(name, np.asarray(value).astype(t.dtype.numpy).reshape(shape))

    def set(self, name: str, value: np.ndarray) -> None:
        self.values[name] = value
        if self.types[name] == L.VType(dtypes.INT64):
            self.ints[name] = int(value)

    def store(self, st: L.Store) -> None:
        value = self.values[st.value]
        lanes = value.size if value.ndim else 1
        n = lanes if st.count is None else max(0, min(lanes, self.i(st.count)))
        storage, span = self.span(st.buffer, st.offset, n)
        new = value.reshape(-1)[:n].astype(storage.dtype)
        if st.agg != "assign":
            with np.errstate(all="ignore"):
                new = _AGGREGATE[st.agg](storage[span], new).astype(storage.dtype)
        storage[span] = new

    # ------------------------------------------------------------ values

    def expr(self, e: L.Expr, t: L.VType) -> np.ndarray:
        dt = t.dtype.numpy
        shape = () if t.lanes == 1 else (t.lanes,)
        if isinstance(e, L.Lit):
            with np.errstate(all="ignore"):
                return np.full(shape, np.asarray(e.value).astype(dt))
        if isinstance(e, L.Name):
            return self.values[e.name].copy()
        if isinstance(e, L.IntValue):
            return np.asarray(self.i(e.value), np.int64)
        if isinstance(e, L.Read):
            n = e.lanes if e.count is None else max(0, min(e.lanes, self.i(e.count)))
            storage, span = self.span(e.buffer, e.offset, n)
            if t.lanes == 1:
                return np.asarray(storage[span][0])
            out = np.zeros(e.lanes, dt)
            out[:n] = storage[span]
            return out
        if isinstance(e, L.Op):
            return np.asarray(intrinsics.evaluate(e.op, e.dtype,
                                                  *(self.values[a] for a in e.args)))
        if isinstance(e, L.Broadcast):
            return np.full(shape, self.values[e.value], dt)
        if isinstance(e, L.Combine):
            with np.errstate(all="ignore"):
                if e.agg == "assign":
                    return self.values[e.value].astype(dt)
                return _AGGREGATE[e.agg](self.values[e.acc], self.values[e.value]).astype(dt)
        if isinstance(e, L.Reduce):
            with np.errstate(all="ignore"):
                return np.asarray(_AGGREGATE[e.agg].reduce(self.values[e.value]).astype(dt))
        if isinstance(e, L.Mask):
            out = self.values[e.value].copy()
            out[max(0, self.i(e.count)):] = e.fill
            return out
        if isinstance(e, L.Fragment):
            if not e.buffer:
                with np.errstate(all="ignore"):
                    return np.full(shape, np.asarray(e.fill).astype(dt))
            storage, span = self.span(e.buffer, e.offset, t.lanes)
            return storage[span].astype(dt)
        if isinstance(e, L.Shuffle):
            return np.concatenate([self.values[e.a], self.values[e.b]])[list(e.lanes)]
        raise IRError(f"unknown loop IR expression {type(e).__name__}")


def static_share(values: range, thread: int, threads: int) -> range:
    """The iterations OpenMP's static schedule (no chunk size) gives `thread` of
    `threads`: contiguous blocks, the first `len % threads` threads one longer."""
    q, r = divmod(len(values), threads)
    start = thread * q + min(thread, r)
    return values[start:start + q + (thread < r)]
