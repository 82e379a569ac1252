"""The tuner's progress line on stderr: generation, candidates, best time, speedup.

    tmm float32[1024,1024] ...: gen 3 | 41 candidates, 2 rejected | best 61.2 ms, 1.79x over default 109.7 ms | 58 s left

On a terminal the line is rewritten after every candidate; otherwise one line is
printed per generation, so logs stay readable.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


def format_seconds(seconds: float | None) -> str:
    if seconds is None or math.isinf(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


@dataclass
class Progress:
    label: str
    deadline: float
    enabled: bool = True
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    generation: int = 0
    candidates: int = 0
    rejected: int = 0
    best: float = math.inf
    default: float | None = None

    def candidate(self, seconds: float | None) -> None:
        self.candidates += 1
        if seconds is None:
            self.rejected += 1
        else:
            self.best = min(self.best, seconds)
        if self._tty():
            self._write("\r" + self.line() + "\x1b[K")

    def note(self, text: str) -> None:
        """A line of its own, e.g. a cluster worker skipped for its hardware."""
        self._write(f"{self.label}: {text}\n")

    def end_generation(self, generation: int) -> None:
        self.generation = generation
        self._write(("\r" if self._tty() else "") + self.line() + ("\x1b[K" if self._tty()
                                                                   else "") + "\n")

    def line(self) -> str:
        left = max(0.0, self.deadline - time.monotonic())
        speedup = ""
        if self.default and not math.isinf(self.best):
            speedup = (f", {self.default / self.best:.2f}x over default "
                       f"{format_seconds(self.default)}")
        return (f"{self.label}: gen {self.generation} | {self.candidates} candidates, "
                f"{self.rejected} rejected | best {format_seconds(self.best)}{speedup} | "
                f"{left:.0f} s left")

    def _tty(self) -> bool:
        return self.enabled and self.stream.isatty()

    def _write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()
