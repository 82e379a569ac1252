"""Workloads run through `pt.einsum` (issue 16, part 3): the extended tensor contractions
paper's shift convolution, and a 3x3 convolution, against PyTorch's eager versions.

The workload's TC is the one the spec lowers to (`polytile einsum` prints it), so the
tuner and `polytile show` see the kernel `pt.einsum` runs; the harness calls
`pt.einsum(spec, *operands, **tables)` itself (`Workload.einsum`), with the workload's
last inputs as the tables named in `Workload.tables`.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from polytile.bench.workload import Workload, torch_module, uniform
from polytile.einsum import einsum_tc

SHIFT_SPEC = "nc(h+1+sh[c])(w+1+sw[c]),ck->nkhw"
CONV_SPEC = "nc(h+r)(w+s),kcrs->nkhw"


def _shift_numpy(x: np.ndarray, wt: np.ndarray, sh: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """Gather the shifted channels (one copy), then one batched matmul, as a NumPy user would."""
    n, c, h, w = x.shape
    moved = np.empty((n, c, h - 2, w - 2), np.float32)
    for k in range(c):
        a, b = 1 + int(sh[k]), 1 + int(sw[k])
        moved[:, k] = x[:, k, a:a + h - 2, b:b + w - 2]
    return np.matmul(wt.T, moved.reshape(n, c, -1)).reshape(n, -1, h - 2, w - 2)


def _shift_torch(x: Any, wt: Any, sh: Any, sw: Any) -> Any:
    """The shift as one advanced-indexing gather (every channel at its own offset), then
    a 1x1 convolution: the fastest eager form we found (a per-channel loop of slices
    and torch.roll per channel are slower on 256 channels)."""
    torch = torch_module()
    _, c, h, w = x.shape
    rows = torch.arange(1, h - 1)[None, :] + sh.long()[:, None]          # c, h-2
    cols = torch.arange(1, w - 1)[None, :] + sw.long()[:, None]          # c, w-2
    moved = x[:, torch.arange(c)[:, None, None], rows[:, :, None], cols[:, None, :]]
    return torch.nn.functional.conv2d(moved, wt.t()[:, :, None, None])


def shift_conv_einsum(n: int, c: int, k: int, h: int, w: int) -> Workload:
    """Output h x w: the input has a one-pixel border for shifts in -1..1."""
    def inputs(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        sh = rng.integers(-1, 2, c).astype(np.int32)
        sw = rng.integers(-1, 2, c).astype(np.int32)
        sh[0] = sw[0] = 1        # the widest shift is present: the output is h x w
        return uniform(rng, n, c, h + 2, w + 2), uniform(rng, c, k), sh, sw
    return Workload(
        "shiftconv-einsum", (("N", n), ("C", c), ("K", k), ("H", h), ("W", w)),
        einsum_tc(SHIFT_SPEC, ["float32", "float32"], {"sh": "int32", "sw": "int32"}),
        "einsum", inputs, _shift_numpy, torch=_shift_torch,
        flops=2.0 * n * k * c * h * w, rtol=1e-3, atol=1e-3,
        note=f"pt.einsum('{SHIFT_SPEC}'); shifts in [-1, 1]; torch: index gather + 1x1 conv2d",
        einsum=SHIFT_SPEC, tables=("sh", "sw"))


def _conv_numpy(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
    """im2col (one copy) and one matmul, as a NumPy user would."""
    n, c, _, _ = x.shape
    k, _, r, s = wt.shape
    windows = sliding_window_view(x, (r, s), axis=(2, 3))        # n c oh ow r s
    oh, ow = windows.shape[2:4]
    cols = windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * r * s)
    out = cols @ wt.reshape(k, c * r * s).T
    return out.reshape(n, oh, ow, k).transpose(0, 3, 1, 2)


def conv_einsum(n: int, c: int, k: int, h: int, w: int, r: int = 3) -> Workload:
    """An r x r convolution with output h x w: both sides get the same input with its
    border (h + r - 1 rows), so torch's conv2d runs without padding."""
    return Workload(
        "conv-einsum", (("N", n), ("C", c), ("K", k), ("H", h), ("W", w)),
        einsum_tc(CONV_SPEC, ["float32", "float32"]), "einsum",
        lambda rng: (uniform(rng, n, c, h + r - 1, w + r - 1), uniform(rng, k, c, r, r)),
        _conv_numpy, torch=lambda x, wt: torch_module().nn.functional.conv2d(x, wt),
        flops=2.0 * n * k * c * h * w * r * r, rtol=1e-3, atol=1e-3,
        note=f"pt.einsum('{CONV_SPEC}'); {r}x{r}, stride 1, input with its border; "
             "torch: conv2d",
        einsum=CONV_SPEC)
