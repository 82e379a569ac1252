"""A `torch.compile` backend: aten graphs become one TC module, the rest stays torch.

    model = torch.compile(model, backend=polytile.torch.backend)

`aot_autograd` gives the backend the forward graph in aten operators (parameters are
inputs). torch's `CapabilityBasedPartitioner` groups the nodes polytile has a rule for
(`fx_rules.supported`) into maximal regions without cycles; each region with at least
one computing node becomes one `def` of a single TC module (helper defs for softmax and
layer norm are called from the regions), and its submodule in the graph is replaced by
a call of that def on the tensors. Everything else (unsupported operators, dynamic
shapes, regions made only of views) runs in torch, so the result is one callable: the
partitioned graph module.

Forward only: a backward graph (training) is left to torch as it is, so gradients are
torch's, and the forward's kernels are polytile's.
"""
from __future__ import annotations

import operator
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from polytile.api import Module, TCFunction, define
from polytile.errors import PolytileError, PolytileWarning, UnsupportedError
from polytile.interop import fx_composite, fx_rules  # noqa: F401 (rules register on import)
from polytile.interop.fx_rules import TC_TYPES, Helpers, Region, Value, dtype_of, shape_of
from polytile.interop.fx_views import VIEWS


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules: Any, node: Node) -> bool:
        return fx_rules.supported(node)


@dataclass
class CompiledGraph:
    """One graph's result: the TC source (one def per region), the module, and the
    partitioned graph module that runs it."""

    source: str
    module: Module | None
    graph: GraphModule
    regions: tuple[str, ...]
    torch_ops: tuple[str, ...]           # operators left to torch

    def __call__(self, *args: Any) -> Any:
        return self.graph(*args)


class _Kernel(torch.nn.Module):
    """Stands for a region's submodule: calls the region's def on the tensors."""

    def __init__(self, fn: TCFunction, outputs: int, as_tuple: bool):
        super().__init__()
        self.fn, self.outputs, self.as_tuple = fn, outputs, as_tuple

    def forward(self, *args: torch.Tensor) -> Any:
        # NumPy views of the tensors' memory take the launcher's fast path.
        result = self.fn(*[a.detach().numpy() for a in args])
        result = result if isinstance(result, tuple) else (result,)
        tensors = tuple(torch.from_numpy(r) for r in result[:self.outputs])
        return tensors if self.as_tuple else tensors[0]


def compile_graph(gm: GraphModule, example_inputs: Sequence[Any] = (),
                  backend: str = "c") -> CompiledGraph:
    """Partition `gm` (an aten graph with shapes in `node.meta["val"]`) and compile its
    regions as one TC module (`backend` as in `polytile.define`: "interp" runs the
    reference interpreter)."""
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    partitions = [p for p in partitioner.propose_partitions()
                  if any(n.target not in VIEWS and n.target is not operator.getitem
                         for n in p.nodes)]
    fused = partitioner.fuse_partitions(partitions, prefix="polytile_region_")
    helpers = Helpers()
    defs: list[tuple[str, str, int, bool]] = []
    for name, sub in list(fused.named_children()):
        if not name.startswith("polytile_region_") or not isinstance(sub, GraphModule):
            continue
        try:
            text, outputs, as_tuple = region_def(name, sub, helpers)
        except UnsupportedError:
            continue                      # stays a torch submodule
        defs.append((name, text, outputs, as_tuple))
    defs = [d for d in defs if _accepted(helpers.source + d[1], d[0])]
    source = helpers.source + "\n".join(text for _, text, _, _ in defs)
    module = define(source, backend, name="<torch.compile graph>") if defs else None
    for name, _, outputs, as_tuple in defs:
        assert module is not None
        setattr(fused, name, _Kernel(module[name], outputs, as_tuple))
    left = tuple(str(n.target) for n in fused.graph.nodes
                 if n.op == "call_function" and n.target is not operator.getitem)
    fused.recompile()
    return CompiledGraph(source, module, fused, tuple(d[0] for d in defs), left)


def _accepted(source: str, name: str) -> bool:
    """Whether polytile accepts a region's def; one it refuses (a missing case of a rule)
    stays torch's, with a warning, rather than failing the whole compile."""
    try:
        define(source, backend="interp", name=f"<{name}>")
    except PolytileError as e:
        warnings.warn(f"polytile leaves {name} to torch: {e}", PolytileWarning, stacklevel=2)
        return False
    return True


def region_def(name: str, sub: GraphModule, helpers: Helpers) -> tuple[str, int, bool]:
    """The TC def of one region's graph, its number of outputs and whether the submodule
    returns a tuple."""
    region = Region(helpers)
    values: dict[Node, Any] = {}
    params: list[str] = []
    for k, node in enumerate(n for n in sub.graph.nodes if n.op == "placeholder"):
        shape, dtype = shape_of(node), dtype_of(node)
        if shape is None or dtype not in TC_TYPES:
            raise UnsupportedError(f"input {node.name} has no static shape and TC type")
        params.append(f"{TC_TYPES[dtype]}({', '.join(map(str, shape))}) x{k}")
        values[node] = Value(f"x{k}", shape, dtype)
    result: Any = None
    for node in sub.graph.nodes:
        if node.op == "call_function":
            args = [_argument(a, values) for a in node.args]
            values[node] = fx_rules.RULES[node.target](region, node, args)
        elif node.op == "output":
            result = node.args[0]
    as_tuple = isinstance(result, (tuple, list))
    outs = list(result) if as_tuple else [result]
    names: list[str] = []
    renamed: dict[str, str] = {}
    for k, out in enumerate(outs):
        v, y = values[out], f"y{k}"
        names.append(y)
        if v.plain and re.fullmatch(r"t\d+", v.tensor) and v.tensor not in renamed:
            renamed[v.tensor] = y         # the statement that computes it writes the output
        else:
            region.emit(v.shape, v.dtype, v.at, name=y)
    for t, y in renamed.items():
        region.statements = [re.sub(rf"\b{t}\b", y, s) for s in region.statements]
    body = "\n".join(f"  {s}" for s in region.statements)
    text = f"def {name}({', '.join(params)}) -> ({', '.join(names)}) {{\n{body}\n}}\n"
    return text, len(outs), as_tuple


def _argument(a: Any, values: dict[Node, Any]) -> Any:
    if isinstance(a, Node):
        return values[a]
    if isinstance(a, (list, tuple)) and any(isinstance(x, Node) for x in a):
        raise UnsupportedError("a list of tensors as an argument")
    return a


@dataclass
class Backend:
    """`torch.compile(model, backend=Backend())`. With `keep=True` the compiled graphs are
    kept in `graphs` (to print their TC, count regions); the shared `backend` keeps none."""

    keep: bool = False
    graphs: list[CompiledGraph] = field(default_factory=list)

    def __call__(self, gm: GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        def forward(graph: GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
            compiled = compile_graph(graph, inputs)
            if self.keep:
                self.graphs.append(compiled)
            return make_boxed_func(compiled)

        def backward(graph: GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
            return make_boxed_func(graph)     # gradients: torch's own aten graph

        return aot_autograd(fw_compiler=forward, bw_compiler=backward)(gm, example_inputs)


backend = Backend()
