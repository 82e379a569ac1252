"""The documentation's examples run as written: every ```python block of README.md and
docs/*.md, each in a fresh process with its own cache directory (a newcomer's first
minute; issue 11 found the README's first example refused by polytile). A python
block followed directly by a ```text block must print exactly that text, so the
messages the docs show cannot drift from the ones polytile prints."""
from __future__ import annotations

import os
import shlex
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polytile.ir import intrinsics

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
    env = dict(os.environ, POLYTILE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{name} fails:\n{done.stderr[-2000:]}"
    if output is not None:
        assert done.stdout == output, f"{name} prints something else than the doc shows"


def test_the_builtin_table_lists_exactly_the_builtins() -> None:
    section = (ROOT / "docs" / "language.md").read_text().split("## Builtins")[1]
    section = section.split("\n## ")[0]
    listed = set(re.findall(r"`([a-z0-9]+)`", section))
    assert listed == set(intrinsics.BUILTINS)


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
