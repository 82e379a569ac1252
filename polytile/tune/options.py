"""One point of the tuning space: every decision the passes take, as one replayable value.

    options = Options(schedules=(("s0", Schedule("i2", 16, (("i0", 4), ("i1", 4)), 1,
                                                 (("i0", 64), ("i1", 128)), True)),),
                      passes=(("fuse.strategy", "rows"),))
    options.text()           # canonical text: database rows, progress output
    options.to_json()        # {"format": 1, "passes": {...}, "schedules": {"s0": {...}}}
    Options.from_json(data)  # the same value back
    options.pass_options()   # what run_pipeline takes: {"fuse.strategy": ..., "autotile.schedules": {...}}

Like tinygrad's list of `Opt`s, an Options value is a decision, not a binary: stored
in the tuning database, it is replayed through the passes of whatever polytile
version reads it. A block it does not name keeps the heuristics' schedule.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from polytile import dtypes
from polytile.errors import ArgumentError
from polytile.passes.pipeline import check_pass_options
from polytile.passes.schedule import Schedule, check_schedule_values
from polytile.targets.target import Target

FORMAT = 1
_SCHEDULE_FIELDS = ("vector", "lanes", "unroll", "vectors", "tiles", "parallel", "order",
                    "prefetch")


@dataclass(frozen=True)
class Options:
    schedules: tuple[tuple[str, Schedule], ...] = ()    # block name -> schedule, sorted
    passes: tuple[tuple[str, Any], ...] = ()            # "pass.param" -> value, sorted

    @staticmethod
    def of(schedules: dict[str, Schedule], passes: dict[str, Any] | None = None) -> Options:
        return Options(tuple(sorted(schedules.items())), tuple(sorted((passes or {}).items())))

    def schedule(self, block: str) -> Schedule | None:
        return dict(self.schedules).get(block)

    def pass_options(self) -> dict[str, Any]:
        """Options for run_pipeline (and Compiler.options)."""
        out: dict[str, Any] = dict(self.passes)
        if self.schedules:
            out["autotile.schedules"] = dict(self.schedules)
        return out

    def check(self, target: Target) -> None:
        """Refuse options that no program could use on `target` (unknown passes or
        parameters, values out of range, vectors wider than its registers). What
        depends on the program (block and index names, each block's element type) is
        checked when the options are applied (polytile.passes.autotile)."""
        check_pass_options(dict(self.passes), target)
        from polytile.passes.autotile import VECTOR_DTYPES
        smallest = min(dtypes.lookup(name).bits for name in VECTOR_DTYPES)  # type: ignore[union-attr]
        widest = max(1, target.vector_bytes * 8 // smallest)
        for name, s in self.schedules:
            check_schedule_values(s, widest, target.name, f"schedule of block {name}")

    def text(self) -> str:
        """Canonical one-line text: equal values, equal text."""
        passes = " ".join(f"{k}={v}" for k, v in self.passes)
        blocks = "; ".join(f"{name}: {s.text()}" for name, s in self.schedules)
        return f"{passes} | {blocks}" if passes else blocks

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "passes": dict(self.passes),
                "schedules": {name: _schedule_json(s) for name, s in self.schedules}}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @staticmethod
    def from_json(data: Any) -> Options:
        """An Options from `to_json` output (or a hand-written entry); ArgumentError
        says what is wrong with it."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError as e:
                raise ArgumentError(f"options are not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ArgumentError("options must be a JSON object with 'schedules' and 'passes'")
        if data.get("format", FORMAT) != FORMAT:
            raise ArgumentError(f"options format {data.get('format')!r} is not supported",
                                hint=f"this polytile reads format {FORMAT}")
        unknown = set(data) - {"format", "passes", "schedules"}
        if unknown:
            raise ArgumentError(f"options have unknown fields {sorted(unknown)}",
                                hint="expected 'schedules' and 'passes'")
        passes = data.get("passes", {})
        schedules = data.get("schedules", {})
        if not isinstance(passes, dict) or not isinstance(schedules, dict):
            raise ArgumentError("'passes' and 'schedules' must be JSON objects")
        for name in passes:
            if "." not in name:
                raise ArgumentError(f"pass option {name!r} must be named 'pass.param'")
        return Options.of({str(k): _schedule_from_json(str(k), v) for k, v in schedules.items()},
                          {str(k): v for k, v in passes.items()})


def _schedule_json(s: Schedule) -> dict[str, Any]:
    out = {"vector": s.vector, "lanes": s.lanes, "vectors": s.vectors,
           "unroll": [[k, v] for k, v in s.unroll], "tiles": [[k, v] for k, v in s.tiles],
           "parallel": s.parallel}
    out = {**out, "order": list(s.order)} if s.order else out
    return {**out, "prefetch": s.prefetch} if s.prefetch else out


def _pairs(block: str, field: str, value: Any) -> tuple[tuple[str, int], ...]:
    items = value.items() if isinstance(value, dict) else value
    try:
        pairs = tuple((str(k), int(v)) for k, v in items)
    except (TypeError, ValueError):
        raise ArgumentError(f"schedule of {block}: {field} must be a list of [index, size] "
                            f"pairs, got {value!r}") from None
    if any(v < 1 for _, v in pairs):
        raise ArgumentError(f"schedule of {block}: {field} sizes must be positive, got {value!r}")
    return pairs


def _schedule_from_json(block: str, data: Any) -> Schedule:
    if not isinstance(data, dict):
        raise ArgumentError(f"schedule of {block} must be a JSON object")
    unknown = set(data) - set(_SCHEDULE_FIELDS)
    if unknown:
        raise ArgumentError(f"schedule of {block} has unknown fields {sorted(unknown)}",
                            hint=f"known fields: {', '.join(_SCHEDULE_FIELDS)}")
    vector = data.get("vector")
    lanes, vectors = data.get("lanes", 1), data.get("vectors", 1)
    if vector is not None and not isinstance(vector, str):
        raise ArgumentError(f"schedule of {block}: vector must be an index name or null")
    if not isinstance(lanes, int) or not isinstance(vectors, int) or lanes < 1 or vectors < 1:
        raise ArgumentError(f"schedule of {block}: lanes and vectors must be positive integers")
    order = data.get("order", [])
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        raise ArgumentError(f"schedule of {block}: order must be a list of index names")
    prefetch = data.get("prefetch", 0)
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
        raise ArgumentError(f"schedule of {block}: prefetch must be a non-negative integer")
    return Schedule(vector, lanes, _pairs(block, "unroll", data.get("unroll", [])), vectors,
                    _pairs(block, "tiles", data.get("tiles", [])),
                    bool(data.get("parallel", True)), tuple(order), prefetch)
