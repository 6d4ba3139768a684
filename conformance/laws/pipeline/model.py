"""Random models cut into layers, their batches and losses: the same on every rank (seeded).

A case's model is a list of layers applied one after another, so any cut into
consecutive stages is a pipeline of it:

    mlp   layer i: Linear(width, width) then tanh; the last layer a plain Linear.  Loss:
          summed squared error against random targets; count = rows in the batch.
    gpt   ``impl.models.gpt`` at a tiny size, as layers: [embeddings (token + position),
          block 0, ..., block L-1, head (final norm + LM head)].  Loss: summed
          cross-entropy with ``ignore_index`` (-100) on some targets; count = targets
          that count.

``build(case, dtype, device)`` -> (layers, inputs, targets, loss_fn, count);
``loss_fn(output, target)`` returns the summed loss of a (micro-)batch.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE_INDEX = -100


class Dense(nn.Module):
    def __init__(self, width: int, activation: bool):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.activation = activation

    def forward(self, x):
        y = self.linear(x)
        return torch.tanh(y) if self.activation else y


class Embeddings(nn.Module):
    """Token plus position embeddings of a GPT (shares its parameters)."""

    def __init__(self, gpt):
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos

    def forward(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x):
        return self.head(self.ln_f(x))


def sum_squared_error(output, target):
    return ((output - target) ** 2).sum()


def summed_cross_entropy(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")


def gpt_config(case):
    from impl.models.gpt import GPTConfig

    return GPTConfig(d_model=8, d_ff=16, n_layers=case.n_layers - 2, n_heads=2, vocab_size=11, context_length=8, attention="eager")


def build(case, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(case.seed)
    torch.manual_seed(case.seed)
    if case.model == "mlp":
        layers = nn.ModuleList(Dense(case.width, activation=i < case.n_layers - 1) for i in range(case.n_layers))
        for p in layers.parameters():  # fresh values from the case's own generator
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) / case.width**0.5)
        inputs = torch.randn(case.batch, case.width, generator=gen)
        targets = torch.randn(case.batch, case.width, generator=gen)
        layers = layers.to(device=device, dtype=dtype)
        return layers, inputs.to(device, dtype), targets.to(device, dtype), sum_squared_error, case.batch
    if case.model == "gpt":
        from impl.models.gpt import GPT

        cfg = gpt_config(case)
        gpt = GPT(cfg)
        with torch.no_grad():
            for p in gpt.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 else 0.0))
        layers = nn.ModuleList([Embeddings(gpt), *gpt.blocks, Head(gpt)]).to(device=device, dtype=dtype)
        tokens = torch.randint(0, cfg.vocab_size, (case.batch, case.seq + 1), generator=gen)
        inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        drop = torch.rand(targets.shape, generator=gen) < 0.3
        drop[0, 0] = False  # at least one target counts
        targets[drop] = IGNORE_INDEX
        count = int((targets != IGNORE_INDEX).sum())
        return layers, inputs.to(device), targets.to(device), summed_cross_entropy, count
    raise ValueError(f"unknown model {case.model!r}")


def named_grads(layers) -> dict[str, torch.Tensor]:
    """Gradient of every parameter, named '<layer index>.<name in the layer>'."""
    return {f"{i}.{n}": (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for i, layer in enumerate(layers) for n, p in layer.named_parameters()}
