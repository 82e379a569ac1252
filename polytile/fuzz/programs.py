"""Hypothesis strategies that write TC programs from the grammar (TC paper, Fig. 14).

    programs()   -> SearchStrategy[str]    one or two `def`s, mostly valid

A program has 1-3 data inputs of any type and rank 0-3 over the sizes N, M, K (or a
constant), sometimes an integer index table X for gathers and scalar arguments s
(integer) and f (float); then 1-4 statements `T(lhs) op rhs where ...` with every
operator (`=`, `+=`, `*=`, `max=`, `min=` and the `!` forms), writing outputs or
temporaries that later statements read; some `+=` updates scatter (`T(i + 1) += ...`,
`T(X(i)) += ...`). Right-hand sides mix reads with affine
subscripts (`i`, `i + 1`, `i - 2`, `2 * i`, `i + j`, `s`), gathers `A(X(i))`,
arithmetic, comparisons, logic, ternaries, builtins, casts, literals of every
spelling, index values, sizes, `A.0`, scalars and `where` lets.

To keep most programs valid, an index that no plain subscript bounds gets a
`where i in 0:N` range; a few are left out on purpose, and reading a temporary
before it is written, in-place updates and type errors happen naturally, so the
checks see failures too. Programs are built as syntax trees and printed with
`polytile.lang.printer` (whose round trip the front-end oracle checks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from polytile.lang import ast
from polytile.lang.printer import format_def

SIZES = ("N", "M", "K")
INDICES = ("i", "j", "k", "l")
DATA_TYPES = ("float", "float", "float", "float", "float", "double", "double", "half",
              "bfloat16", "int32", "int", "int8", "int16", "int64", "uint8", "bool")
INDEX_TYPES = ("int32", "int64", "int8", "uint8", "int16")
INT_LITERALS = ("0", "1", "2", "3", "7", "0x3", "100", "300", "65504", "2147483648")
FLOAT_LITERALS = ("0.5", "1.5", "2.0", "0.25", "1e-3", "3.f", ".5", "1e2", "2.5E+1", "4.")
UNARY_BUILTINS = ("exp", "log", "tanh", "sqrt", "abs", "fabs", "floor", "ceil", "round",
                  "trunc", "relu", "sigmoid", "rsqrt", "sin", "cos", "erf", "expm1", "log1p",
                  "cbrt", "atan", "exp2", "fabsf", "expf", "sqrtf", "tanhf")
BINARY_BUILTINS = ("fmaxf", "fminf", "max", "min", "pow", "fmod", "atan2", "hypot", "copysign")
CASTS = ("int32", "float", "double", "int8", "uint8", "int64", "half", "bool", "int",
         "bfloat16", "int16")
BINARY_OPS = ("+", "+", "-", "*", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||")
# Sizes of right-hand sides: plain reads and short expressions are the most common, as
# in real programs (and they reach the reductions' corner cases more often).
_BUDGETS = (1, 1, 1, 2, 2, 3, 3, 4, 6, 8, 12, 16)
ASSIGN_OPS = ("=", "=", "=", "+=", "*=", "max=", "min=", "+=!", "+=!", "*=!", "max=!", "min=!")
UPDATE_OPS = ("=", "+=", "+=", "*=", "max=", "min=", "+=!")


@dataclass
class _Scope:
    """What one statement's right-hand side may use."""

    tensors: dict[str, int]                  # readable tensor -> rank
    tables: list[str]                        # integer tensors of rank 1 (gather tables)
    scalars: list[str]
    indices: list[str]
    sizes: list[str]                         # size names the inputs bind
    lets: list[str] = field(default_factory=list)
    bound: set[str] = field(default_factory=set)   # indices a plain subscript bounds


def _number(text: str) -> ast.Number:
    if text[:2] in ("0x", "0X"):
        return ast.Number(text, int(text, 16))
    if any(c in text for c in ".eEfF"):
        return ast.Number(text, float(text.rstrip("fF")))
    return ast.Number(text, int(text))


def _subscript(draw: st.DrawFn, scope: _Scope) -> ast.Expr:
    if not scope.indices:
        return _number(draw(st.sampled_from(("0", "0", "1"))))
    name = draw(st.sampled_from(scope.indices))
    index = ast.Name(name)
    kind = draw(st.integers(0, 11))
    if kind <= 5:
        scope.bound.add(name)
        return index
    if kind == 6:
        scope.bound.add(name)
        return ast.Binary("+", index, _number(draw(st.sampled_from(("1", "2")))))
    if kind == 7:
        scope.bound.add(name)
        return ast.Binary("-", index, _number("1"))
    if kind == 8:
        scope.bound.add(name)
        return ast.Binary("*", _number("2"), index)
    if kind == 9 and scope.tables:
        scope.bound.add(name)
        return ast.Call(draw(st.sampled_from(scope.tables)), (index,))
    if kind == 10:
        other = ast.Name(draw(st.sampled_from(scope.indices)))
        return ast.Binary("+", index, other)
    if "s" in scope.scalars:
        with_scalar: list[ast.Expr] = [ast.Name("s"), ast.Binary("+", index, ast.Name("s"))]
        return draw(st.sampled_from(with_scalar))
    return _number("0")


def _read(draw: st.DrawFn, scope: _Scope) -> ast.Expr:
    name = draw(st.sampled_from(sorted(scope.tensors)))
    return ast.Call(name, tuple(_subscript(draw, scope) for _ in range(scope.tensors[name])))


def _leaf(draw: st.DrawFn, scope: _Scope) -> ast.Expr:
    kind = draw(st.integers(0, 11))
    if kind <= 5 and scope.tensors:
        return _read(draw, scope)
    if kind == 6:
        return _number(draw(st.sampled_from(FLOAT_LITERALS)))
    if kind == 7:
        return _number(draw(st.sampled_from(INT_LITERALS)))
    if kind == 8 and scope.indices:
        return ast.Name(draw(st.sampled_from(scope.indices)))
    if kind == 9 and scope.lets:
        return ast.Name(draw(st.sampled_from(scope.lets)))
    if kind == 10 and scope.scalars:
        return ast.Name(draw(st.sampled_from(scope.scalars)))
    if kind == 11:
        shaped = [n for n, rank in scope.tensors.items() if rank]
        if shaped and draw(st.integers(0, 1)) == 1:
            name = draw(st.sampled_from(sorted(shaped)))
            return ast.DimOf(name, draw(st.integers(0, scope.tensors[name] - 1)))
        if scope.sizes:
            return ast.Name(draw(st.sampled_from(scope.sizes)))
    return _number(draw(st.sampled_from(("1", "0.5", "2"))))


def _expr(draw: st.DrawFn, scope: _Scope, budget: int) -> ast.Expr:
    """An expression of at most about `budget` nodes."""
    if budget <= 1 or draw(st.integers(0, 4)) == 0:
        return _leaf(draw, scope)
    kind = draw(st.integers(0, 11))
    if kind <= 4:
        split = draw(st.integers(1, budget - 1))
        return ast.Binary(draw(st.sampled_from(BINARY_OPS)), _expr(draw, scope, split),
                          _expr(draw, scope, budget - split))
    if kind == 5:
        return ast.Unary(draw(st.sampled_from(("-", "-", "!", "+"))),
                         _expr(draw, scope, budget - 1))
    if kind == 6:
        third = max(1, (budget - 1) // 3)
        cond = ast.Binary(draw(st.sampled_from(("<", ">", "==", ">=", "!="))),
                          _expr(draw, scope, third), _expr(draw, scope, 1))
        return ast.Ternary(cond, _expr(draw, scope, third), _expr(draw, scope, third))
    if kind == 7:
        return ast.Call(draw(st.sampled_from(UNARY_BUILTINS)), (_expr(draw, scope, budget - 1),))
    if kind == 8:
        half = max(1, (budget - 1) // 2)
        return ast.Call(draw(st.sampled_from(BINARY_BUILTINS)),
                        (_expr(draw, scope, half), _expr(draw, scope, half)))
    if kind == 9:
        return ast.Call(draw(st.sampled_from(CASTS)), (_expr(draw, scope, budget - 1),))
    if kind == 10 and scope.tensors:    # a gather: data used as a subscript
        name = draw(st.sampled_from(sorted(scope.tensors)))
        subs = [_subscript(draw, scope) for _ in range(scope.tensors[name])]
        if subs:
            inner = _read(draw, scope) if not scope.tables else ast.Call(
                draw(st.sampled_from(scope.tables)), (_subscript(draw, scope),))
            subs[draw(st.integers(0, len(subs) - 1))] = inner
        return ast.Call(name, tuple(subs))
    return _expr(draw, scope, budget - 1)


@dataclass
class _Function:
    """The signature drawn so far and the tensors the statements have written."""

    args: list[ast.Arg]
    tensors: dict[str, int]
    tables: list[str]
    scalars: list[str]
    sizes: list[str]
    written: dict[str, int] = field(default_factory=dict)     # tensor -> rank
    outputs: list[str] = field(default_factory=list)


def _signature(draw: st.DrawFn) -> _Function:
    args: list[ast.Arg] = []
    tensors: dict[str, int] = {}
    for name in ("A", "B", "C")[:draw(st.integers(1, 3))]:
        rank = draw(st.integers(0, 3))
        dims = tuple(draw(st.sampled_from(SIZES + SIZES + (3,))) for _ in range(rank))
        args.append(ast.TensorArg(draw(st.sampled_from(DATA_TYPES)), dims, name))
        tensors[name] = rank
    tables = []
    if draw(st.integers(0, 2)) == 0:
        args.append(ast.TensorArg(draw(st.sampled_from(INDEX_TYPES)),
                                  (draw(st.sampled_from(SIZES)),), "X"))
        tensors["X"] = 1
        tables.append("X")
    scalars = []
    if draw(st.integers(0, 3)) == 0:
        args.append(ast.ScalarArg(draw(st.sampled_from(("int32", "int64", "int8", "uint8"))),
                                  "s"))
        scalars.append("s")
    if draw(st.integers(0, 3)) == 0:
        args.append(ast.ScalarArg(draw(st.sampled_from(("float", "double", "half"))), "f"))
        scalars.append("f")
    order = draw(st.permutations(range(len(args))))
    sizes = sorted({d for a in args if isinstance(a, ast.TensorArg) for d in a.dims
                    if isinstance(d, str)})
    return _Function([args[k] for k in order], tensors, tables, scalars, sizes)


def _nodes(e: ast.Expr) -> list[ast.Expr]:
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        out.append(x)
        stack.extend(ast.children(x))
    return out


def _statement(draw: st.DrawFn, fn: _Function, first: bool) -> ast.Assign:
    written = sorted(fn.written)
    choice = draw(st.integers(0, 5))
    if first or choice <= 1 or not written:
        target = next(n for n in ("O", "P", "Q") if n not in fn.written) \
            if len(fn.outputs) < 3 else fn.outputs[0]
    elif choice == 2:
        target = next((n for n in ("T", "U") if n not in fn.written), "T")
    else:
        target = draw(st.sampled_from(written))
    rank = fn.written.get(target, draw(st.integers(0, 3)))
    names = list(draw(st.permutations(INDICES)))
    lhs, rest = names[:rank], names[rank:]
    update = target in fn.written
    # A later statement on a written tensor combines with its content rather than
    # overwriting it (which would hide what the earlier statements computed).
    op = draw(st.sampled_from(UPDATE_OPS if update else ASSIGN_OPS))
    reduced = rest[:draw(st.sampled_from((0, 1, 1, 2)))] if op != "=" else []
    readable = dict(fn.tensors)
    readable.update(fn.written)
    scope = _Scope(readable, fn.tables, fn.scalars, lhs + reduced, fn.sizes)
    where: list[ast.WhereClause] = []
    if draw(st.integers(0, 5)) == 0:
        value = _expr(draw, scope, draw(st.sampled_from(_BUDGETS[:6])))
        where.append(ast.Let("v", value))
        scope.lets.append("v")
    indices: tuple[ast.Name, ...] = tuple(ast.Name(i) for i in lhs)
    scatter: tuple[ast.Expr, ...] = ()
    if update and op == "+=" and lhs and draw(st.booleans()):
        # A scatter: one subscript becomes an expression (`T(i + 1) += ...`, `T(X(i))`).
        subs: list[ast.Expr] = list(indices)
        subs[draw(st.integers(0, len(subs) - 1))] = _subscript(draw, scope)
        indices, scatter = (), tuple(subs)
        scope.tensors = {n: r for n, r in scope.tensors.items() if n != target}
    rhs = _expr(draw, scope, draw(st.sampled_from(_BUDGETS)))
    if update and op == "=":    # an in-place update: T(i) = f(T(i), ...)
        own = ast.Call(target, tuple(ast.Name(i) for i in lhs))
        updates: list[ast.Expr] = [ast.Binary("+", own, rhs), ast.Call("fmaxf", (own, rhs)),
                                   ast.Binary("*", rhs, own)]
        rhs = draw(st.sampled_from(updates))
    for index in reduced:      # a reduction index the right-hand side does not use is none
        vectors = sorted(n for n, rank in readable.items() if rank)
        if vectors and index not in {n.name for n in _nodes(rhs) if isinstance(n, ast.Name)}:
            name = draw(st.sampled_from(vectors))
            subs = [_subscript(draw, scope) for _ in range(readable[name])]
            subs[draw(st.integers(0, len(subs) - 1))] = ast.Name(index)
            scope.bound.add(index)
            rhs = ast.Binary(draw(st.sampled_from(("*", "+", "-"))), rhs, ast.Call(name, tuple(subs)))
    used = set(lhs) | {n.name for e in [rhs, *scatter] + [w.value for w in where
                                                          if isinstance(w, ast.Let)]
                       for n in _nodes(e) if isinstance(n, ast.Name)}
    for index in scope.indices:
        if index in used and index not in scope.bound and draw(st.integers(0, 19)) != 0:
            hi = draw(st.sampled_from([ast.Name(n) for n in fn.sizes] + [_number("3")]))
            where.append(ast.RangeConstraint(index, _number("0"), hi))
    if draw(st.integers(0, 15)) == 0 and fn.tensors:
        access = _read(draw, scope)
        if isinstance(access, ast.Call):
            where.append(ast.Exists(access))
    if target not in fn.written:
        fn.written[target] = rank
        if target not in ("T", "U"):
            fn.outputs.append(target)
    op_text, init = (op[:-1], True) if op.endswith("!") else (op, False)
    return ast.Assign(target, indices, op_text, init, rhs,
                      tuple(draw(st.permutations(where))), scatter=scatter)


def _definition(draw: st.DrawFn, name: str) -> ast.Def:
    fn = _signature(draw)
    count = draw(st.sampled_from((1, 1, 1, 2, 2, 3, 4)))
    body = [_statement(draw, fn, first=k == 0) for k in range(count)]
    outputs = []
    for o in fn.outputs:
        if draw(st.integers(0, 9)) == 0:   # a declared type (the shape stays inferred)
            outputs.append(ast.Output(o, draw(st.sampled_from(DATA_TYPES)), ()))
        else:
            outputs.append(ast.Output(o))
    return ast.Def(name, tuple(fn.args), tuple(outputs), tuple(body))


@st.composite
def programs(draw: st.DrawFn) -> str:
    """TC source with one `def f`, sometimes a second `def g`."""
    text = format_def(_definition(draw, "f"))
    if draw(st.integers(0, 19)) == 0:
        text += format_def(_definition(draw, "g"))
    return text
