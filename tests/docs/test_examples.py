"""The documentation's examples run as written: every ```python block of README.md and
docs/*.md, each in a fresh process with its own cache directory (a newcomer's first
minute; issue 11 found the README's first example refused by polytile)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for k, match in enumerate(BLOCK.finditer(doc.read_text())):
            line = doc.read_text()[:match.start()].count("\n") + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def test_the_readme_has_examples() -> None:
    assert any(name.startswith("README.md") for name, _ in python_blocks())


@pytest.mark.parametrize("name, code", python_blocks(), ids=[n for n, _ in python_blocks()])
def test_example_runs(name: str, code: str, tmp_path: Path) -> None:
    env = dict(os.environ, POLYTILE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{name} fails:\n{done.stderr[-2000:]}"
