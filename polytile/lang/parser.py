"""Recursive-descent parser for TC (Fig. 14), with C operator precedence.

    parse(text) -> Module

Errors are `ParseError`s that point at the offending token and say what was expected.
"""
from __future__ import annotations

from polytile.deep import MAX_DEPTH, MAX_NESTING, retry_deep
from polytile.dtypes import TYPE_NAMES
from polytile.errors import ParseError, Source, SourceLoc, TypeCheckError, abbreviate
from polytile.lang import ast
from polytile.lang.cursor import TokenCursor
from polytile.lang.lexer import Token, tokenize

# Binary operators by precedence level, lowest first (C's order).
_BINARY_LEVELS = (("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="),
                  ("+", "-"), ("*", "/", "%"))
_REDUCTIONS = {"=": ("=", False), "+=": ("+=", False), "*=": ("*=", False),
               "min=": ("min=", False), "max=": ("max=", False),
               "+=!": ("+=", True), "*=!": ("*=", True),
               "min=!": ("min=", True), "max=!": ("max=", True)}


def parse(text: str, name: str = "<string>") -> ast.Module:
    """Parse TC source holding one or more `def`s."""
    return retry_deep(lambda: _Parser(Source(text, name)).module())


def parse_expr(text: str) -> ast.Expr:
    """Parse a lone expression (used by tests and the einsum front end)."""
    parser = _Parser(Source(text))
    expr = parser.expr()
    parser.expect_eof()
    return expr


class _Parser(TokenCursor[Token]):
    error_class = ParseError

    def __init__(self, source: Source):
        super().__init__(tokenize(source))
        self.nesting = 0         # expressions being parsed inside each other
        self.source = source

    # -------------------------------------------------------------- helpers
    def expect_name(self, what: str = "a name") -> Token:
        return self.expect_kind("name", what)

    def expect_eof(self) -> None:
        if self.tok.kind != "eof":
            raise self.error("end of input")

    def comma_list(self, item, close: str):  # type: ignore[no-untyped-def]
        items = []
        if not self.at(close):
            items.append(item())
            while self.accept(","):
                items.append(item())
        self.expect(close)
        return tuple(items)

    # -------------------------------------------------------------- definitions
    def module(self) -> ast.Module:
        defs = []
        while self.tok.kind != "eof":
            defs.append(self.definition())
        if not defs:
            raise ParseError("no TC function found", self.tok.loc,
                             "a TC source holds one or more `def name(args) -> (outs) { ... }`")
        seen: dict[str, ast.Def] = {}
        for d in defs:
            if d.name in seen:
                raise ParseError(f"function {d.name} is defined twice", d.loc)
            seen[d.name] = d
        return ast.Module(tuple(_calls_of_functions(d, frozenset(seen)) for d in defs))

    def definition(self) -> ast.Def:
        if not self.at_word("def"):
            raise self.error("'def'")
        start = self.advance().loc
        name = self.expect_name("a function name")
        self.expect("(")
        args = self.comma_list(self.argument, ")")
        if not self.accept("->"):
            raise self.error("'->' and the list of outputs", "write `-> (out1, out2)`")
        self.expect("(")
        outputs = self.comma_list(self.output, ")")
        if not outputs:
            raise ParseError(f"function {name.text} has no outputs", name.loc)
        self.expect("{")
        body = []
        while not self.at("}"):
            if self.tok.kind == "eof":
                raise self.error("'}' closing the body of " + name.text)
            body.append(self.statement())
        self.advance()
        return ast.Def(name.text, args, outputs, tuple(body), start)

    def type_name(self) -> Token:
        tok = self.expect_name("a type")
        if tok.text not in TYPE_NAMES:
            raise ParseError(f"unknown type '{tok.text}'", tok.loc,
                             "types are " + ", ".join(sorted(TYPE_NAMES)))
        return tok

    def dims(self) -> tuple[str | int, ...]:
        def dim() -> str | int:
            tok = self.advance()
            if tok.kind == "name":
                return tok.text
            if tok.kind == "number" and tok.text.isdigit():
                return _size_value(tok, "dimension", "use a size name, e.g. float(N) A")
            raise ParseError(f"expected a size name or an integer, found {tok}", tok.loc)
        self.expect("(")
        return self.comma_list(dim, ")")

    def argument(self) -> ast.Arg:
        type_tok = self.type_name()
        if self.at("("):
            dims = self.dims()
            name = self.expect_name("the tensor's name")
            return ast.TensorArg(type_tok.text, dims, name.text, name.loc)
        name = self.expect_name("the argument's name")
        return ast.ScalarArg(type_tok.text, name.text, name.loc)

    def output(self) -> ast.Output:
        if self.tok.kind == "name" and self.tok.text in TYPE_NAMES and (
                self.peek().text == "(" or self.peek().kind == "name"):
            type_tok = self.advance()
            dims = self.dims() if self.at("(") else ()
            name = self.expect_name("the output's name")
            return ast.Output(name.text, type_tok.text, dims, name.loc)
        name = self.expect_name("an output name")
        return ast.Output(name.text, None, None, name.loc)

    # -------------------------------------------------------------- statements
    def statement(self) -> ast.Stmt:
        start = self.tok.loc
        if self.at("("):
            self.advance()
            outs = self.comma_list(self.plain_name, ")")
            self.expect("=")
            return self.call_def(outs, start)
        tensor = self.expect_name("a statement (`T(i, j) = ...`)")
        if self.at(","):                       # Fig. 14's unparenthesized `A, B = f(X, Y)`
            outs = [ast.Name(tensor.text, tensor.loc)]
            while self.accept(","):
                outs.append(self.plain_name())
            self.expect("=")
            return self.call_def(tuple(outs), start)
        indices: tuple[ast.Name, ...] = ()
        scatter: tuple[ast.Expr, ...] = ()
        if self.accept("("):
            subscripts = self.comma_list(self.expr, ")")
            names = [x.name for x in subscripts if isinstance(x, ast.Name)]
            if len(names) == len(subscripts) and len(set(names)) == len(names):
                indices = subscripts      # type: ignore[assignment]
            else:
                scatter = subscripts
        if self.tok.kind != "op" or self.tok.text not in _REDUCTIONS:
            raise self.error("'=' or a reduction (+=, *=, min=, max=, +=!, ...)")
        op, init = _REDUCTIONS[self.advance().text]
        rhs = self.expr()
        where: list[ast.WhereClause] = []
        if self.at_word("where") and self.peek().kind == "name":
            self.advance()
            where.append(self.where_clause())
            while self.accept(","):
                where.append(self.where_clause())
        return ast.Assign(tensor.text, indices, op, init, rhs, tuple(where), start, scatter)

    def call_def(self, outs: tuple[ast.Name, ...], start: SourceLoc) -> ast.CallDef:
        func = self.expect_name("the name of the called function")
        self.expect("(")
        args = self.comma_list(self.plain_name, ")")
        return ast.CallDef(outs, func.text, args, start)

    def plain_name(self) -> ast.Name:
        tok = self.expect_name()
        return ast.Name(tok.text, tok.loc)

    def where_clause(self) -> ast.WhereClause:
        tok = self.tok
        if tok.text == "exists" and self.peek().kind == "name":
            self.advance()
            access = self.postfix()
            if not isinstance(access, ast.Call):
                raise ParseError("`exists` takes a tensor access like `A(i, j)`", tok.loc)
            return ast.Exists(access, tok.loc)
        name = self.expect_name("`i in lo:hi`, `exists A(i)` or `name = expr`")
        if self.at_word("in"):
            self.advance()
            lo = self.expr()
            self.expect(":", "ranges are written `lo:hi` (half-open)")
            hi = self.expr()
            return ast.RangeConstraint(name.text, lo, hi, name.loc)
        if self.accept("="):
            return ast.Let(name.text, self.expr(), name.loc)
        raise self.error("'in' or '=' after " + name.text)

    # -------------------------------------------------------------- expressions
    def expr(self) -> ast.Expr:
        """An expression; the outermost call also checks the depth of the whole tree."""
        start = self.tok.loc
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise ParseError(f"expression nested more than {MAX_NESTING} levels deep "
                             "(parentheses, calls, conditionals)", start,
                             "split it into several statements with temporaries")
        try:
            e = self.conditional()
        finally:
            self.nesting -= 1
        if self.nesting == 0 and ast.depth(e) > MAX_DEPTH:
            raise ParseError(f"expression is {ast.depth(e)} levels deep; polytile compiles "
                             f"up to {MAX_DEPTH} (a chain of operators counts one level per "
                             "operator)", start,
                             "split it into several statements with temporaries")
        return e

    def conditional(self) -> ast.Expr:
        cond = self.binary(0)
        if self.at("?"):
            loc = self.advance().loc
            then = self.expr()
            self.expect(":", "a conditional is written `c ? a : b`")
            other = self.expr()
            return ast.Ternary(cond, then, other, loc)
        return cond

    def binary(self, level: int) -> ast.Expr:
        if level == len(_BINARY_LEVELS):
            return self.unary()
        lhs = self.binary(level + 1)
        while self.tok.kind == "op" and self.tok.text in _BINARY_LEVELS[level]:
            op = self.advance()
            rhs = self.binary(level + 1)
            lhs = ast.Binary(op.text, lhs, rhs, op.loc)
        return lhs

    def unary(self) -> ast.Expr:
        ops = []       # a loop, not recursion: `- - - x` may be long
        while self.tok.kind == "op" and self.tok.text in ("-", "+", "!"):
            ops.append(self.advance())
        e = self.postfix()
        for op in reversed(ops):
            e = ast.Unary(op.text, e, op.loc)
        return e

    def postfix(self) -> ast.Expr:
        tok = self.tok
        if tok.kind == "number":
            self.advance()
            return ast.Number(tok.text, _number_value(tok), tok.loc)
        if self.accept("("):
            inner = self.expr()
            self.expect(")")
            return inner
        if tok.kind != "name":
            raise self.error("an expression")
        self.advance()
        if self.accept("("):
            return ast.Call(tok.text, self.comma_list(self.expr, ")"), tok.loc)
        if self.at(".") and self.peek().kind == "number":
            self.advance()
            dim = self.advance()
            if not dim.text.isdigit():
                raise ParseError(f"expected a dimension number after '{tok.text}.'", dim.loc)
            return ast.DimOf(tok.text, _size_value(dim, "dimension number",
                                                   "A.0 is the first dimension of A"), tok.loc)
        return ast.Name(tok.text, tok.loc)


def _calls_of_functions(d: ast.Def, functions: frozenset[str]) -> ast.Def:
    """`O1 = MLP1(I, W1, B1)` (Fig. 15) reads like a 0-d assignment, but when MLP1 is a
    function of the same source and every argument a plain name, it is a call statement."""
    params = {a.name for a in d.args}

    def convert(s: ast.Stmt) -> ast.Stmt:
        if (isinstance(s, ast.Assign) and not s.indices and s.op == "=" and not s.where
                and isinstance(s.rhs, ast.Call) and s.rhs.name in functions
                and s.rhs.name not in params
                and all(isinstance(a, ast.Name) for a in s.rhs.args)):
            return ast.CallDef((ast.Name(s.tensor, s.loc),), s.rhs.name,
                               tuple(s.rhs.args), s.loc)  # type: ignore[arg-type]
        return s

    body = tuple(convert(s) for s in d.body)
    return d if body == d.body else ast.Def(d.name, d.args, d.outputs, body, d.loc)


_LARGEST_SIZE = (1 << 63) - 1


def _size_value(tok: Token, what: str, hint: str) -> int:
    """A constant size or dimension number: sizes are int64, so a larger one describes
    no array (and int() refuses decimals of over 4,300 digits with a ValueError)."""
    digits = tok.text.lstrip("0")
    if len(digits) > 19 or int(digits or "0") > _LARGEST_SIZE:
        raise TypeCheckError(f"the {what} {abbreviate(tok.text)} is too large: sizes are "
                             f"int64 (at most {_LARGEST_SIZE})", tok.loc, hint)
    return int(digits or "0")


def _number_value(tok: Token) -> int | float:
    text = tok.text
    hexadecimal = text[:2] in ("0x", "0X")
    if any(c in text for c in ".eEfF") and not hexadecimal:
        return float(text.rstrip("fF"))
    digits = text[2:] if hexadecimal else text
    if len(digits.lstrip("0")) > 20:     # past every integer type (and int()'s digit limit)
        raise TypeCheckError(f"integer literal {abbreviate(text)} does not fit in int64, the "
                             "widest integer type", tok.loc,
                             "write a float literal (with a decimal point) for a real number")
    return int(digits, 16 if hexadecimal else 10)
