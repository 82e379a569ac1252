"""Which pipeline choices are genes of one program, decided by running the passes.

    programs = Programs(lowered, target, plan)     # the passes before autotile
    choices = pipeline_choices(programs, offered_choices(target, plan is not None))
    # (Choice("fuse.strategy", ("none", "rows"), same=(("max", "rows"),)),
    #  Choice("gpu.rows", (64,)), ...)      one value: not a gene of this program

A pipeline choice (a pass option the tuner may set, PIPELINE_CHOICES) is a gene of a
program only where its values build different programs: a fusion strategy when there
is nothing to fuse, packing when nothing is packed, `gpu.rows` when there is no fused
row loop, would only add copies of the same kernels to the search. The rule, exactly:

* the *contexts* of a choice are the setting of every choice at its default, and each
  setting that moves one other choice to another of its values;
* two values of a choice are the *same* when they build the same program (the printed
  IR after the last pass before autotile, hashed) in every context; of each set of
  same values the first (the default first) is kept, the others map to it (`same`), so
  a stored or given option with such a value still lands on its program;
* a choice left with one value is fixed to its default: not a gene.

A choice that only matters once two others have both moved would be missed; the
contexts catch the interactions between two choices (`gpu.rows` acts only under
`fuse.strategy=rows`, which the GPU targets do not default to).
tests/tune/test_choices.py compares the kept values with the full product of the CPU
choices and of the GPU choices that act on each other; the full product of all eight
opencl choices for softmax, layer norm and tmm built no program the kept values miss.

The cost: one pipeline run per context and value, about (sum of the values)^2 / 2
settings, each run pass by pass with every pass's output kept by its input and its
own options, so a setting that differs only in a later pass reruns only that pass
(the GPU targets' choices are all pass gpu's, milliseconds per run).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from polytile.ir import nodes as N
from polytile.ir.printer import format_function
from polytile.passes.pipeline import run_pipeline
from polytile.runtime.files import sha256_text
from polytile.targets.target import Target

# Pipeline parameters worth searching, by pass; offered only for passes the target runs
# before autotile, and genes only of programs where they change something.
PIPELINE_CHOICES: dict[str, tuple[Any, ...]] = {
    # (In name order: a variant's settings are compared with Options', which sorts them.)
    # A merged index (h_w) is one long vector row; apart, the tuner may still tile h and w.
    "collapse.enabled": (True, False),
    "fuse.strategy": ("rows", "max", "none"),
    "gathercopy.enabled": (True, False),
    # A convolution summed along its channels or along w (neutral on a group convolution
    # on AVX-512: the tuner decides there).
    "outlayout.enabled": (True, False),
    "pack.enabled": (True, False),
    "ptrinc.enabled": (True, False),
    # UNIT §IV-B on a contraction run on an instruction: which layable mapping (the
    # instruction and its loops), the register tile (the inner loops unrolled; rows 0:
    # as many as the registers hold) and threads over the outer loop or none.
    "tensorize.chains": (4, 2),
    "tensorize.mapping": (0, 1, 2, 3),
    "tensorize.parallel": (True, False),
    "tensorize.rows": (0, 2, 3, 4, 6),
    # A matrix instruction on tiles (AMX) where the target has one, or the lane-dot ones.
    "tensorize.tiles": (True, False),
    # GPU targets (TC §6: block sizes, promotion on/off, mapped dimensions); the grid
    # follows from the work-group size and the extents.
    "gpu.threads": (64, 32, 128, 256),
    "gpu.tile_k": (16, 0, 8, 32),
    "gpu.dims": (3, 2, 1),
    "gpu.unroll": (2, 1, 4),
    "gpu.reduce": (64, 0, 256),
    "gpu.pad": (1, 0),
    # Work-items sharing a fused row (FusionStitching's block composition; 0: a row per
    # work-item; 32: one warp).
    "gpu.rows": (64, 0, 32, 128, 256),
}

Setting = Mapping[str, Any]


@dataclass(frozen=True)
class Choice:
    """A pipeline choice for one program: its values that build programs of their own
    (the default first), and each other value with the kept value it builds the same
    program as."""

    name: str
    values: tuple[Any, ...]
    same: tuple[tuple[Any, Any], ...] = ()

    def resolve(self, value: Any) -> Any:
        """The kept value that builds what `value` builds (`value` if it is kept or
        unknown)."""
        return dict(self.same).get(value, value)


def before_autotile(target: Target) -> Target:
    """`target` with the passes before autotile: the program the schedule genes apply to
    (all of it on a target without autotile)."""
    names = [name for name, _ in target.passes]
    cut = names.index("autotile") if "autotile" in names else len(names)
    return replace(target, passes=target.passes[:cut])


def offered_choices(target: Target, plan: bool) -> dict[str, tuple[Any, ...]]:
    """The choices of the passes `target` runs before autotile, each with its values,
    the target's default first; with `plan`, "plan" is one more fusion strategy."""
    names = {name for name, _ in before_autotile(target).passes}
    defaults = {f"{name}.{k}": v for name, params in target.passes for k, v in params}
    offered = {}
    for gene, values in PIPELINE_CHOICES.items():
        if gene.split(".")[0] in names:
            default = defaults.get(gene, values[0])
            offered[gene] = (default,) + tuple(v for v in values if v != default)
    if plan and "fuse.strategy" in offered:
        offered["fuse.strategy"] += ("plan",)
    return offered


class Programs:
    """The pipeline before autotile for one lowered program, under any setting of the
    choices, run pass by pass: each pass's output is kept by (its input's digest, the
    pass, its options), so settings that differ only in a later pass share the earlier
    passes' runs, and settings whose earlier passes build the same program share the
    rest."""

    def __init__(self, lowered: N.Function, target: Target,
                 plan: Sequence[Sequence[int]] | None = None):
        self.lowered = lowered
        self.target = before_autotile(target)
        self.plan = [list(g) for g in plan or ()]
        self.runs = 0
        self._kept: dict[tuple[str, str, tuple[tuple[str, Any], ...]],
                         tuple[N.Function, str]] = {}

    def program(self, setting: Setting) -> tuple[N.Function, str]:
        """The program `setting` builds and its digest (of its printed IR)."""
        fn, digest = self.lowered, "lowered"
        for name, params in self.target.passes:
            own = tuple(sorted((k, v) for k, v in setting.items()
                               if k.split(".")[0] == name))
            key = (digest, name, own)
            if key not in self._kept:
                options = dict(own)
                if options.get("fuse.strategy") == "plan":
                    # The Compiler adds the same groups when it builds a candidate
                    # (Compiler.planned).
                    options["fuse.groups"] = self.plan
                out = run_pipeline(fn, replace(self.target, passes=((name, params),)), options)
                self.runs += 1
                self._kept[key] = (out, sha256_text(format_function(out)))
            fn, digest = self._kept[key]
        return fn, digest


def pipeline_choices(programs: Programs,
                     offered: Mapping[str, tuple[Any, ...]]) -> tuple[Choice, ...]:
    """Every offered choice with the values that build programs of their own in its
    contexts (see the module's docstring); a choice of one value is not a gene."""
    base = {name: values[0] for name, values in offered.items()}
    moved = [{**base, name: value} for name, values in offered.items() for value in values[1:]]
    out = []
    for name, values in offered.items():
        contexts = [base] + [s for s in moved if s[name] == base[name]]
        kept: dict[tuple[str, ...], Any] = {}
        same = []
        for value in values:
            built = tuple(programs.program({**s, name: value})[1] for s in contexts)
            if built in kept:
                same.append((value, kept[built]))
            else:
                kept[built] = value
        out.append(Choice(name, tuple(kept.values()), tuple(same)))
    return tuple(out)
