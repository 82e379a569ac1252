"""Source locations and the one error hierarchy that leaves the package.

Every error carries a message, an optional location and an optional hint. Printed,
it names the file, line and column, shows the source line and puts a caret under
the offending text:

    mv.tc:2:14: error: range of k is ambiguous
      C(i) += A(i + k)
                   ^
    hint: add a where clause, e.g. `where k in 0:N`
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    """A named piece of source text; compared by identity so that locations stay cheap."""

    text: str
    name: str = "<string>"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def line(self, number: int) -> str:
        lines = self.text.splitlines()
        return lines[number - 1] if 1 <= number <= len(lines) else ""


@dataclass(frozen=True)
class SourceLoc:
    """1-based line and column of the first character, and the length of the span."""

    line: int
    col: int
    length: int = 1
    source: Source | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        name = self.source.name if self.source is not None else "<string>"
        return f"{name}:{self.line}:{self.col}"

    def excerpt(self) -> str:
        """The source line with a caret under the span, or '' without source text."""
        if self.source is None:
            return ""
        text = self.source.line(self.line).rstrip("\n")
        if not text:
            return ""
        width = max(1, min(self.length, len(text) - self.col + 1))
        return f"  {text}\n  {' ' * (self.col - 1)}{'^' * width}"


def abbreviate(text: str, width: int = 24) -> str:
    """`text` for a message: long ones (a 5,000-digit literal) shortened, with their length."""
    if len(text) <= width:
        return text
    return f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


class PolytileError(Exception):
    """Base of every error polytile raises on purpose."""

    phase = "error"

    def __init__(self, message: str, loc: SourceLoc | None = None, hint: str | None = None):
        self.message = message
        self.loc = loc
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.loc}: " if self.loc is not None else ""
        parts = [f"{head}{self.phase}: {self.message}"]
        if self.loc is not None:
            excerpt = self.loc.excerpt()
            if excerpt:
                parts.append(excerpt)
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class ParseError(PolytileError):
    phase = "parse error"


class NameResolutionError(PolytileError):
    phase = "name error"


class TypeCheckError(PolytileError):
    phase = "type error"


class RangeInferenceError(PolytileError):
    phase = "range inference error"


class OutOfBoundsError(PolytileError):
    """An access that reads or writes outside its tensor (static or at run time)."""

    phase = "out-of-bounds error"


class CausalityError(PolytileError):
    """An in-place update that reads elements written by other iterations (TC §3)."""

    phase = "in-place update error"


class ArgumentError(PolytileError):
    """A call with the wrong number, rank, dtype or sizes of arguments."""

    phase = "argument error"


class IRError(PolytileError):
    """Malformed IR text or IR that breaks the Stripe rules."""

    phase = "IR error"


class BuildError(PolytileError):
    """The C compiler failed; keeps the generated source and the compiler's output."""

    phase = "build error"

    def __init__(self, message: str, source_code: str = "", compiler_output: str = "",
                 hint: str | None = None):
        self.source_code = source_code
        self.compiler_output = compiler_output
        super().__init__(message, None, hint)


class CacheError(PolytileError):
    """A file of the cache directory is not what polytile keeps there, and it cannot
    safely be replaced; the message names the path to delete."""

    phase = "cache error"


class KernelError(PolytileError):
    """A compiled kernel reported a failure at run time (e.g. a gather index out of range)."""

    phase = "kernel error"


class UnsupportedError(PolytileError, NotImplementedError):
    """A construct polytile parses but does not implement yet; the message says which."""

    phase = "not supported"


class PolytileWarning(UserWarning):
    """Base of the warnings polytile gives: something was wrong, and polytile went on
    with a safe choice (the message says which, and how to make it go away)."""


class TuningEntryWarning(PolytileWarning):
    """A stored tuning entry could not be applied; the heuristics were used instead."""
