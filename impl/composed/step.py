"""One training step of the GPT-style model with its parallelisms composed on a mesh.

Contract
    ``composed_train_step(model, mesh, inputs, targets, *, lr=0.1, data_parallel="ddp",
    n_microbatches=1, schedule="1f1b", ignore_index=-100)`` -> ``ComposedResult``, called
    on every rank of the mesh at once.

    model      an ``impl.models.gpt.GPT`` holding the same fp32 weights on every rank (it
               is copied, never changed).
    mesh       from ``impl.mesh.get_parallel_mesh``; dims tp (tensor parallel: impl's
               Megatron-style GPT over ``mesh.group("tp")``), pp (pipeline: consecutive
               blocks per stage, embeddings on the first, final norm and head on the
               last; ``impl.pipeline`` over ``mesh.group("pp")``), cp (context parallel:
               each rank holds a contiguous chunk of N / cp tokens of every sequence,
               position embeddings at its absolute positions, attention as ring attention
               (``impl.context_parallel``) over ``mesh.group("cp")``), dp (data parallel).
               The replicas of a parameter are the ranks of ``mesh.group(("dp", "cp"))``
               (just dp when cp = 1): same parameters, different tokens.
    inputs, targets
               the whole global batch (B, N) int64, the same on every rank; dp rank i
               takes rows [i B / dp, (i + 1) B / dp) (B divisible by dp), cp rank j the
               columns [j N / cp, (j + 1) N / cp); targets equal to ``ignore_index`` do
               not count.
    data_parallel
               "ddp": gradients all-reduced (sum) over the replica group and divided by
               its size R; "fsdp": impl's FSDP (FULL_SHARD) wraps the (tensor-parallel)
               model over the replica group (not with pp > 1).
    Loss       every rank sums the cross-entropy of its tokens (vocabulary-parallel when
               tp > 1) and scales it by R / T, T the number of targets that count in the
               whole batch (known on every rank: the batch is replicated); averaging the
               gradients over the R replicas then gives the gradient of (sum over the
               batch) / T, the loss normalised once by the global token count.  The
               reported loss is (sum over the replicas of their sums) / T, broadcast from
               the last stage.
    Step       plain SGD (``torch.optim.SGD(lr=lr)``) on each rank's own parameters
               (FSDP: its shards).
    Returns    ``ComposedResult(loss, grads, params)``: the loss (0-d fp32) and the dense
               model's gradients (after reduction, before the step) and parameters (after
               the step), gathered over tp, pp and the FSDP shards under the dense
               model's parameter names; the same on every rank.
    Communication
               tp: the tensor-parallel layers' all-reduces (activations and their
               gradients) and the gathers of the dense view; pp: point-to-point sends of
               activations and gradients, one broadcast of the loss, one all_gather_object
               of the dense view; cp: ring attention's point-to-point K/V exchanges and
               one small all_gather of metadata per call; replicas (dp x cp): the gradient
               reduction (per parameter all-reduce or FSDP's all-gathers and
               reduce-scatters) and one all-reduce of the loss sum.  Gradients are
               reduced over the replica group only (never over tp or pp).

``Composer`` holds each decision as a method (the token count, the local loss scale, the
replica dimensions, the positions of a rank's tokens, the gradient reduction) so that a variant can change one of them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from impl.models import gpt
from impl.pipeline import partition, pipeline_train_step
from impl.tensor_parallel import TensorParallelGPT, vocab_parallel_cross_entropy
from impl.tensor_parallel import comm as tp_comm
from impl.tensor_parallel.model import TensorParallelAttention

DATA_PARALLEL = ("ddp", "fsdp")


@dataclass
class ComposedResult:
    loss: torch.Tensor
    grads: dict
    params: dict


class PipelineStage(nn.Module):
    """Stage ``stage`` of ``n_stages`` of a (tensor-parallel or dense) GPT: its blocks, plus
    the embeddings on the first stage and the final norm and head on the last.  Parameter
    names are the whole model's (``blocks.<i>...``)."""

    def __init__(self, model: nn.Module, stage: int, n_stages: int, positions: torch.Tensor | None = None):
        super().__init__()
        lo, hi = partition(len(model.blocks), n_stages)[stage]
        self.positions = positions  # this rank's token positions (context parallelism); None: 0..n-1
        self.first, self.last = stage == 0, stage == n_stages - 1
        self.context_length = model.cfg.context_length
        if self.first:
            self.tok, self.pos = model.tok, model.pos
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(lo, hi)})
        if self.last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x):
        if self.first:
            n = x.shape[1]
            pos = self.positions if self.positions is not None else torch.arange(n, device=x.device)
            if pos.numel() != n:
                raise ValueError(f"{n} tokens but {pos.numel()} positions")
            x = self.tok(x) + self.pos(pos.to(x.device))
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x


def _ring(q, k, v, group):
    from impl.context_parallel.ring import RingAttention

    return RingAttention.apply(q, k, v, True, group, "contiguous")


class _RingDenseAttention(gpt.CausalSelfAttention):
    """``gpt.CausalSelfAttention`` whose attention runs as ring attention over ``cp_group``."""

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (t.view(b, n, self.n_heads, c // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = _ring(q, k, v, self.cp_group)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class _RingTensorParallelAttention(TensorParallelAttention):
    """The tensor-parallel attention (this rank's heads) with ring attention over ``cp_group``."""

    def forward(self, x):
        qkv = self.qkv(x)
        b, n, c3 = qkv.shape
        q, k, v = qkv.split(c3 // 3, dim=-1)
        q, k, v = (t.view(b, n, self.local_heads, c3 // 3 // self.local_heads).transpose(1, 2) for t in (q, k, v))
        y = _ring(q, k, v, self.cp_group)
        return self.proj(y.transpose(1, 2).reshape(b, n, c3 // 3))


def context_parallel_attention(model: nn.Module, group) -> None:
    """Make every block's attention of ``model`` (dense or tensor-parallel GPT) ring
    attention over ``group``, in place; parameters and their names unchanged."""
    for block in model.blocks:
        attn = block.attn
        attn.__class__ = _RingTensorParallelAttention if isinstance(attn, TensorParallelAttention) else _RingDenseAttention
        attn.cp_group = group


def _tp_specs(module: nn.Module) -> dict:
    """name -> (tp_shard (dim, n), row permutation or None) for each sharded parameter."""
    specs = {}
    for mname, sub in module.named_modules():
        for pname, p in sub.named_parameters(recurse=False):
            spec = getattr(p, "tp_shard", None)
            if spec is not None:
                specs[f"{mname}.{pname}" if mname else pname] = (spec, getattr(sub, "row_permutation", None))
    return specs


def _fsdp_local(fsdp, grads: bool) -> dict:
    """{name: tensor} of the module FSDP wraps, shards gathered over its group."""
    if not grads:
        return fsdp.gather_full_params()
    from impl.fsdp import comm as fsdp_comm

    out = {}
    for unit in fsdp._units:
        for flat in unit.flats:
            if not flat.trainable:
                continue
            g = flat.shard.grad if flat.shard.grad is not None else torch.zeros_like(flat.shard)
            full = torch.empty(flat.chunk * fsdp.shard_size, dtype=torch.float32, device=g.device)
            if fsdp.shard_group is None:
                full.copy_(g)
            else:
                fsdp_comm.all_gather_flat(full, g.detach().contiguous(), fsdp.shard_group, async_op=False)
            for s in flat.slots:
                for n in s.names:
                    out[n] = full[s.offset : s.offset + s.numel].view(s.shape).clone()
    for name, p in fsdp._kept_names:
        out[name] = p.grad.detach().clone() if p.grad is not None else None
    return out


class Composer:
    """The composed step; each decision a method (see the module docstring)."""

    # --- decisions -------------------------------------------------------------------------

    def token_count(self, targets, local_targets, ignore_index, mesh) -> int:
        """T: the targets that count in the whole (replicated) batch, not this rank's."""
        return int((targets != ignore_index).sum())

    def replica_dims(self, mesh) -> tuple:
        """The dimensions whose ranks hold the same parameters and different tokens: dp,
        and cp when the sequence is split."""
        return ("dp", "cp") if mesh.size("cp") > 1 else ("dp",)

    def loss_scale(self, mesh, count: int) -> float:
        """What a rank's summed loss is multiplied by before backward: R / T, R the
        replicas (dp x cp) whose gradients are then averaged."""
        return mesh.size(self.replica_dims(mesh)) / count

    def positions(self, mesh, seq_len: int, device) -> torch.Tensor:
        """This rank's token positions: its contiguous chunk of the sequence under cp."""
        n = seq_len // mesh.size("cp")
        start = mesh.rank("cp") * n
        return torch.arange(start, start + n, device=device)

    def reduce_gradients(self, params, mesh) -> None:
        """DDP path: average every gradient over the replica group (dp, and cp)."""
        dims = self.replica_dims(mesh)
        dp = mesh.size(dims)
        if dp == 1:
            return
        group = mesh.group(dims)
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
                p.grad.div_(dp)

    def synchronise(self, module, fsdp, mesh) -> None:
        """Gradients averaged over the dp group: FSDP's reduce-scatters, or ``reduce_gradients``."""
        if fsdp is not None:
            fsdp.finish_gradient_synchronization()
        else:
            self.reduce_gradients(list(module.parameters()), mesh)

    # --- the step --------------------------------------------------------------------------

    def check(self, model, mesh, inputs, targets, data_parallel, n_microbatches):
        if not isinstance(model, gpt.GPT):
            raise TypeError(f"composed_train_step composes impl.models.gpt.GPT, got {type(model).__name__}")
        if data_parallel not in DATA_PARALLEL:
            raise ValueError(f"data_parallel must be one of {DATA_PARALLEL}, got {data_parallel!r}")
        if inputs.dim() != 2 or targets.shape != inputs.shape or inputs.dtype != torch.int64:
            raise ValueError(f"inputs and targets must be (B, N) int64 of one shape, got {tuple(inputs.shape)} {inputs.dtype} and {tuple(targets.shape)}")
        if inputs.shape[1] % mesh.size("cp"):
            raise ValueError(f"sequence length {inputs.shape[1]} is not divisible by the context-parallel size {mesh.size('cp')}")
        dp, tp, pp = mesh.size("dp"), mesh.size("tp"), mesh.size("pp")
        if inputs.shape[0] % dp:
            raise ValueError(f"batch size {inputs.shape[0]} is not divisible by the data-parallel size {dp}")
        cfg = model.cfg
        if cfg.n_heads % tp or cfg.d_ff % tp:
            raise ValueError(f"n_heads {cfg.n_heads} and d_ff {cfg.d_ff} must be divisible by the tensor-parallel size {tp}")
        if cfg.n_layers < pp:
            raise ValueError(f"cannot cut {cfg.n_layers} blocks into {pp} pipeline stages")
        if pp > 1 and data_parallel == "fsdp":
            raise ValueError("FSDP is not composed with pipeline stages here: use data_parallel='ddp' with pp > 1")
        if pp > 1 and not 1 <= n_microbatches <= inputs.shape[0] // dp:
            raise ValueError(f"n_microbatches {n_microbatches} must lie in 1..{inputs.shape[0] // dp} (the local batch)")

    def step(self, model, mesh, inputs, targets, *, lr=0.1, data_parallel="ddp", n_microbatches=1, schedule="1f1b", ignore_index=-100):
        self.check(model, mesh, inputs, targets, data_parallel, n_microbatches)
        dp, tp, pp, cp = mesh.size("dp"), mesh.size("tp"), mesh.size("pp"), mesh.size("cp")
        replicas = self.replica_dims(mesh)
        device = next(model.parameters()).device
        inputs, targets = inputs.to(device), targets.to(device)
        vocab = model.cfg.vocab_size
        tp_group = mesh.group("tp") if tp > 1 else None

        dense = copy.deepcopy(model)
        local = TensorParallelGPT(dense, tp_group) if tp > 1 else dense
        specs = _tp_specs(local) if tp > 1 else {}
        if cp > 1:
            context_parallel_attention(local, mesh.group("cp"))

        def loss_sum(logits, y):
            if tp > 1:
                return vocab_parallel_cross_entropy(logits, y, tp_group, vocab_size=vocab, ignore_index=ignore_index, reduction="sum")
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=ignore_index, reduction="sum")

        rows = inputs.shape[0] // dp
        r = mesh.rank("dp")
        x, y = inputs[r * rows : (r + 1) * rows], targets[r * rows : (r + 1) * rows]
        positions = None
        if cp > 1:
            positions = self.positions(mesh, inputs.shape[1], device)
            n_local, c = inputs.shape[1] // cp, mesh.rank("cp")
            x, y = x[:, c * n_local : (c + 1) * n_local], y[:, c * n_local : (c + 1) * n_local]
        count = self.token_count(targets, y, ignore_index, mesh)
        scale = self.loss_scale(mesh, count)

        fsdp = None
        if pp > 1:
            module = PipelineStage(local, mesh.rank("pp"), pp, positions)
            out = pipeline_train_step(module, schedule, x, y, loss_sum, n_microbatches, group=mesh.group("pp"), normalizer=1.0 / scale)
            last = mesh.rank("pp") == pp - 1
            local_sum = torch.zeros((), dtype=torch.float32, device=device) if not last else (out.detach().float() / scale).reshape(())
            src = dist.get_global_rank(mesh.group("pp"), pp - 1)
            dist.broadcast(local_sum, src=src, group=mesh.group("pp"))
        else:
            if data_parallel == "fsdp":
                from impl.fsdp import FSDP

                stage = PipelineStage(local, 0, 1, positions)
                n_rep = mesh.size(replicas)
                module = fsdp = FSDP(stage, group=mesh.group(replicas)) if n_rep > 1 else None
                if fsdp is None:
                    module = stage
            else:
                module = PipelineStage(local, 0, 1, positions)
            s = loss_sum(module(x), y)
            (s * scale).backward()
            local_sum = s.detach().float().reshape(())

        self.synchronise(module, fsdp, mesh)

        total = local_sum.clone()
        if mesh.size(replicas) > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=mesh.group(replicas))
        loss = total / count

        grads = self.dense_view(module, fsdp, specs, mesh, grads=True)
        opt = torch.optim.SGD(module.parameters(), lr=lr)
        opt.step()
        params = self.dense_view(module, fsdp, specs, mesh, grads=False)
        return ComposedResult(loss=loss, grads=grads, params=params)

    # --- the dense view ----------------------------------------------------------------------

    @torch.no_grad()
    def dense_view(self, module, fsdp, specs, mesh, grads: bool) -> dict:
        if fsdp is not None:
            named = _fsdp_local(fsdp, grads)
        else:
            named = {n: (p.grad if grads else p) for n, p in module.named_parameters()}
            named = {n: (None if t is None else t.detach().clone()) for n, t in named.items()}
        tp_group = mesh.group("tp") if mesh.size("tp") > 1 else None
        out = {}
        for name in sorted(named):
            t = named[name]
            if name in specs:
                (dim, n), perm = specs[name]
                if t is None:
                    t = torch.zeros(1)  # never: a sharded parameter always has a gradient here
                full = tp_comm._all_gather(t.contiguous(), dim, tp_group).narrow(dim, 0, n).clone()
                if perm is not None:
                    d = torch.empty_like(full)
                    d[perm.to(full.device)] = full
                    full = d
                t = full
            out[name] = t
        if mesh.size("pp") > 1:
            parts = [None] * mesh.size("pp")
            dist.all_gather_object(parts, {k: (None if v is None else v.cpu()) for k, v in out.items()}, group=mesh.group("pp"))
            out = {k: v for part in parts for k, v in part.items()}
        return out


def composed_train_step(model, mesh, inputs, targets, *, lr=0.1, data_parallel="ddp", n_microbatches=1, schedule="1f1b", ignore_index=-100):
    """One composed training step; see the module docstring."""
    return Composer().step(model, mesh, inputs, targets, lr=lr, data_parallel=data_parallel,
                           n_microbatches=n_microbatches, schedule=schedule, ignore_index=ignore_index)
