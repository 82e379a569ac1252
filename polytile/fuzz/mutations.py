"""The corpus of real TC programs and a hypothesis strategy that mutates them.

    corpus(paths)   -> list[str]                  every `def` found in .tc and .py files
    mutants(corpus) -> SearchStrategy[str]        1-4 mutations of one corpus program

Mutations work on characters (delete, insert, duplicate, swap, replace; the inserted
characters are TC's punctuation, digits, letters and now and then any code point) and
on tokens (delete, duplicate, swap, replace with a token of the program or a TC
keyword, type or builtin), and splice a line of another program in. Most mutants are
malformed, which is the point: the front end must reject each with a PolytileError.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from hypothesis import strategies as st

# A `def` whose body holds no braces: how TC functions look in .tc files and in the
# Python sources that embed them.
_DEF = re.compile(r"def\s+\w+\s*\([^{}]*?\)\s*->\s*\([^{}]*?\)\s*\{[^{}]*\}")
_TOKEN = re.compile(r"[A-Za-z0-9_.]+|\+=!|\*=!|->|==|!=|<=|>=|&&|\|\||\+=|\*=|\S")
_ALPHABET = "(){},:;?!+-*/%<>=&|.#\n \t0123456789eEfxXijkNMABO_"
_WORDS = ("def", "where", "in", "exists", "float", "int32", "double", "half", "bool",
          "uint8", "int64", "bfloat16", "exp", "fmaxf", "max=", "min=!", "+=!", "*=", "0:N",
          "1e400", "0x", "18446744073709551616", "A.9", "?", ":", "(", ")", ",")


def corpus(paths: Iterable[Path]) -> list[str]:
    """Every TC function in the files (`.tc` files and Python sources that embed TC)."""
    found: dict[str, None] = {}
    for path in paths:
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for file in files:
            if file.suffix in (".tc", ".py") and file.is_file():
                for match in _DEF.finditer(file.read_text(errors="replace")):
                    found.setdefault(match.group())
    return list(found)


def default_corpus_paths() -> list[Path]:
    """The paper's programs and the conformance corpus of a source checkout (when this
    package sits in one), and the benchmark workloads that ship with polytile."""
    package = Path(__file__).resolve().parents[1]
    tests = package.parent / "tests"
    return [p for p in (tests / "paper", tests / "conformance" / "programs.py",
                        package / "bench") if p.exists()]


def _mutate(draw: st.DrawFn, text: str, others: list[str]) -> str:
    kind = draw(st.integers(0, 9))
    n = len(text)
    at = draw(st.integers(0, n))
    if kind == 0:                                    # delete a few characters
        return text[:at] + text[at + draw(st.integers(1, 3)):]
    if kind == 1:                                    # insert characters
        if draw(st.integers(0, 9)) == 0:
            chars = chr(draw(st.integers(0, 0x10FFFF).filter(lambda c: not 0xD800 <= c < 0xE000)))
        else:
            chars = "".join(draw(st.lists(st.sampled_from(_ALPHABET), min_size=1, max_size=3)))
        return text[:at] + chars + text[at:]
    if kind == 2:                                    # duplicate a span
        end = min(n, at + draw(st.integers(1, 12)))
        return text[:end] + text[at:end] + text[end:]
    if kind == 3 and n >= 2:                         # swap two characters
        a, b = sorted((min(at, n - 1), draw(st.integers(0, n - 1))))
        return text[:a] + text[b] + text[a + 1:b] + text[a] + text[b + 1:]
    if kind == 4 and others:                         # splice in a line of another program
        lines = draw(st.sampled_from(others)).splitlines()
        line = draw(st.sampled_from(lines))
        cut = text.rfind("\n", 0, at) + 1
        return text[:cut] + line + "\n" + text[cut:]
    tokens = [m.span() for m in _TOKEN.finditer(text)]
    if not tokens:
        return text
    k = draw(st.integers(0, len(tokens) - 1))
    start, end = tokens[k]
    if kind == 5:                                    # delete a token
        return text[:start] + text[end:]
    if kind == 6:                                    # duplicate a token
        return text[:end] + " " + text[start:end] + text[end:]
    if kind == 7:                                    # swap two tokens
        k2 = draw(st.integers(0, len(tokens) - 1))
        (s1, e1), (s2, e2) = sorted((tokens[k], tokens[k2]))
        if s2 < e1:
            return text
        return text[:s1] + text[s2:e2] + text[e1:s2] + text[s1:e1] + text[e2:]
    spans = [text[s:e] for s, e in tokens]
    word = draw(st.sampled_from(spans + list(_WORDS)))
    return text[:start] + word + text[end:]           # replace a token


def mutants(programs: list[str]) -> st.SearchStrategy[str]:
    """1-4 mutations of a program of `programs` (which must not be empty)."""
    @st.composite
    def mutant(draw: st.DrawFn) -> str:
        text = draw(st.sampled_from(programs))
        for _ in range(draw(st.integers(1, 4))):
            text = _mutate(draw, text, programs)
        return text
    return mutant()
