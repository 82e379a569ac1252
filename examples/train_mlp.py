"""Train a two-layer MLP whose layers are TC functions, next to the same model in plain
PyTorch, on a synthetic classification task; both losses are printed per epoch.

    python examples/train_mlp.py

The layers run as polytile.torch ops: compiled kernels forward, gradients derived from
the TC (polytile.autodiff) backward, torch.optim updating the parameters. With the same
initial weights and batches the two models follow the same trajectory, up to float32
rounding.
"""
from __future__ import annotations

import torch

import polytile as pt
import polytile.torch as ptt

LAYERS = pt.define("""
def dense_relu(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
  y(n,o) +=! x(n,i) * w(o,i)
  y(n,o) = relu(y(n,o) + b(o))
}
def dense(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
  y(n,o) +=! x(n,i) * w(o,i)
  y(n,o) = y(n,o) + b(o)
}
""")
dense_relu, dense = ptt.op(LAYERS.dense_relu), ptt.op(LAYERS.dense)


def data(samples: int = 2048, features: int = 32, classes: int = 4, seed: int = 0
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Points labelled by the nearest of `classes` random centres."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=gen) * 2
    labels = torch.randint(0, classes, (samples,), generator=gen)
    points = centres[labels] + torch.randn(samples, features, generator=gen)
    return points, labels


def parameters(features: int, hidden: int, classes: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(hidden, features), (hidden,), (classes, hidden), (classes,)]
    return [(torch.randn(*s, generator=gen) / s[-1] ** 0.5).requires_grad_() for s in shapes]


def polytile_model(x: torch.Tensor, w1, b1, w2, b2) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return dense(dense_relu(x, w1, b1), w2, b2)


def torch_model(x: torch.Tensor, w1, b1, w2, b2) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2, b2)


def train(model, epochs: int = 5, batch: int = 128, hidden: int = 64) -> list[float]:  # type: ignore[no-untyped-def]
    """The mean training loss of each epoch."""
    x, y = data()
    params = parameters(x.shape[1], hidden, int(y.max()) + 1, seed=1)
    optimizer = torch.optim.SGD(params, lr=0.1)
    losses = []
    for _ in range(epochs):
        total = 0.0
        for start in range(0, len(x), batch):
            logits = model(x[start:start + batch], *params)
            loss = torch.nn.functional.cross_entropy(logits, y[start:start + batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / (len(x) // batch))
    return losses


if __name__ == "__main__":
    ours, theirs = train(polytile_model), train(torch_model)
    print("epoch  polytile loss  torch loss")
    for epoch, (a, b) in enumerate(zip(ours, theirs), 1):
        print(f"{epoch:5d}  {a:13.6f}  {b:10.6f}")
