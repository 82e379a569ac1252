"""The compilation cache seen through `polytile.define` (issue 3, "Done when").

Every test has its own cache directory: a `Config` passed to `define(config=...)`
in this process, `POLYTILE_CACHE_DIR` in child processes. Compiler invocations are
counted twice over: by polytile (`compiler_invocations()`, per process) and by a
POLYTILE_CC wrapper script that logs every run of the compiler, whoever starts it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runtime.helpers import logging_compiler

import polytile as pt
from polytile.config import Config
from polytile.errors import OutOfBoundsError, ParseError
from polytile.runtime.toolchain import compiler_invocations

MMB = """
def mmb(float(M,K) A, float(K,N) B, float(N) c) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
  C(m,n) = fmaxf(C(m,n) + c(n), 0)
}
"""

# The same program with every tensor, index, size and the function renamed, names that
# sort in the opposite order, other spacing and a comment: the same cache entry.
MMB_RENAMED = """
# renamed throughout
def z_layer(float(R, Q) zz, float(Q, P) yy, float(P) aa) -> (bb) {
  bb(y, x)  +=!  zz(y, a) * yy(a, x)     # a is the reduction index
  bb(y, x) = fmaxf(bb(y, x) + aa(x), 0)
}
"""

SHAPES = [(7, 13), (13, 37), (37,)]


def mmb_reference(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.maximum(a.astype(np.float64) @ b + c, 0).astype(np.float32)


def inputs(shapes: list[tuple[int, ...]], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.fixture
def cc(tmp_path: Path) -> tuple[Path, Path]:
    found = logging_compiler(tmp_path)
    if found is None:
        pytest.skip("no C compiler on PATH")
    return found


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(cache_dir=tmp_path / "cache")


def cache_entries(cache_dir: Path) -> list[Path]:
    kernels = cache_dir / "kernels"
    return sorted(kernels.iterdir()) if kernels.exists() else []


def log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines()


# ---------------------------------------------------------------- child processes

# A user's process: configured through the environment only; compares the compiled
# result with the interpreter's and prints what it saw.
CHILD = """
import json, sys
import numpy as np
import polytile as pt
from polytile.runtime.toolchain import compiler_invocations

job = json.loads(sys.argv[1])
fn = pt.define(job["source"])[job["function"]]
reference = pt.define(job["source"], backend="interp")[job["function"]]
rng = np.random.default_rng(0)
errors = []
for shapes in job["calls"]:
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got, want = np.asarray(fn(*args), np.float64), np.asarray(reference(*args), np.float64)
    errors.append(float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)))
print(json.dumps({"invocations": compiler_invocations(), "errors": errors}))
"""


def run_child(tmp_path: Path, cache_dir: Path, cc: Path, source: str = MMB,
              function: str = "mmb", calls: list[list[tuple[int, ...]]] | None = None,
              hash_seed: int | None = None) -> dict[str, Any]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("POLYTILE_") and k != "PYTHONHASHSEED"}
    env.update(POLYTILE_CACHE_DIR=str(cache_dir), POLYTILE_CC=str(cc))
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = str(hash_seed)
    job = json.dumps({"source": source, "function": function, "calls": calls or [SHAPES]})
    done = subprocess.run([sys.executable, str(script), job], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert all(e < 1e-5 for e in result["errors"]), result
    return result


def test_second_process_invokes_no_compiler(tmp_path: Path, cc: tuple[Path, Path]) -> None:
    wrapper, log = cc
    cache_dir = tmp_path / "cache"
    first = run_child(tmp_path, cache_dir, wrapper)
    assert first["invocations"] >= 1
    cold = log_lines(log)
    assert any("-shared" in line for line in cold), cold
    second = run_child(tmp_path, cache_dir, wrapper)
    assert second["invocations"] == 0
    assert log_lines(log) == cold, "the warm process ran the compiler"
    assert len(cache_entries(cache_dir)) == 1


def test_renamed_program_hits_the_cache_in_a_fresh_process(tmp_path: Path,
                                                           cc: tuple[Path, Path]) -> None:
    wrapper, log = cc
    cache_dir = tmp_path / "cache"
    run_child(tmp_path, cache_dir, wrapper)
    cold = log_lines(log)
    renamed = run_child(tmp_path, cache_dir, wrapper, MMB_RENAMED, "z_layer")
    assert renamed["invocations"] == 0
    assert log_lines(log) == cold
    assert len(cache_entries(cache_dir)) == 1


SOFTMAX = """
def softmax(float(N,C) X) -> (Y) {
  mx(n) max=! X(n,c)
  e(n,c) = exp(X(n,c) - mx(n))
  s(n) +=! e(n,c)
  Y(n,c) = e(n,c) / s(n)
}
"""


def test_warm_start_does_not_depend_on_the_hash_seed(tmp_path: Path,
                                                     cc: tuple[Path, Path]) -> None:
    """The key hashes the optimized IR, so the passes must print the same IR in every
    process: softmax's three temporaries, localized into the fused row loop, once came
    out in set order, which PYTHONHASHSEED changes (seeds 1 and 3 gave two orders)."""
    wrapper, log = cc
    cache_dir = tmp_path / "cache"
    calls: list[list[tuple[int, ...]]] = [[(5, 13)], [(3, 37)]]
    run_child(tmp_path, cache_dir, wrapper, SOFTMAX, "softmax", calls, hash_seed=1)
    cold = log_lines(log)
    for seed in (3, 4):
        warm = run_child(tmp_path, cache_dir, wrapper, SOFTMAX, "softmax", calls,
                         hash_seed=seed)
        assert warm["invocations"] == 0, f"PYTHONHASHSEED={seed} missed the cache"
    assert log_lines(log) == cold
    assert len(cache_entries(cache_dir)) == 2


def test_truncated_shared_object_is_rebuilt(tmp_path: Path, cc: tuple[Path, Path]) -> None:
    wrapper, log = cc
    cache_dir = tmp_path / "cache"
    run_child(tmp_path, cache_dir, wrapper)
    (entry,) = cache_entries(cache_dir)
    (so,) = entry.glob("*.so")
    # In place: no process has it mapped (it was built and loaded by the child).
    with open(so, "r+b") as f:
        f.truncate(so.stat().st_size // 3)
    before = len(log_lines(log))
    rebuilt = run_child(tmp_path, cache_dir, wrapper)     # checks the result too
    assert rebuilt["invocations"] == 1
    assert len(log_lines(log)) == before + 1
    (entry_after,) = cache_entries(cache_dir)
    (so_after,) = entry_after.glob("*.so")
    assert so_after != so and not so.exists()
    # And the rebuilt entry is good: the next process loads it without compiling.
    assert run_child(tmp_path, cache_dir, wrapper)["invocations"] == 0


# ---------------------------------------------------------------- in this process

def test_renamings_hit_the_same_entry(config: Config) -> None:
    args = inputs(SHAPES)
    want = mmb_reference(*args)
    np.testing.assert_allclose(pt.define(MMB, config=config).mmb(*args), want, rtol=1e-5,
                               atol=1e-5)
    (entry,) = cache_entries(config.cache_dir)
    before = compiler_invocations()
    variants = [MMB_RENAMED, MMB.replace("mmb", "other"), MMB.replace("k", "kk"),
                MMB.replace("A", "B_").replace("B", "A").replace("A_", "B")]
    for source in variants:
        module = pt.define(source, config=config)
        (fn,) = (module[f.name] for f in module.program.functions)
        np.testing.assert_allclose(fn(*args), want, rtol=1e-5, atol=1e-5)
    assert compiler_invocations() == before
    assert cache_entries(config.cache_dir) == [entry]


def test_different_shapes_miss_and_old_shapes_still_hit(config: Config) -> None:
    fn = pt.define(MMB, config=config).mmb
    small = inputs(SHAPES)
    fn(*small)
    before = compiler_invocations()
    for k, shapes in enumerate(([(7, 13), (13, 36), (36,)], [(1, 13), (13, 37), (37,)],
                                [(7, 14), (14, 37), (37,)])):
        args = inputs(shapes, k)
        np.testing.assert_allclose(fn(*args), mmb_reference(*args), rtol=1e-5, atol=1e-5)
        assert compiler_invocations() == before + k + 1, shapes
    assert len(cache_entries(config.cache_dir)) == 4
    # A new define of the first shapes is answered from the cache.
    np.testing.assert_allclose(pt.define(MMB, config=config).mmb(*small), mmb_reference(*small),
                               rtol=1e-5, atol=1e-5)
    assert compiler_invocations() == before + 3


GATHER = """
def lookup(float(E,D) table, int32(B,L) idx) -> (out) {
  out(b,d) +=! table(idx(b,l), d)
}
"""


def test_out_of_range_gather_raises_and_the_kernel_keeps_working(config: Config) -> None:
    fn = pt.define(GATHER, config=config).lookup
    rng = np.random.default_rng(1)
    table = rng.standard_normal((11, 37)).astype(np.float32)
    good = rng.integers(0, 11, (5, 3)).astype(np.int32)

    def want(idx: np.ndarray) -> np.ndarray:
        return table.astype(np.float64)[idx].sum(axis=1).astype(np.float32)

    for bad_value in (11, -1, 2**31 - 1):
        bad = good.copy()
        bad[3, 2] = bad_value
        # The first call of a shape takes the checked path, later calls the fast path.
        for _ in range(2):
            with pytest.raises(OutOfBoundsError) as info:
                fn(table, bad)
            assert isinstance(info.value, pt.PolytileError)
            assert "table" in info.value.message and str(bad_value) in info.value.message
            np.testing.assert_allclose(fn(table, good), want(good), rtol=1e-5)
    out = np.full((5, 37), 9.0, np.float32)
    bad = good.copy()
    bad[0, 0] = 12
    with pytest.raises(OutOfBoundsError):
        fn(table, bad, out=out)
    np.testing.assert_allclose(fn(table, good, out=out), want(good), rtol=1e-5)


# ---------------------------------------------------------------- no TC name reaches C

# Names the TC lexer accepts that mean something to C, to the C preprocessor, to the
# generated code's own vocabulary (args, err, polytile_kernel, pt_*), or to the
# alpha-renaming (p0, o0, i0, t0, kernel), and a comment that tries to end a C comment.
ADVERSARIAL = """
# */ #include <evil.h> /*
def __attribute__(float(N,M) int, float(M) restrict, int32(K) system, float s0)
    -> (p0, return, o0) {
  p0(for, while) = int(for, while) * restrict(while) + system(0) * s0   # */ abort(); /*
  return(for) +=! p0(for, if) * 2
  o0(i0) max=! int(i0, t0)
  args(t0) = restrict(t0) + 1
  err(i0) +=! args(kernel) * int(i0, kernel)
  return(i0) = return(i0) + err(i0)
}
"""

BLAND = """
def f(float(N,M) a, float(M) b, int32(K) c, float d) -> (x, y, z) {
  x(i, j) = a(i, j) * b(j) + c(0) * d
  y(i) +=! x(i, j) * 2
  z(i) max=! a(i, j)
  u(j) = b(j) + 1
  v(i) +=! u(j) * a(i, j)
  y(i) = y(i) + v(i)
}
"""

TC_NAMES = ("__attribute__", "int", "restrict", "system", "s0", "p0", "return", "o0",
            "for", "while", "if", "i0", "t0", "args", "err", "kernel", "evil", "abort")
C_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def c_code_without_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", text)


def test_no_tc_name_reaches_the_generated_c(tmp_path: Path) -> None:
    sizes = [(3, 5), (5,), (2,)]
    a, b = inputs(sizes[:2])
    c = np.array([4, -1], np.int32)
    texts = []
    for k, source in enumerate((ADVERSARIAL, BLAND)):
        config = Config(cache_dir=tmp_path / f"cache{k}")
        module = pt.define(source, config=config)
        fn = module[module.program.functions[0].name]
        x, y, z = fn(a, b, c, np.float32(0.5))
        want_x = a * b + 4 * np.float32(0.5)
        np.testing.assert_allclose(x, want_x, rtol=1e-6)
        np.testing.assert_allclose(
            y, 2 * want_x.sum(1) + (a * (b + 1)).sum(1), rtol=1e-5)
        np.testing.assert_array_equal(z, a.max(1))
        (entry,) = cache_entries(config.cache_dir)
        texts.append((entry / "kernel.c").read_text())
    adversarial, bland = texts
    # Alpha-renaming happens before lowering: the C is the same text whatever the names.
    assert adversarial == bland
    code_words = set(C_WORD.findall(c_code_without_comments(adversarial)))
    vocabulary = set(C_WORD.findall(c_code_without_comments(bland)))
    assert not (set(TC_NAMES) & code_words) - vocabulary
    assert "evil" not in adversarial and "abort" not in adversarial


@pytest.mark.parametrize("name", ["a*/b", "a/*b", "x\\ny", "é", "ab٣", "x²"])
def test_names_the_lexer_refuses(name: str) -> None:
    """Only [_A-Za-z0-9] names exist in TC, so nothing that ends a C comment or a line
    can be a name in the first place."""
    with pytest.raises(ParseError):
        pt.define(f"def {name}(float(N) X) -> (Y) {{ Y(i) = X(i) }}", backend="interp")


# ---------------------------------------------------------------- one key in every process

DIGESTS = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
from conformance.programs import CASES
from ir.test_lowered_corpus import TARGETS, case_call, optimized
from polytile.codegen.c import COptions, generate_c
from polytile.ir.printer import format_function

digests = {}
for case in CASES:
    call = case_call(case)
    for target in TARGETS:
        ir = optimized(call, target)
        text = format_function(ir) + generate_c(ir, COptions(symbol="polytile_kernel")).text
        digests[f"{case.name} on {target}"] = hashlib.sha256(text.encode()).hexdigest()
print(json.dumps(digests))
"""


def test_optimized_ir_and_c_are_the_same_in_every_process(tmp_path: Path) -> None:
    """What the cache key hashes (the optimized IR) and what it stores (the C) must not
    depend on the process: no iteration over sets or dicts keyed by id() in the passes
    or the code generator. Two processes with other hash seeds, every corpus program,
    every target. (Seeds 1 and 2 gave conv2d's micro-kernel its unrolled copies in two
    orders while the unrolled indices were a frozenset of string tags.)"""
    script = tmp_path / "digests.py"
    script.write_text(DIGESTS)
    tests_dir = str(Path(__file__).resolve().parent)
    children = []
    for seed in (1, 2):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        env.update(PYTHONHASHSEED=str(seed), POLYTILE_CACHE_DIR=str(tmp_path / "cache"))
        children.append(subprocess.Popen([sys.executable, str(script), tests_dir], env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True))
    results = []
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err
        results.append(json.loads(out.splitlines()[-1]))
    first, second = results
    assert len(first) >= 300
    differ = sorted(k for k in first if first[k] != second.get(k))
    assert not differ, differ
