"""The bench's one table, as aligned text for the terminal and as markdown for RESULTS.md.

    print(throughput_text(rows, peak))
    write_section(Path("benchmarks/RESULTS.md"), "throughput", markdown_text)

Ratios are speedups of polytile: NumPy's time over polytile's, so 2.00x means polytile
takes half the time; "vs compile" holds it against torch.compile. An n/a cell points to
a footnote with its reason (no out= version, failed to compile, ...). The rate is
polytile's, in GFLOP/s (compute-bound workloads) or GB/s of compulsory traffic
(memory-bound ones), and "% peak" holds it against the FMA peak with all cores or the
best STREAM bandwidth measured in the same run.
RESULTS.md is made of sections, each replaced only by the kind of run that wrote it.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polytile.bench.harness import COMPILED, IMPLS, Outcome, Row
from polytile.bench.latency import DispatchResult, LatencyRow, median_of
from polytile.bench.peak import Peak
from polytile.bench.targets import BANDWIDTH_FRACTION, memory_bound_targets

HEADER = ("workload", "polytile ms", "NumPy ms", "torch ms", "torch.compile ms", "vs NumPy",
          "vs torch", "vs compile", "rate", "% peak", "check")
_DETAIL_WIDTH = 60
_DISPLAY = {"polytile": "polytile", "numpy": "NumPy", "torch": "torch", COMPILED: COMPILED}
_Notes = dict[tuple[str, str], int]     # (impl, reason it is n/a) -> footnote number
FILE_TITLE = ("# polytile benchmark results\n\n"
              "Written by `polytile bench --write`. Each section below is replaced by the next "
              "run of the kind that wrote it; numbers are same-run medians.\n")


def milliseconds(seconds: float | None) -> str:
    if seconds is None:
        return ""
    ms = seconds * 1e3
    for limit, digits in ((100, 0), (10, 1), (1, 2), (0.01, 3)):
        if ms >= limit:
            return f"{ms:.{digits}f}"
    return f"{ms:.4f}"


def results_table(rows: Sequence[Row], peak: Peak | None, *, detail_width: int | None
                  = _DETAIL_WIDTH) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """HEADER and one line of cells per row; n/a cells point to `na_footnotes(rows)`."""
    notes = _na_notes(rows)
    lines = []
    for row in rows:
        cells = [row.label]
        for impl in IMPLS:
            outcome = row.outcomes[impl]
            cells.append(milliseconds(outcome.timing.median) if outcome.timing
                         else _status_cell(impl, outcome, notes))
        ours = row.seconds("polytile")
        for other in IMPLS[1:]:
            theirs = row.seconds(other)
            cells.append(f"{theirs / ours:.2f}x" if ours and theirs else "")
        cells.extend(_rate(row, ours, peak))
        cells.append(_check_cell(row, detail_width))
        lines.append(tuple(cells))
    return HEADER, lines


def throughput_text(rows: Sequence[Row], peak: Peak | None) -> str:
    """The results table, its footnotes and the memory-bound target, for the terminal."""
    parts = [format_text(*results_table(rows, peak)), "\n".join(na_footnotes(rows, 150))]
    header, targets = memory_bound_targets(rows, peak)
    if targets:
        parts.append(f"memory-bound target: >= {BANDWIDTH_FRACTION:g} of measured bandwidth "
                     "or faster than torch.compile\n" + format_text(header, targets))
    return "\n\n".join(p for p in parts if p)


def na_footnotes(rows: Sequence[Row], width: int) -> list[str]:
    """One line per distinct n/a reason: "[1] torch: no out= version in torch eager"."""
    return [f"[{number}] {_DISPLAY[impl]}: {_squeezed(reason, width)}"
            for (impl, reason), number in _na_notes(rows).items()]


def _na_notes(rows: Sequence[Row]) -> _Notes:
    notes: _Notes = {}
    for row in rows:
        for impl in IMPLS:
            outcome = row.outcomes[impl]
            if outcome.status == "n/a" and outcome.detail:
                notes.setdefault((impl, outcome.detail), len(notes) + 1)
    return notes


def _status_cell(impl: str, outcome: Outcome, notes: _Notes) -> str:
    number = notes.get((impl, outcome.detail))
    return f"{outcome.status} [{number}]" if outcome.status == "n/a" and number else outcome.status


def _squeezed(text: str, width: int) -> str:
    """All of an error on one line (torch's first line often only names the backend)."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 3] + "..."


def _rate(row: Row, seconds: float | None, peak: Peak | None) -> tuple[str, str]:
    if not seconds:
        return "", ""
    w = row.workload
    if w.memory_bound:
        rate = w.bytes / seconds / 1e9
        of_peak = peak.bandwidth_peak if peak else None
        text = f"{rate:.1f} GB/s"
    else:
        rate = w.flops / seconds / 1e9
        of_peak = peak.flops_peak if peak else None
        text = f"{rate:.1f} GFLOP/s"
    return text, (f"{100 * rate / of_peak:.0f}%" if of_peak else "n/a")


def _check_cell(row: Row, width: int | None) -> str:
    ours = row.outcomes["polytile"]
    text = ours.status if not ours.detail else f"{ours.status}: {_one_line(ours.detail)}"
    others = [f"{impl} {row.outcomes[impl].status}" for impl in IMPLS[1:]
              if row.outcomes[impl].status in ("WRONG", "FAILED")]
    if others:
        text += " (" + ", ".join(others) + ")"
    if width is not None and len(text) > width:
        text = text[:width - 3] + "..."
    return text


def _one_line(text: str) -> str:
    """The first meaningful line of an error (rendered errors start with the location)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else ""


def format_text(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    numeric = {i for i, h in enumerate(header) if i not in (0, len(header) - 1)}

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(widths[i]) if i in numeric else c.ljust(widths[i])
                         for i, c in enumerate(cells)).rstrip()
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def format_markdown(header: Sequence[str], lines: Sequence[Sequence[str]],
                    text_columns: Sequence[int] = (0, -1)) -> str:
    """A pipe table; columns in `text_columns` are left-aligned, the others right."""
    def fmt(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    left = {i % len(header) for i in text_columns}
    align = ["---" if i in left else "---:" for i in range(len(header))]
    return "\n".join([fmt(header), "| " + " | ".join(align) + " |", *(fmt(x) for x in lines)])


def spread_table(rows: Sequence[Row]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Median and p10-p90 in ms for every implementation, and the number of samples."""
    header = ("workload", *(f"{_DISPLAY[impl]} ms: median [p10–p90] (samples)"
                            for impl in IMPLS))
    notes = _na_notes(rows)
    lines = []
    for row in rows:
        cells = [row.label]
        for impl in IMPLS:
            t = row.outcomes[impl].timing
            cells.append(f"{milliseconds(t.median)} [{milliseconds(t.p10)}–"
                         f"{milliseconds(t.p90)}] ({len(t.samples)})" if t else
                         _status_cell(impl, row.outcomes[impl], notes))
        lines.append(tuple(cells))
    return header, lines


def wrong_rows(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.outcomes["polytile"].status == "WRONG"]


def wrong_banner(rows: Sequence[Row]) -> str:
    """A loud paragraph naming every workload where polytile disagrees with NumPy."""
    bad = wrong_rows(rows)
    if not bad:
        return ""
    lines = [f"!!! WRONG RESULTS: polytile disagrees with NumPy on {len(bad)} workload(s) !!!"]
    lines += [f"  {r.label}: {r.outcomes['polytile'].detail}" for r in bad]
    return "\n".join(lines)


def throughput_markdown(rows: Sequence[Row], peak: Peak | None, peak_error: str | None,
                        facts: dict[str, str], command: str, date: str, title: str,
                        notes: Sequence[str] = ()) -> str:
    out = [f"## {title}", "", f"- date: {date}", f"- command: `{command}`"]
    out += [f"- {note}" for note in notes]
    out += ["", "### Machine", ""] + [f"- {k}: {v}" for k, v in facts.items()]
    out += ["", "### Measured peak", ""]
    out += [f"- {line}" for line in peak.lines()] if peak else [f"- not measured: {peak_error}"]
    banner = wrong_banner(rows)
    if banner:
        out += ["", "### WRONG RESULTS", "", "```", banner, "```"]
    out += ["", "### Results", "", format_markdown(*results_table(rows, peak, detail_width=120)),
            ""]
    out += [f"- {note}" for note in na_footnotes(rows, 400)]
    out += ["", ("Ratios are polytile's speedup (the other's time / polytile's time); rate and % "
            "peak are polytile's: GFLOP/s against the all-core FMA peak, or GB/s of compulsory "
            "traffic (inputs read once, outputs written once) against the best STREAM figure. "
            "Rows marked `out=` write into preallocated outputs; the others allocate them "
            "per call. `check` compares with NumPy: |ours - NumPy| <= atol + rtol·|NumPy| "
            "elementwise, with the tolerances listed under Workloads. torch.compile is "
            "PyTorch's version through `torch.compile` (inductor, default options), compiled "
            "once per workload by a first call that is not timed; its compile time is listed "
            "under Workloads (the first workload's includes inductor's one-time start-up, and "
            "inductor's on-disk cache makes reruns compile faster)."), ""]
    header, targets = memory_bound_targets(rows, peak)
    if targets:
        out += ["### Memory-bound target", "",
                format_markdown(header, targets), "",
                (f"Issue 4: at least {BANDWIDTH_FRACTION:g} of the measured bandwidth (the best "
                 "STREAM figure above) or faster than torch.compile, whichever is weaker. Rows "
                 "with fresh outputs only: torch.compile has no out= variant."), ""]
    out += ["### Spread", "", format_markdown(*spread_table(rows), text_columns=(0,)), ""]
    out += ["### Workloads", ""]
    seen = set()
    for row in rows:
        w = row.workload
        if w.name in seen:
            continue
        seen.add(w.name)
        work = (f"{w.bytes / 1e6:.4g} MB moved" if w.memory_bound
                else f"{w.flops / 1e6:.4g} MFLOP")
        note = f"; {w.note}" if w.note else ""
        compile_seconds = row.outcomes[COMPILED].compile_seconds
        if compile_seconds is not None:
            note += f"; torch.compile took {compile_seconds:.1f} s to compile"
        out.append(f"- {w.name}: `{w.function}` with {w.size_text}; {work}; "
                   f"rtol {w.rtol:g}, atol {w.atol:g}{note}")
    failures = [(r.label, impl, r.outcomes[impl].detail) for r in rows for impl in IMPLS
                if r.outcomes[impl].status in ("FAILED", "WRONG")]
    if failures:
        out += ["", "### Failures in full", ""]
        for label, impl, detail in failures:
            out += [f"{label} ({impl}):", "", "```", detail.rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def write_section(path: Path, name: str, text: str) -> None:
    """Replace section `name` of the markdown file at `path` (or add it); atomic."""
    begin, end = f"<!-- polytile-bench:{name}:begin -->", f"<!-- polytile-bench:{name}:end -->"
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    try:
        current = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = FILE_TITLE
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(current):
        updated = pattern.sub(lambda _: block, current, count=1)
    else:
        updated = current.rstrip() + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(updated, encoding="utf-8")
    os.replace(temp, path)


# ------------------------------------------------------------------ latency
LATENCY_HEADER = ("example", "sizes", "import ms", "probe ms", "define ms", "first call ms",
                  "compiles", "cached: define ms", "cached: first call ms", "cached: compiles",
                  "second call ms", "status")


def latency_table(rows: Sequence[LatencyRow]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Medians over the child processes: cold cache, then warm cache in a fresh process."""
    lines = []
    for row in rows:
        if row.error and not row.warm:
            lines.append((row.example.name, row.example.sizes, *[""] * 9,
                          "FAILED: " + _one_line(row.error)[:_DETAIL_WIDTH]))
            continue

        def ms(records: Sequence[dict[str, Any]], key: str) -> str:
            return milliseconds(median_of(records, key))

        def count(records: Sequence[dict[str, Any]], key: str) -> str:
            values = sorted({r[key] for r in records if key in r})
            return ",".join(str(v) for v in values)
        lines.append((row.example.name, row.example.sizes, ms(row.cold, "import_s"),
                      ms(row.cold, "probe_s"), ms(row.cold, "define_s"),
                      ms(row.cold, "first_call_s"), count(row.cold, "call_compiles"),
                      ms(row.warm, "define_s"), ms(row.warm, "first_call_s"),
                      count(row.warm, "call_compiles"), ms(row.warm, "second_call_s"),
                      "FAILED: " + _one_line(row.error)[:_DETAIL_WIDTH] if row.error else "ok"))
    return LATENCY_HEADER, lines


def dispatch_table(result: DispatchResult) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    header: tuple[str, ...] = ("call (16 float32)", "µs per call", "p10–p90 µs", "vs np.add")
    lines: list[tuple[str, ...]] = []
    for name, seconds in result.seconds.items():
        base = result.seconds["np.add out=" if "out=" in name else "np.add"]
        lo, hi = result.spread[name]
        lines.append((name, f"{seconds * 1e6:.2f}", f"{lo * 1e6:.2f}–{hi * 1e6:.2f}",
                      f"{seconds / base:.1f}x"))
    return header, lines


def latency_markdown(rows: Sequence[LatencyRow], dispatch: DispatchResult,
                     facts: dict[str, str], command: str, date: str,
                     title: str = "Latency") -> str:
    out = [f"## {title}", "", f"- date: {date}", f"- command: `{command}`", "",
           "### Machine", ""] + [f"- {k}: {v}" for k, v in facts.items()]
    out += ["", "### First call and cached call", "", format_markdown(*latency_table(rows)), "",
            ("Each example runs in a new process with a new, empty POLYTILE_CACHE_DIR (`define "
            "ms` = parse + check; `first call ms` = lower + passes + generate C + compile + load "
            "+ run; `compiles` = C compiler runs during that call), then in another new process "
            "on the same, now warm, directory (`cached:` columns; `compiles` there must be 0). "
            "`probe ms` is the one-time probe of the C compiler that a cache directory keeps "
            "after its first use; `import ms` is `import polytile` (NumPy included). Medians "
            "over the processes run."), ""]
    out += ["### Dispatch overhead", ""]
    if dispatch.error:
        out += [f"FAILED: {dispatch.error}"]
    else:
        out += [format_markdown(*dispatch_table(dispatch)), "",
                ("In-process, cached kernel; issue 3 asks for the polytile call to be within "
                 "10x of the NumPy ufunc call.")]
    failures = [r for r in rows if r.error]
    if failures:
        out += ["", "### Failures in full", ""]
        for r in failures:
            out += [f"{r.example.name}:", "", "```", r.error.rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"
