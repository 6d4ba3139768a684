"""The references: the documented mesh layout (pure) and one dense step on the whole batch."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from impl.models.gpt import GPTConfig, make_gpt

F64, F32 = torch.float64, torch.float32


def layout_groups(sizes: dict, order, dim) -> list[list[int]]:
    """Groups along ``dim`` of the row-major layout over ``order`` (the last dim has stride 1)."""
    strides, s = {}, 1
    for d in reversed(order):
        strides[d] = s
        s *= sizes.get(d, 1)
    others = [d for d in order if d != dim]
    groups = []
    for fixed in itertools.product(*(range(sizes.get(d, 1)) for d in others)):
        base = sum(i * strides[d] for d, i in zip(others, fixed))
        groups.append([base + i * strides[dim] for i in range(sizes.get(dim, 1))])
    return groups


def config(case) -> GPTConfig:
    d_model = case.n_heads * case.head_dim
    return GPTConfig(d_model=d_model, d_ff=case.d_ff, n_layers=case.n_layers, n_heads=case.n_heads,
                     vocab_size=case.vocab_size, context_length=max(8, case.seq), attention="eager")


def model(case):
    torch.manual_seed(case.seed)
    return make_gpt(config(case))


def batch(case):
    g = torch.Generator().manual_seed(case.seed + 1)
    ids = torch.randint(0, case.vocab_size, (case.batch, case.seq), generator=g)
    tgt = torch.randint(0, case.vocab_size, (case.batch, case.seq), generator=g)
    if case.ignore_fraction:
        drop = torch.rand(case.batch, case.seq, generator=g) < case.ignore_fraction
        drop.view(-1)[0] = False  # at least one token counts
        # uneven counts across data-parallel ranks: the first row keeps every token
        drop[0] = False
        tgt = tgt.masked_fill(drop, case.ignore_index)
    return ids, tgt


def _loss(m, ids, tgt, ignore_index, token=None):
    logits = m(ids)
    per = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=ignore_index, reduction="none")
    count = (tgt != ignore_index).sum()
    return (per.sum() if token is None else per[token]) / count


def dense_step(case, dtype):
    """(loss, grads, params after SGD) of one process on the whole batch in ``dtype``."""
    m = model(case).to(dtype)
    ids, tgt = batch(case)
    loss = _loss(m, ids, tgt, case.ignore_index)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    with torch.no_grad():
        params = {n: (p - case.lr * p.grad).detach().clone() for n, p in m.named_parameters()}
    return loss.detach(), grads, params


def magnitudes(case):
    """Per-token |gradient| summed over the tokens that count, float64 (the oracle's scale)."""
    m = model(case).to(F64)
    ids, tgt = batch(case)
    total = {}
    for t in torch.nonzero(tgt.reshape(-1) != case.ignore_index).flatten().tolist():
        m.zero_grad(set_to_none=True)
        _loss(m, ids, tgt, case.ignore_index, token=t).backward()
        for n, p in m.named_parameters():
            g = p.grad.abs() if p.grad is not None else torch.zeros_like(p)
            total[n] = g if n not in total else total[n] + g
    return total
