"""Compile C source text into a shared object with the system compiler.

    build_shared_object(c_text, ("-O3",), toolchain, Path("out/kernel.so"))

writes `out/kernel.c`, runs `cc -O3 -shared -fPIC -o out/.kernel.so.<random>.tmp
out/kernel.c -lm` and renames the result to `out/kernel.so`, so the path never
holds a half-written object. A failure raises BuildError carrying the full source
and the compiler's output; the message quotes only the first error lines.
"""
from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from polytile.errors import BuildError
from polytile.runtime.toolchain import Toolchain, run_compiler

# Generated kernels call exp, tanh, ...; libm must come after the source file.
_LIBS = ("-lm",)
_ERROR_LINE = re.compile(r"\b(error|fatal error)\b", re.IGNORECASE)
_QUOTED_LINES = 5


@dataclass(frozen=True)
class BuildResult:
    so_path: Path
    source_path: Path
    command: tuple[str, ...]
    compiler_output: str   # warnings of a successful build; usually empty
    seconds: float


def build_shared_object(source: str, flags: Sequence[str], toolchain: Toolchain,
                        out_path: Path, *, source_path: Path | None = None,
                        timeout: float = 600.0) -> BuildResult:
    """Compile `source` into the shared object `out_path`.

    The source is written to `source_path` (default: `out_path` with suffix .c)
    first, so compiler messages point at a file one can open.
    """
    source_path = source_path if source_path is not None else out_path.with_suffix(".c")
    source_path.write_text(source, encoding="utf-8")
    temp_out = out_path.with_name(f".{out_path.name}.{secrets.token_hex(4)}.tmp")
    command = (*toolchain.command, *flags, "-shared", "-fPIC", "-o", str(temp_out),
               str(source_path), *_LIBS)
    start = time.perf_counter()
    try:
        result = run_compiler(command[0], command[1:], timeout=timeout)
    except BuildError as e:  # could not run or timed out: add the source we tried
        raise BuildError(e.message, source, e.compiler_output, e.hint) from e
    seconds = time.perf_counter() - start
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        _remove(temp_out)
        raise BuildError(_failure_message(result.returncode, output), source, output,
                         hint=_FAILURE_HINT)
    os.replace(temp_out, out_path)
    return BuildResult(out_path, source_path, command, output, seconds)


_FAILURE_HINT = ("the whole generated source is in BuildError.source_code and the full "
                 "compiler output in BuildError.compiler_output; `polytile show FILE.tc "
                 "--stage c` prints the source, and POLYTILE_KEEP_BUILD_DIRS=1 keeps "
                 "the build directory")


def _failure_message(returncode: int, output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)] or lines
    status = f"exit code {returncode}" if returncode > 0 else f"signal {-returncode}"
    quoted = "\n".join(f"  {line}" for line in errors[:_QUOTED_LINES])
    more = len(errors) - _QUOTED_LINES
    if more > 0:
        quoted += f"\n  ... and {more} more"
    return f"C compiler failed ({status}) on generated code" + (f":\n{quoted}" if quoted else "")


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
