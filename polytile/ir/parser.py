"""Read the IR text that `polytile.ir.printer` writes (see its docstring for the form).

    parse_function(text) -> Function     parse_block(text) -> Block

Recursive descent over tokens; newlines and indentation carry no meaning, so
`format_function(parse_function(text)) == text` for printed text, and
`parse_function(format_function(fn)) == fn` for any IR whose names are words and
whose affines are normalized (`Affine.of`). `//` lines directly before a
`block` are its comment; comments anywhere else are an error, since they would
be lost. Errors are `IRError`s pointing at the offending token (line:col).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from polytile import dtypes
from polytile.dtypes import DType
from polytile.errors import IRError, Source, SourceLoc
from polytile.ir.nodes import (
    AGG_OPS,
    DIRECTIONS,
    GPU_KINDS,
    ROW_PHASE_KINDS,
    Across,
    Affine,
    Block,
    BlockSchedule,
    Constant,
    Dim,
    Function,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    NextRow,
    Phase,
    Refinement,
    RowGroup,
    RowPhase,
    Special,
    Staged,
    Statement,
    Stitched,
    Store,
    Tensorized,
    TensorShape,
    Tiled,
    VectorLoop,
    WarpTiled,
)
from polytile.lang.cursor import TokenCursor

# Names follow the TC lexer: `2LUT` is a name, `12` and `1e5` are numbers.
NAME = re.compile(r"[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
_STRING = r'"(?:[^"\\\n]|\\.)*"'
_WORD = r"[A-Za-z0-9_.\-]+"
_TOKENS = re.compile("|".join([
    r"(?P<space>[ \t\r\n]+)", r"(?P<comment>//[^\n]*)",
    r"(?P<scalar>\$[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*)",
    rf"(?P<tag>#(?:{_WORD}|{_STRING}))", rf"(?P<location>@(?:{_WORD}|{_STRING}))",
    rf"(?P<string>{_STRING})", r"(?P<op><-|->|>=|[()\[\]{},:=+\-*])",
]))
_SPECIAL_FLOATS = {"inf": float("inf"), "nan": float("nan")}


@dataclass(frozen=True)
class _Token:
    kind: str          # name, int, float, scalar, tag, location, string, comment, op, eof
    text: str
    loc: SourceLoc

    def __str__(self) -> str:
        return "end of input" if self.kind == "eof" else f"'{self.text}'"


def parse_function(text: str, name: str = "<ir>") -> Function:
    parser = _Parser(Source(text, name))
    fn = parser.function()
    parser.expect_kind("eof", "end of input")
    return fn


def parse_block(text: str, name: str = "<ir>") -> Block:
    parser = _Parser(Source(text, name))
    block = parser.block()
    parser.expect_kind("eof", "end of input")
    return block


def _tokenize(source: Source) -> list[_Token]:
    text, tokens = source.text, []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        loc = SourceLoc(line, pos - line_start + 1, 1, source)
        word = _word_at(text, pos)
        if word is not None:
            kind, lexeme = word
        else:
            match = _TOKENS.match(text, pos)
            if match is None:
                raise IRError(f"unexpected character {text[pos]!r}", loc)
            kind, lexeme = match.lastgroup or "op", match.group()
        if kind == "space":
            line += lexeme.count("\n")
            if "\n" in lexeme:
                line_start = pos + lexeme.rfind("\n") + 1
        else:
            tokens.append(_Token(kind, lexeme, SourceLoc(loc.line, loc.col, len(lexeme), source)))
        pos += len(lexeme)
    tokens.append(_Token("eof", "", SourceLoc(line, pos - line_start + 1, 1, source)))
    return tokens


def _word_at(text: str, pos: int) -> tuple[str, str] | None:
    """A name or a number; a word starting with a digit is a number when that reading
    is at least as long (`1e5`, `2`), else a name (`2LUT`), as in the TC lexer."""
    name, number = NAME.match(text, pos), _NUMBER.match(text, pos)
    if number and (name is None or len(number.group()) >= len(name.group())):
        lexeme = number.group()
        return ("int" if lexeme.isdigit() else "float"), lexeme
    return ("name", name.group()) if name else None


class _Parser(TokenCursor[_Token]):
    error_class = IRError

    def __init__(self, source: Source):
        super().__init__(_tokenize(source))

    # -------------------------------------------------------------- helpers
    def expect_word(self, word: str) -> _Token:
        if not self.at_word(word):
            raise self.error(f"'{word}'")
        return self.advance()

    def name(self, what: str = "a name") -> str:
        return self.expect_kind("name", what).text

    def integer(self, what: str = "an integer") -> int:
        negative = self.accept("-")
        value = int(self.expect_kind("int", what).text)
        return -value if negative else value

    def listed(self, close: str, item):  # type: ignore[no-untyped-def]
        """Comma-separated items up to (and consuming) `close`."""
        items = []
        if not self.accept(close):
            items.append(item())
            while self.accept(","):
                items.append(item())
            self.expect(close)
        return tuple(items)

    def dtype(self) -> DType:
        tok = self.tok
        found = dtypes.lookup(self.name("a dtype")) if tok.kind == "name" else None
        if found is None:
            raise IRError(f"unknown dtype {tok}", tok.loc,
                          "one of: " + ", ".join(t.name for t in dtypes.ALL))
        return found

    def word(self, kind: str, what: str) -> str:
        """The text of a tag or location token, without its sigil."""
        text = self.expect_kind(kind, what).text[1:]
        return json.loads(text) if text.startswith('"') else text

    # -------------------------------------------------------------- structure
    def function(self) -> Function:
        self.expect_word("function")
        name = self.name("a function name")
        self.expect("(")
        params = self.listed(")", lambda: self.name("a parameter name"))
        self.expect("{")
        body = self.block()
        self.expect("}")
        return Function(name, params, body)

    def block(self) -> Block:
        comment = self.comment()
        self.expect_word("block")
        name = self.name("a block name")
        idxs = self.listed("]", self.index) if self.accept("[") else ()
        tags = []
        while self.tok.kind == "tag":
            tags.append(self.word("tag", "a tag"))
        schedule = self.schedule() if self.at_word("schedule") else BlockSchedule()
        self.expect("(")
        constraints: list[Affine] = []
        refs: list[Refinement] = []
        while not self.accept(")"):
            if self.tok.text in DIRECTIONS and self.peek().kind == "name":
                refs.append(self.refinement())
            else:
                constraints.append(self.constraint())
        self.expect("{")
        stmts: list[Statement] = []
        while not self.accept("}"):
            stmts.append(self.statement())
        return Block(name, idxs, tuple(constraints), tuple(refs), tuple(stmts),
                     frozenset(tags), comment, schedule)

    def schedule(self) -> BlockSchedule:
        """`schedule(item, ...)`, as polytile.ir.printer.format_schedule writes it."""
        self.expect_word("schedule")
        self.expect("(")
        fields: dict[str, Any] = {}
        gpu: list[tuple[str, str]] = []
        self.listed(")", lambda: self.schedule_item(fields, gpu))
        return BlockSchedule(**fields, gpu=tuple(gpu))

    def schedule_item(self, fields: dict[str, Any], gpu: list[tuple[str, str]]) -> None:
        item = self.advance()
        word = item.text
        if word in ("micro", "simd"):
            fields[word] = True
            return
        if word not in ("parallel", "combine", "vector", "unroll", "order", "transpose",
                        "boundary", "prefetch", "stream", "next_row", "folded", "first",
                        "tensorize", "stage", "across", "stitch", "mma", "rows",
                        "tiles", *GPU_KINDS):
            raise IRError(f"unknown schedule item {word!r}", item.loc,
                          "items: micro, vector(i, dtype, lanes), boundary(remainders|guarded), "
                          "unroll(i, ...), order(i, ...), transpose(width), parallel(i), "
                          "combine(buffer, ...), simd, "
                          "grid(i), thread(i), prefetch(distance), stream(view, ...), "
                          "next_row(view, index, rows, stride), folded(block), first(i, ...), "
                          "tensorize(instruction, i, k), "
                          "stage(k, tile, A, ..., pad = n), across(k, threads[, warp = n]), "
                          "stitch(for barrier, single, ...), mma(instruction, i, j, k, warps, warps, tiles, tiles), "
                          "tiles(instruction, i, j, k[, kept]), "
                          "rows(r, threads[, warp = n], single barrier, across, spread, ...)")
        self.expect("(")
        if word in ("unroll", "order"):
            fields[word] = self.listed(")", lambda: self.name("an index"))
            return
        if word == "combine":
            fields[word] = self.listed(")", lambda: self.name("a buffer"))
            return
        if word == "stream":
            fields[word] = self.listed(")", lambda: self.name("a view"))
            return
        if word == "first":
            fields[word] = self.listed(")", lambda: self.name("a reduction index"))
            return
        if word == "stitch":
            fields[word] = Stitched(self.listed(")", self.phase))
            return
        if word == "parallel":
            fields["parallel"] = self.name("the index that runs in threads")
        elif word == "vector":
            index = self.name("the vector index")
            self.expect(",")
            dtype = self.dtype()
            self.expect(",")
            fields["vector"] = VectorLoop(index, dtype, self.integer("the lanes"))
        elif word == "folded":
            fields["folded"] = self.name("the contraction that makes the writes")
        elif word == "transpose":
            fields["transpose"] = self.integer("the panel width")
        elif word == "prefetch":
            fields["prefetch"] = self.integer("the prefetch distance")
        elif word == "next_row":
            view = self.name("the prefetched view")
            self.expect(",")
            index = self.name("the row index")
            self.expect(",")
            rows = self.integer("the rows")
            self.expect(",")
            ahead = NextRow(view, index, rows, self.integer("the row stride"))
            fields["next_row"] = fields.get("next_row", ()) + (ahead,)
        elif word == "tensorize":
            name = self.name("the instruction")
            self.expect(",")
            lane = self.name("the lane index")
            self.expect(",")
            reduction = self.name("the reduction index")
            self.expect(",")
            rows = self.integer("the rows of the register tile")
            self.expect(",")
            chains = self.integer("the chains of the register tile")
            kept = self.accept(",")
            if kept:
                self.expect_word("kept")
            fields["tensorize"] = Tensorized(name, lane, reduction, rows, chains, kept)
        elif word == "stage":
            index = self.name("the staged reduction index")
            self.expect(",")
            tile = self.integer("the reduction tile")
            refs: list[str] = []
            pad = 0
            while self.tok.text == ",":
                self.advance()
                if self.tok.text == "pad" and self.peek().text == "=":
                    self.advance()
                    self.expect("=")
                    pad = self.integer("the padding")
                    break
                refs.append(self.name("a staged buffer"))
            fields["stage"] = Staged(index, tile, tuple(refs), pad)
        elif word == "rows":
            index = self.name("the row index")
            self.expect(",")
            threads = self.integer("the work-items")
            warp = self.warp()
            phases: list[RowPhase] = []
            while self.tok.text == ",":
                self.advance()
                phases.append(self.row_phase())
            fields["rows"] = RowGroup(index, threads, tuple(phases), warp)
        elif word == "across":
            index = self.name("the reduction index")
            self.expect(",")
            threads = self.integer("the work-items")
            fields["across"] = Across(index, threads, self.warp())
        elif word == "mma":
            name = self.name("the instruction")
            self.expect(",")
            m_index = self.name("the rows index")
            self.expect(",")
            n_index = self.name("the columns index")
            self.expect(",")
            k_index = self.name("the reduction index")
            self.expect(",")
            counts = [self.integer("the warps along the rows")]
            for what in ("the warps along the columns", "a warp's tiles along the rows",
                         "a warp's tiles along the columns"):
                self.expect(",")
                counts.append(self.integer(what))
            fields["mma"] = WarpTiled(name, m_index, n_index, k_index, *counts)
        elif word == "tiles":
            name = self.name("the instruction")
            loops = []
            for what in ("the rows index", "the columns index", "the reduction index"):
                self.expect(",")
                loops.append(self.name(what))
            kept = self.accept(",")
            if kept:
                self.expect_word("kept")
            fields["tiles"] = Tiled(name, *loops, kept=kept)
        elif word == "boundary":
            fields["boundary"] = self.name("remainders or guarded")
        else:
            gpu.append((self.name("an index"), word))
        self.expect(")")

    def phase(self) -> Phase:
        """`for` or `single`, then `barrier` if the threads wait after the phase."""
        tok = self.tok
        kind = self.name("for or single")
        if kind not in ("for", "single"):
            raise IRError(f"a stitched phase is `for` or `single`, not {kind!r}", tok.loc)
        barrier = self.tok.text == "barrier"
        if barrier:
            self.advance()
        return Phase(kind == "for", barrier)

    def warp(self) -> int:
        """`, warp = n` after a group's work-items, or 0."""
        if self.tok.text != "," or self.peek().text != "warp":
            return 0
        self.advance()
        self.advance()
        self.expect("=")
        return self.integer("the warp's work-items")

    def row_phase(self) -> RowPhase:
        """`single`, or `spread(index)` or `across(index)`, then `barrier` if the group
        waits after it."""
        tok = self.tok
        kind = self.name("single, spread or across")
        if kind not in ROW_PHASE_KINDS:
            raise IRError(f"a row group's phase is one of {', '.join(ROW_PHASE_KINDS)}, not "
                          f"{kind!r}", tok.loc)
        loop = ""
        if kind != "single":
            self.expect("(")
            loop = self.name(f"the index a {kind} phase deals out")
            self.expect(")")
        barrier = self.tok.text == "barrier"
        if barrier:
            self.advance()
        return RowPhase(kind, barrier, loop)

    def comment(self) -> str:
        lines = []
        while self.tok.kind == "comment":
            text = self.advance().text[2:]
            lines.append(text.removeprefix(" "))
        if lines and not self.at_word("block"):
            raise self.error("'block' after a comment",
                             "comments are kept only as the comment of the block that follows")
        return "\n".join(lines)

    def index(self) -> Index:
        name = self.name("an index name")
        size = self.integer("an index range") if self.accept(":") else None
        if self.accept("="):
            return Index(name, 1 if size is None else size, self.affine())
        if size is None:
            raise self.error("':' and a range, or '=' and the value passed in")
        return Index(name, size)

    def constraint(self) -> Affine:
        expr = self.affine()
        self.expect(">=")
        if self.tok.kind != "int" or self.tok.text != "0":
            raise self.error("'0'", "constraints are written `expr >= 0`")
        self.advance()
        return expr

    def refinement(self) -> Refinement:
        direction = self.advance().text
        into = self.name("a refinement name")
        from_ = self.name("the parent's buffer name") if self.accept("<-") else ""
        self.expect("[")
        access = self.listed("]", self.affine)
        dtype = self.dtype()
        self.expect("(")
        dims = self.listed(")", self.dim)
        agg = "assign"
        if self.accept(":"):
            tok = self.tok
            agg = self.name("an aggregation")
            if agg not in AGG_OPS:
                raise IRError(f"unknown aggregation '{agg}'", tok.loc, "one of: " +
                              ", ".join(AGG_OPS))
        location = self.word("location", "a location") if self.tok.kind == "location" else None
        return Refinement(direction, from_, into, access, TensorShape(dtype, dims), agg, location)

    def dim(self) -> Dim:
        size = self.integer("a size")
        self.expect(":")
        return Dim(size, self.integer("a stride"))

    def affine(self) -> Affine:
        terms: dict[str, int] = {}
        const = 0
        sign = -1 if self.accept("-") else 1
        while True:
            if self.tok.kind == "int":
                value = sign * int(self.advance().text)
                if self.accept("*"):
                    name = self.name("an index name after '*'")
                    terms[name] = terms.get(name, 0) + value
                else:
                    const += value
            elif self.tok.kind == "name":
                name = self.advance().text
                terms[name] = terms.get(name, 0) + sign
            else:
                raise self.error("an affine term (integer, index or integer*index)")
            if self.accept("+"):
                sign = 1
            elif self.accept("-"):
                sign = -1
            else:
                return Affine.of(terms, const)

    # -------------------------------------------------------------- statements
    def statement(self) -> Statement:
        if self.tok.kind == "comment" or (self.at_word("block") and self.peek().kind == "name"):
            return self.block()
        if self.at_word("special") and self.peek().kind == "name":
            return self.special()
        if self.tok.kind == "scalar":
            into = self.advance().text
            self.expect("=")
            return self.scalar_definition(into)
        if self.tok.kind == "name" and self.peek().text in ("=", "["):
            ref = self.advance().text
            dynamic = self.listed("]", self.dynamic_offset) if self.accept("[") else ()
            self.expect("=")
            self.expect_word("store")
            self.expect("(")
            value = self.expect_kind("scalar", "a scalar ($name)").text
            self.expect(")")
            return Store(ref, value, dynamic)
        raise self.error("a statement ($x = ..., BUF = store($x), special, block or '}')")

    def scalar_definition(self, into: str) -> Statement:
        op = self.name("load, index, const or an intrinsic")
        self.expect("(")
        if op == "load":
            ref = self.name("a refinement name")
            dynamic = self.listed("]", self.dynamic_offset) if self.accept("[") else ()
            offset = (self.expect_kind("scalar", "a scalar offset ($name)").text
                      if self.accept("+") else None)
            self.expect(")")
            return Load(into, ref, dynamic, offset)
        if op == "index":
            value = self.affine()
            self.expect(")")
            return LoadIndex(into, value)
        if op == "const":
            number = self.number()
            self.expect(",")
            dtype = self.dtype()
            self.expect(")")
            return Constant(into, number, dtype)
        inputs = self.listed(")", lambda: self.expect_kind("scalar", "a scalar ($name)").text)
        self.expect(":")
        return Intrinsic(op, inputs, into, self.dtype())

    def dynamic_offset(self) -> str | None:
        if self.at_word("_"):
            self.advance()
            return None
        return self.expect_kind("scalar", "a scalar offset ($name) or '_'").text

    def number(self) -> int | float | bool:
        negative = self.accept("-")
        tok = self.advance()
        value: int | float | bool
        if tok.kind == "int":
            value = int(tok.text)
        elif tok.kind == "float":
            value = float(tok.text)
        elif tok.kind == "name" and tok.text in _SPECIAL_FLOATS:
            value = _SPECIAL_FLOATS[tok.text]
        elif tok.kind == "name" and tok.text in ("true", "false") and not negative:
            return tok.text == "true"
        else:
            raise IRError(f"expected a number, found {tok}", tok.loc)
        return -value if negative else value

    def special(self) -> Special:
        self.expect_word("special")
        name = self.name("a special's name")
        self.expect("(")
        inputs = self.listed(")", lambda: self.name("an input buffer"))
        self.expect("->")
        self.expect("(")
        outputs = self.listed(")", lambda: self.name("an output buffer"))
        params = self.listed("}", self.special_param) if self.accept("{") else ()
        return Special(name, inputs, outputs, params)

    def special_param(self) -> tuple[str, str]:
        key = self.name("a parameter name")
        self.expect("=")
        return key, json.loads(self.expect_kind("string", 'a quoted value ("...")').text)
