"""A cursor over a token list, shared by the TC parser and the IR text parser."""
from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from polytile.errors import PolytileError, SourceLoc


class TokenLike(Protocol):
    kind: str          # "eof" ends the list
    text: str
    loc: SourceLoc


T = TypeVar("T", bound=TokenLike)


class TokenCursor(Generic[T]):
    """Position in `tokens` plus the usual recursive-descent helpers; `error_class`
    is the error a syntax error is reported as."""

    error_class: type[PolytileError] = PolytileError

    def __init__(self, tokens: list[T]):
        self.tokens = tokens
        self.pos = 0

    @property
    def tok(self) -> T:
        return self.tokens[self.pos]

    def peek(self, offset: int = 1) -> T:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def advance(self) -> T:
        tok = self.tok
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def at(self, text: str) -> bool:
        return self.tok.kind == "op" and self.tok.text == text

    def at_word(self, word: str) -> bool:
        return self.tok.kind == "name" and self.tok.text == word

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.advance()
            return True
        return False

    def error(self, expected: str, hint: str | None = None) -> Any:
        return self.error_class(f"expected {expected}, found {self.tok}", self.tok.loc, hint)

    def expect(self, text: str, hint: str | None = None) -> T:
        if not self.at(text):
            raise self.error(f"'{text}'", hint)
        return self.advance()

    def expect_kind(self, kind: str, what: str) -> T:
        if self.tok.kind != kind:
            raise self.error(what)
        return self.advance()
