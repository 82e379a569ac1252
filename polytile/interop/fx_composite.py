"""Composite aten operators as helper defs of the module, called from the region:

    _softmax(t3, -1, False)   ->   t4 = softmax_1(t3)
                                   def softmax_1(float(D0, D1) x) -> (y) { ... }

one helper per variant (rank, dimension, dtype, ...); semantics inlines the calls
(docs/language.md, "Functions calling functions"), so the passes see one function.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import Node

from polytile.interop.fx_rules import TC_TYPES, Region, Value, args_of, aten, literal, rule


def _signature(name: str, dtype: torch.dtype, dims: Sequence[str], label: str = "x") -> str:
    return f"{TC_TYPES[dtype]}({', '.join(dims)}) {label}"


def _softmax_def(rank: int, dim: int, dtype: torch.dtype, log: bool) -> Callable[[str], str]:
    def make(name: str) -> str:
        sizes = [f"D{d}" for d in range(rank)]
        a = [f"a{d}" for d in range(rank)]
        full = f"({', '.join(a)})"
        rest = [x for d, x in enumerate(a) if d != dim]
        red = f"({', '.join(rest)})" if rest else ""
        result = (f"y{full} = x{full} - m{red} - log(s{red})" if log
                  else f"y{full} = e{full} / s{red}")
        return (f"def {name}({_signature(name, dtype, sizes)}) -> (y) {{\n"
                f"  m{red} max=! x{full}\n  e{full} = exp(x{full} - m{red})\n"
                f"  s{red} +=! e{full}\n  {result}\n}}\n")
    return make


def _softmax_check(node: Node) -> bool:
    return not node.kwargs and args_of(node)[2] is False


def _softmax(region: Region, node: Node, args: list[Any], log: bool) -> Value:
    x = region.plain(args[0])
    rank = len(x.shape)
    dim = args_of(node)[1] % rank if rank else 0
    helper = region.helpers.get(("log_softmax" if log else "softmax", rank, dim, x.dtype),
                                _softmax_def(rank, dim, x.dtype, log))
    y = region.fresh()
    region.statements.append(f"{y} = {helper}({x.tensor})")
    return Value(y, x.shape, x.dtype)


rule(aten._softmax.default, check=_softmax_check)(
    lambda region, node, args: _softmax(region, node, args, log=False))
rule(aten._log_softmax.default, check=_softmax_check)(
    lambda region, node, args: _softmax(region, node, args, log=True))


def _layer_norm_def(rank: int, normalized: int, dtype: torch.dtype, weight: bool, bias: bool,
                    eps: str) -> Callable[[str], str]:
    def make(name: str) -> str:
        sizes = [f"D{d}" for d in range(rank)]
        a = [f"a{d}" for d in range(rank)]
        outer, inner = rank - normalized, sizes[rank - normalized:]
        full = f"({', '.join(a)})"
        row = f"({', '.join(a[:outer])})" if outer else ""
        params = [_signature(name, dtype, sizes)]
        scaled = f"d{full} * rstd{row}"
        if weight:
            params.append(_signature(name, dtype, inner, "w"))
            scaled += f" * w({', '.join(a[outer:])})"
        if bias:
            params.append(_signature(name, dtype, inner, "b"))
            scaled += f" + b({', '.join(a[outer:])})"
        count = f"{TC_TYPES[dtype]}({' * '.join(inner)})"
        return (f"def {name}({', '.join(params)}) -> (y, mean, rstd) {{\n"
                f"  s{row} +=! x{full}\n  mean{row} = s{row} / {count}\n"
                f"  d{full} = x{full} - mean{row}\n  q{row} +=! d{full} * d{full}\n"
                f"  rstd{row} = rsqrt(q{row} / {count} + {eps})\n  y{full} = {scaled}\n}}\n")
    return make


def _layer_norm_check(node: Node) -> bool:
    return not node.kwargs and literal(args_of(node)[4]) is not None and all(
        isinstance(a, Node) or a is None for a in args_of(node)[2:4])


@rule(aten.native_layer_norm.default, check=_layer_norm_check)
def _layer_norm(region: Region, node: Node, args: list[Any]) -> tuple[Value, ...]:
    x = region.plain(args[0])
    rank, normalized = len(x.shape), len(args_of(node)[1])
    weight, bias = (region.plain(a) if isinstance(a, Value) else None for a in args[2:4])
    eps = literal(args_of(node)[4])
    assert eps is not None
    helper = region.helpers.get(
        ("layer_norm", rank, normalized, x.dtype, weight is not None, bias is not None, eps),
        _layer_norm_def(rank, normalized, x.dtype, weight is not None, bias is not None, eps))
    y, mean, rstd = region.fresh(), region.fresh(), region.fresh()
    operands = [x.tensor] + [v.tensor for v in (weight, bias) if v is not None]
    region.statements.append(f"({y}, {mean}, {rstd}) = {helper}({', '.join(operands)})")
    outer = rank - normalized
    stats_shape = x.shape[:outer] + (1,) * normalized
    stats = [Value(t, x.shape[:outer], x.dtype).view(stats_shape, lambda idx: idx[:outer])
             for t in (mean, rstd)]
    return (Value(y, x.shape, x.dtype), *stats)
