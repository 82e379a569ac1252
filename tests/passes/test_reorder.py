"""reorder (polytile/passes/reorder.py): the loops of scalar kernels run with the
smallest stride innermost, and a parallel index inside a reduction of equal stride.
Golden text before and after, and the same results from the IR interpreter."""
from __future__ import annotations

from polytile.dtypes import INT32
from polytile.ir import nodes as N
from polytile.passes.reorder import reorder

from .helpers import block, check_pass, lowered, target

GENERIC = target("cpu-generic")


def loop_names(b: N.Block) -> list[str]:
    return [i.name for i in b.idxs if i.affine is None]


def test_largest_stride_goes_outside() -> None:
    # B(i,j) = A(j,i) with A 7 x 13: j has stride 13 in A, i at most 7 (in B).
    before = lowered("def t(int32(N,M) A) -> (B) {\n  B(i,j) = A(j,i)\n}\n", {"A": (7, 13)})
    after = reorder(before, GENERIC, {})
    assert loop_names(block(before, "s0")) == ["i", "j"]
    assert loop_names(block(after, "s0")) == ["j", "i"]
    check_pass("reorder_transpose", before, after)


def test_column_sums_put_the_parallel_index_inside() -> None:
    # S(j) += A(i, j): i has stride N in A, j stride 1 -> j innermost: independent sums.
    before = lowered("def cs(int32(M,N) A) -> (S) {\n  S(j) +=! A(i,j)\n}\n", {"A": (9, 11)})
    after = reorder(before, GENERIC, {})
    assert loop_names(block(after, "s0")) == ["i", "j"]
    check_pass("reorder_column_sums", before, after)


def test_vector_leaves_record_their_loop_order() -> None:
    """A vector micro-kernel's loops are ordered in its schedule (its indices stay): here
    the reduction c, X's largest stride, goes outside the parallel n, so the sums over c
    aggregate into memory after each c instead of c running innermost through a
    strided X (batch norm's statistics)."""
    from polytile.passes.autotile import autotile
    from polytile.passes.schedule import Schedule
    source = "def stats(float(C,N,H) X) -> (Y) {\n  Y(n,h) +=! X(c,n,h)\n}\n"
    lowered_fn = lowered(source, {"X": (6, 5, 16)})
    avx2 = target("cpu-avx2")
    before = autotile(lowered_fn, avx2, {"schedules": {"s0": Schedule("h", 8)}})
    after = reorder(before, avx2, {})
    leaf = [b for b in leaves(block(after, "s0")) if b.schedule.vector][0]
    assert leaf.schedule.order == ("c", "n")
    assert leaf.idxs == [b for b in leaves(block(before, "s0")) if b.schedule.vector][0].idxs
    check_pass("reorder_vector_leaf", before, after)


def leaves(b: N.Block) -> list[N.Block]:
    inner = [s for s in b.stmts if isinstance(s, N.Block)]
    return [b] if not inner else [leaf for s in inner for leaf in leaves(s)]


def test_disabled_and_vector_blocks_keep_their_indices() -> None:
    fn = lowered("def cs(int32(M,N) A) -> (S) {\n  S(j) +=! A(i,j)\n}\n", {"A": (9, 11)})
    assert reorder(fn, GENERIC, {"enabled": False}) is fn
    s0 = block(fn, "s0")
    tagged = N.Function(fn.name, fn.params, N.Block(
        fn.body.name, fn.body.idxs, fn.body.constraints, fn.body.refs,
        (N.Block(s0.name, s0.idxs, s0.constraints, s0.refs, s0.stmts, s0.tags,
                 schedule=N.BlockSchedule(micro=True,
                                          vector=N.VectorLoop("j", INT32, 8))),), fn.body.tags))
    after = reorder(tagged, GENERIC, {})
    assert block(after, "s0").idxs == s0.idxs                  # the indices stay
    assert block(after, "s0").schedule.order == ("i",)         # the order is recorded


def test_pointer_incremented_leaves_keep_the_reduction_innermost() -> None:
    """A shift convolution after ptrinc reads X through a table of increments per c, so
    X's view shows no stride for c and Wt (stride K along c) would put c outside l (h),
    aggregating into memory after every c; c stays innermost, on register accumulators
    (4.8x faster on the paper's 8x256x256 28x28 on the AMD EPYC host)."""
    from polytile.passes.autotile import autotile
    from polytile.passes.ptrinc import ptrinc
    source = ("def sc(float(N,C,H,W) X, int32(C) SH, float(C,K) Wt) -> (O) {\n"
              "  O(i,j,l,w) +=! X(i, c, l + SH(c), w) * Wt(c,j) where l in 0:H-3\n}\n")
    fn = lowered(source, {"X": (4, 64, 8, 20), "SH": (64,), "Wt": (64, 24)})
    avx512 = target("cpu-avx512")
    before = autotile(ptrinc(fn, avx512, {}), avx512, {})
    after = reorder(before, avx512, {})
    leaf, = [b for b in leaves(after.body) if "contraction" in b.tags and b.schedule.vector]
    assert any(isinstance(s, N.Load) and s.offset for s in leaf.stmts)
    written = {n for r in leaf.refs if r.dir != "in" for a in r.access for n in a.names}
    order = leaf.schedule.order
    assert order and order[-1] not in written                  # the reduction innermost
    assert all(n in written for n in order[:-1])
    check_pass("reorder_ptrinc_leaf", before, after)
