"""pack (polytile/passes/pack.py): an operand that a contraction reads with a non-unit
stride along the vector index, and reuses across another index, is copied once into
panels as wide as the micro-kernel's vector tile, with that index innermost. Golden
text before and after, and the same results from the IR interpreter."""
from __future__ import annotations

from polytile.ir import nodes as N
from polytile.passes.pack import pack

from .helpers import check_pass, lowered, target

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(n,kk)\n}\n"
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(kk,n)\n}\n"
AVX512 = target("cpu-avx512")


def test_tmm_reads_b_in_panels() -> None:
    # N = 29 < 32: one panel of 16 lanes is full, the second has 13; the contraction's
    # n splits into (n_o, n) with a constraint that removes the overflow.
    before = lowered(TMM, {"A": (37, 53), "B": (29, 53)})
    after = pack(before, AVX512, {"min_reuse": 4})
    names = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert names == ["s0_init", "pack_B_panels0", "s0"]
    (packed,) = [r for r in after.body.refs if r.dir == "none"]
    assert packed.shape.sizes == (2, 53, 16)
    check_pass("pack_tmm", before, after)


def test_wide_panels_take_two_vectors() -> None:
    before = lowered(TMM, {"A": (37, 53), "B": (70, 53)})
    after = pack(before, AVX512, {"min_reuse": 4})
    (packed,) = [r for r in after.body.refs if r.dir == "none"]
    assert packed.shape.sizes == (3, 53, 32)
    check_pass("pack_tmm_wide", before, after)


def test_nothing_to_pack() -> None:
    # mm: B is already unit-stride along n.
    mm = lowered(MM, {"A": (37, 53), "B": (53, 29)})
    assert pack(mm, AVX512, {"min_reuse": 4}) == mm
    # tmm with two rows: B would be read twice per element, less than min_reuse.
    tmm = lowered(TMM, {"A": (2, 53), "B": (29, 53)})
    assert pack(tmm, AVX512, {"min_reuse": 4}) == tmm
    # N below the vector width: no outer-product kernel to feed.
    narrow = lowered(TMM, {"A": (37, 53), "B": (7, 53)})
    assert pack(narrow, AVX512, {"min_reuse": 4}) == narrow
    assert pack(tmm, AVX512, {"enabled": False}) is tmm
