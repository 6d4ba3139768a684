"""The GPT-style model of ``impl.models.gpt`` made tensor-parallel, from the layers.

Contract (W ranks in ``group``):

TensorParallelBlock(block, group, sequence_parallel=False)   from a ``gpt.Block``
    attention: the fused QKV projection column-parallel with its rows regrouped so rank r
    holds the Q, K and V rows of heads [r H / W, (r + 1) H / W); the output projection
    row-parallel.  MLP: up column-parallel, down row-parallel.  Norms replicated.
    n_heads and d_ff must be divisible by W.
    Input and output (B, N, C) replicated; communication: two all-reduces forward (after
    attention and after the MLP), two backward (the gradients entering them).
    sequence_parallel: input and output (B, N / W, C), the rank's tokens; the norms run on
    the rank's tokens; each all-reduce becomes an all-gather before the column-parallel
    layer and a reduce-scatter after the row-parallel one (backward: the reverse), plus one
    all-reduce of each norm weight's gradient.  N must be divisible by W.
TensorParallelGPT(model, group, sequence_parallel=False)      from a ``gpt.GPT``
    token embedding vocab-parallel, position embedding replicated, blocks as above, final
    norm replicated, LM head column-parallel over the vocabulary.  Input token ids (B, N)
    replicated; output the rank's logits (B, N, V_r) in the chunk layout, ready for
    ``vocab_parallel_cross_entropy(..., vocab_size=V)``.

``gather_full(module, grads=False)`` rebuilds the dense module's parameters (or their
gradients) on every rank, under the dense module's parameter names.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from impl.models import gpt

from . import comm
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding


class TensorParallelRMSNorm(nn.Module):
    """A replicated RMSNorm; under sequence parallelism its weight's gradient (partial:
    each rank saw its own tokens) is all-reduced."""

    def __init__(self, norm: gpt.RMSNorm, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.tp_group, self.sequence_parallel, self.eps = group, sequence_parallel, norm.eps
        self.weight = nn.Parameter(norm.weight.detach().clone())

    def forward(self, x):
        weight = comm.all_reduce_grad(self.weight, self.tp_group) if self.sequence_parallel else self.weight
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * weight


def qkv_row_permutation(d_model: int, world_size: int) -> torch.Tensor:
    """Rows of the fused (3C, C) QKV weight, regrouped by rank: [Q_0 K_0 V_0 Q_1 K_1 V_1 ...]
    where X_r is the rows of heads [r H / W, (r + 1) H / W) of projection X."""
    per = d_model // world_size
    rows = [torch.arange(part * d_model + r * per, part * d_model + (r + 1) * per) for r in range(world_size) for part in range(3)]
    return torch.cat(rows)


class TensorParallelAttention(nn.Module):
    def __init__(self, attn: gpt.CausalSelfAttention, group=None, sequence_parallel: bool = False):
        super().__init__()
        w = comm.group_size(group)
        if attn.n_heads % w:
            raise ValueError(f"TensorParallelAttention: n_heads {attn.n_heads} is not divisible by the tensor-parallel size {w}")
        d_model = attn.proj.out_features
        self.local_heads, self.backend = attn.n_heads // w, attn.backend
        self.qkv = ColumnParallelLinear(attn.qkv, group, sequence_parallel=sequence_parallel,
                                        row_permutation=qkv_row_permutation(d_model, w))
        self.proj = RowParallelLinear(attn.proj, group, sequence_parallel=sequence_parallel)

    def forward(self, x):
        qkv = self.qkv(x)  # (B, N, 3 C / W): this rank's heads
        b, n, c3 = qkv.shape
        q, k, v = qkv.split(c3 // 3, dim=-1)
        q, k, v = (t.view(b, n, self.local_heads, c3 // 3 // self.local_heads).transpose(1, 2) for t in (q, k, v))
        y = gpt.attention(q, k, v, self.backend)
        return self.proj(y.transpose(1, 2).reshape(b, n, c3 // 3))


class TensorParallelMLP(nn.Module):
    def __init__(self, mlp: gpt.MLP, group=None, sequence_parallel: bool = False):
        super().__init__()
        w = comm.group_size(group)
        if mlp.up.out_features % w:
            raise ValueError(f"TensorParallelMLP: d_ff {mlp.up.out_features} is not divisible by the tensor-parallel size {w}")
        self.up = ColumnParallelLinear(mlp.up, group, sequence_parallel=sequence_parallel)
        self.down = RowParallelLinear(mlp.down, group, sequence_parallel=sequence_parallel)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class TensorParallelBlock(nn.Module):
    def __init__(self, block: gpt.Block, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.tp_group, self.sequence_parallel = group, sequence_parallel
        self.ln1 = TensorParallelRMSNorm(block.ln1, group, sequence_parallel)
        self.attn = TensorParallelAttention(block.attn, group, sequence_parallel)
        self.ln2 = TensorParallelRMSNorm(block.ln2, group, sequence_parallel)
        self.mlp = TensorParallelMLP(block.mlp, group, sequence_parallel)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TensorParallelGPT(nn.Module):
    def __init__(self, model: gpt.GPT, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.cfg, self.tp_group, self.sequence_parallel = model.cfg, group, sequence_parallel
        self.tok = VocabParallelEmbedding(model.tok, group)
        self.pos = nn.Embedding.from_pretrained(model.pos.weight.detach().clone(), freeze=False)
        self.blocks = nn.ModuleList(TensorParallelBlock(b, group, sequence_parallel) for b in model.blocks)
        self.ln_f = TensorParallelRMSNorm(model.ln_f, group, sequence_parallel)
        self.head = ColumnParallelLinear(model.head, group, sequence_parallel=sequence_parallel)

    def forward(self, idx):
        n = idx.shape[1]
        if n > self.cfg.context_length:
            raise ValueError(f"sequence length {n} exceeds context_length {self.cfg.context_length}")
        x = self.tok(idx) + self.pos(torch.arange(n, device=idx.device))
        if self.sequence_parallel:
            x = comm.scatter_to_sp_region(x, self.tp_group)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# --- dense view ------------------------------------------------------------------------------


def _owner_groups(module: nn.Module) -> dict[int, object]:
    """id(parameter) -> the tp_group of the module that holds it directly."""
    owners = {}
    for sub in module.modules():
        if hasattr(sub, "tp_group"):
            for p in sub.parameters(recurse=False):
                owners[id(p)] = (sub.tp_group, sub)
    return owners


def gather_full(module: nn.Module, grads: bool = False) -> dict[str, torch.Tensor | None]:
    """The dense parameters (or gradients; None where a gradient is None) on every rank.

    A sharded parameter (``tp_shard = (dim, n)``) is all-gathered along dim and cut to n;
    a regrouped fused QKV is put back in dense order; names are the dense module's.
    Collective: one all-gather per sharded parameter (every rank must call it).
    """
    owners = _owner_groups(module)
    out = {}
    for name, p in module.named_parameters():
        t = p.grad if grads else p
        spec = getattr(p, "tp_shard", None)
        group, owner = owners.get(id(p), (None, None))
        if spec is not None:
            dim, n = spec
            if t is None:  # a gradient missing here must be missing everywhere
                out[name] = None
                continue
            full = comm._all_gather(t.detach(), dim, group).narrow(dim, 0, n).clone()
            perm = getattr(owner, "row_permutation", None)
            if perm is not None:
                dense = torch.empty_like(full)
                dense[perm.to(full.device)] = full
                full = dense
        else:
            full = None if t is None else t.detach().clone()
        out[name] = full
    return out
