"""AMX's tiles on matmuls (pass `tensorize`'s `tiles`, polytile/loops/tiles.py): which
contractions take them, what the IR records and the verifier checks, the loops, and that
the kernels are exact (int8) or within float32 rounding (bfloat16) on sizes that divide
no tile, strided and batched operands, in threads: in the loop interpreter, and compiled
on the software AMX of amx_emulation.h on any host (on the real one where the host has
it and Linux grants this process the tile data)."""
from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.backends.c_x86 import CX86Backend
from polytile.codegen.c import print_c
from polytile.errors import IRError
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.isa import description
from polytile.loops import interp
from polytile.loops.lower import lower
from polytile.loops.text import kernel_text
from polytile.targets.target import host_features, inspection_target, load_target, usable

from .test_tensorize import BF, GOLDEN, I8, S8, ir, schedules

AMX = frozenset({"amx_tile", "amx_int8", "amx_bf16"})
XEON = inspection_target("cpu-avx512", frozenset())          # every feature it declares
VNNI_ONLY = replace(XEON, features=XEON.features - AMX)
HEADER = Path(__file__).with_name("amx_emulation.h")
U8_S8 = "def mm(int8(M,K) A, uint8(K,N) B) -> (C) {\n  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"
BATCHED = ("def bmm(bfloat16(B,M,K) A, bfloat16(B,K,N) W) -> (C) {\n"
           "  C(b,m,n) +=! float(A(b,m,k)) * float(W(b,k,n))\n}")
CONV = ("def qconv(uint8(N,C,H,W) I, int8(O,C,KH,KW) F) -> (Out) {\n"
        "  Out(n,o,h,w) +=! int32(I(n,c,h+kh,w+kw)) * int32(F(o,c,kh,kw))\n}")
INTRINSIC = {BF: "_tile_dpbf16ps", I8: "_tile_dpbusd", S8: "_tile_dpbssd",
             U8_S8: "_tile_dpbusd"}
TYPES = {BF: (ml_dtypes.bfloat16, ml_dtypes.bfloat16), I8: (np.uint8, np.int8),
         S8: (np.int8, np.int8), U8_S8: (np.int8, np.uint8)}
TYPES_BY_NAME = {"bf16": (ml_dtypes.bfloat16, ml_dtypes.bfloat16, "float"),
                 "u8s8": (np.uint8, np.int8, "int"), "s8s8": (np.int8, np.int8, "int"),
                 "s8u8": (np.int8, np.uint8, "int")}
# rows, reduction, columns: none a multiple of a tile (16 x 16, 32 bfloat16 or 64 bytes of
# reduction), one of exactly one tile, one of one row
SIZES = [(1, 1, 1), (16, 32, 16), (17, 65, 33), (40, 130, 37), (3, 200, 70)]


def tiles(fn):  # type: ignore[no-untyped-def]
    return [s.schedule.tiles for s in fn.body.stmts if s.schedule.tiles is not None]


def random(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def check(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Integers bit for bit (int32 sums wrap); bfloat16 products within a float32
    rounding per term of the largest magnitude (the tiles add in their own order)."""
    if got.dtype.kind == "i":
        want = np.matmul(a.astype(np.int64), b.astype(np.int64))
        np.testing.assert_array_equal(got, ((want + 2**31) % 2**32 - 2**31).astype(np.int32))
    else:
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        bound = np.matmul(np.abs(a64), np.abs(b64)) * a.shape[-1] * 2.0**-23 + 1e-30
        assert np.all(np.abs(got - np.matmul(a64, b64)) <= bound)


def test_amx_takes_the_matmuls_where_the_target_has_it() -> None:
    for source, name in ((BF, "tdpbf16ps_amx"), (I8, "tdpbusd_amx"), (S8, "tdpbssd_amx")):
        (t,) = tiles(ir(source, XEON, A=(40, 70), B=(70, 90)))
        assert (t.instruction, t.rows, t.cols, t.reduction) == (name, "i0", "i1", "i2")
        assert tiles(ir(source, VNNI_ONLY, A=(40, 70), B=(70, 90))) == []
        off = ir(source, XEON, {"tensorize.tiles": False}, A=(40, 70), B=(70, 90))
        assert tiles(off) == [] and schedules(off)          # the lane-dot ones instead
    # s8 x u8: tdpbusd's unsigned a is B, so the tiles' rows run along the columns (n)
    (t,) = tiles(ir(U8_S8, XEON, A=(40, 70), B=(70, 90)))
    assert (t.instruction, t.rows, t.cols) == ("tdpbusd_amx", "i1", "i0")
    # a convolution: pixels along the tiles' rows, output channels along their columns,
    # the groups along the channels (not along a window loop of 3: the tiles would be
    # 3/64 full), the window around them; the weights, read by no other output loop,
    # kept
    (t,) = tiles(ir(CONV, XEON, I=(1, 32, 6, 6), F=(16, 32, 3, 3)))
    assert (t.rows, t.cols, t.reduction, t.kept) == ("i3", "i1", "i4", True)


def test_the_ir_round_trips_and_the_verifier_checks_the_loops() -> None:
    fn = ir(BF, XEON, A=(40, 70), B=(70, 90))
    text = format_function(fn)
    assert "#tensorized schedule(parallel(i0), tiles(tdpbf16ps_amx, i0, i1, i2, kept))" in text
    assert format_function(parse_function(text)) == text
    verify(parse_function(text))
    swapped = text.replace("tiles(tdpbf16ps_amx, i0, i1, i2", "tiles(tdpbf16ps_amx, i1, i0, i2")
    with pytest.raises(IRError, match="does not compute there"):
        verify(parse_function(swapped))
    other = text.replace("tiles(tdpbf16ps_amx,", "tiles(tdpbusd_amx,")
    with pytest.raises(IRError, match="does not compute there"):
        verify(parse_function(other))


def test_weights_are_kept_packed_only_where_nothing_loops_around_the_tiles() -> None:
    """B, a read-only parameter, keeps its tiles between calls; not with a batch loop
    around the tiles (each batch would pack them again), which the verifier refuses, nor
    with tensorize.keep off."""
    (t,) = tiles(ir(BF, XEON, A=(40, 70), B=(70, 90)))
    assert t.kept
    assert not tiles(ir(BF, XEON, {"tensorize.keep": False}, A=(40, 70), B=(70, 90)))[0].kept
    batched = ir(BATCHED, XEON, A=(3, 17, 40), W=(3, 40, 20))
    assert not tiles(batched)[0].kept
    text = format_function(batched).replace("i1, i2, i3)", "i1, i2, i3, kept)")
    with pytest.raises(IRError, match="loops around them"):
        verify(parse_function(text))


def test_the_tile_loops_pack_both_operands_and_configure_each_thread() -> None:
    """Golden loop IR (POLYTILE_UPDATE_GOLDEN=1 to accept a deliberate change): A and B
    packed into zeroed tiles (B's pairs side by side), the setup and finish around each
    thread's row of tiles, an output tile staged on the stack."""
    kernel = lower(ir(BF, XEON, A=(20, 40), B=(40, 18)))
    text = kernel_text(kernel)
    path = GOLDEN / "bmm_amx.loops"
    if os.environ.get("POLYTILE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), "the loop IR changed; see the docstring"
    c = print_c(kernel).text
    assert c.count("_tile_loadconfig") == 1 and c.count("_tile_dpbf16ps") == 1
    assert c.count("_tile_release") == 1


@pytest.mark.parametrize("source", [BF, I8, S8, U8_S8])
@pytest.mark.parametrize("m, k, n", SIZES)
def test_the_loop_interpreter_runs_the_tiles(source: str, m: int, k: int, n: int) -> None:
    fn = ir(source, XEON, A=(m, k), B=(k, n))
    assert tiles(fn) or 1 in (m, n, k)       # a loop of one iteration is no tile's loop
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a_t, b_t = TYPES[source]
    a, b = random(rng, a_t, (m, k)), random(rng, b_t, (k, n))
    out = np.zeros((m, n), np.float32 if source == BF else np.int32)
    buffers = {"p0": a, "p1": b, "o0": out}
    interp.run(fn, buffers, lower(fn))
    check(buffers["o0"], a, b)


CONVS = [  # (N, C, H, W), (O, C, KH, KW), stride
    ((1, 32, 6, 6), (16, 32, 3, 3), 1), ((2, 70, 9, 19), (20, 70, 3, 3), 1),
    ((1, 5, 11, 12), (3, 5, 1, 1), 1), ((1, 17, 13, 15), (33, 17, 3, 3), 2)]


def conv_source(stride: int) -> str:
    return CONV if stride == 1 else CONV.replace("h+kh,w+kw", f"{stride}*h+kh,{stride}*w+kw")


def conv_reference(x: np.ndarray, f: np.ndarray, stride: int) -> np.ndarray:
    n, _, h, w = x.shape
    o, _, kh, kw = f.shape
    oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for r in range(kh):
        for s in range(kw):
            patch = x[:, :, r:r + stride * oh:stride, s:s + stride * ow:stride].astype(np.int64)
            out += np.einsum("nchw,oc->nohw", patch, f[:, :, r, s].astype(np.int64))
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)


def test_the_mapping_gene_picks_the_tiles_rows_along_another_loop() -> None:
    """In the order of how well the tiles are filled: pixels along w (0) or h (1); the
    groups along a window loop come last."""
    picked = [tiles(ir(CONV, XEON, {"tensorize.mapping": k}, I=(1, 32, 6, 6),
                       F=(16, 32, 3, 3)))[0] for k in range(4)]
    assert [(t.rows, t.reduction) for t in picked] == [
        ("i3", "i4"), ("i2", "i4"), ("i3", "i6"), ("i3", "i5")]
    fn = ir(CONV, XEON, {"tensorize.mapping": 1}, I=(2, 40, 9, 7), F=(20, 40, 3, 3))
    rng = np.random.default_rng(8)
    x, f = random(rng, np.uint8, (2, 40, 9, 7)), random(rng, np.int8, (20, 40, 3, 3))
    buffers = {"p0": x, "p1": f, "o0": np.zeros((2, 20, 7, 5), np.int32)}
    interp.run(fn, buffers, lower(fn))
    np.testing.assert_array_equal(buffers["o0"], conv_reference(x, f, 1))


@pytest.mark.parametrize("x_shape, f_shape, stride", CONVS)
def test_the_loop_interpreter_runs_convolutions_on_the_tiles(x_shape, f_shape, stride) -> None:  # type: ignore[no-untyped-def]
    fn = ir(conv_source(stride), XEON, I=x_shape, F=f_shape)
    assert tiles(fn)
    rng = np.random.default_rng(sum(x_shape))
    x, f = random(rng, np.uint8, x_shape), random(rng, np.int8, f_shape)
    want = conv_reference(x, f, stride)
    buffers = {"p0": x, "p1": f, "o0": np.zeros(want.shape, np.int32)}
    interp.run(fn, buffers, lower(fn))
    np.testing.assert_array_equal(buffers["o0"], want)


def test_threads_take_the_row_tiles_or_else_a_batch_loop() -> None:
    """9 row tiles: shared out; 2 (a batch of 17-row matmuls) or 1 (a convolution's image
    row of 4 pixels): the batch or the image rows run in threads, each thread packing into
    its own buffers (allocated inside the loop)."""
    def parallel(fn):  # type: ignore[no-untyped-def]
        (block,) = [s for s in fn.body.stmts if getattr(s, "schedule", None) is not None
                    and s.schedule.tiles is not None]
        return block.schedule.parallel
    assert parallel(ir(BF, XEON, A=(130, 77), B=(77, 45))) == "i0"
    batched = ir(BATCHED, XEON, A=(3, 17, 40), W=(3, 40, 20))
    assert parallel(batched) == "i0"
    conv = ir(CONV, XEON, I=(1, 32, 6, 6), F=(16, 32, 3, 3))
    assert parallel(conv) == "i2"            # h: n has one iteration
    text = kernel_text(lower(conv))
    assert text.index("parallel for") < text.index("p0 in tdpbusd_amx's tiles")


def test_the_loop_interpreter_runs_batched_tiles() -> None:
    fn = ir(BATCHED, XEON, A=(3, 17, 40), W=(3, 40, 20))
    (t,) = tiles(fn)
    assert (t.rows, t.cols, t.reduction) == ("i1", "i2", "i3")
    rng = np.random.default_rng(5)
    a, w = random(rng, ml_dtypes.bfloat16, (3, 17, 40)), random(rng, ml_dtypes.bfloat16,
                                                                (3, 40, 20))
    buffers = {"p0": a, "p1": w, "o0": np.zeros((3, 17, 20), np.float32)}
    interp.run(fn, buffers, lower(fn))
    check(buffers["o0"], a, w)


# ---------------------------------------------------------------- compiled

def amx_target():  # type: ignore[no-untyped-def]
    """cpu-avx2 (which both kinds of our hosts run) with AMX's features in use."""
    if not {"avx2", "fma"} <= host_features():
        pytest.skip("this host has no AVX2 and FMA to run cpu-avx2 kernels")
    base = load_target("cpu-avx2")
    return replace(base, optional=base.optional + tuple(sorted(AMX)),
                   features=host_features() | AMX)


@pytest.fixture(params=["software", "hardware"])
def amx(request, monkeypatch):  # type: ignore[no-untyped-def]
    """Kernels built on the software AMX (any host), or for the real one (where the host
    has AMX and Linux grants the tile data)."""
    if request.param == "hardware":
        if not AMX <= host_features():
            pytest.skip("this host has no AMX (or Linux refuses its tile data): the AMX "
                        "kernels run on the software AMX only")
        return request.param
    flags = CX86Backend.flags

    def emulated(self, target, toolchain, sanitize):  # type: ignore[no-untyped-def]
        return tuple(f for f in flags(self, target, toolchain, sanitize)
                     if not f.startswith("-mamx")) + ("-include", str(HEADER))
    monkeypatch.setattr(CX86Backend, "flags", emulated)
    return request.param


def compiled(source: str) -> pt.Module:
    module = pt.define(source, target="cpu-avx2")
    assert module.compiler is not None
    module.compiler.target = amx_target()
    return module


@pytest.mark.parametrize("source", [BF, I8, S8, U8_S8])
def test_compiled_tiles_compute_every_size(amx: str, source: str) -> None:
    module = compiled(source)
    fn = next(iter(module._functions.values()))
    a_t, b_t = TYPES[source]
    rng = np.random.default_rng(11)
    for m, k, n in SIZES:
        a, b = random(rng, a_t, (m, k)), random(rng, b_t, (k, n))
        check(fn(a, b), a, b)
    kernel = fn.compiled((a, b))
    assert kernel is not None
    assert INTRINSIC[source] in Path(kernel.source_path).read_text()


def test_kept_tiles_follow_the_weights_values(amx: str) -> None:
    """The same weights: packed once; other values in the same array, or another array:
    packed again (never stale)."""
    rng = np.random.default_rng(13)
    module = compiled(BF)
    a = random(rng, ml_dtypes.bfloat16, (33, 70))
    b = random(rng, ml_dtypes.bfloat16, (70, 45))
    for _ in range(2):
        check(module.bmm(a, b), a, b)
    b[3, 4] = 100
    check(module.bmm(a, b), a, b)
    other = random(rng, ml_dtypes.bfloat16, (70, 45))
    check(module.bmm(a, other), a, other)
    kernel = module.bmm.compiled((a, b))
    assert kernel is not None and "kept between calls" in Path(kernel.source_path).read_text()


def test_compiled_convolutions_on_the_tiles(amx: str) -> None:
    rng = np.random.default_rng(14)
    for x_shape, f_shape, stride in CONVS:
        module = compiled(conv_source(stride))
        x, f = random(rng, np.uint8, x_shape), random(rng, np.int8, f_shape)
        np.testing.assert_array_equal(module.qconv(x, f), conv_reference(x, f, stride))
        kernel = module.qconv.compiled((x, f))
        assert kernel is not None and "_tile_dpbusd" in Path(kernel.source_path).read_text()


def test_compiled_tiles_read_strided_and_batched_operands_in_threads(amx: str) -> None:
    """Operands that are views with gaps (every other column, a transposed matrix), and a
    batch; 130 rows are 9 row tiles, dealt out to the threads."""
    rng = np.random.default_rng(12)
    module = compiled(BF)
    big = random(rng, ml_dtypes.bfloat16, (130, 2 * 77))
    b = random(rng, ml_dtypes.bfloat16, (45, 77)).T
    a = big[:, ::2]
    check(module.bmm(a, b), a, b)
    batched = compiled(BATCHED)
    a3 = random(rng, ml_dtypes.bfloat16, (3, 17, 40))
    w3 = random(rng, ml_dtypes.bfloat16, (3, 40, 20))
    check(batched.bmm(a3, w3), a3, w3)


def test_the_amx_kernels_compile_with_the_real_flags(tmp_path: Path) -> None:
    """gcc emits the AMX instructions on any x86 host (run only where the host has AMX)."""
    for source in (BF, I8):
        c = tmp_path / "k.c"
        c.write_text(print_c(lower(ir(source, XEON, A=(40, 70), B=(70, 90)))).text)
        flags = [f for d in ("tdpbf16ps_amx", "tdpbusd_amx") for f in description(d).cflags]
        subprocess.run(["gcc", "-O2", "-march=x86-64-v4", "-fopenmp", "-Wno-psabi", *flags,
                        "-c", "-o", str(tmp_path / "k.o"), str(c)], check=True,
                       capture_output=True, text=True)
        dump = subprocess.run(["objdump", "-d", str(tmp_path / "k.o")], check=False,
                              capture_output=True,
                              text=True)
        if dump.returncode == 0:
            assert "ldtilecfg" in dump.stdout and "tilerelease" in dump.stdout
            assert ("tdpbf16ps" if source == BF else "tdpbusd") in dump.stdout


def test_amx_is_not_used_where_linux_refuses_the_tile_data() -> None:
    flags = frozenset({"avx512f", "amx_tile", "amx_int8", "amx_bf16"})
    assert usable(flags, lambda: True) == flags
    assert usable(flags, lambda: False) == frozenset({"avx512f"})
    asked = []
    assert usable(frozenset({"avx2"}), lambda: asked.append(1) or True) == {"avx2"}
    assert asked == []            # no AMX: Linux is not asked


def test_polytile_show_prints_the_tiles_for_a_machine_with_amx(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from polytile.cli import main as cli_main
    path = tmp_path / "mm.tc"
    path.write_text(BF + "\n")
    args = ["show", str(path), "--stage", "c", "--sizes", "M=40,K=70,N=37",
            "--target", "cpu-avx512"]
    assert cli_main([*args, "--features", "amx_tile,amx_bf16"]) == 0
    shown = capsys.readouterr()
    assert "_tile_dpbf16ps" in shown.out and "amx_bf16, amx_tile" in shown.err
    assert cli_main([*args, "--features", "avx512_bf16"]) == 0
    out = capsys.readouterr().out
    assert "_tile_" not in out and "_mm512_dpbf16_ps" in out
    assert cli_main([*args, "--features", "amx"]) == 1
    assert "has no optional feature amx" in capsys.readouterr().err


LAYOUTS = {"A": ("m,k", "k,m"), "B": ("k,n", "n,k")}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(TYPES_BY_NAME)), st.sampled_from(LAYOUTS["A"]),
       st.sampled_from(LAYOUTS["B"]), st.booleans(), st.integers(2, 40), st.integers(2, 90),
       st.integers(2, 40), st.integers(0, 2**31))
def test_any_matmul_layout_on_the_tiles_matches_numpy(kind: str, a_at: str, b_at: str,
                                                      batch: bool, m: int, k: int, n: int,
                                                      seed: int) -> None:
    """Transposed operands, a batch, any sizes: where the tiles take the matmul, the loop
    interpreter computes it (exactly for integers)."""
    a_t, b_t, ctype = TYPES_BY_NAME[kind]
    a_type, b_type = (np.dtype(t).name if t is not ml_dtypes.bfloat16 else "bfloat16"
                      for t in (a_t, b_t))
    accumulate = "float" if ctype == "float" else "int32"
    shape = {"m": "M", "k": "K", "n": "N"}
    lead, lead_shape = ("b,", "B,") if batch else ("", "")
    a_dims = lead_shape + ",".join(shape[i] for i in a_at.split(","))
    b_dims = lead_shape + ",".join(shape[i] for i in b_at.split(","))
    source = (f"def mm({a_type}({a_dims}) X, {b_type}({b_dims}) Y) -> (Z) {{\n"
              f"  Z({lead}m,n) +=! {accumulate}(X({lead}{a_at})) * {accumulate}(Y({lead}{b_at}))\n}}")
    sizes = {"m": m, "k": k, "n": n}
    a_shape = ((3,) if batch else ()) + tuple(sizes[i] for i in a_at.split(","))
    b_shape = ((3,) if batch else ()) + tuple(sizes[i] for i in b_at.split(","))
    fn = ir(source, XEON, X=a_shape, Y=b_shape)
    assert tiles(fn)
    rng = np.random.default_rng(seed)
    a, b = random(rng, a_t, a_shape), random(rng, b_t, b_shape)
    out_shape = ((3,) if batch else ()) + (m, n)
    buffers = {"p0": a, "p1": b, "o0": np.zeros(out_shape, np.float32 if ctype == "float"
                                                 else np.int32)}
    interp.run(fn, buffers, lower(fn))
    a_mk = a if a_at == "m,k" else np.swapaxes(a, -1, -2)
    b_kn = b if b_at == "k,n" else np.swapaxes(b, -1, -2)
    check(buffers["o0"], a_mk, b_kn)
