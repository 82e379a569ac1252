"""The documentation's examples run as written: every ```python block of README.md and
docs/*.md, each in a fresh process with its own cache directory (a newcomer's first
minute; issue 11 found the README's first example refused by polytile). A python
block followed directly by a ```text block must print exactly that text, so the
messages the docs show cannot drift from the ones polytile prints."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from polytile import dtypes, errors
from polytile.ir import intrinsics
from polytile.runtime.emulated import cross_problem

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```\n(?:\n?```text\n(.*?)^```)?", re.S | re.M)


def python_blocks() -> list[tuple[str, str, str | None]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in BLOCK.finditer(text):
            line = text[:match.start()].count("\n") + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", match.group(1), match.group(2)))
    return found


BLOCKS = python_blocks()


def test_the_readme_and_every_doc_page_have_examples() -> None:
    names = {name.split(":")[0] for name, _, _ in BLOCKS}
    assert {"README.md", "docs/language.md", "docs/errors.md"} <= names


@pytest.mark.parametrize("name, code, output", BLOCKS, ids=[n for n, _, _ in BLOCKS])
def test_example_runs(name: str, code: str, output: str | None, tmp_path: Path) -> None:
    if re.search(r"^import torch|^import polytile.torch", code, re.M):
        pytest.importorskip("torch", reason="the example uses torch, an optional extra")
    if re.search(r"cluster=", code):
        pytest.importorskip("distributed", reason="the example tunes on a Dask cluster, "
                                                  "the optional cluster extra")
    if "cpu-arm64-dot" in code and cross_problem() is not None:
        pytest.skip(f"the example runs on cpu-arm64-dot, which needs {cross_problem()}")
    env = dict(os.environ, POLYTILE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{name} fails:\n{done.stderr[-2000:]}"
    if output is not None:
        assert done.stdout == output, f"{name} prints something else than the doc shows"


def _section(doc: str, heading: str) -> str:
    text = (ROOT / "docs" / doc).read_text()
    assert f"\n## {heading}\n" in text, f"docs/{doc} has no section '## {heading}'"
    return text.split(f"\n## {heading}\n")[1].split("\n## ")[0]


def test_the_builtin_tables_list_exactly_the_builtins_with_their_arguments() -> None:
    """Every `name(args)` in the first column of the Builtins tables: the names are
    exactly the builtins (aliases included), each with its number of arguments."""
    rows = [line.split("|")[1] for line in _section("language.md", "Builtins").splitlines()
            if line.startswith("| `")]
    listed = [call for cell in rows for call in re.findall(r"`(\w+)\(([^)]*)\)`", cell)]
    assert sorted(name for name, _ in listed) == sorted(intrinsics.BUILTINS)
    for name, params in listed:
        op = intrinsics.BUILTIN_ALIASES.get(name, name)
        assert len(params.split(",")) == intrinsics.OPS[op].arity, name


def test_the_type_list_names_exactly_the_types() -> None:
    paragraph = _section("language.md", "Types and casts").split("Types:")[1].split("\n\n")[0]
    assert set(re.findall(r"`(\w+)`", paragraph)) == set(dtypes.TYPE_NAMES)


def test_every_error_class_has_a_section_with_a_program_that_raises_it() -> None:
    """docs/errors.md has a section per PolytileError class, whose example catches exactly
    that class and shows what it prints (test_example_runs runs it and compares)."""
    classes = [errors.PolytileError]
    for cls in classes:
        classes.extend(c for c in cls.__subclasses__() if c.__module__ == errors.__name__)
    for cls in classes:
        section = _section("errors.md", cls.__name__)
        match = BLOCK.search(section)
        assert match and match.group(2), f"## {cls.__name__}: no python block with its output"
        assert re.search(rf"except (pt\.)?{cls.__name__} as", match.group(1)), cls.__name__
        if cls is errors.PolytileError:    # catches every class: print which one it was
            assert match.group(2).startswith("PolytileError\n")


CONSOLE = re.compile(r"^```console\n(.*?)^```", re.S | re.M)


def console_commands() -> list[tuple[str, str, str]]:
    """(where, command, the output the doc shows, possibly empty) per `$ ` line."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in CONSOLE.finditer(text):
            line = text[:match.start()].count("\n") + 2
            for k, chunk in enumerate(match.group(1).split("$ ")[1:]):
                command, _, shown = chunk.partition("\n")
                found.append((f"{doc.relative_to(ROOT)}:{line}#{k + 1}", command, shown))
    return found


COMMANDS = console_commands()


def test_the_cli_page_has_commands() -> None:
    assert any(where.startswith("docs/cli.md") for where, _, _ in COMMANDS)


@pytest.mark.parametrize("where, command, shown", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_console_example_runs(where: str, command: str, shown: str, tmp_path: Path) -> None:
    words = shlex.split(command)
    assert words[0] == "polytile", f"{where}: console examples run polytile commands"
    env = dict(os.environ, POLYTILE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "polytile", *words[1:]], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{where}: {command}\n{done.stderr[-2000:]}"
    if shown:
        assert done.stdout == shown, f"{where}: {command} prints something else"
