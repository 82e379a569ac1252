"""Issue 4's memory-bound target, judged on the rows of one run.

    header, lines = memory_bound_targets(rows, peak)

A memory-bound workload meets the target when polytile reaches 0.7 of the measured
bandwidth (the best STREAM figure of the same run) or is faster than torch.compile,
"whichever is weaker": either one suffices. Only rows with fresh outputs are judged,
because torch.compile has no `out=` variant to set against polytile's.
"""
from __future__ import annotations

from collections.abc import Sequence

from polytile.bench.harness import COMPILED, FRESH, Row
from polytile.bench.peak import Peak

BANDWIDTH_FRACTION = 0.7
HEADER: tuple[str, ...] = ("workload", "polytile GB/s", "of bandwidth", "vs compile", "target")


def memory_bound_targets(rows: Sequence[Row], peak: Peak | None
                         ) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """One line per fresh memory-bound row: the two measures and the verdict."""
    lines: list[tuple[str, ...]] = []
    for row in rows:
        if not row.workload.memory_bound or row.variant != FRESH:
            continue
        ours, compiled = row.seconds("polytile"), row.seconds(COMPILED)
        rate = row.workload.bytes / ours / 1e9 if ours else None
        fraction = rate / peak.bandwidth_peak if rate is not None and peak else None
        lines.append((row.label, f"{rate:.1f}" if rate is not None else "",
                      f"{fraction:.2f}" if fraction is not None else "n/a",
                      f"{compiled / ours:.2f}x" if ours and compiled else "n/a",
                      target_verdict(row, fraction)))
    return HEADER, lines


def target_verdict(row: Row, fraction: float | None) -> str:
    status = row.outcomes["polytile"].status
    if status != "ok":
        return f"missed: polytile {status}"
    ours, compiled = row.seconds("polytile"), row.seconds(COMPILED)
    met = []
    if ours and compiled and ours < compiled:
        met.append("faster than torch.compile")
    if fraction is not None and fraction >= BANDWIDTH_FRACTION:
        met.append(f"≥ {BANDWIDTH_FRACTION:g} of bandwidth")
    if met:
        return "met: " + " and ".join(met)
    if compiled is None and fraction is None:
        return "unknown: no torch.compile time and no measured bandwidth"
    return "missed" + (" (no torch.compile time)" if compiled is None else "")
