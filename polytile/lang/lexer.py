"""Tokens of TC source.

Identifiers follow Fig. 14 (`[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*`, so `2LUT` is a
name) and numbers follow C. A word starting with a digit is a number when the
number reading is at least as long as the name reading (`1e6` is a number,
`2LUT` a name). Keywords (`def`, `where`, `in`, `exists`) are lexed as names and
recognized by the parser only where the grammar expects them, so a tensor may be
called `in`, as in the paper's fcrelu.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from polytile.errors import ParseError, Source, SourceLoc

_NAME = re.compile(r"[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*")
_NUMBER = re.compile(
    r"0[xX][0-9a-fA-F]+"
    r"|(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?"
)
_SPACE = re.compile(r"(?:[ \t\r\n]+|#[^\n]*)+")
# Longest first. "+=!" is one token; "min=" / "max=" are formed from a name by the lexer.
_PUNCT = ("+=!", "*=!", "->", "==", "!=", "<=", ">=", "&&", "||", "+=", "*=",
          "(", ")", "{", "}", ",", ":", "?", ".", "+", "-", "*", "/", "%", "!",
          "<", ">", "=")


@dataclass(frozen=True)
class Token:
    kind: str            # "name", "number", "op", "eof"
    text: str
    loc: SourceLoc

    def __str__(self) -> str:
        return "end of input" if self.kind == "eof" else f"'{self.text}'"


def tokenize(source: Source) -> list[Token]:
    text = source.text
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0

    def loc_at(start: int, length: int) -> SourceLoc:
        return SourceLoc(line, start - line_start + 1, max(1, length), source)

    while True:
        space = _SPACE.match(text, pos)
        if space:
            chunk = space.group()
            newlines = chunk.count("\n")
            if newlines:
                line += newlines
                line_start = pos + chunk.rfind("\n") + 1
            pos = space.end()
        if pos >= len(text):
            # Point just past the last token, so the error shows a source line and a caret.
            end = (SourceLoc(tokens[-1].loc.line, tokens[-1].loc.col + tokens[-1].loc.length,
                             1, source) if tokens else SourceLoc(1, 1, 1, source))
            tokens.append(Token("eof", "", end))
            return tokens
        ch = text[pos]
        # ASCII only: str.isalnum() is also true for letters like 'é', which no name matches.
        if (ch.isascii() and ch.isalnum()) or ch == "_" or (
                ch == "." and _dot_starts_number(text, pos, tokens)):
            tokens.append(_word(text, pos, loc_at))
            pos += len(tokens[-1].text)
            continue
        for punct in _PUNCT:
            if text.startswith(punct, pos):
                tokens.append(Token("op", punct, loc_at(pos, len(punct))))
                pos += len(punct)
                break
        else:
            raise ParseError(f"unexpected character {ch!r}", loc_at(pos, 1),
                             "TC source uses ASCII names, numbers and C operators")


def _dot_starts_number(text: str, pos: int, tokens: list[Token]) -> bool:
    """`.5` is a number, but in `A.0` the dot selects a dimension."""
    after_name = bool(tokens) and (tokens[-1].kind == "name" or tokens[-1].text == ")")
    return not after_name and pos + 1 < len(text) and text[pos + 1] in "0123456789"


def _word(text: str, pos: int, loc_at) -> Token:  # type: ignore[no-untyped-def]
    name = _NAME.match(text, pos)
    number = _NUMBER.match(text, pos)
    name_len = name.end() - pos if name else 0
    number_len = number.end() - pos if number else 0
    if number_len and number_len >= name_len:
        return Token("number", number.group(), loc_at(pos, number_len))  # type: ignore[union-attr]
    word = name.group()  # type: ignore[union-attr]
    end = pos + len(word)
    if word in ("min", "max") and text.startswith("=", end) and not text.startswith("==", end):
        op = word + ("=!" if text.startswith("=!", end) and not text.startswith("=!=", end)
                     else "=")
        return Token("op", op, loc_at(pos, len(op)))
    return Token("name", word, loc_at(pos, len(word)))
