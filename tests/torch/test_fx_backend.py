"""polytile.torch.backend: torch.compile models whose aten forward graphs become one TC
module (one def per region), checked against eager torch on odd sizes; unsupported
operators stay with torch and the model still runs."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch is an optional dependency "
                            "(pip install polytile[torch])")

import polytile.torch as ptt
from polytile.interop.fx_views import reshape_groups

nn, F = torch.nn, torch.nn.functional


def run(model, *args, grad: bool = False):
    """The compiled model's outputs, eager's, and what the backend compiled."""
    torch._dynamo.reset()
    backend = ptt.Backend(keep=True)
    compiled = torch.compile(model, backend=backend)
    with torch.set_grad_enabled(grad):
        ours, eager = compiled(*args), model(*args)
    assert backend.graphs, "the backend was not called"
    return ours, eager, backend.graphs


def close(ours, eager) -> None:
    ours = ours if isinstance(ours, tuple) else (ours,)
    eager = eager if isinstance(eager, tuple) else (eager,)
    for a, b in zip(ours, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(7, 13), nn.Linear(13, 5)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def test_mlp_is_one_region() -> None:
    torch.manual_seed(0)
    ours, eager, graphs = run(MLP(), torch.randn(3, 7))
    close(ours, eager)
    (graph,) = graphs
    assert graph.regions == ("polytile_region_0",) and graph.torch_ops == ()
    assert graph.source.count(" +=! ") == 2          # both addmm contractions


def test_mlp_on_a_batch_of_sequences_leaves_the_merging_reshape_to_torch() -> None:
    """Linear on a 3-d input flattens (merges) two dimensions: not affine, torch's."""
    torch.manual_seed(1)
    x = torch.randn(5, 3, 9).transpose(0, 1)            # non-contiguous, (3, 5, 9)
    model = nn.Sequential(nn.Linear(9, 11), nn.Tanh(), nn.Linear(11, 3))
    ours, eager, graphs = run(model, x)
    close(ours, eager)
    assert graphs[0].regions


class LayerNormGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(11)

    def forward(self, x):
        h = self.ln(x)
        return F.gelu(h, approximate="tanh") + F.gelu(x) * 0.5, h.mean(-1, keepdim=True)


def test_layer_norm_and_gelu_call_a_helper_def() -> None:
    torch.manual_seed(2)
    model = LayerNormGelu()
    with torch.no_grad():
        model.ln.weight.normal_()
        model.ln.bias.normal_()
    ours, eager, graphs = run(model, torch.randn(3, 5, 11))
    close(ours, eager)
    source = graphs[0].source
    assert "def layer_norm_1(" in source and "= layer_norm_1(x" in source


def attention_scores(q, k, mask, scale: float):
    return torch.softmax(q @ k.transpose(-1, -2) * scale + mask, dim=-1)


def test_attention_scores_softmax() -> None:
    torch.manual_seed(3)
    q, k, mask = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(5, 7)
    ours, eager, graphs = run(lambda q, k, m: attention_scores(q, k, m, 0.35), q, k, mask)
    close(ours, eager)
    assert len(graphs[0].regions) == 1 and "softmax_1(" in graphs[0].source


class Ops(nn.Module):
    """Embedding, reductions with keepdim, where, pow, sigmoid, slices, permutes."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6)

    def forward(self, ids, x):
        e = self.emb(ids)                                  # (3, 4, 6)
        a = e.permute(0, 2, 1)                             # (3, 6, 4)
        s = a.sum(dim=(1,), keepdim=True) - a.amax(-1, keepdim=True).mean(1, keepdim=True)
        y = torch.where(x > 0, torch.sigmoid(x) ** 2, -x.exp()) / 3.0
        return s.squeeze(1), y[:, 1:5] * 2 - e.sum(-1), torch.tanh(y).pow(3)


def test_embedding_reductions_and_elementwise() -> None:
    torch.manual_seed(4)
    ids = torch.randint(0, 10, (3, 4))
    ours, eager, graphs = run(Ops(), ids, torch.randn(3, 6))
    close(ours, eager)
    assert graphs[0].torch_ops == ()


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(7, 13), nn.Linear(13, 5)

    def forward(self, x):
        h = torch.cumsum(F.relu(self.l1(x)), dim=1)        # cumsum: no rule, torch's
        return torch.softmax(self.l2(h), -1), h.sum(0)


def test_unsupported_operator_stays_with_torch() -> None:
    torch.manual_seed(5)
    ours, eager, graphs = run(Mixed(), torch.randn(3, 7))
    close(ours, eager)
    assert "aten.cumsum.default" in graphs[0].torch_ops
    assert len(graphs[0].regions) == 2                     # before and after the cumsum


def test_training_uses_polytile_forward_and_torch_backward() -> None:
    torch.manual_seed(6)
    model, x = Mixed(), torch.randn(3, 7)
    ours, eager, _ = run(model, x, grad=True)
    close(tuple(o.detach() for o in ours), tuple(e.detach() for e in eager))
    ours[0].sum().backward()
    mine = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x)[0].sum().backward()
    for a, b in zip(mine, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("src, dst, affine", [
    ((6, 4), (2, 3, 4), True), ((6, 4), (6, 1, 4), True), ((1, 6), (6,), True),
    ((2, 3), (6,), False), ((6, 4), (4, 6), False), ((2, 3, 4), (2, 3, 4), True)])
def test_reshape_is_a_view_only_where_affine(src, dst, affine) -> None:
    assert (reshape_groups(src, dst) is not None) == affine


def _aten_graph(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn, tracing_mode="fake")(*args)


def test_region_text() -> None:
    """The TC a small graph becomes: views fold into subscripts, softmax is a helper
    def called from the region, and the last statement writes the output."""
    from polytile.interop.fx import compile_graph

    def f(x, w, b):
        return torch.softmax(F.relu(x @ w.t() + b), -1).sum(0)

    args = (torch.randn(3, 5), torch.randn(4, 5), torch.randn(4))
    graph = compile_graph(_aten_graph(f, *args))
    assert graph.source.splitlines()[-7:] == [
        "def polytile_region_0(float(4, 5) x0, float(3, 5) x1, float(4) x2) -> (y0) {",
        "  t1(i0, i1) +=! x1(i0, k0) * x0(i1, k0) where i0 in 0:3, i1 in 0:4, k0 in 0:5",
        "  t2(i0, i1) = t1(i0, i1) + x2(i1) where i0 in 0:3, i1 in 0:4",
        "  t3(i0, i1) = relu(t2(i0, i1)) where i0 in 0:3, i1 in 0:4",
        "  t4 = softmax_1(t3)",
        "  y0(i0) +=! t4(k0, i0) where i0 in 0:4, k0 in 0:3",
        "}"]
    torch.testing.assert_close(graph(*args), f(*args))


def test_a_region_polytile_refuses_stays_with_torch(monkeypatch) -> None:
    """A rule that writes TC polytile refuses costs that region, with a warning, not the
    compile."""
    from polytile.errors import PolytileWarning
    from polytile.interop import fx_rules
    from polytile.interop.fx import compile_graph

    def broken(region, node, args):
        return region.emit(args[0].shape, args[0].dtype, lambda idx: "undefined_tensor(0)")

    monkeypatch.setitem(fx_rules.RULES, fx_rules.aten.relu.default, broken)
    x = torch.randn(3, 5)
    with pytest.warns(PolytileWarning, match="leaves polytile_region_0 to torch"):
        graph = compile_graph(_aten_graph(lambda x: F.relu(x * 2), x))
    assert graph.regions == ()
    torch.testing.assert_close(graph(x), F.relu(x * 2))


def test_symbolic_sizes_become_tc_size_names() -> None:
    """A call with new shapes makes torch.compile retrace with symbolic sizes; the
    region keeps them as TC size names and polytile specializes per call."""
    torch._dynamo.reset()
    torch.manual_seed(7)
    model = LayerNormGelu()
    backend = ptt.Backend(keep=True)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for rows in (3, 5, 8):
            x = torch.randn(rows, 4, 11)
            close(compiled(x), model(x))
    assert len(backend.graphs) == 2
    dynamic = backend.graphs[-1]
    assert dynamic.regions and dynamic.torch_ops == ()
    assert "float(s" in dynamic.source        # a symbolic size in the signature


UNARY = [torch.tanh, torch.sigmoid, F.relu, F.gelu, lambda a: F.gelu(a, approximate="tanh"),
         lambda a: -a, lambda a: (a.abs() + 1).log(), lambda a: a * 0.5 - 1, lambda a: a ** 2,
         lambda a: torch.softmax(a, -1), lambda a: torch.log_softmax(a, 0),
         lambda a: a - a.mean(-1, keepdim=True), lambda a: a / (a.abs().amax(0) + 1),
         lambda a: a.sum(0, keepdim=True) + a, lambda a: a.t().contiguous().t() * 2,
         lambda a: a.unsqueeze(0).expand(2, *a.shape).sum(0)]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum,
          lambda a, y: torch.where(a > y, a, y), lambda a, y: a / (y.abs() + 1)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(UNARY) - 1), st.integers(0, len(BINARY) - 1)),
                min_size=1, max_size=4),
       st.integers(1, 6), st.integers(1, 7), st.integers(0, 2**31 - 1))
def test_random_chains_match_torch(chain, m, n, seed) -> None:
    """Chains of elementwise ops, reductions and views on a (m, n) tensor with a (n,) one
    broadcast in: the region (run by the reference interpreter) computes what torch does."""
    from polytile.interop.fx import compile_graph

    def f(x, y):
        for u, b in chain:
            x = BINARY[b](UNARY[u](x), y)
        return x

    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(m, n, generator=g), torch.randn(n, generator=g)
    graph = compile_graph(_aten_graph(f, x, y), backend="interp")
    assert graph.regions and graph.torch_ops == ()
    torch.testing.assert_close(graph(x, y), f(x, y), rtol=1e-4, atol=1e-5)
