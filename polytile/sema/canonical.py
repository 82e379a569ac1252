"""Alpha-renaming: the same function whatever its tensors and indices are called.

TC §6.1 keys the compilation cache on "a summarily templatized version of TC";
here tensors become p0, p1, ... (parameters in order), o0, ... (outputs), t0, ...
(temporaries) and each statement's indices i0, i1, ... in range order, so
renaming anything in the source hits the same cache entry. Size names vanish
once sizes are specialized, so they are left alone.
"""
from __future__ import annotations

from dataclasses import replace

from polytile.sema import program as P
from polytile.sema.specialize import Specialized


def alpha_rename(fn: P.Function) -> P.Function:
    names: dict[str, str] = {}
    for prefix, group in (("p", fn.params), ("o", fn.outputs), ("t", fn.temps)):
        for k, t in enumerate(group):
            names[t.name] = f"{prefix}{k}"

    def tensor(t: P.Tensor) -> P.Tensor:
        return replace(t, name=names[t.name])

    statements = []
    for st in fn.statements:
        idx = {name: f"i{k}" for k, (name, _) in enumerate(st.ranges)}
        statements.append(P.Statement(
            names[st.tensor], tuple(idx[i] for i in st.indices), st.op, st.init,
            _expr(st.rhs, names, idx), tuple((idx[n], r) for n, r in st.ranges), st.loc,
            tuple(_expr(x, names, idx) for x in st.scatter)))
    return P.Function("kernel", tuple(tensor(t) for t in fn.params),
                      tuple(tensor(t) for t in fn.outputs), tuple(tensor(t) for t in fn.temps),
                      tuple(statements), fn.sizes, frozenset(names[n] for n in fn.inout),
                      fn.loc)


def _expr(e: P.TExpr, names: dict[str, str], idx: dict[str, str]) -> P.TExpr:
    if isinstance(e, P.IndexVar):
        return replace(e, name=idx[e.name])
    if isinstance(e, P.ScalarArg):
        return replace(e, name=names[e.name])
    if isinstance(e, P.Read):
        return replace(e, tensor=names[e.tensor],
                       indices=tuple(_expr(i, names, idx) for i in e.indices))
    if isinstance(e, P.Op):
        return replace(e, args=tuple(_expr(a, names, idx) for a in e.args))
    return e


def canonical(spec: Specialized) -> Specialized:
    """The specialization of the alpha-renamed function (same sizes)."""
    fn = spec.fn
    renamed = alpha_rename(fn)
    names = {a.name: b.name for a, b in zip(fn.params + fn.outputs + fn.temps,
                                            renamed.params + renamed.outputs + renamed.temps)}
    ranges = tuple(tuple((f"i{k}", lo, hi) for k, (_, lo, hi) in enumerate(st_ranges))
                   for st_ranges in spec.ranges)
    # Integer scalar arguments appear in subscripts under their new names.
    env = spec.env + tuple((names[n], v) for n, v in spec.env if n in names)
    return Specialized(renamed, env, tuple((names[n], s) for n, s in spec.shapes), ranges)
