"""The workloads `polytile bench` runs: issue 4's list, and a quick set for smoke runs.

    for w in select(quick=False, only=["tmm", "softmax"]):
        args = w.make_inputs(np.random.default_rng(0))
        expected = w.numpy(*args)

Sizes are the issue's (the TC paper's, scaled for 2 CPU cores). Issue 4 names batchnorm
and group norm without sizes; they use a ResNet-like activation of 51 MiB (larger than
this machine's caches, like softmax and the GELU chain). The quick set has every
workload at small sizes that divide no tile, for a run of a few seconds.
"""
from __future__ import annotations

from collections.abc import Sequence

from polytile.bench.contractions import gconv, mlp1, mlp3, tbmm, tmm, two_lut
from polytile.bench.einsums import conv_einsum, shift_conv_einsum
from polytile.bench.memorybound import batchnorm, bias_gelu_residual, groupnorm, layernorm, softmax
from polytile.bench.workload import Workload


def full_set() -> list[Workload]:
    return [
        tmm(128, 32, 256), tmm(128, 1024, 1024), tmm(1024, 1024, 1024),
        tbmm(500, 26, 72, 26),
        gconv(32, 32, 16, 16, 14, 14),
        mlp1(128, 2000, 128),
        # MLP3 small as issue 13 sizes it (128x256 -> 128 -> 64 -> 32, 11 MFLOP), and the
        # smaller one the bench measured before it (2.6 MFLOP).
        mlp3(128, 256, 128, 64, 32), mlp3(128, 128, 64, 32, 2),
        mlp3(128, 1024, 1024, 1024, 1024),
        two_lut(1_000_000, 64, 128, 50),
        softmax(4096, 4096),
        layernorm(4096, 1024),
        batchnorm(64, 256, 28, 28),
        groupnorm(64, 32, 8, 28, 28),
        bias_gelu_residual(4096, 4096),
        shift_conv_einsum(8, 256, 256, 28, 28),
        conv_einsum(1, 64, 64, 56, 56),
    ]


def quick_set() -> list[Workload]:
    return [
        tmm(37, 19, 53),
        tbmm(5, 6, 7, 9),
        gconv(2, 3, 4, 5, 9, 8),
        mlp1(8, 41, 13),
        mlp3(8, 17, 9, 5, 2),
        two_lut(1000, 8, 6, 5),
        softmax(33, 101),
        layernorm(33, 67),
        batchnorm(4, 6, 7, 5),
        groupnorm(3, 4, 2, 7, 5),
        bias_gelu_residual(33, 101),
        shift_conv_einsum(2, 5, 3, 7, 6),
        conv_einsum(2, 3, 5, 9, 7),
    ]


def select(quick: bool = False, only: Sequence[str] | None = None) -> list[Workload]:
    """The chosen set, filtered by family ("tmm") or full name ("tmm 128x32x256")."""
    chosen = quick_set() if quick else full_set()
    if only:
        chosen = [w for w in chosen if w.matches(only)]
    return chosen


def families() -> list[str]:
    return list(dict.fromkeys(w.key for w in full_set()))
