"""Aten views as index maps (no statement, no copy): the consumer's subscripts are
remapped. Only affine maps: a reshape that merges dimensions would need a division in
the subscript, so it stays with torch.

    permute(x, [1, 0])  then  exp(.)   ->   t1(i0, i1) = exp(x0(i1, i0)) where ...
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.fx import Node

from polytile.interop.fx_rules import (
    Index,
    Region,
    Rule,
    Value,
    args_of,
    aten,
    rule,
    shape_of,
    static,
)


def _view_rule(index_of: Callable[[Node, Value], Callable[[Index], Index]]) -> Rule:
    def apply(region: Region, node: Node, args: list[Any]) -> Value:
        shape = shape_of(node)
        assert shape is not None
        index = index_of(node, args[0])
        names = tuple(f"i{d}" for d in range(len(shape)))
        if shape == args[0].shape and index(names) == names:
            return args[0]           # the same elements in the same places (clone, view)
        return args[0].view(shape, index)
    return apply


def _permutation(node: Node, x: Value) -> list[int]:
    rank = len(x.shape)
    if node.target is aten.t.default:
        return [1, 0] if rank == 2 else list(range(rank))
    if node.target is aten.transpose.int:
        d0, d1 = (d % rank for d in args_of(node)[1:3])
        order = list(range(rank))
        order[d0], order[d1] = order[d1], order[d0]
        return order
    return [d % rank for d in args_of(node)[1]]


def _permute(node: Node, x: Value) -> Callable[[Index], Index]:
    order = _permutation(node, x)
    inverse = [order.index(d) for d in range(len(order))]
    return lambda idx: tuple(idx[inverse[d]] for d in range(len(order)))


rule(aten.t.default, aten.transpose.int, aten.permute.default)(_view_rule(_permute))


def _drop_ones(node: Node, x: Value) -> Callable[[Index], Index]:
    """unsqueeze / squeeze / identity views: only size-1 dimensions change, so the
    value's indices at the other dimensions are the tensor's, in order."""
    out = shape_of(node)
    assert out is not None
    kept = [d for d, n in enumerate(out) if n != 1]

    def index(idx: Index) -> Index:
        inner = iter(idx[d] for d in kept)
        return tuple("0" if n == 1 else next(inner) for n in x.shape)
    return index


rule(aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
     aten.clone.default, aten.alias.default, aten.detach.default,
     check=lambda n: set(n.kwargs) <= {"memory_format"})(_view_rule(_drop_ones))


def _expand(node: Node, x: Value) -> Callable[[Index], Index]:
    out = shape_of(node)
    assert out is not None
    lead = len(out) - len(x.shape)
    return lambda idx: tuple("0" if n == 1 else idx[lead + d] for d, n in enumerate(x.shape))


rule(aten.expand.default, check=lambda n: set(n.kwargs) <= {"implicit"})(_view_rule(_expand))


def reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, list[int]]] | None:
    """For each source dimension larger than 1, the destination dimensions (larger than
    1, consecutive) it splits into; None when the reshape merges dimensions (the source
    index would need a division: left to torch)."""
    wanted = [d for d, n in enumerate(dst) if n > 1]
    groups, k = [], 0
    for d, n in enumerate(src):
        if n == 1:
            continue
        group, product = [], 1
        while product < n and k < len(wanted):
            group.append(wanted[k])
            product *= dst[wanted[k]]
            k += 1
        if product != n:
            return None
        groups.append((d, group))
    return groups if k == len(wanted) else None


def _reshape_check(node: Node) -> bool:
    x, out = shape_of(args_of(node)[0]), shape_of(node)
    if x is None or out is None:
        return False
    if not (static(x) and static(out)):      # symbolic: only ones added or removed
        return [d for d in x if d != 1] == [d for d in out if d != 1]
    return reshape_groups(x, out) is not None  # type: ignore[arg-type]


def _reshape(node: Node, x: Value) -> Callable[[Index], Index]:
    out = shape_of(node)
    assert out is not None
    if static(x.shape) and static(out):
        groups = reshape_groups(x.shape, out)  # type: ignore[arg-type]
    else:
        groups = list(zip([d for d, n in enumerate(x.shape) if n != 1],
                          [[d] for d, n in enumerate(out) if n != 1]))
    assert groups is not None

    def index(idx: Index) -> Index:
        subs = ["0"] * len(x.shape)
        for d, group in groups:
            terms: list[str] = []
            stride: Any = 1               # symbolic shapes: one dimension per group
            for o in reversed(group):
                terms.append(idx[o] if stride == 1 else f"{stride} * {idx[o]}")
                stride *= out[o]
            subs[d] = " + ".join(reversed(terms))
        return tuple(subs)
    return index


rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
     check=_reshape_check)(_view_rule(_reshape))


def _slice_check(node: Node) -> bool:
    x = shape_of(args_of(node)[0])
    args = list(args_of(node)[1:]) + [None] * (5 - len(node.args))
    step = args[3] if args[3] is not None else 1
    return (x is not None and static(x) and not node.kwargs and isinstance(step, int)
            and step > 0)


def _slice(node: Node, x: Value) -> Callable[[Index], Index]:
    rank = len(x.shape)
    args = list(args_of(node)[1:]) + [None] * (5 - len(node.args))
    dim = (args[0] or 0) % rank
    start = args[1] or 0
    extent = int(x.shape[dim])               # static: see _slice_check
    start = max(0, start + extent if start < 0 else min(start, extent))
    step = args[3] or 1

    def index(idx: Index) -> Index:
        sub = idx[dim] if step == 1 else f"{step} * {idx[dim]}"
        return idx[:dim] + ((f"{sub} + {start}" if start else sub),) + idx[dim + 1:]
    return index


rule(aten.slice.Tensor, check=_slice_check)(_view_rule(_slice))


def _select(node: Node, x: Value) -> Callable[[Index], Index]:
    dim = args_of(node)[1] % len(x.shape)
    at = args_of(node)[2] % x.shape[dim]
    return lambda idx: idx[:dim] + (str(at),) + idx[dim:]


rule(aten.select.int, check=lambda n: not n.kwargs and static(shape_of(args_of(n)[0]) or ("?",))
     )(_view_rule(_select))


VIEWS = frozenset({aten.t.default, aten.transpose.int, aten.permute.default,
                   aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
                   aten.squeeze.default, aten.clone.default, aten.alias.default,
                   aten.detach.default, aten.expand.default, aten.view.default,
                   aten._unsafe_view.default, aten.reshape.default, aten.slice.Tensor,
                   aten.select.int})
