"""UNIT's inspector: which loop mappings make a contraction an instruction (arithmetic
and access isomorphism, kinds of loops, broadcast operands), on matmuls of every
integer and bfloat16 flavour, a quantized convolution, and random layouts."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.cli import main as cli_main
from polytile.isa import descriptions
from polytile.isa.inspect import find
from polytile.sema.specialize import specialize

ALL = descriptions()


def matches(source: str, **shapes: tuple[int, ...]) -> set[str]:
    fn = next(iter(pt.define(source, backend="interp")._functions.values())).fn
    return {m.mapping.text() for m in find(specialize(fn, shapes, {}), ALL)}


def test_a_u8_s8_matmul_is_vpdpbusd_two_ways() -> None:
    found = matches("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
                    "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}", A=(8, 12), B=(12, 32))
    assert found == {f"{name}: l -> n, k -> k; a = A (broadcast), b = B"
                     for name in ("vpdpbusd_512", "vpdpbusd_256")} | {
                     f"{name}: l -> m, k -> k; a = A, b = B (broadcast)"
                     for name in ("vpdpbusd_512", "vpdpbusd_256")}


def test_operands_in_the_other_order_still_match() -> None:
    found = matches("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
                    "  C(m,n) +=! int32(B(k,n)) * int32(A(m,k))\n}", A=(8, 12), B=(12, 32))
    assert "vpdpbusd_512: l -> n, k -> k; a = A (broadcast), b = B" in found


@pytest.mark.parametrize("source, wanted", [
    ("def mm(int8(M,K) A, int8(K,N) B) -> (C) {\n  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}",
     {"sdot_neon"}),
    (("def mm(uint8(M,K) A, uint8(K,N) B) -> (C) {\n"
      "  C(m,n) +=! uint32(A(m,k)) * uint32(B(k,n))\n}"), {"udot_neon"}),
    (("def mm(int16(M,K) A, int16(K,N) B) -> (C) {\n"
      "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"), {"vpmaddwd_256", "vpmaddwd_512"}),
    (("def mm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n"
      "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}"), {"vdpbf16ps_512"}),
    ("def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}", set()),
    (("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
      "  C(m,n) +=! int32(A(m,k)) + int32(B(k,n))\n}"), set()),      # a sum is no product
    (("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
      "  C(m,n) max=! int32(A(m,k)) * int32(B(k,n))\n}"), set()),    # nor a max a sum
])
def test_each_flavour_finds_its_instructions(source: str, wanted: set[str]) -> None:
    found = matches(source, A=(8, 12), B=(12, 32))
    assert {text.split(":")[0] for text in found} == wanted


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
    assert out.startswith("mm: 4 mappings\n")
    assert "  statement 1 (line 2): vpdpbusd_512: l -> n, k -> k; a = A (broadcast), b = B" \
        in out
