"""torch.compile(backend=polytile.torch.backend) against eager torch and inductor on
three small models (inference): an MLP, layer norm + GELU + residual, and attention
scores -> softmax -> @V. Prints the median time per call of each and the ratios, and
how many polytile regions (kernels' defs) and torch operators each graph kept.

    PYTHONPATH=. python benchmarks/fx_backend.py [--repeat 50]

Medians of interleaved runs; on a shared machine the noise is large, so ratios within
~15% are not a difference.
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
