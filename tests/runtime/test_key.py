from __future__ import annotations

import dataclasses
import re

import pytest

from polytile.runtime.key import CacheKey, polytile_source_hash

KEY = CacheKey(program="p", signature="float32[3]", target="cpu-generic", options="",
               flags=("-O3",), compiler="cc 12")


def test_polytile_source_hash_is_stable_per_process() -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", polytile_source_hash())
    assert KEY.polytile == polytile_source_hash()


def test_digest_is_stable_and_changes_with_every_part() -> None:
    assert KEY.digest() == dataclasses.replace(KEY).digest()
    changes = {"program": "q", "signature": "float32[4]", "target": "cpu-avx2",
               "options": "tile=8", "flags": ("-O2",), "compiler": "cc 13", "polytile": "x"}
    digests = {dataclasses.replace(KEY, **{name: value}).digest()  # type: ignore[arg-type]
               for name, value in changes.items()}
    assert len(digests) == len(changes) and KEY.digest() not in digests


def test_parts_do_not_run_together() -> None:
    a = dataclasses.replace(KEY, program="ab", signature="c")
    b = dataclasses.replace(KEY, program="a", signature="bc")
    assert a.digest() != b.digest()


def test_explain_names_the_differing_parts() -> None:
    other = dataclasses.replace(KEY, signature="float32[4]", flags=("-O2",))
    assert [line.split(":")[0] for line in KEY.explain(other)] == ["signature", "flags"]
    assert KEY.explain(KEY) == []


def test_parts_must_be_strings() -> None:
    with pytest.raises(TypeError, match="flags"):
        dataclasses.replace(KEY, flags=["-O3"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options"):
        dataclasses.replace(KEY, options={"tile": 8})  # type: ignore[arg-type]
