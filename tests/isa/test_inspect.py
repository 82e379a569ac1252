"""UNIT's inspector: which loop mappings make a contraction an instruction (arithmetic
and access isomorphism, kinds of loops, broadcast operands), on matmuls of every
integer and bfloat16 flavour, a quantized convolution, and random layouts."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile import dtypes
from polytile.cli import main as cli_main
from polytile.isa import descriptions
from polytile.isa.inspect import find, widens
from polytile.sema.specialize import specialize

ALL = descriptions()


def matches(source: str, **shapes: tuple[int, ...]) -> set[str]:
    fn = next(iter(pt.define(source, backend="interp")._functions.values())).fn
    return {m.mapping.text() for m in find(specialize(fn, shapes, {}), ALL)}


def test_a_u8_s8_matmul_is_vpdpbusd_two_ways_and_vpmaddwd_widened() -> None:
    found = matches("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
                    "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}", A=(8, 12), B=(12, 32))
    assert found == {f"{name}: l -> n, k -> k; a = A (broadcast), b = B"
                     for name in ("vpdpbusd_512", "vpdpbusd_256")} | {
                     f"{name}: l -> m, k -> k; a = A, b = B (broadcast)"
                     for name in ("vpdpbusd_512", "vpdpbusd_256")} | {
                     f"{name}: l -> n, k -> k; a = A (broadcast, widened), b = B (widened)"
                     for name in ("vpmaddwd_512", "vpmaddwd_256")} | {
                     f"{name}: l -> m, k -> k; a = A (widened), b = B (broadcast, widened)"
                     for name in ("vpmaddwd_512", "vpmaddwd_256")} | {
                     # AMX: its groups g and a group's 4 bytes t both take k (k = 4 g + t)
                     "tdpbusd_amx: m -> m, n -> n, g -> k, t -> k; a = A, b = B"}


def test_two_reduction_loops_of_a_description_split_one_of_the_program() -> None:
    """A split takes the description's last two reduction loops onto one program loop
    (AMX's groups and a group's values); a program with two reduction loops of its own
    also gets them one each, and a description of one reduction loop never splits."""
    found = matches("def mm(bfloat16(B,M,K) A, bfloat16(B,K,N) W) -> (C) {\n"
                    "  C(b,m,n) +=! float(A(b,m,k)) * float(W(b,k,n))\n}",
                    A=(2, 8, 12), W=(2, 12, 32))
    assert {t for t in found if "amx" in t} == {
        "tdpbf16ps_amx: m -> m, n -> n, g -> k, t -> k; a = A, b = W"}
    two = matches("def mm(bfloat16(M,K,J) A, bfloat16(K,J,N) B) -> (C) {\n"
                  "  C(m,n) +=! float(A(m,k,j)) * float(B(k,j,n))\n}",
                  A=(8, 12, 2), B=(12, 2, 32))
    assert {t for t in two if "amx" in t} == {
        "tdpbf16ps_amx: m -> m, n -> n, g -> k, t -> j; a = A, b = B",
        "tdpbf16ps_amx: m -> m, n -> n, g -> j, t -> k; a = A, b = B",
        "tdpbf16ps_amx: m -> m, n -> n, g -> j, t -> j; a = A, b = B",
        "tdpbf16ps_amx: m -> m, n -> n, g -> k, t -> k; a = A, b = B"}
    assert not any(t.count("-> k") > 1 for t in two if "vdpbf16ps" in t)


def test_operands_in_the_other_order_still_match() -> None:
    found = matches("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
                    "  C(m,n) +=! int32(B(k,n)) * int32(A(m,k))\n}", A=(8, 12), B=(12, 32))
    assert "vpdpbusd_512: l -> n, k -> k; a = A (broadcast), b = B" in found


@pytest.mark.parametrize("source, wanted", [
    ("def mm(int8(M,K) A, int8(K,N) B) -> (C) {\n  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}",
     {"sdot_neon", "vpmaddwd_256", "vpmaddwd_512",        # s8 widens to s16 exactly
      "mma_s8_m16n8k32", "tdpbssd_amx"}),
    (("def mm(uint8(M,K) A, int16(K,N) B) -> (C) {\n"
      "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"), {"vpmaddwd_256", "vpmaddwd_512"}),
    (("def mm(uint16(M,K) A, int16(K,N) B) -> (C) {\n"     # u16 does not fit in s16
      "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"), set()),
    (("def mm(int8(M,K) A, uint8(K,N) B) -> (C) {\n"       # vpdpbusd's a = B, b = A
      "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"),
     {"vpdpbusd_256", "vpdpbusd_512", "vpmaddwd_256", "vpmaddwd_512", "tdpbusd_amx"}),
    (("def mm(int8(M,K) A, int8(K,N) B) -> (C) {\n"        # int16 products: not int32's
      "  C(m,n) +=! int16(A(m,k)) * int16(B(k,n))\n}"), set()),
    (("def mm(uint8(M,K) A, uint8(K,N) B) -> (C) {\n"
      "  C(m,n) +=! uint32(A(m,k)) * uint32(B(k,n))\n}"), {"udot_neon"}),
    (("def mm(int16(M,K) A, int16(K,N) B) -> (C) {\n"
      "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"), {"vpmaddwd_256", "vpmaddwd_512"}),
    (("def mm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n"
      "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}"), {"vdpbf16ps_512", "mma_bf16_m16n8k16",
                                                          "tdpbf16ps_amx"}),
    ("def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}", set()),
    (("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
      "  C(m,n) +=! int32(A(m,k)) + int32(B(k,n))\n}"), set()),      # a sum is no product
    (("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
      "  C(m,n) max=! int32(A(m,k)) * int32(B(k,n))\n}"), set()),    # nor a max a sum
])
def test_each_flavour_finds_its_instructions(source: str, wanted: set[str]) -> None:
    found = matches(source, A=(8, 12), B=(12, 32))
    assert {text.split(":")[0] for text in found} == wanted


@pytest.mark.parametrize("narrow, wide, exact", [
    ("uint8", "int16", True), ("int8", "int16", True), ("int16", "int16", True),
    ("uint8", "uint16", True), ("uint16", "int32", True), ("uint16", "int16", False),
    ("int8", "uint16", False), ("int8", "uint8", False), ("uint8", "int8", False),
    ("int32", "int16", False), ("bool", "int16", False),
    ("bfloat16", "float32", True), ("float16", "float32", True), ("float32", "float64", True),
    ("bfloat16", "float64", True), ("float16", "bfloat16", False),
    ("bfloat16", "float16", False), ("float32", "bfloat16", False), ("int8", "float32", False),
])
def test_widening_is_exact_only_where_every_value_fits(narrow: str, wide: str,
                                                       exact: bool) -> None:
    a, b = dtypes.lookup(narrow), dtypes.lookup(wide)
    assert a is not None and b is not None
    assert widens(a, b) is exact
    if exact and a.kind == "f" and a.bits == 16:
        # every bit pattern but NaNs, subnormals and infinities included, comes back
        values = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(a.numpy)
        with np.errstate(invalid="ignore"):        # signalling NaNs among the patterns
            values = values[~np.isnan(values.astype(np.float64))]
        back = values.astype(b.numpy).astype(a.numpy)
        np.testing.assert_array_equal(back.view(np.uint16), values.view(np.uint16))
        if narrow == "bfloat16":     # and widening is the shift by 16 bits the C code does
            shifted = (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            np.testing.assert_array_equal(shifted.astype(b.numpy), values.astype(b.numpy))
    elif exact and a.kind == "f":
        assert np.finfo(a.numpy).nmant < np.finfo(b.numpy).nmant
    elif exact:    # every value of the narrow type survives the trip through the wide one
        info = np.iinfo(a.numpy)
        values = np.arange(info.min, info.max + 1, dtype=np.int64).astype(a.numpy)
        np.testing.assert_array_equal(values.astype(b.numpy).astype(np.int64),
                                      values.astype(np.int64))


def test_a_quantized_convolution_maps_its_output_channels_or_pixels_to_lanes() -> None:
    found = matches("def qconv(uint8(N,C,H,W) I, int8(O,C,KH,KW) F) -> (Out) {\n"
                    "  Out(n,o,h,w) +=! int32(I(n,c,h+kh,w+kw)) * int32(F(o,c,kh,kw))\n}",
                    I=(1, 8, 6, 6), F=(16, 8, 3, 3))
    vnni = {t for t in found if t.startswith("vpdpbusd_512")}
    # lanes along o (the image broadcast) or along a pixel index (the filter broadcast);
    # the reduction along c, kh or kw; n has one iteration, so it is no lane.
    assert len(vnni) == 3 * 3
    assert "vpdpbusd_512: l -> o, k -> c; a = I (broadcast), b = F" in vnni
    assert "vpdpbusd_512: l -> w, k -> kw; a = I, b = F (broadcast)" in vnni
    assert not any("l -> n" in t for t in vnni)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 40), n=st.integers(2, 40), k=st.integers(2, 40),
       a_t=st.booleans(), b_t=st.booleans())
def test_layouts_and_sizes_do_not_change_the_mappings(m: int, n: int, k: int, a_t: bool,
                                                        b_t: bool) -> None:
    a = "A(k,m)" if a_t else "A(m,k)"
    b = "B(n,k)" if b_t else "B(k,n)"
    source = (f"def mm(uint8({'K,M' if a_t else 'M,K'}) A, int8({'N,K' if b_t else 'K,N'}) B)"
              f" -> (C) {{\n  C(m,n) +=! int32({a}) * int32({b})\n}}")
    found = matches(source, A=(k, m) if a_t else (m, k), B=(n, k) if b_t else (k, n))
    assert {t for t in found if t.startswith("vpdpbusd_512")} == {
        "vpdpbusd_512: l -> n, k -> k; a = A (broadcast), b = B",
        "vpdpbusd_512: l -> m, k -> k; a = A, b = B (broadcast)"}


def test_polytile_instructions_shows_the_mappings_of_a_file(tmp_path, capsys) -> None:
    path = tmp_path / "mm.tc"
    path.write_text("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
                    "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}\n")
    assert cli_main(["instructions", str(path), "--sizes", "M=4,K=8,N=16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mm: 9 mappings\n")
    assert "  statement 1 (line 2): vpdpbusd_512: l -> n, k -> k; a = A (broadcast), b = B" \
        in out
    assert "  statement 1 (line 2): tdpbusd_amx: m -> m, n -> n, g -> k, t -> k; a = A, b = B" \
        in out
