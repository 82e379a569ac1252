"""The fuzzer in CI: a bounded campaign with fixed seeds (hypothesis.seed, no example
database, so every run draws the same cases) finds nothing; and the fuzzer's own parts
report what they should."""
from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import sys
import time

import numpy as np
import pytest

import polytile as pt
from polytile.config import load_config
from polytile.fuzz import require_hypothesis
from polytile.fuzz.__main__ import main
from polytile.fuzz.mutations import corpus, default_corpus_paths
from polytile.fuzz.oracle import (
    TOLERANCE,
    Outcome,
    check_compiled,
    check_front_end,
    check_gradient,
    difference,
    narrowest_tolerance,
    overflowed,
)
from polytile.fuzz.runner import Campaign, Failure, isolated, run
from polytile.lang.parser import parse
from polytile.sema.analyze import analyze


@pytest.fixture
def config(tmp_path):
    return dataclasses.replace(load_config(), cache_dir=tmp_path / "cache", ignore_tuned=True)


@pytest.mark.parametrize("cases, compile_cases", [
    (600, 15), pytest.param(1500, 80, marks=pytest.mark.slow)])   # 45 s on a Zen 3 EPYC
def test_a_bounded_campaign_finds_nothing(config, cases, compile_cases):
    programs = tuple(corpus(default_corpus_paths()))
    report = run(Campaign(cases=cases, compile_cases=compile_cases, seed=0, corpus=programs,
                          config=config))
    assert report.ok, "\n\n".join(f.reproducer() for f in report.failures)
    assert sum(report.front_end.values()) == cases
    assert report.front_end["accepted"] >= cases // 5
    assert report.front_end["rejected"] >= cases // 5
    assert sum(report.compiled.values()) == compile_cases
    assert report.compiled["compared"] >= compile_cases * 5 // 8


def test_the_corpus_holds_the_paper_and_the_conformance_programs():
    programs = corpus(default_corpus_paths())
    names = {p.split("(")[0].split()[-1] for p in programs}
    assert {"sgemm", "fcrelu", "2LUT", "conv2d", "bmm", "kron", "sqdist"} <= names
    assert len(programs) >= 100


def test_the_front_end_oracle_flags_a_non_polytile_exception(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("boom")
    monkeypatch.setattr(pt, "define", broken)
    outcome = check_front_end("def f(float(N) A) -> (B) { B(i) = A(i) }")
    assert outcome.kind == "error" and "ValueError: boom" in outcome.detail


def test_the_front_end_oracle_accepts_and_rejects():
    assert check_front_end("def f(float(N) A) -> (B) { B(i) = A(i) }") == Outcome("accepted")
    assert check_front_end("def f(float(N) A) -> (B) { B(i) = }") == \
        Outcome("rejected", "ParseError")


def test_the_compile_oracle_compares_and_sees_errors_in_both_backends(config):
    good = "def f(float(N) A, int32(N) X) -> (B) { B(i) = A(X(i)) * 2 }"
    assert check_compiled(good, seed=1, config=config).kind == "compared"
    # Indices from data out of range: both backends raise, which is agreement.
    bad = "def f(float(N) A, int32(N) X) -> (B) { B(i) = A(X(i) + 100) }"
    assert check_compiled(bad, seed=1, config=config) == Outcome("raised", "OutOfBoundsError")


def test_difference_is_exact_for_integers_and_tolerant_for_floats():
    assert difference(np.array([1, 2]), np.array([1, 2])) == ""
    assert "first at (1,)" in difference(np.array([1, 3]), np.array([1, 2]))
    x = np.array([1.0, np.nan, np.inf], np.float32)
    assert difference(x + np.float32(1e-6), x) == ""
    assert difference(x * np.float32(1.01), x) != ""
    assert difference(np.array([np.nan], np.float32), np.array([1.0], np.float32)) != ""
    assert difference(np.array([-np.inf], np.float32), np.array([np.inf], np.float32)) != ""


def test_a_float64_result_of_float32_math_is_compared_to_float32_tolerance(config):
    """The fuzzer's seed 13 find: `expf` of a bool is float32 (libm's e rounds
    correctly, NumPy's float32 exp is an ulp above), times a float64 tensor; the
    output is float64 but carries float32's error, so float64's tolerance would
    report a mismatch that no backend can avoid."""
    source = ("def f(int64 s, float f, float() A, double(N) B, float() C, int32(K) X) -> (O, P) {\n"
              "  O() min= expf(A() && C()) * B(i)\n  P() = A() where v = B(0)\n}\n")
    fn = analyze(parse(source)).functions[0]
    assert narrowest_tolerance(fn) == TOLERANCE["float32"]
    plain = analyze(parse("def f(double(N) B) -> (O) { O(i) = B(i) * 2 }")).functions[0]
    assert narrowest_tolerance(plain) == TOLERANCE["float64"]
    assert check_compiled(source, seed=3, config=config).kind == "compared"
    wide = np.array([-4.0774229764938354])
    assert difference(np.array([-4.077422618865967]), wide) != ""
    assert difference(np.array([-4.077422618865967]), wide, TOLERANCE["float32"]) == ""


def test_a_reduction_that_overflows_in_one_order_only_is_not_a_mismatch(config):
    """The fuzzer's seed 14 find: O is 0, then O *= six int32 values near 2^30 as
    floats. The compiled code multiplies them into O one at a time (0 stays 0); the
    reference takes their product first (inf) and then 0 * inf = NaN. Reductions run in
    any order, so both are right; agreement everywhere else is still required."""
    source = ("def f(int64 s, int32(M, M, M) A) -> (float() O) {\n"
              "  O() = fmod(A(1, 1, 0), A(1, 0, 1)) >= (A(0, 0, 0) >= A(0, 1, 0)) >= 1.5"
              " where v = A(1, 1, 1)\n"
              "  O() *= A(l, j, 2 * l)\n  O() += 7\n  O() *= float(A(j + j, 2 * j, j))\n}\n")
    outcome = check_compiled(source, seed=19, config=config)
    assert outcome.kind == "overflowed" and "expected np.float32(nan)" in outcome.detail
    # Without a float reduction, a NaN against a finite value stays a mismatch.
    plain = analyze(parse("def f(float(N) A) -> (B) { B(i) = A(i) * 2 }")).functions[0]
    nan, one = np.array([np.nan], np.float32), np.array([1.0], np.float32)
    assert not overflowed(plain, (nan,), (one,), 0.0)
    product = analyze(parse("def f(float(N) A) -> (B) { B() *=! A(i) }")).functions[0]
    assert overflowed(product, (nan,), (one,), 0.0)
    assert not overflowed(product, (np.array([1.0, 2.0], np.float32),),
                           (np.array([np.nan, 3.0], np.float32),), 0.0)


def test_isolation_counts_a_crash_and_a_timeout():
    def segfault() -> Outcome:
        faulthandler.disable()     # pytest's handler would print the child's stack
        os.kill(os.getpid(), signal.SIGSEGV)
        return Outcome("compared")
    assert isolated(segfault, 30) == Outcome("crash", "killed by SIGSEGV")

    def slow() -> Outcome:
        time.sleep(30)
        return Outcome("compared")
    assert isolated(slow, 0.5).kind == "timeout"
    assert isolated(lambda: Outcome("compared"), 30) == Outcome("compared")


def test_a_failure_file_replays(tmp_path, capsys):
    failure = Failure("compile", "mismatch",
                      "def f(float(N) A) -> (B) {\n  B(i) = A(i) * 2\n}\n", 5, "what was seen")
    path = tmp_path / "case.tc"
    path.write_text(failure.reproducer())
    assert main(["--replay", str(path)]) == 0
    assert "compile (seed 5): compared" in capsys.readouterr().out


def test_a_failure_on_another_target_replays_on_it(tmp_path, monkeypatch, capsys):
    failure = Failure("compile", "mismatch",
                      "def f(float(N) A) -> (B) {\n  B(i) = A(i) * 2\n}\n", 5, "seen",
                      target="cpu-generic")
    text = failure.reproducer()
    assert text.startswith("# polytile.fuzz compile mismatch seed=5 target=cpu-generic\n")
    path = tmp_path / "case.tc"
    path.write_text(text)
    targets = []
    from polytile.fuzz import oracle
    real = oracle.check_compiled

    def spy(source, seed, config=None, options=None):
        targets.append(config.target)
        return real(source, seed, config, options)
    monkeypatch.setattr(oracle, "check_compiled", spy)
    assert main(["--replay", str(path)]) == 0
    assert targets == ["cpu-generic"]
    assert "compile (seed 5): compared" in capsys.readouterr().out
    # a target of the command line takes the place of the file's
    assert main(["--replay", str(path), "--target", "cpu-avx2"]) == 0
    assert targets[-1] == "cpu-avx2"
    # An unknown or unusable target stops the command before any case runs.
    assert main(["--target", "no-such-target", "--cases", "1"]) == 2
    assert "unknown target" in capsys.readouterr().err


def test_pass_options_reach_the_compiled_side_and_replay(tmp_path, monkeypatch, capsys):
    failure = Failure("compile", "mismatch", "def f(float(N,M) A) -> (B) {\n"
                      "  B(i) +=! A(i,j)\n  B(i) = B(i) * 2\n}\n", 5, "seen",
                      options=(("fuse.strategy", "none"),))
    text = failure.reproducer()
    assert '# options: {"fuse.strategy": "none"}' in text
    path = tmp_path / "case.tc"
    path.write_text(text)
    seen = []
    from polytile.fuzz import oracle
    real = oracle.check_compiled

    def spy(source, seed, config=None, options=None):
        seen.append(options)
        return real(source, seed, config, options)
    monkeypatch.setattr(oracle, "check_compiled", spy)
    assert main(["--replay", str(path)]) == 0
    assert seen == [{"fuse.strategy": "none"}]
    assert "compile (seed 5): compared" in capsys.readouterr().out
    # an option of the command line takes the place of the file's, the others stay
    assert main(["--replay", str(path), "--option", "fuse.strategy=max",
                 "--option", "pack.enabled=false"]) == 0
    assert seen[-1] == {"fuse.strategy": "max", "pack.enabled": False}
    # options are checked against the target before any case runs
    for bad in ("fuse.strategy=sideways", "fuse", "nosuchpass.x=1"):
        assert main(["--option", bad, "--cases", "1"]) == 2
        assert capsys.readouterr().err


# Forward programs the gradient campaigns drew whose derived programs the front end
# rejected: an index the adjoint term does not use (i), a bound of three sizes, and the
# count of an unused index bounded by three sizes (a value: min(M, N + 1, N - s)).
GRADIENT_FINDS = (
    ("def f(float(3, N) A, uint8(K) B) -> (O, P) {\n"
     "  O(k, l, j) +=! A(B(l - 1), 2 * j) + B(i) where k in 0:3\n  P() +=! A(1, 0)\n}\n"),
    ("def f(bool(N, K) B, float(K) C, double(M) A) -> (float() O, P) {\n"
     "  O() +=! A(l) where v = C(l), exists B(l, l)\n  P(i, j) = B(j, i)\n}\n"),
    ("def f(uint8 s, int16(M, N, N) A, double() B) -> (O) {\n"
     "  O() +=! s == B() ? A(j, 2 * k, j) != 1 : 0.5\n"
     "  O() += B() - A(i, i - 1, i + s)\n}\n"),
    # cpu-generic, seed 96: an output first written in part, then min= over part of it.
    ("def f(uint8(N) B, float(N) C, uint8(M, K) A) -> (O) {\n"
     "  O(k) = (1 && C(k - 1)) + ((k > B(0) ? 2 : 3.f) + 3)\n"
     "  O(l) min= C(l) + B(j) + A(k, k)\n}\n"),
)


@pytest.mark.parametrize("source", GRADIENT_FINDS)
def test_the_gradient_oracle_compiles_the_derived_program(source, config):
    assert check_gradient(source, seed=1, config=config).kind == "compared"


def test_a_bfloat16_gradient_sums_in_float32_as_the_reference_does(config):
    """opencl and cpu seed 99: d_A, a bfloat16 sum of 108 terms near 1e7, came out up to
    2x off: the compiled code added each term into the bfloat16 element; it now sums in
    float32 and rounds once, as the reference does (polytile.sema.widen)."""
    source = ("def f(half() B, bfloat16(M) A, int32(M) C, uint8 s) -> (O) {\n"
              "  O(k, j) = j != k where k in 0:M, j in 0:M\n"
              "  O(l, j) *= C(s) + C(i) + A(k) where l in 0:M, j in 0:3\n}\n")
    assert check_gradient(source, seed=9, config=config).kind == "compared"


def test_the_gradient_oracle_skips_programs_without_one_and_replays(tmp_path, capsys,
                                                                    config):
    ints = "def f(int32(N) A) -> (B) { B(i) = A(i) * 2 }"
    assert check_gradient(ints, seed=1, config=config) == Outcome("rejected",
                                                                 "UnsupportedError")
    path = tmp_path / "case.tc"
    path.write_text(Failure("gradient", "mismatch", GRADIENT_FINDS[1], 4, "seen").reproducer())
    assert main(["--replay", str(path)]) == 0
    assert "gradient (seed 4): compared" in capsys.readouterr().out
    assert main(["--cases", "0", "--gradient-cases", "3", "--seed", "1", "--quiet"]) == 0
    assert "gradient: 3 programs with a gradient" in capsys.readouterr().out


def test_the_command_counts_cases(capsys):
    assert main(["--cases", "30", "--seed", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "front end: 30 cases" in out and "0 non-Polytile exceptions" in out


def test_a_missing_hypothesis_gets_a_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    with pytest.raises(pt.PolytileError, match="needs hypothesis") as info:
        require_hypothesis()
    assert "pip install" in (info.value.hint or "")
    assert main(["--cases", "1"]) == 2
    assert "needs hypothesis" in capsys.readouterr().err


# A gradient the opencl campaign drew (seed 93): its staged reduction put a barrier in a
# loop under an always-true work-item guard, and PoCL 3.1's kernel compiler aborted the
# process ("Could not find a dominating alternative variable"). X's random indices leave
# its range, so both sides raise; before the fix the case was a crash.
POCL_ABORT = ("def f(int64(N) X, double(N, N, K) C, float(K) A, double(N, 3) B) -> (O, P) {\n"
              "  O(i, k) min=! 1 - A(j) + B(l, k) where i in 0:3\n  P() max=! A(X(j))\n}\n")


def _fuzz_in_a_process(*args: str):  # type: ignore[no-untyped-def]
    """`python -m polytile.fuzz ARGS` in a process of its own, as a user runs it (this one
    may hold PoCL's threads from other tests, which a forked case would hang on): its
    completed process, which exited 0. Skips where the opencl target cannot run here
    (exit status 2, the reason on stderr)."""
    import subprocess
    done = subprocess.run([sys.executable, "-m", "polytile.fuzz", *args],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode == 2:
        pytest.skip(f"the opencl target cannot run here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_a_staged_reduction_on_pocl_does_not_abort(tmp_path):
    """Replayed in a process of its own, as a user would (`_fuzz_in_a_process`)."""
    path = tmp_path / "case.tc"
    path.write_text(Failure("gradient", "crash", POCL_ABORT, 215588, "SIGABRT",
                            target="opencl").reproducer())
    done = _fuzz_in_a_process("--replay", str(path))
    assert "gradient (seed 215588): raised OutOfBoundsError" in done.stdout


def test_an_opencl_campaign_with_options_runs_its_cases():
    """The options are checked without probing the device in the parent process (whose
    PoCL threads would hang every forked case)."""
    done = _fuzz_in_a_process("--cases", "0", "--compile-cases", "3", "--seed", "4",
                              "--target", "opencl", "--option", "fuse.strategy=rows",
                              "--quiet")
    assert "compile: 3 accepted programs" in done.stdout
    assert "0 timeouts" in done.stdout
