"""torch's own composition as a composed-parallelism target: DTensor TP, FSDP2, pipelining.

    --target conformance.selftests.targets.known_good.composed_dtensor

The protocol's ``get_parallel_mesh`` and ``composed_train_step`` (``conformance/target.py``)
from torch's pieces, as torchtitan composes them:

- mesh: torch's ``init_device_mesh`` (``composed_torch_pieces.TorchMesh``); every
  parallelism takes its sub-mesh of that one root, so FSDP2 sees TP's DTensors as the
  inner dimension of a 2-D mesh;
- tensor parallelism: ``parallelize_module`` -- the token embedding ``RowwiseParallel``, the
  LM head ``ColwiseParallel`` with its logits left sharded and the loss taken under
  ``loss_parallel()``; in each block the fused QKV rows regrouped per rank ([Q_r K_r V_r])
  and ``ColwiseParallel``, the projection and MLP down ``RowwiseParallel``, MLP up
  ``ColwiseParallel``; norms and position embeddings replicated;
- FSDP: ``fully_shard`` of the whole model over the dp sub-mesh (2-D with TP), torch's
  SGD on the DTensor shards;
- DDP: the gradients' local tensors all-reduced over the dp group, one call a parameter,
  divided by dp (torch 2.13's ``DistributedDataParallel(device_mesh=...)`` and
  ``replicate`` over a TP'd module left no registered parameters here);
- pipeline: ``torch.distributed.pipelining`` (static shapes; ``Schedule1F1B``, or
  ``ScheduleGPipe`` for fewer micro-batches than stages, which 1F1B refuses);
- the loss: each rank scales its summed cross-entropy by dp / T (T: the batch's targets
  that count), and the dp ranks' gradients are averaged.

Not applicable: context parallelism.  torch's ``context_parallel`` replaces CUDA SDPA
kernels (flash, memory-efficient, cuDNN) only, so on the CPU a case with cp > 1 reads "not
applicable"; on a GPU it reads "not offered" (not composed here).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from conformance.selftests.targets.known_good.composed_torch_pieces import _pipeline, get_parallel_mesh  # noqa: F401


class RegroupedAttention(nn.Module):
    """The dense attention with its fused QKV rows regrouped as [Q_0 K_0 V_0 Q_1 K_1 V_1 ...]
    (r: rank r's heads), so that ColwiseParallel's row shards hold whole heads."""

    def __init__(self, attn, tp: int):
        super().__init__()
        c = attn.proj.in_features
        self.d_head = c // attn.n_heads
        per = c // tp
        order = [j * c + r * per + i for r in range(tp) for j in range(3) for i in range(per)]
        self.register_buffer("rows", torch.tensor(order), persistent=False)
        self.qkv = nn.Linear(c, 3 * c, bias=False)
        with torch.no_grad():
            self.qkv.weight.copy_(attn.qkv.weight[self.rows])
        self.proj = attn.proj

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # this rank's heads of Q, K and V
        q, k, v = (t.reshape(b, n, -1, self.d_head).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.d_head)
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, n, -1)
        return self.proj(y)


class _LossParallel(torch.autograd.Function):
    """The summed cross-entropy of logits sharded over the vocabulary, under ``loss_parallel()``
    for the forward and the backward alike (torch asks both inside it)."""

    @staticmethod
    def forward(ctx, local_logits, targets, mesh, vocab, ignore_index):
        from torch.distributed.tensor import DTensor, Shard
        from torch.distributed.tensor.parallel import loss_parallel

        leaf = local_logits.detach().reshape(targets.numel(), local_logits.shape[-1]).requires_grad_(True)
        with torch.enable_grad(), loss_parallel():
            logits = DTensor.from_local(leaf, mesh, [Shard(1)], run_check=False, shape=torch.Size((leaf.shape[0], vocab)),
                                        stride=(vocab, 1))
            loss = F.cross_entropy(logits, targets.reshape(-1), ignore_index=ignore_index, reduction="sum")
            full = loss.full_tensor() if isinstance(loss, DTensor) else loss
        ctx.leaf, ctx.full, ctx.shape = leaf, full, local_logits.shape
        return full.detach().clone()

    @staticmethod
    def backward(ctx, grad):
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():
            torch.autograd.backward(ctx.full, grad)
        return ctx.leaf.grad.reshape(ctx.shape), None, None, None, None


class Stage(nn.Module):
    """Blocks [lo, hi) of the (parallelised) model; embeddings first, norm and head last."""

    def __init__(self, model, lo, hi, first, last):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok, self.pos = model.tok, model.pos
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(lo, hi)})
        if last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x):
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x


@dataclass
class ComposedResult:
    loss: torch.Tensor
    grads: dict
    params: dict


def _parallelise(model, tp_mesh, tp):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"tok": RowwiseParallel(input_layouts=Replicate()), "head": ColwiseParallel(output_layouts=Shard(-1))}
    for i, block in enumerate(model.blocks):
        block.attn = RegroupedAttention(block.attn, tp)
        plan.update({f"blocks.{i}.attn.qkv": ColwiseParallel(), f"blocks.{i}.attn.proj": RowwiseParallel(),
                     f"blocks.{i}.mlp.up": ColwiseParallel(), f"blocks.{i}.mlp.down": RowwiseParallel()})
    return parallelize_module(model, tp_mesh, plan)


def _dense(module, name, t):
    """A full tensor under the dense model's name and row order."""
    from torch.distributed.tensor import DTensor

    t = (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
    rows = getattr(module.get_submodule(name[: -len(".qkv.weight")]), "rows", None) if name.endswith("attn.qkv.weight") else None
    if rows is not None:
        out = torch.empty_like(t)
        out[rows.to(t.device)] = t
        t = out
    return t


def composed_train_step(model, mesh, inputs, targets, *, lr=0.1, data_parallel="ddp", n_microbatches=1, schedule="1f1b",
                        ignore_index=-100):
    from conformance.selftests.targets.known_good.composed_torch_pieces import _check
    from conformance.verdicts import NotApplicable

    _check(model, mesh, inputs, targets, data_parallel, n_microbatches)
    dp, tp, pp, cp = (mesh.size(d) for d in ("dp", "tp", "pp", "cp"))
    device = next(model.parameters()).device
    if cp > 1:
        if device.type == "cpu":
            raise NotApplicable("torch's context_parallel replaces CUDA SDPA kernels only: no context parallelism "
                                "on the CPU in a composition of torch's pieces")
        raise NotImplementedError("context parallelism is not composed with torch's pieces here")
    cfg = model.cfg
    root = mesh.device_mesh
    dense = copy.deepcopy(model)
    if tp > 1:
        dense = _parallelise(dense, root["tp"], tp)
    rows = inputs.shape[0] // dp
    r0 = mesh.rank("dp") * rows
    x, y = inputs.to(device)[r0:r0 + rows], targets.to(device)[r0:r0 + rows]
    total = int((targets != ignore_index).sum())  # the batch is on every rank
    scale = dp / total  # the dp ranks' gradients are averaged

    def loss_sum(logits, tgt):
        if tp > 1:
            return _LossParallel.apply(logits, tgt, root["tp"], cfg.vocab_size, ignore_index)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=ignore_index,
                               reduction="sum")

    s, L = mesh.rank("pp"), cfg.n_layers
    lo, hi = s * L // pp, (s + 1) * L // pp
    stage = Stage(dense, lo, hi, s == 0, s == pp - 1)
    fsdp = data_parallel == "fsdp" and dp > 1
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(stage, mesh=root["dp"])

    if pp > 1:
        vocab = cfg.vocab_size if tp == 1 else stage_vocab(cfg.vocab_size, tp, mesh.rank("tp"))
        local = _pipeline(stage, (mesh.group("pp"), s, pp), x, y, lambda out, tgt: loss_sum(out, tgt) * scale,
                          n_microbatches, schedule, device, cfg.d_model, vocab)
        part = (local.reshape(()).float() / scale) if local is not None else torch.zeros((), device=device)
        dist.broadcast(part, src=dist.get_global_rank(mesh.group("pp"), pp - 1), group=mesh.group("pp"))
    else:
        summed = loss_sum(stage(x), y)
        (summed * scale).backward()
        part = summed.detach().float().reshape(())
    loss = part.clone()
    if dp > 1:
        dist.all_reduce(loss, group=mesh.group("dp"))
    loss = loss / total

    named = dict(stage.named_parameters())
    if not fsdp and dp > 1:
        from torch.distributed.tensor import DTensor

        for p in named.values():
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(g, group=mesh.group("dp"))
                g.div_(dp)
    grads = {n: _dense(stage, n, p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in named.items()}
    torch.optim.SGD(stage.parameters(), lr=lr).step()
    after = {n: _dense(stage, n, p) for n, p in named.items()}
    if pp > 1:
        parts = [None] * pp
        dist.all_gather_object(parts, ({n: t.cpu() for n, t in grads.items()}, {n: t.cpu() for n, t in after.items()}),
                               group=mesh.group("pp"))
        grads = {n: t.to(device) for g_, _ in parts for n, t in g_.items()}
        after = {n: t.to(device) for _, p_ in parts for n, t in p_.items()}
    return ComposedResult(loss=loss.reshape(()), grads=grads, params=after)


def stage_vocab(vocab: int, tp: int, tp_rank: int) -> int:
    """The width of this rank's logits: torch's Shard(-1) cuts ceil(V / tp) columns a rank."""
    per = -(-vocab // tp)
    return max(0, min(per, vocab - tp_rank * per))
