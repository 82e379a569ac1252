"""Finite-difference checks of derived gradients, independent of polytile.autodiff:
the directional derivative of L = sum(seed * outputs) along a random direction,
by central differences in float64, against the derived gradients' inner product
with that direction."""
from __future__ import annotations

from typing import Any

import numpy as np

import polytile as pt

EPS = 1e-6


def as_tuple(x: Any) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def gradient_function(module: pt.Module) -> pt.TCFunction:
    (fn,) = module.program.functions
    return module[fn.name]


def check(fn: pt.TCFunction, args: tuple, rng: np.random.Generator,
          grad_backend_fn: pt.TCFunction | None = None, rtol: float = 1e-6) -> None:
    """fn runs in float64; its derived gradient (or `grad_backend_fn`, the same
    gradient compiled otherwise) matches central differences."""
    floats = [k for k, (p, a) in enumerate(zip(fn.fn.params, args))
              if p.kind == "input" and p.dtype.is_float]
    outputs = as_tuple(fn(*args))
    seeds = [rng.standard_normal(np.shape(o)).astype(o.dtype) for o in outputs
             if o.dtype.kind == "f"]
    gradient = grad_backend_fn or gradient_function(pt.grad(fn))
    grads = as_tuple(gradient(*args, *seeds))
    assert len(grads) == len(floats)
    directions = {k: rng.standard_normal(np.shape(args[k])) for k in floats}

    def loss(step: float) -> float:
        moved = tuple(a + step * directions[k] if k in directions else a
                      for k, a in enumerate(args))
        outs = [o for o in as_tuple(fn(*moved)) if o.dtype.kind == "f"]
        return float(sum(np.sum(s * o) for s, o in zip(seeds, outs)))

    numeric = (loss(EPS) - loss(-EPS)) / (2 * EPS)
    derived = float(sum(np.sum(g * directions[k]) for g, k in zip(grads, floats)))
    scale = max(abs(numeric), abs(derived), 1.0)
    assert abs(numeric - derived) <= rtol * scale * 10 + 1e-7, (
        f"{fn.name}: derivative along a random direction {derived}, finite differences "
        f"{numeric}\n{pt.grad(fn).source}")
