"""Instructions described in TC (polytile/isa, UNIT §III): every description loads; its
meaning (the TC function on the reference interpreter) agrees with an independent NumPy
formula on random full-range operands; its C form compiles on any x86 host with the
description's flags; and where the host has the feature, the instruction computes what
the description says: bit for bit for integers, within an ulp of the larger partial sum
for bfloat16 (the instruction adds its pairs in the other order)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from polytile.cli import main as cli_main
from polytile.codegen.c import print_c
from polytile.errors import IRError, UnsupportedError
from polytile.ir.nodes import Affine
from polytile.isa import Description, descriptions, load_description
from polytile.loops import nodes as L
from polytile.loops.interp import run_kernel
from polytile.runtime.cuda import device_problem
from polytile.runtime.emulated import cross_problem
from polytile.targets.target import host_features

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from c_harness import CC, FLAGS, needs_cc

DESCRIPTIONS = {d.name: d for d in descriptions()}
AMX = sorted(n for n in DESCRIPTIONS if n.endswith("_amx"))
AMX_EMULATION = Path(__file__).with_name("amx_emulation.h")
X86 = sorted(n for n, d in DESCRIPTIONS.items() if "c-x86" in d.definition.forms)
ARM = sorted(n for n, d in DESCRIPTIONS.items() if "c-arm64" in d.definition.forms)
START = Affine.constant(0)
ARM_CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
# The cross compiler without its C library's headers (Debian: libc6-dev-arm64-cross, a
# package it only recommends) cannot build a test program either.
ARM_LIBC = Path("/usr/aarch64-linux-gnu/include/stdio.h").exists()
needs_arm = pytest.mark.skipif(
    ARM_CC is None or QEMU is None or not ARM_LIBC,
    reason="no aarch64-linux-gnu-gcc with its C library, or no qemu-aarch64 (Debian: "
           "gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user; .ci/run installs "
           "them): the Arm instructions are not checked")


def wrap32(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def pairs(x: np.ndarray, lanes: int) -> np.ndarray:
    return x.reshape(lanes, -1).astype(np.int64 if x.dtype.kind in "iu" else np.float64)


def reference(name: str, *x: np.ndarray) -> np.ndarray:
    """What the vendor's manual says each instruction computes, in NumPy."""
    if name.startswith(("vpdpbusd", "sdot")):
        acc, a, b = x
        return wrap32(acc.astype(np.int64) + (pairs(a, len(acc)) * pairs(b, len(acc))).sum(1))
    if name.startswith("udot"):
        acc, a, b = x
        total = acc.astype(np.int64) + (pairs(a, len(acc)) * pairs(b, len(acc))).sum(1)
        return (total % 2**32).astype(np.uint32)
    if name.startswith("vpmaddwd"):
        a, b = x
        lanes = len(a) // 2
        return wrap32((pairs(a, lanes) * pairs(b, lanes)).sum(1))
    if name.startswith("vdpbf16ps"):
        acc, a, b = x
        return acc.astype(np.float64) + (pairs(a, len(acc)) * pairs(b, len(acc))).sum(1)
    if name.startswith("mma_"):     # Tensor Cores: d (16 x 8) = acc + a (16 x K) b (8 x K)^T
        acc, a, b = x
        kind = np.int64 if a.dtype.kind in "iu" else np.float64
        k = len(a) // 16
        total = (acc.reshape(16, 8).astype(kind)
                 + a.reshape(16, k).astype(kind) @ b.reshape(8, k).astype(kind).T)
        return (wrap32(total) if kind is np.int64 else total).reshape(-1)
    # AMX: C (16 x 16) += A (16 rows of G groups) times B (G rows of 16 column groups)
    acc, a, b = x
    group = len(a) // 256
    a3 = a.reshape(16, 16, group).astype(np.int64 if a.dtype.kind in "iu" else np.float64)
    b3 = b.reshape(16, 16, group).astype(a3.dtype)
    total = acc.reshape(16, 16).astype(a3.dtype) + np.einsum("mgt,gnt->mn", a3, b3)
    return (wrap32(total) if a3.dtype == np.int64 else total).reshape(-1)


def operands(d: Description, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in d.definition.inputs:
        np_type = t.dtype.numpy
        if np_type.kind in "iu":
            info = np.iinfo(np_type)
            out.append(rng.integers(info.min, info.max, t.lanes, endpoint=True, dtype=np_type))
        else:
            out.append(rng.standard_normal(t.lanes).astype(np_type))
    return out


def kernel(d: Description) -> L.Kernel:
    """Load each operand, run the instruction (after its setup and before its finish,
    where it has them), store each result."""
    ins, outs = d.definition.inputs, d.definition.outputs
    params = tuple(L.Buffer(f"b{p}", t.dtype, 0, param=p, writable=p >= len(ins))
                   for p, t in enumerate(ins + outs))
    body: list[L.Stmt] = [L.Let(f"v{p}", t, L.Read(f"b{p}", START, t.lanes))
                          for p, t in enumerate(ins)]
    results = tuple(f"r{k}" for k in range(len(outs)))
    around = {step: L.Instruction(name, (), ()) for step, name in d.steps().items()}
    body += [*([around["setup"]] if "setup" in around else []),
             L.Instruction(d.name, results, tuple(f"v{p}" for p in range(len(ins)))),
             *([around["finish"]] if "finish" in around else [])]
    body += [L.Store(f"b{len(ins) + k}", START, r) for k, r in enumerate(results)]
    return L.Kernel(d.name, params, (), tuple(body))


def assert_matches(name: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:     # a float32 rounding per term, of the largest magnitude a lane reaches
        terms = 32 if "amx" in name or "mma" in name else 2
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0,
                                   atol=float(np.abs(want).max()) * 2.0**-24 * 4 * terms)


def test_every_shipped_description_loads() -> None:
    assert {"vpdpbusd_512", "vpdpbusd_256", "vpmaddwd_256", "vpmaddwd_512",
            "vdpbf16ps_512", "sdot_neon", "udot_neon", "tdpbusd_amx", "tdpbssd_amx",
            "tdpbf16ps_amx"} <= set(DESCRIPTIONS)
    vnni = DESCRIPTIONS["vpdpbusd_512"].definition
    assert [str(t) for t in vnni.inputs] == ["int32x16", "uint8x64", "int8x64"]
    assert [str(t) for t in vnni.outputs] == ["int32x16"]
    assert vnni.feature == "avx512_vnni" and "-mavx512vnni" in vnni.cflags


@pytest.mark.parametrize("name", sorted(DESCRIPTIONS))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_tc_meaning_is_the_manuals(name: str, seed: int) -> None:
    d = DESCRIPTIONS[name]
    x = operands(d, seed)
    (got,) = d.definition.meaning(*x)
    assert_matches(name, got, reference(name, *x))


def test_the_integer_edges_wrap_as_the_hardware_does() -> None:
    pair = np.full(16, -32768, np.int16)
    (got,) = DESCRIPTIONS["vpmaddwd_256"].definition.meaning(pair, pair)
    np.testing.assert_array_equal(got, np.full(8, -2**31, np.int32))
    acc = np.full(16, 2**31 - 1, np.int32)
    a, b = np.full(64, 255, np.uint8), np.full(64, 127, np.int8)
    (got,) = DESCRIPTIONS["vpdpbusd_512"].definition.meaning(acc, a, b)
    np.testing.assert_array_equal(got, wrap32(np.full(16, 2**31 - 1 + 4 * 255 * 127)))


def build(d: Description, tmp: Path, emulated: bool = False) -> Path:
    """The instruction's kernel as a shared object; `emulated`: on the software AMX of
    tests/isa/amx_emulation.h, without the instruction's flags."""
    source = print_c(kernel(d), "k").text
    (tmp / "k.c").write_text(source)
    so = tmp / "k.so"
    flags = ["-include", str(AMX_EMULATION), "-std=gnu99"] if emulated else list(d.cflags)
    subprocess.run([CC, *FLAGS, *flags, "-Wno-psabi", "-shared", "-fPIC", "-o", str(so),
                    str(tmp / "k.c"), "-lm"], check=True, capture_output=True, text=True)
    return so


@needs_cc
@pytest.mark.parametrize("name", X86)
def test_the_c_form_compiles_on_any_x86_host(name: str, tmp_path: Path) -> None:
    assert build(DESCRIPTIONS[name], tmp_path).exists()


@needs_cc
@pytest.mark.parametrize("name", X86)
def test_the_instruction_computes_its_description(name: str, tmp_path: Path) -> None:
    d = DESCRIPTIONS[name]
    if d.feature not in host_features():
        pytest.skip(f"this host has no {d.feature}: {name} is compiled, not run")
    check_the_c_form(d, build(d, tmp_path))


@needs_cc
@pytest.mark.parametrize("name", AMX)
def test_the_amx_c_form_computes_its_description_on_the_software_amx(name: str,
                                                                     tmp_path: Path) -> None:
    """On any host: the C forms (setup, instruction, finish) built against the SDM's
    pseudo-code in C, which also aborts where a tile is used unconfigured."""
    check_the_c_form(DESCRIPTIONS[name], build(DESCRIPTIONS[name], tmp_path, emulated=True))


def check_the_c_form(d: Description, so: Path) -> None:
    name = d.name
    lib = ctypes.CDLL(str(so))
    for seed in range(4):
        x = operands(d, seed)
        outs = [np.zeros(t.lanes, t.dtype.numpy) for t in d.definition.outputs]
        arrays = x + outs
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        assert lib.k(pointers, (ctypes.c_int64 * 4)()) == 0
        interpreted = x + [np.zeros_like(o) for o in outs]
        run_kernel(kernel(d), interpreted)     # the description, through the loop IR
        for got, want in zip(outs, interpreted[len(x):]):
            assert_matches(name, got, want.astype(np.float64) if want.dtype.kind == "f"
                           else want)


def c_array(name: str, x: np.ndarray) -> str:
    ctype = {"i": "int", "u": "uint"}[x.dtype.kind] + f"{x.dtype.itemsize * 8}_t"
    return f"static {ctype} {name}[{len(x)}] = {{{', '.join(str(int(v)) for v in x)}}};"


@needs_arm
@pytest.mark.parametrize("name", ARM)
def test_the_arm_instruction_computes_its_description_under_qemu(name: str,
                                                                 tmp_path: Path) -> None:
    """Cross-compiled for AArch64 with the description's flags, run by qemu-aarch64 (its
    default CPU has the dot product), on random full-range operands."""
    d = DESCRIPTIONS[name]
    x = operands(d, 7)
    outs = [np.zeros(t.lanes, t.dtype.numpy) for t in d.definition.outputs]
    names = [f"in{p}" for p in range(len(x))] + [f"out{k}" for k in range(len(outs))]
    main = "\n".join([
        "#include <stdio.h>", print_c(kernel(d), "k", forms="c-arm64").text,
        *(c_array(n, a) for n, a in zip(names, x + outs)),
        "int main(void) {",
        f"  void *args[] = {{{', '.join(names)}}};",
        "  int64_t err[4];",
        "  if (k(args, err) != 0) return 1;",
        *(f"  for (int l = 0; l < {len(o)}; l++) printf(\"%lld\\n\", (long long)out{k}[l]);"
          for k, o in enumerate(outs)),
        "  return 0;", "}"])
    (tmp_path / "main.c").write_text(main)
    exe = tmp_path / "main"
    subprocess.run([ARM_CC, "-O2", "-static", "-Wall", "-Werror", "-Wno-psabi", *d.cflags,
                    "-o", str(exe), str(tmp_path / "main.c"), "-lm"],
                   check=True, capture_output=True, text=True)
    run = subprocess.run([QEMU, str(exe)], check=True, capture_output=True, text=True)
    got = np.array([int(v) for v in run.stdout.split()])
    (want,) = d.definition.meaning(*x)
    np.testing.assert_array_equal(got, want.astype(np.int64))


def test_a_description_without_its_keys_or_with_two_functions_is_refused() -> None:
    text = DESCRIPTIONS["vpmaddwd_256"].source
    with pytest.raises(IRError, match="lacks feature"):
        load_description(text.replace("# feature: avx2\n", ""), "x.tc")
    with pytest.raises(IRError, match="defines 2 functions"):
        load_description(text + text.replace("vpmaddwd_256(", "other("), "x.tc")
    with pytest.raises(IRError, match="sizes must read"):
        load_description(text.replace("# sizes: L=8", "# sizes: L=eight"), "x.tc")


def test_polytile_instructions_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["instructions"]) == 0
    out = capsys.readouterr().out
    for name, d in DESCRIPTIONS.items():
        line = next(row for row in out.splitlines() if row.startswith(name + " "))
        assert d.feature in line
        runs = line.rsplit("  ", 1)[-1].strip()
        if d.definition.warp:           # a GPU's: runs where there is a CUDA device
            problem = device_problem()
            assert runs == ("yes" if problem is None else f"no ({problem.split(' (')[0]})")
        elif "c-x86" not in d.definition.forms:     # an Arm one: emulated (cpu-arm64-dot)
            assert runs == ("under qemu-aarch64" if cross_problem() is None else "no")
            assert "cpu-arm64-dot" in line
        else:
            assert runs == ("yes" if d.feature in host_features() else "no")
    assert "cpu-avx512" in out


def test_an_instruction_prints_only_for_its_architecture() -> None:
    with pytest.raises(UnsupportedError, match="no c-x86 form"):
        print_c(kernel(DESCRIPTIONS["sdot_neon"]))
    assert "#include <arm_neon.h>" in print_c(kernel(DESCRIPTIONS["sdot_neon"]),
                                              forms="c-arm64").text


def test_bfloat16_operands_are_bfloat16() -> None:
    d = DESCRIPTIONS["vdpbf16ps_512"]
    assert d.definition.inputs[1].dtype.numpy == np.dtype(ml_dtypes.bfloat16)
