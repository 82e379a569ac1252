"""Calls of TC functions from TC functions, inlined into the caller's statements.

    def scores(float(M,D) Q, float(N,D) K, float s) -> (S) {
      S(i,j) +=! Q(i,d) * K(j,d) * s
    }
    def attention(float(M,D) Q, float(N,D) K, float s) -> (P) {
      S = scores(Q, K, s)
      P(i,j) = exp(S(i,j))
    }

`S = scores(Q, K, s)` becomes the callee's statements, renamed:

    S(i,j) +=! Q(i,d) * K(j,d) * s

* parameters become the call's arguments, outputs the call's results (tensors of the
  caller: its outputs or temporaries), temporaries fresh names (`T` -> `T_scores`);
* an index or `where` name of the callee that would mean something else in the caller
  (a size, a scalar, a tensor) is renamed (`M` -> `M_scores`), so nothing is captured;
* each size of the callee becomes a size alias (`D@scores`) that range inference treats
  as an opaque symbol. Once the caller's shapes are inferred, `bind_aliases` gives each
  alias the extent of the argument dimension it was declared on, and checks that every
  dimension declared with that size (or a constant) has that extent: a mismatch is an
  error at the call.

Calls inside the callee are expanded the same way, in the caller's names; a function
that reaches itself through calls is an error at the call that closes the cycle.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from polytile.dtypes import DType, lookup
from polytile.errors import NameResolutionError, SourceLoc, TypeCheckError
from polytile.lang import ast
from polytile.sema import program as P
from polytile.sema.sizes import SizeExpr


@dataclass(frozen=True)
class Binding:
    """At `loc`, dimension `dim` of the caller's tensor `tensor` was passed where the
    callee declared `declared` (an alias of a callee size, or a constant)."""

    alias: str | None
    const: int | None
    tensor: str
    dim: int
    callee: str
    size: str                  # the callee's spelling, for messages
    loc: SourceLoc


@dataclass(frozen=True)
class DtypeCheck:
    """The caller's `tensor` must have the callee parameter's dtype."""

    tensor: str
    dtype: DType
    callee: str
    param: str
    loc: SourceLoc


@dataclass
class Inliner:
    """Expands the calls of one caller; collects what the caller checks after typing
    and range inference."""

    defs: dict[str, ast.Def]
    caller: ast.Def
    reserved: set[str]                  # names the caller's scope gives a meaning
    taken: set[str]                     # those and the caller's index names
    aliases: list[str] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)
    dtype_checks: list[DtypeCheck] = field(default_factory=list)
    declared_shapes: dict[str, tuple[str | int, ...]] = field(default_factory=dict)
    declared_dtypes: dict[str, DType] = field(default_factory=dict)
    count: int = 0

    @staticmethod
    def for_caller(d: ast.Def, defs: dict[str, ast.Def]) -> Inliner:
        taken: set[str] = set()
        for a in d.args:
            taken.add(a.name)
            if isinstance(a, ast.TensorArg):
                taken.update(x for x in a.dims if isinstance(x, str))
        taken.update(o.name for o in d.outputs)
        indices: set[str] = set()
        for s in d.body:
            if isinstance(s, ast.Assign):
                taken.add(s.tensor)
                indices |= _statement_names(s, {}, {})
            else:
                taken.update(o.name for o in s.outputs)
        # A fresh temporary must not meet the caller's index names either.
        return Inliner(defs, d, set(taken), taken | indices)

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}{n}"
        self.taken.add(name)
        self.reserved.add(name)
        return name

    # ------------------------------------------------------------ expansion
    def expand(self, call: ast.CallDef, ranks: dict[str, int], scalars: dict[str, DType],
               inputs: set[str], stack: tuple[str, ...] = ()) -> Iterator[ast.Assign]:
        """The callee's statements in the caller's names. A generator: the caller records
        each statement's rank before the next call's arguments are checked."""
        stack = stack or (self.caller.name,)
        callee = self.defs.get(call.func)
        if callee is None:
            raise NameResolutionError(f"unknown TC function {call.func}", call.loc)
        if call.func in stack:
            cycle = " -> ".join(stack[stack.index(call.func):] + (call.func,))
            raise TypeCheckError(f"TC function {call.func} calls itself ({cycle})", call.loc,
                                 "TC functions cannot recurse: loops are written as "
                                 "indices, e.g. a reduction `+=!`")
        self.count += 1
        tensors, values = self.bind_call(call, callee, ranks, scalars, inputs)
        own_scalars = {a.name for a in callee.args if isinstance(a, ast.ScalarArg)}
        for s in callee.body:
            if isinstance(s, ast.CallDef):
                outs = tuple(ast.Name(tensors[o.name], o.loc) for o in s.outputs)
                args = tuple(ast.Name(values[a.name] if a.name in own_scalars
                                      else tensors.get(a.name, a.name), a.loc)
                             for a in s.args)
                yield from self.expand(ast.CallDef(outs, s.func, args, s.loc), ranks,
                                       scalars, inputs, stack + (call.func,))
                continue
            yield self.rename_statement(s, tensors, values, callee)

    def bind_call(self, call: ast.CallDef, callee: ast.Def, ranks: dict[str, int],
                  scalars: dict[str, DType], inputs: set[str]
                  ) -> tuple[dict[str, str], dict[str, str]]:
        """Check the call's arguments and results; the renaming of the callee's tensors
        (`tensors`) and of its scalars and sizes used as values (`values`)."""
        if len(call.args) != len(callee.args):
            raise TypeCheckError(f"{callee.name} takes {len(callee.args)} arguments "
                                 f"({', '.join(a.name for a in callee.args)}), got "
                                 f"{len(call.args)}", call.loc)
        if len(call.outputs) != len(callee.outputs):
            raise TypeCheckError(f"{callee.name} returns {len(callee.outputs)} tensors "
                                 f"({', '.join(o.name for o in callee.outputs)}), but the "
                                 f"call names {len(call.outputs)}", call.loc)
        for o in call.outputs:
            if any(a.name == o.name for a in call.args):
                raise TypeCheckError(f"{o.name} is both an argument and a result of "
                                     f"{callee.name}", o.loc,
                                     "write the result to a new tensor")
        tensors: dict[str, str] = {}
        values: dict[str, str] = {}
        suffix = callee.name if self.count == 1 else f"{callee.name}{self.count}"
        for param, arg in zip(callee.args, call.args):
            if isinstance(param, ast.ScalarArg):
                if arg.name not in scalars:
                    raise TypeCheckError(f"{callee.name}'s parameter {param.name} is a "
                                         f"scalar, but {arg.name} is not a scalar argument "
                                         f"of {self.caller.name}", arg.loc)
                want = lookup(param.dtype)
                if scalars[arg.name] != want:
                    raise TypeCheckError(f"{callee.name}'s parameter {param.name} is {want}, "
                                         f"but {arg.name} is {scalars[arg.name]}", arg.loc)
                values[param.name] = arg.name
                continue
            if arg.name in scalars or arg.name not in ranks:
                what = "a scalar" if arg.name in scalars else "not a tensor computed before " \
                    "the call"
                raise TypeCheckError(f"{callee.name}'s parameter {param.name} is a tensor, "
                                     f"but {arg.name} is {what}", arg.loc)
            if ranks[arg.name] != len(param.dims):
                raise TypeCheckError(f"{callee.name}'s parameter {param.name} has "
                                     f"{len(param.dims)} dimensions, but {arg.name} has "
                                     f"{ranks[arg.name]}", arg.loc)
            tensors[param.name] = arg.name
            self.dtype_checks.append(DtypeCheck(arg.name, lookup(param.dtype),  # type: ignore
                                                callee.name, param.name, arg.loc))
            for d, dim in enumerate(param.dims):
                if isinstance(dim, int):
                    self.bindings.append(Binding(None, dim, arg.name, d, callee.name,
                                                 str(dim), arg.loc))
                    continue
                if dim not in values:
                    values[dim] = f"{dim}@{suffix}"
                    self.aliases.append(values[dim])
                self.bindings.append(Binding(values[dim], None, arg.name, d, callee.name,
                                             dim, arg.loc))
        results = [o.name for o in call.outputs]
        for o, out in zip(call.outputs, callee.outputs):
            if o.name in inputs or o.name in scalars:
                raise TypeCheckError(f"{o.name} is an input and inputs are read-only", o.loc,
                                     "name a new temporary or an output for the result")
            if results.count(o.name) > 1:
                raise TypeCheckError(f"{o.name} receives two results of {callee.name}", o.loc)
            tensors[out.name] = o.name
            if out.dtype is not None:
                self.declared_dtypes[o.name] = lookup(out.dtype)  # type: ignore[assignment]
            if out.dims:
                self.declared_shapes[o.name] = tuple(
                    values[x] if isinstance(x, str) else x for x in out.dims)
        for s in callee.body:
            written = [s.tensor] if isinstance(s, ast.Assign) else [o.name for o in s.outputs]
            for name in written:
                if name not in tensors:
                    tensors[name] = self.fresh(f"{name}_{callee.name}")
        return tensors, values

    def rename_statement(self, s: ast.Assign, tensors: dict[str, str],
                         values: dict[str, str], callee: ast.Def) -> ast.Assign:
        """`s` in the caller's names; its own index and `where` names are kept unless the
        caller gives them a meaning."""
        local = _statement_names(s, tensors, values)
        names = dict(values)
        for n in local:
            names[n] = self.fresh_local(n, callee.name)
        dims = {a.name: a.dims for a in callee.args if isinstance(a, ast.TensorArg)}
        renamer = _Renamer(tensors, names, dims, values)
        where = tuple(renamer.where(w) for w in s.where)
        return replace(s, tensor=tensors[s.tensor],
                       indices=tuple(ast.Name(names.get(i.name, i.name), i.loc)
                                     for i in s.indices),
                       rhs=renamer.expr(s.rhs), where=where,
                       scatter=tuple(renamer.expr(x) for x in s.scatter))

    def fresh_local(self, name: str, callee: str) -> str:
        if name not in self.reserved:
            return name
        base, n = f"{name}_{callee}", 1
        candidate = base
        while candidate in self.reserved:
            n += 1
            candidate = f"{base}{n}"
        return candidate        # statement-local: not reserved for later statements

    # ------------------------------------------------------------ after inference
    def bind_aliases(self, shapes: dict[str, tuple[SizeExpr, ...]],
                     tensor_dtypes: dict[str, DType]) -> dict[str, SizeExpr]:
        """Each alias's extent in the caller's sizes; every binding checked."""
        for c in self.dtype_checks:
            if tensor_dtypes[c.tensor] != c.dtype:
                raise TypeCheckError(f"{c.callee}'s parameter {c.param} is {c.dtype}, but "
                                     f"{c.tensor} is {tensor_dtypes[c.tensor]}", c.loc,
                                     f"cast it first, e.g. T(...) = {c.dtype}({c.tensor}(...))")
        env: dict[str, SizeExpr] = {}
        for b in self.bindings:
            if b.alias is not None and b.alias not in env:
                env[b.alias] = shapes[b.tensor][b.dim]
        for _ in range(len(env) + 1):      # aliases of nested calls name other aliases
            new = {a: e.substitute(env) for a, e in env.items()}
            if new == env:
                break
            env = new
        for b in self.bindings:
            actual = shapes[b.tensor][b.dim].substitute(env)
            expected = env[b.alias] if b.alias is not None else SizeExpr.const_(b.const or 0)
            if actual != expected:
                first = next(x for x in self.bindings if x.alias == b.alias) if b.alias else b
                raise TypeCheckError(
                    f"{b.callee} declares dimension {b.dim} of this argument as {b.size}, "
                    f"which is {expected} (from dimension {first.dim} of {first.tensor}), "
                    f"but {b.tensor} has {actual} there", b.loc,
                    "the sizes a function's parameters share must be equal at every call: "
                    "give these dimensions one size name in the caller's signature")
        return env


class _Renamer:
    def __init__(self, tensors: dict[str, str], names: dict[str, str],
                 dims: dict[str, tuple[str | int, ...]], values: dict[str, str]):
        self.tensors, self.names, self.dims, self.values = tensors, names, dims, values

    def expr(self, e: ast.Expr) -> ast.Expr:
        if isinstance(e, ast.Name):
            if e.name in self.names:
                return replace(e, name=self.names[e.name])
            if e.name in self.tensors:                      # a rank-0 tensor
                return replace(e, name=self.tensors[e.name])
            return e
        if isinstance(e, ast.DimOf):
            declared = self.dims.get(e.tensor)
            if declared is not None and 0 <= e.dim < len(declared):
                x = declared[e.dim]
                return (ast.Name(self.values[x], e.loc) if isinstance(x, str)
                        else ast.Number(str(x), x, e.loc))
            return replace(e, tensor=self.tensors.get(e.tensor, e.tensor))
        if isinstance(e, ast.Call):
            return replace(e, name=self.tensors.get(e.name, e.name),
                           args=tuple(self.expr(a) for a in e.args))
        if isinstance(e, ast.Unary):
            return replace(e, operand=self.expr(e.operand))
        if isinstance(e, ast.Binary):
            return replace(e, lhs=self.expr(e.lhs), rhs=self.expr(e.rhs))
        if isinstance(e, ast.Ternary):
            return replace(e, cond=self.expr(e.cond), then=self.expr(e.then),
                           other=self.expr(e.other))
        return e

    def where(self, w: ast.WhereClause) -> ast.WhereClause:
        if isinstance(w, ast.RangeConstraint):
            return replace(w, index=self.names.get(w.index, w.index), lo=self.expr(w.lo),
                           hi=self.expr(w.hi))
        if isinstance(w, ast.Exists):
            access = self.expr(w.access)
            assert isinstance(access, ast.Call)
            return replace(w, access=access)
        return replace(w, name=self.names.get(w.name, w.name), value=self.expr(w.value))


def _statement_names(s: ast.Assign, tensors: dict[str, str], values: dict[str, str]
                     ) -> set[str]:
    """The statement's own names: indices and `where` names (not tensors, sizes or
    scalars of the callee)."""
    found = {i.name for i in s.indices}
    stack: list[ast.Expr] = [s.rhs, *s.scatter]
    for w in s.where:
        if isinstance(w, ast.RangeConstraint):
            found.add(w.index)
            stack += [w.lo, w.hi]
        elif isinstance(w, ast.Let):
            found.add(w.name)
            stack.append(w.value)
        else:
            stack.append(w.access)
    while stack:
        e = stack.pop()
        if isinstance(e, ast.Name):
            found.add(e.name)
        stack.extend(ast.children(e))
    return {n for n in found if n not in values and n not in tensors}


# ---------------------------------------------------------------- substitution

def substitute_statement(st: P.Statement, env: dict[str, SizeExpr]) -> P.Statement:
    memo: dict[int, P.TExpr] = {}
    return replace(st, rhs=_substitute(st.rhs, env, memo),
                   ranges=tuple((n, P.Range(r.lo.substitute(env), r.hi.substitute(env)))
                                for n, r in st.ranges),
                   scatter=tuple(_substitute(x, env, memo) for x in st.scatter))


def _substitute(e: P.TExpr, env: dict[str, SizeExpr], memo: dict[int, P.TExpr]) -> P.TExpr:
    """`e` with size aliases replaced; shared subtrees (from `where` lets) stay shared."""
    known = memo.get(id(e))
    if known is not None:
        return known
    out: P.TExpr = e
    if isinstance(e, P.SizeVal):
        out = replace(e, expr=e.expr.substitute(env))
    elif isinstance(e, P.Read):
        out = replace(e, indices=tuple(_substitute(x, env, memo) for x in e.indices))
    elif isinstance(e, P.Op):
        out = replace(e, args=tuple(_substitute(x, env, memo) for x in e.args))
    memo[id(e)] = out
    return out
