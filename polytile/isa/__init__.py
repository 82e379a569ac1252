"""Tensorized instructions described in TC (UNIT §III): one file per instruction in this
directory, shipped with the package.

A description is one TC function, which says what the instruction computes on its
operands, and comment lines `# key: value` that say what it takes to use it:

    # feature: avx512_vnni                  the CPU feature that runs it (cpuinfo's name)
    # cflags: -mavx512f -mavx512vnni        what the C compiler needs to emit it
    # sizes: L=16                           the sizes that make the operands registers
    # c-x86: {out0} = (__typeof__({out0}))_mm512_dpbusd_epi32(...);   the C form
                                            (c-arm64 for an AArch64 instruction)
    # c-x86-setup: _tile_loadconfig(...);   optional: what a thread runs once before a
    # c-x86-finish: _tile_release();        run of the instruction, and after it (AMX's
                                            tile configuration)
    def vpdpbusd_512(int32(L) acc, uint8(L,4) a, int8(L,4) b) -> (d) {
      d(l) = acc(l)
      d(l) += int32(a(l,k)) * int32(b(l,k))
    }

A warp-level instruction (Tensor Cores' mma.sync, feature `tensor_cores`) has a `cuda`
form and, per operand, the fragment layout: `# layout-a: 8: <formula>` says each of a
warp's 32 threads holds 8 elements of `a`, element {e} of thread {lane} at the place
<formula> (C integer arithmetic) of `a` flattened row-major; loading checks that the
threads hold every element exactly once.

An instruction either reads its accumulator (vpdpbusd: `d(l) = acc(l)` before the
reduction, `acc` an operand) or only computes the reduction (vpmaddwd: `d(l) +=! ...`,
no accumulator operand); then whoever runs it aggregates its result into the
accumulator with the reduction's own aggregation (a vector add for `+=!`), which is
what the description says the instruction's result is a part of. `Description.accumulates`
and `Description.aggregation` tell the two apart, so the rewriter needs no instruction
names.

Loading registers an `InstructionDef` (polytile.loops.instructions): its operands are
the TC parameters, flattened into vectors (uint8(16,4) is uint8x64, lane 4*l + k), and
its meaning is the TC function run by the reference interpreter, so the description is
the one definition of what the instruction computes; the tests check each C form against
it bit for bit on hosts that have the feature. Adding an instruction is adding a file.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from polytile.errors import IRError
from polytile.ir import nodes as N
from polytile.isa.inspect import output, reduction_block
from polytile.loops.instructions import InstructionDef, register_instruction
from polytile.loops.nodes import VType
from polytile.sema import program as P

KEYS = ("feature", "cflags", "sizes")
FORMS = ("c-x86", "c-arm64", "cuda")   # at least one: the form for that backend
# Optional, per form: statements a thread runs once before a run of the instruction and
# once after it, registered as instructions of no operands called `<name>.setup` and
# `<name>.finish` (AMX's tiles are configured so; a lowering that uses the instruction
# emits them around its loops: polytile.loops.tiles).
AROUND = ("setup", "finish")
WARP = 32                           # threads of a warp, which run a warp-level instruction


@dataclass(frozen=True)
class Description:
    name: str
    feature: str
    cflags: tuple[str, ...]
    sizes: tuple[tuple[str, int], ...]
    source: str                      # the file's text
    definition: InstructionDef
    reduction: N.Block               # its reduction statement, lowered (the inspector's)
    tc: P.Function                   # the checked TC function
    # `<name>.setup` and `<name>.finish`, those of AROUND it has
    around: tuple[InstructionDef, ...] = ()

    def steps(self) -> dict[str, str]:
        """The steps of AROUND it has ("setup", "finish") -> their instructions' names."""
        return {a.name.rsplit(".", 1)[1]: a.name for a in self.around}

    @property
    def operands(self) -> tuple[str, ...]:
        """The views the reduction reads (canonical names p<k>, the k-th parameter), in
        parameter order: vpdpbusd's a and b are p1 and p2, vpmaddwd's p0 and p1."""
        return tuple(sorted((r.into for r in self.reduction.refs if r.dir == "in"),
                            key=lambda v: int(v[1:])))

    @property
    def operand_types(self) -> tuple[VType, ...]:
        return tuple(self.definition.inputs[int(v[1:])] for v in self.operands)

    @property
    def accumulates(self) -> bool:
        """Whether the instruction reads its accumulator: it has an operand besides the
        ones its reduction reads (the value the output starts from)."""
        return len(self.definition.inputs) > len(self.operands)

    @property
    def aggregation(self) -> str:
        """How the reduction combines its terms (and so how a result of an instruction
        that does not accumulate joins the accumulator): "add" for `+=` and `+=!`."""
        out = output(self.reduction)
        assert out is not None            # reduction_block found its store
        return out.agg


@functools.lru_cache(maxsize=1)
def descriptions() -> tuple[Description, ...]:
    """Every shipped description, registered as an instruction of the loop IR."""
    files = sorted((f for f in resources.files(__name__).iterdir() if f.name.endswith(".tc")),
                   key=lambda f: f.name)
    out = tuple(load_description(f.read_text(), f.name) for f in files)
    for d in out:
        for definition in (d.definition, *d.around):
            register_instruction(definition)
    return out


def load_description(text: str, origin: str) -> Description:
    """The description in `text` (a file called `origin`, for messages)."""
    import polytile as pt
    from polytile.ir.lower import lower
    from polytile.sema.canonical import canonical
    from polytile.sema.specialize import specialize

    meta: dict[str, str] = {}
    layouts: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        key, colon, value = line.removeprefix("#").partition(":")
        if line.startswith("#") and colon and key.strip() in KEYS + FORMS + tuple(
                f"{f}-{a}" for f in FORMS for a in AROUND):
            meta[key.strip()] = value.strip()
        elif line.startswith("#") and colon and key.strip().startswith("layout-"):
            layouts[key.strip().removeprefix("layout-")] = _layout(value, origin)
    missing = [k for k in KEYS if k not in meta] + (
        [] if any(f in meta for f in FORMS) else [" or ".join(FORMS)])
    if missing:
        raise IRError(f"instruction description {origin} lacks {', '.join(missing)}",
                      hint=f"each file has comment lines '# key: value' for {', '.join(KEYS)} "
                           f"and a C form ({', '.join(FORMS)})")
    module = pt.define(text, backend="interp", name=origin)
    functions = list(module._functions.values())
    if len(functions) != 1:
        raise IRError(f"instruction description {origin} defines {len(functions)} functions, "
                      "not one")
    tc = functions[0]
    sizes = _sizes(meta["sizes"], origin)
    shapes = {p.name: tuple(d.evaluate(dict(sizes)) for d in p.shape) for p in tc.fn.params}
    spec = specialize(tc.fn, shapes, {})
    reduction = reduction_block(lower(canonical(spec)))
    ins = [(shapes[p.name], p.dtype) for p in tc.fn.params]
    outs = [(spec.shape(o.name), o.dtype) for o in tc.fn.outputs]

    def meaning(*values: np.ndarray) -> tuple[np.ndarray, ...]:
        args = [np.asarray(v).reshape(shape) for v, (shape, _) in zip(values, ins)]
        result = tc(*args)
        result = result if isinstance(result, tuple) else (result,)
        return tuple(np.asarray(r).reshape(-1) for r in result)

    definition = InstructionDef(
        tc.name, outputs=tuple(VType(dt, math.prod(s)) for s, dt in outs),
        inputs=tuple(VType(dt, math.prod(s)) for s, dt in ins), meaning=meaning,
        forms={f: meta[f] for f in FORMS if f in meta}, feature=meta["feature"],
        cflags=tuple(meta["cflags"].split()),
        names=tuple(p.name for p in tc.fn.params) + tuple(o.name for o in tc.fn.outputs),
        layouts=layouts)
    if layouts:
        _check_layouts(definition, origin)
    around = []
    for step in AROUND:
        forms = {f: meta[f"{f}-{step}"] for f in FORMS if f"{f}-{step}" in meta}
        if forms:
            around.append(InstructionDef(f"{tc.name}.{step}", outputs=(), inputs=(),
                                         meaning=lambda: (), forms=forms,
                                         feature=meta["feature"], cflags=definition.cflags))
    return Description(tc.name, meta["feature"], definition.cflags, sizes, text, definition,
                       reduction, tc.fn, tuple(around))


def _sizes(text: str, origin: str) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, value = item.partition("=")
        try:
            out.append((name.strip(), int(value)))
        except ValueError:
            raise IRError(f"instruction description {origin}: sizes must read 'L=16, ...', "
                          f"not {text!r}") from None
    return tuple(out)



def _layout(value: str, origin: str) -> tuple[int, str]:
    count, _, formula = value.partition(":")
    try:
        return int(count), formula.strip()
    except ValueError:
        raise IRError(f"instruction description {origin}: a layout line reads "
                      f"'# layout-a: 8: <place of {{lane}}'s element {{e}}>', not {value!r}"
                      ) from None


def _check_layouts(d: InstructionDef, origin: str) -> None:
    """A warp-level instruction's layouts cover every operand, and each puts every element
    of its operand in exactly one thread's registers."""
    types = dict(zip(d.names, d.inputs + d.outputs))
    if set(d.layouts) != set(d.names):
        raise IRError(f"instruction description {origin} gives fragment layouts for "
                      f"{sorted(d.layouts)}, not for its operands {list(d.names)}")
    for name, (count, _) in d.layouts.items():
        places = sorted(d.place(name, lane, e) for lane in range(WARP) for e in range(count))
        if places != list(range(types[name].lanes)):
            raise IRError(f"instruction description {origin}: the layout of {name} does not "
                          f"place each of its {types[name].lanes} elements in one thread's "
                          f"registers")


def description(name: str) -> Description:
    """The shipped description called `name`."""
    for d in descriptions():
        if d.name == name:
            return d
    raise IRError(f"no instruction description called {name!r}",
                  hint=f"shipped: {', '.join(d.name for d in descriptions())}")
