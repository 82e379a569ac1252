"""Semantic analysis: syntax tree -> checked, typed Program.

    analyze(module) -> Program

Per function: arguments and sizes, the tensors each statement writes (outputs
or temporaries), typing (undeclared output and temporary dtypes are the
promotion of everything assigned to them), range inference (`ranges.py`) as a
fixpoint over the statements, then the checks of TC §3: inputs are immutable,
`=` has no reduction index, in-place updates are causal.
"""
from __future__ import annotations

from polytile import dtypes
from polytile.deep import retry_deep
from polytile.dtypes import DType
from polytile.errors import (CausalityError, NameResolutionError, RangeInferenceError,
                             TypeCheckError, UnsupportedError)
from polytile.errors import SourceLoc
from polytile.lang import ast
from polytile.sema import program as P
from polytile.sema import ranges as R
from polytile.sema import typing as T
from polytile.sema.inline import Inliner, substitute_statement
from polytile.sema.sizes import SizeExpr


# Operations in one statement once where-bindings are copied into their uses: past this
# the generated C takes a compiler minutes (gcc: 85 s for a 50,000-term chain).
MAX_EXPANDED = 100_000


def analyze(module: ast.Module) -> P.Program:
    defs = {d.name: d for d in module.defs}
    return retry_deep(lambda: P.Program(tuple(_Function(d, defs).build()
                                              for d in module.defs)))


def _dims_expr(dims: tuple[str | int, ...]) -> tuple[SizeExpr, ...]:
    return tuple(SizeExpr.sym(d) if isinstance(d, str) else SizeExpr.const_(d) for d in dims)


class _Function:
    def __init__(self, d: ast.Def, defs: dict[str, ast.Def]):
        self.d = d
        self.functions = frozenset(defs)
        self.calls = Inliner.for_caller(d, defs)
        self.params: list[P.Tensor] = []
        self.sizes: list[str] = []
        self.scalars: dict[str, DType] = {}
        self.declared: dict[str, DType] = {}          # written tensors with a declared dtype
        self.shapes: dict[str, tuple[SizeExpr, ...]] = {}
        self.outputs = {o.name: o for o in d.outputs}

    # ------------------------------------------------------------ signature
    def signature(self) -> None:
        seen: set[str] = set()
        for a in self.d.args:
            if a.name in seen:
                raise NameResolutionError(f"argument {a.name} is declared twice", a.loc)
            seen.add(a.name)
            dtype = dtypes.lookup(a.dtype)
            assert dtype is not None
            if isinstance(a, ast.ScalarArg):
                self.scalars[a.name] = dtype
                self.params.append(P.Tensor(a.name, dtype, (), "scalar", a.loc))
                continue
            for dim in a.dims:
                if isinstance(dim, str) and dim not in self.sizes:
                    self.sizes.append(dim)
            shape = _dims_expr(a.dims)
            self.shapes[a.name] = shape
            self.params.append(P.Tensor(a.name, dtype, shape, "input", a.loc))
        # A name may be both a size and a tensor (the paper's sconv2d has `float(...,W) I`
        # and `... W`): `W(...)` is the tensor, a bare `W` the size.
        for o in self.d.outputs:
            if o.name in seen:
                raise NameResolutionError(f"{o.name} is both an argument and an output", o.loc,
                                          "outputs are new tensors; to update an input in "
                                          "place, pass it as an output with out=")
            if o.name in self.outputs and self.outputs[o.name] is not o:
                raise NameResolutionError(f"output {o.name} is listed twice", o.loc)
            if o.dtype is not None:
                self.declared[o.name] = dtypes.lookup(o.dtype)  # type: ignore[assignment]
                if o.dims:
                    for dim in o.dims:
                        if isinstance(dim, str) and dim not in self.sizes:
                            raise NameResolutionError(
                                f"size {dim} of output {o.name} is not bound by any input",
                                o.loc)
                    self.shapes[o.name] = _dims_expr(o.dims)

    # ------------------------------------------------------------ statements
    def check_statement_shape(self, s: ast.Assign, ranks: dict[str, int]) -> None:
        if s.tensor in self.scalars or any(p.name == s.tensor and p.kind == "input"
                                           for p in self.params):
            raise TypeCheckError(f"{s.tensor} is an input and inputs are read-only", s.loc,
                                 "write the result to an output or a new temporary")
        if s.tensor in self.sizes:
            raise TypeCheckError(f"{s.tensor} is a size and cannot be assigned", s.loc)
        if s.scatter and (s.op != "+=" or s.init):
            names = [x.name if isinstance(x, ast.Name) else None for x in s.scatter]
            twice = next((x for k, x in enumerate(s.scatter)
                          if isinstance(x, ast.Name) and x.name in names[:k]), None)
            if twice is not None and None not in names:
                raise TypeCheckError(f"index {twice.name} appears twice on the left-hand side",
                                     twice.loc, "each output dimension needs its own index; "
                                     "to add into a diagonal, scatter with +=")
            raise TypeCheckError(
                f"{s.tensor} is indexed by an expression on the left-hand side (a scatter), "
                f"which only `+=` may do", _loc_of(s.scatter, s.loc),
                "index the left-hand side by plain names, e.g. `C(i, j) = ...`, or "
                "accumulate with `+=` into a tensor written before")
        names = [i.name for i in s.indices]
        for i, idx in enumerate(s.indices):
            if idx.name in names[:i]:
                raise TypeCheckError(f"index {idx.name} appears twice on the left-hand side",
                                     idx.loc, "each output dimension needs its own index")
            if idx.name in self.sizes or idx.name in self.scalars or idx.name in self.shapes:
                raise TypeCheckError(f"{idx.name} is a size, argument or tensor, not an index",
                                     idx.loc)
        written = len(s.scatter or s.indices)
        rank = ranks.setdefault(s.tensor, written)
        if rank != written:
            raise TypeCheckError(f"{s.tensor} is written with {rank} indices elsewhere but "
                                 f"{written} here", s.loc)

    def build(self) -> P.Function:
        self.signature()
        stmts: list[ast.Assign] = []
        ranks: dict[str, int] = {n: len(s) for n, s in self.shapes.items()}
        inputs = {p.name for p in self.params if p.kind == "input"}
        for s in self.d.body:
            body = (self.calls.expand(s, ranks, self.scalars, inputs)
                    if isinstance(s, ast.CallDef) else (s,))
            for inlined in body:
                self.check_statement_shape(inlined, ranks)
                stmts.append(inlined)
        self.adopt_declarations()
        written = [s.tensor for s in stmts]
        for name, o in self.outputs.items():
            if name not in written:
                raise TypeCheckError(f"output {name} is never written", o.loc,
                                     "assign it in a statement, or remove it from the outputs")
        temps = [n for n in dict.fromkeys(written) if n not in self.outputs]
        dtypes_ = self.infer_dtypes(stmts, ranks)
        typed = [self.type_statement(s, k, stmts, ranks, dtypes_) for k, s in enumerate(stmts)]
        statements, shapes = self.infer_ranges(typed, stmts)
        inout = self.check_order(stmts, typed)
        for s, st in zip(stmts, statements):
            self.check_reductions(s, st)
            self.check_causality(s, st)
        if self.calls.aliases:
            tensor_dtypes = {**dtypes_, **{p.name: p.dtype for p in self.params}}
            env = self.calls.bind_aliases(shapes, tensor_dtypes)
            shapes = {n: tuple(x.substitute(env) for x in shape) for n, shape in shapes.items()}
            statements = [substitute_statement(st, env) for st in statements]

        def tensor(name: str, kind: str) -> P.Tensor:
            loc = self.outputs[name].loc if name in self.outputs else next(
                s.loc for s in stmts if s.tensor == name)
            return P.Tensor(name, dtypes_[name], shapes[name], kind, loc)

        return P.Function(self.d.name, tuple(self.params),
                          tuple(tensor(o.name, "output") for o in self.d.outputs),
                          tuple(tensor(t, "temp") for t in temps),
                          tuple(statements), tuple(self.sizes), frozenset(inout), self.d.loc)

    def adopt_declarations(self) -> None:
        """Results of calls whose callee declares their dtype or shape (in its sizes'
        aliases, bound after range inference) are declared in the caller too, unless the
        caller declares them itself."""
        self.sizes_with_aliases = self.sizes + self.calls.aliases
        for name, dtype in self.calls.declared_dtypes.items():
            self.declared.setdefault(name, dtype)
        for name, dims in self.calls.declared_shapes.items():
            self.shapes.setdefault(name, _dims_expr(dims))

    def scope(self, dtypes_: dict[str, DType], visible: set[str],
              ranks: dict[str, int]) -> T.Scope:
        tensors = {p.name: p for p in self.params if p.kind == "input"}
        for name in visible:
            shape = self.shapes.get(name) or tuple(SizeExpr.const_(0) for _ in
                                                   range(ranks[name]))
            tensors[name] = P.Tensor(name, dtypes_.get(name, dtypes.INT32), shape, "temp")
        return T.Scope(tensors, self.scalars, frozenset(self.sizes_with_aliases),
                       dict(self.shapes),
                       self.functions)

    def infer_dtypes(self, stmts: list[ast.Assign], ranks: dict[str, int]) -> dict[str, DType]:
        """Undeclared outputs and temporaries: the promotion of all values assigned to them,
        iterated to a fixpoint because statements may read each other's results."""
        current: dict[str, DType] = dict(self.declared)
        undeclared = {s.tensor for s in stmts} - set(self.declared)
        for _ in range(len(stmts) + 2):
            found: dict[str, tuple[DType, bool]] = {}
            visible = {s.tensor for s in stmts}
            for s in stmts:
                scope = self.scope(current, visible, ranks)
                T.lets_scope(s.where, scope)
                rhs = T.resolve(s.rhs, scope)
                if s.tensor in undeclared:
                    if s.tensor in found:
                        found[s.tensor] = T.promote(*found[s.tensor], rhs.dtype, rhs.weak)
                    else:
                        found[s.tensor] = (rhs.dtype, rhs.weak)
            new = dict(self.declared)
            for name, (dtype, _) in found.items():
                new[name] = dtype
            if new == current:
                break
            current = new
        return current

    def type_statement(self, s: ast.Assign, k: int, stmts: list[ast.Assign],
                       ranks: dict[str, int], dtypes_: dict[str, DType]
                       ) -> tuple[P.TExpr, tuple[P.Read, ...], T.Scope]:
        visible = {x.tensor for x in stmts[:k + 1]} | set(self.outputs)
        scope = self.scope(dtypes_, visible, ranks)
        scope.later = frozenset(x.tensor for x in stmts[k + 1:]) - visible
        T.lets_scope(s.where, scope)
        rhs = T.resolve(s.rhs, scope)
        size = P.expanded_size(rhs.expr)
        if size > MAX_EXPANDED:
            raise UnsupportedError(
                f"this statement expands to {size} operations, more than the "
                f"{MAX_EXPANDED} polytile compiles (a where binding is copied into each use)",
                s.loc, "store intermediate results in temporaries, e.g. T(i) = ...; then "
                       "use T(i), instead of where bindings used several times")
        exists = []
        for w in s.where:
            if isinstance(w, ast.Exists):
                e = T.resolve(w.access, scope).expr
                if not isinstance(e, P.Read):
                    raise TypeCheckError("`exists` needs a tensor access", w.loc)
                exists.append(e)
        value = T.finalize(rhs, s.loc)
        target = dtypes_[s.tensor]
        T.check_assignable(value.dtype, target, s.tensor, s.loc)
        if rhs.weak:   # a literal takes the type of the tensor it is assigned to
            value = T.retype(rhs.expr, target, s.loc)
        for i in s.indices:
            scope.index_locs.setdefault(i.name, i.loc)
        return value, tuple(exists), scope

    # ------------------------------------------------------------ ranges
    def where_ranges(self, s: ast.Assign, scope: T.Scope) -> tuple[tuple[str, P.Range], ...]:
        out: list[tuple[str, P.Range]] = []
        for w in s.where:
            if not isinstance(w, ast.RangeConstraint):
                continue
            bounds = []
            for e in (w.lo, w.hi):
                value = R.bound(T.finalize(T.resolve(e, scope), w.loc))
                if value is None:
                    raise RangeInferenceError(
                        f"the bounds of {w.index} must be integer expressions of sizes, "
                        "constants and integer arguments", w.loc)
                bounds.append(value)
            if any(name == w.index for name, _ in out):
                raise RangeInferenceError(f"{w.index} has two where ranges", w.loc)
            out.append((w.index, P.Range(bounds[0], bounds[1])))
        return tuple(out)

    def infer_ranges(self, typed: list, stmts: list[ast.Assign]
                     ) -> tuple[list[P.Statement], dict[str, tuple[SizeExpr, ...]]]:
        infos = []
        scatters: list[tuple[P.TExpr, ...]] = []
        for s, (rhs, exists, scope) in zip(stmts, typed):
            accesses = [R.Access(r.tensor, r.indices, r.loc) for r in T.reads(rhs)]
            accesses += [R.Access(r.tensor, r.indices, r.loc) for r in exists]
            order = [i.name for i in s.indices]
            scatter = self.scatter_subscripts(s, scope)
            if scatter:
                # The written tensor's bounds take part in inference like a read's.
                accesses.append(R.Access(s.tensor, scatter, s.loc))
            for a in accesses:
                for sub in a.subscripts:
                    order += sorted(T.index_names(sub) - set(order))
            order += sorted(T.index_names(rhs) - set(order))
            where = self.where_ranges(s, scope)
            for name, _ in where:
                if name not in order:
                    loc = next(w.loc for w in s.where if isinstance(w, ast.RangeConstraint)
                               and w.index == name)
                    raise RangeInferenceError(f"where clause names {name}, which the statement "
                                              "does not use", loc)
            infos.append(R.StatementInfo(s.tensor, tuple(i.name for i in s.indices),
                                         tuple(dict.fromkeys(order)), tuple(accesses), where,
                                         tuple(scope.index_locs.items()), s.loc))
            scatters.append(scatter)
        shapes = dict(self.shapes)
        done: dict[int, dict[str, P.Range]] = {}
        progress = True
        while progress:
            progress = False
            for k, info in enumerate(infos):
                if k in done:
                    continue
                found, unresolved = R.infer_statement(info, shapes)
                if unresolved:
                    continue
                done[k] = found
                progress = True
                if info.lhs_tensor not in shapes and not scatters[k]:
                    shapes[info.lhs_tensor] = tuple(found[i].hi for i in info.lhs_indices)
        for k, info in enumerate(infos):
            if k not in done:
                _, unresolved = R.infer_statement(info, shapes)
                raise R.explain_unresolved(info, unresolved, shapes)
        statements = []
        for k, (s, info) in enumerate(zip(stmts, infos)):
            if scatters[k] and s.tensor not in shapes:
                raise RangeInferenceError(
                    f"the shape of {s.tensor} is not known where it is scattered into",
                    s.loc, f"declare it as an output, e.g. `-> (float(N) {s.tensor})`, or "
                    "write it with a plainly indexed statement first")
            ranges = done[k]
            for name, r in ranges.items():
                span = r.hi - r.lo
                if span.is_const and span.const <= 0:
                    raise RangeInferenceError(
                        f"range of {name} is empty ({r})", dict(info.index_locs).get(name, s.loc),
                        "no value keeps every access in bounds; check the where clauses "
                        "(a range `where i in lo:hi` is half-open and needs hi > lo)")
            statements.append(P.Statement(s.tensor, info.lhs_indices, s.op, s.init,
                                          typed[k][0],
                                          tuple((i, ranges[i]) for i in info.indices), s.loc,
                                          scatters[k]))
        return statements, shapes

    def scatter_subscripts(self, s: ast.Assign, scope: T.Scope) -> tuple[P.TExpr, ...]:
        """A scatter's left-hand subscripts, typed: affine in the indices, or read from
        data (checked at run time, like a gather's)."""
        subs = []
        for x in s.scatter:
            loc = getattr(x, "loc", s.loc)
            e = T.finalize(T.resolve(x, scope), loc)
            if not e.dtype.is_integral:
                raise TypeCheckError(f"subscript of {s.tensor} is {e.dtype}, not an integer",
                                     loc)
            subs.append(e)
        return tuple(subs)

    # ------------------------------------------------------------ checks
    def check_order(self, stmts: list[ast.Assign], typed: list) -> set[str]:
        """Outputs read before they are written are in/out (the caller passes them
        with out=); temporaries may not be."""
        initialized: set[str] = set()
        inout: set[str] = set()
        for s, (rhs, exists, _) in zip(stmts, typed):
            for r in T.reads(rhs) + list(exists):
                if r.tensor not in initialized and r.tensor not in self.shapes_inputs():
                    self._uninitialized(r.tensor, r.loc, inout)
            if s.tensor not in initialized:
                if s.op != "=" and not s.init:
                    self._uninitialized(s.tensor, s.loc, inout)
                initialized.add(s.tensor)
        return inout

    def shapes_inputs(self) -> set[str]:
        return {p.name for p in self.params}

    def _uninitialized(self, name: str, loc, inout: set[str]) -> None:  # type: ignore
        if name in self.outputs:
            inout.add(name)
            return
        raise NameResolutionError(f"temporary {name} is read before it is written", loc,
                                  "initialize it first, e.g. with `=` or a `+=!` reduction")

    def check_reductions(self, s: ast.Assign, st: P.Statement) -> None:
        if s.op == "=" and st.reduction_indices:
            names = ", ".join(st.reduction_indices)
            raise TypeCheckError(
                f"{names} appear{'s' if len(st.reduction_indices) == 1 else ''} only on the "
                f"right-hand side, so {s.tensor}(...) = ... would reduce over "
                f"{'it' if len(st.reduction_indices) == 1 else 'them'}", s.loc,
                "use a reduction: +=! (sum from 0), *=!, min=!, max=!, or += to accumulate "
                "into the existing value")

    def check_causality(self, s: ast.Assign, st: P.Statement) -> None:
        """TC §3: the right-hand side is read in full before any element is written, so
        an in-place update may only read the element its own iteration writes."""
        for r in T.reads(st.rhs):
            if r.tensor != s.tensor:
                continue
            if st.scatter:
                raise CausalityError(f"a scatter into {s.tensor} reads {s.tensor}", r.loc,
                                     f"write the result to a new tensor instead of "
                                     f"{s.tensor}")
            same = all(isinstance(x, P.IndexVar) and x.name == i
                       for x, i in zip(r.indices, st.indices))
            if same and not st.reduction_indices:
                continue
            shown = f"{r.tensor}({', '.join(_show(x) for x in r.indices)})"
            why = ("other iterations of the reduction update" if same
                   else "another iteration writes")
            raise CausalityError(f"in-place update of {s.tensor} reads {shown}, which {why}",
                                 r.loc, f"write the result to a new tensor instead of "
                                 f"{s.tensor}")


def _loc_of(exprs: tuple[ast.Expr, ...], default: SourceLoc) -> SourceLoc:
    """Where the first non-name subscript is."""
    first = next((x for x in exprs if not isinstance(x, ast.Name)), None)
    return getattr(first, "loc", default) if first is not None else default


def _show(e: P.TExpr) -> str:
    if isinstance(e, P.IndexVar):
        return e.name
    if isinstance(e, P.Const):
        return str(e.value)
    return "..."

