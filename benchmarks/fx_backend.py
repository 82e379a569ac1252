"""torch.compile(backend=polytile.torch.backend) against eager torch and inductor on
three small models (inference): an MLP, layer norm + GELU + residual, and attention
scores -> softmax -> @V. Prints the median time per call of each and the ratios, and
how many polytile regions (kernels' defs) and torch operators each graph kept.

    PYTHONPATH=. python benchmarks/fx_backend.py [--repeat 50]

Medians of interleaved runs; on a shared machine the noise is large, so ratios within
~15% are not a difference.

Measured 2026-11-25 on AMD EPYC Zen 3, AVX2, 2 cores, under load (load average ~4),
with OMP_NUM_THREADS=1 (with 2 threads every time varied by up to 10x between runs):

    workload                  eager     inductor  polytile  eager/polytile  inductor/polytile
    mlp 127x256->512->256     1266 us   1400 us   2656 us   0.48            0.53
    layernorm+gelu 1023x768   4477 us   6394 us   2577 us   1.74            2.48
    attention 4x127x64         480 us    481 us    960 us   0.50            0.50

One polytile region per graph, no operator left to torch. The GEMM-bound graphs lose to
torch's BLAS calls; the memory-bound one (a row reduction feeding elementwise work) wins.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import polytile.torch as ptt


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


class LayerNormGelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(768)

    def forward(self, x):
        return x + F.gelu(self.ln(x), approximate="tanh")


def attention(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.125 + mask, dim=-1) @ v


def workloads():
    torch.manual_seed(0)
    yield "mlp 127x256->512->256", MLP().eval(), (torch.randn(127, 256),)
    yield "layernorm+gelu 1023x768", LayerNormGelu().eval(), (torch.randn(1023, 768),)
    yield "attention 4x127x64", attention, (torch.randn(4, 127, 64), torch.randn(4, 127, 64),
                                            torch.randn(4, 127, 64), torch.randn(127, 127))


def median_time(fn, args, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=50)
    opts = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, model, args in workloads():
        torch._dynamo.reset()
        backend = ptt.Backend(keep=True)
        runs = {"eager": model,
                "inductor": torch.compile(model, dynamic=False),
                "polytile": torch.compile(model, backend=backend, dynamic=False)}
        with torch.no_grad():
            expected = model(*args)
            for label, fn in runs.items():
                torch.testing.assert_close(fn(*args), expected, rtol=1e-4, atol=1e-4)
            times = {label: [] for label in runs}
            for _ in range(5):                              # interleaved rounds
                for label, fn in runs.items():
                    times[label].append(median_time(fn, args, opts.repeat // 5 or 1))
        t = {label: statistics.median(v) for label, v in times.items()}
        graph = backend.graphs[-1]
        print(f"{name:26s} eager {t['eager'] * 1e6:8.1f} us  inductor "
              f"{t['inductor'] * 1e6:8.1f} us  polytile {t['polytile'] * 1e6:8.1f} us  "
              f"eager/polytile {t['eager'] / t['polytile']:5.2f}  inductor/polytile "
              f"{t['inductor'] / t['polytile']:5.2f}  regions {len(graph.regions)} "
              f"torch ops {len(graph.torch_ops)}")


if __name__ == "__main__":
    main()
