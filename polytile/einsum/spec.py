"""The einsum spec: its syntax tree and its parser.

    parse_spec("nc(h+r)(w+s), ckrs -> nkhw")

An operand is a run of subscripts, one per dimension: a lowercase letter (an index, as
in NumPy) or a parenthesised sum of terms, each an index with an optional integer
coefficient (`2h`, `2*h`), an integer, or a table lookup `sh[c]` / `off_h[c, x]` whose
arguments are index letters and whose values come from an integer array passed by
keyword. The output's letters follow `->`. The grammar (spaces are ignored):

    spec      := operand (',' operand)* '->' letter*
    operand   := (letter | '(' sum ')')*
    sum       := ['-'] term (('+' | '-') term)*
    term      := INT | [INT ['*']] letter | [INT ['*']] NAME '[' letter (',' letter)* ']'

Errors are `ParseError`s whose location points into the spec, so they print it with a
caret under the offending character, as the TC parser's do.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from polytile.errors import ParseError, Source, SourceLoc, abbreviate

# ----------------------------------------------------------------- syntax tree


@dataclass(frozen=True)
class IndexTerm:
    """`coeff * index`."""

    coeff: int
    index: str
    loc: SourceLoc


@dataclass(frozen=True)
class ConstTerm:
    value: int
    loc: SourceLoc


@dataclass(frozen=True)
class TableTerm:
    """`coeff * table[args]`: a data-dependent offset read from an integer array."""

    coeff: int
    table: str
    args: tuple[str, ...]
    loc: SourceLoc


Term = IndexTerm | ConstTerm | TableTerm


@dataclass(frozen=True)
class Subscript:
    """One dimension's index function: the sum of its terms."""

    terms: tuple[Term, ...]
    loc: SourceLoc

    @property
    def plain(self) -> str | None:
        """The index letter when the subscript is exactly one index (`h`), else None."""
        if len(self.terms) == 1 and isinstance(self.terms[0], IndexTerm) \
                and self.terms[0].coeff == 1:
            return self.terms[0].index
        return None

    @property
    def indices(self) -> tuple[str, ...]:
        """Index letters of the affine part, in order."""
        return tuple(t.index for t in self.terms if isinstance(t, IndexTerm))

    @property
    def tables(self) -> tuple[TableTerm, ...]:
        return tuple(t for t in self.terms if isinstance(t, TableTerm))


@dataclass(frozen=True)
class Operand:
    subscripts: tuple[Subscript, ...]
    loc: SourceLoc


@dataclass(frozen=True)
class Letter:
    name: str
    loc: SourceLoc


@dataclass(frozen=True)
class Spec:
    text: str
    operands: tuple[Operand, ...]
    output: tuple[Letter, ...]

    @cached_property
    def tables(self) -> tuple[TableTerm, ...]:
        """Every table lookup, in order of appearance (computed once: calls check them)."""
        return tuple(t for op in self.operands for s in op.subscripts for t in s.tables)

    def table_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.table for t in self.tables))

    def letters(self) -> tuple[str, ...]:
        """Every index letter of the inputs (table arguments included), first use first."""
        found: list[str] = []
        for op in self.operands:
            for s in op.subscripts:
                for t in s.terms:
                    if isinstance(t, IndexTerm):
                        found.append(t.index)
                    elif isinstance(t, TableTerm):
                        found.extend(t.args)
        return tuple(dict.fromkeys(found))

    def summed(self) -> tuple[str, ...]:
        """Indices reduced over: those of the inputs that the output does not name."""
        out = {letter.name for letter in self.output}
        return tuple(i for i in self.letters() if i not in out)


# ----------------------------------------------------------------- parser

MAX_COEFF = 1 << 31     # coefficients and constants beyond this are surely mistakes


def parse_spec(text: str) -> Spec:
    """Parse and check an einsum spec (see the module docstring for the grammar)."""
    return _Parser(text).spec()


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.source = Source(text, "<einsum>")
        self.pos = 0
        if "\n" in text:
            raise ParseError("an einsum spec is one line", self.loc(text.index("\n")),
                             "remove the line break")

    # ------------------------------------------------------------- helpers
    def loc(self, start: int, length: int = 1) -> SourceLoc:
        return SourceLoc(1, start + 1, max(1, length), self.source)

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def found(self) -> str:
        char = self.peek()
        return f"'{char}'" if char else "the end of the spec"

    def error(self, expected: str, hint: str | None = None) -> ParseError:
        return ParseError(f"expected {expected}, found {self.found()}", self.loc(self.pos), hint)

    def expect(self, char: str, hint: str | None = None) -> None:
        if self.peek() != char:
            raise self.error(f"'{char}'", hint)
        self.pos += 1

    def integer(self) -> tuple[int, SourceLoc]:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        digits = self.text[start:self.pos]
        loc = self.loc(start, len(digits))
        if len(digits) > 10 or int(digits) > MAX_COEFF:
            raise ParseError(f"the number {abbreviate(digits)} is too large", loc,
                             f"coefficients and offsets are below {MAX_COEFF}")
        return int(digits), loc

    def word(self) -> tuple[str, int]:
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isalnum()
                                             or self.text[self.pos] == "_"):
            self.pos += 1
        return self.text[start:self.pos], start

    # ------------------------------------------------------------- grammar
    def spec(self) -> Spec:
        operands = [self.operand()]
        while self.peek() == ",":
            self.pos += 1
            operands.append(self.operand())
        if self.peek() != "-" or not self.text.startswith("->", self.pos):
            raise self.error("'->' and the output's indices" if self.peek() in ("", "-")
                             else "an index, '(', ',' or '->'",
                             "an einsum spec names the output: 'ij,jk->ik'")
        self.pos += 2
        output = self.output()
        spec = Spec(self.text, tuple(operands), output)
        _check(spec)
        return spec

    def operand(self) -> Operand:
        self.skip_space()
        start = self.pos
        subscripts = []
        while True:
            char = self.peek()
            if char == "(":
                subscripts.append(self.parenthesised())
            elif char.isalpha() or char == "_":
                subscripts.append(self.bare_letter())
            elif char.isdigit():
                raise self.error("an index or '('", "a constant subscript goes in "
                                 "parentheses, e.g. (3)")
            elif char in (",", "-", ""):
                break
            else:
                raise self.error("an index, '(', ',' or '->'")
        return Operand(tuple(subscripts), self.loc(start, max(1, self.pos - start)))

    def bare_letter(self) -> Subscript:
        letter = self.letter("an index")
        return Subscript((IndexTerm(1, letter.name, letter.loc),), letter.loc)

    def letter(self, what: str) -> Letter:
        self.skip_space()
        char = self.peek()
        if not char.islower() or not char.isascii():
            raise self.error(what, "indices are the letters a-z" if char.isalpha() else None)
        self.pos += 1
        if self.peek() == "[":
            raise ParseError("a table lookup must be inside parentheses", self.loc(self.pos),
                             "write the subscript as a sum, e.g. (h+sh[c])")
        return Letter(char, self.loc(self.pos - 1))

    def parenthesised(self) -> Subscript:
        start = self.pos
        self.pos += 1
        terms = [self.term(negative=self.accept("-"))]
        while self.peek() in ("+", "-"):
            negative = self.peek() == "-"
            self.pos += 1
            terms.append(self.term(negative))
        if self.peek() != ")":
            raise self.error("'+', '-' or ')'")
        self.pos += 1
        return Subscript(tuple(terms), self.loc(start, self.pos - start))

    def accept(self, char: str) -> bool:
        if self.peek() == char:
            self.pos += 1
            return True
        return False

    def term(self, negative: bool) -> Term:
        sign = -1 if negative else 1
        char = self.peek()
        start = self.pos
        coeff = 1
        if char.isdigit():
            coeff, loc = self.integer()
            after = self.peek()
            if not (after == "*" or after.isalpha() or after == "_"):
                return ConstTerm(sign * coeff, loc)
            self.accept("*")
            if not (self.peek().isalpha() or self.peek() == "_"):
                raise self.error("an index or a table after the coefficient")
        elif not (char.isalpha() or char == "_"):
            raise self.error("an index, a number or a table lookup")
        self.skip_space()
        name, at = self.word()
        if self.peek() == "[":
            return self.table(name, at, sign * coeff, start)
        if len(name) != 1 or not name.islower() or not name.isascii():
            hint = (f"write a sum of letters, e.g. ({'+'.join(name)})"
                    if name.isalpha() and name.islower() else "indices are the letters a-z")
            raise ParseError(f"'{name}' is not an index: indices are single lowercase letters",
                             self.loc(at, len(name)), hint)
        return IndexTerm(sign * coeff, name, self.loc(start, self.pos - start))

    def table(self, name: str, at: int, coeff: int, start: int) -> TableTerm:
        if not (name[0].isalpha() or name[0] == "_"):
            raise ParseError(f"'{name}' is not a table name", self.loc(at, len(name)),
                             "a table is named like a Python identifier, e.g. sh[c]")
        self.pos += 1
        args = [self.letter("an index")]
        while self.accept(","):
            args.append(self.letter("an index"))
        if self.peek() != "]":
            raise self.error("',' or ']'", "a table's arguments are index letters: off[c, x]")
        self.pos += 1
        return TableTerm(coeff, name, tuple(a.name for a in args),
                         self.loc(start, self.pos - start))

    def output(self) -> tuple[Letter, ...]:
        letters = []
        while self.peek():
            if self.peek() in ("(", ","):
                raise self.error("an index", "the output's subscripts are plain letters")
            letters.append(self.letter("an index"))
        return tuple(letters)


def _check(spec: Spec) -> None:
    """What the grammar cannot say: output letters once each and used by an input; a
    table with one arity; tables named unlike each other's indices."""
    letters = set(spec.letters())
    seen: set[str] = set()
    for letter in spec.output:
        if letter.name in seen:
            raise ParseError(f"the output names {letter.name} twice", letter.loc,
                             "each output index appears once after '->'")
        seen.add(letter.name)
        if letter.name not in letters:
            raise ParseError(f"the output index {letter.name} appears in no input", letter.loc,
                             "every output index must index an input, which gives its range")
    arity: dict[str, TableTerm] = {}
    for t in spec.tables:
        first = arity.setdefault(t.table, t)
        if len(first.args) != len(t.args):
            raise ParseError(f"table {t.table} is looked up with {len(t.args)} index(es) here "
                             f"and with {len(first.args)} before", t.loc)
