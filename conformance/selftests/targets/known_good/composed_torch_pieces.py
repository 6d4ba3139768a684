"""A composed training step of another design than impl's, built on torch's own pieces.

    --target conformance.selftests.targets.known_good.composed_torch_pieces

    get_parallel_mesh(dims, order=("pp", "dp", "cp", "tp"))
    composed_train_step(model, mesh, inputs, targets, *, lr, data_parallel, n_microbatches,
                        schedule, ignore_index)

The protocol's contract (``conformance/target.py``: the row-major mesh, a step whose loss,
gradients and parameters equal one process on the whole batch).  The choices differ from
impl's where the contract leaves them free:

- mesh: torch's ``init_device_mesh`` over every dimension; a group over several dimensions
  is the sub-mesh flattened (``DeviceMesh._flatten``);
- pipeline: torch's ``torch.distributed.pipelining`` (``PipelineStage`` with static shapes,
  ``Schedule1F1B``, or ``ScheduleGPipe`` for fewer micro-batches than stages, which 1F1B
  refuses); stage s holds blocks [s L / pp, (s + 1) L / pp);
- tensor parallelism: heads and MLP columns split by rank inside the blocks only; the
  embeddings, norms and LM head are replicated (no vocabulary-parallel loss: every TP rank
  computes the whole logits and the same gradients for the replicated weights);
- context parallelism: no ring: K and V all-gathered over the cp group (an autograd
  function whose backward all-reduces and keeps this rank's chunk), attention over the
  whole sequence with the causal mask at this chunk's absolute positions;
- the loss: each rank divides its summed cross-entropy by the global count of targets that
  count, found by an all-reduce of the local counts over the replicas (dp x cp), and the
  replicas' gradients are SUMMED (impl scales by R / T and averages);
- data parallelism: one all-reduce of all gradients flattened into one buffer;
- FSDP: one flat buffer of this rank's (tensor-parallel) parameters, sharded over the
  replicas; the shards are all-gathered for the step, the flat gradient is reduced to this
  rank's shard (reduce-scatter), plain SGD runs on the shard, the shards are all-gathered
  into the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

_MESHES: dict = {}


# --- the mesh --------------------------------------------------------------------------------


class TorchMesh:
    """Groups of a row-major mesh from torch's ``init_device_mesh``."""

    def __init__(self, dims: dict, order):
        from torch.distributed.device_mesh import init_device_mesh

        self.order = tuple(order)
        unknown = [d for d in dims if d not in self.order]
        if unknown:
            raise ValueError(f"mesh dimensions {unknown} are not in the order {self.order}")
        self.sizes = {d: int(dims.get(d, 1)) for d in self.order}
        world = dist.get_world_size()
        if math.prod(self.sizes.values()) != world:
            raise ValueError(f"mesh sizes {self.sizes} multiply to {math.prod(self.sizes.values())}, not the world size {world}")
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        self.device_mesh = init_device_mesh(device, tuple(self.sizes[d] for d in self.order), mesh_dim_names=self.order)
        self.coord = dict(zip(self.order, self.device_mesh.get_coordinate()))
        self._groups = {}

    def _key(self, dims) -> tuple:
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        if not dims or any(d not in self.order for d in dims):
            raise ValueError(f"the mesh has dimensions {self.order}, asked for {dims}")
        return tuple(d for d in self.order if d in dims)

    def group(self, dims):
        key = self._key(dims)
        if key not in self._groups:
            sub = self.device_mesh[key if len(key) > 1 else key[0]]
            if len(key) > 1:
                sub = sub._flatten("_".join(key))
            self._groups[key] = sub.get_group()
        return self._groups[key]

    def size(self, dims) -> int:
        return math.prod(self.sizes[d] for d in self._key(dims))

    def rank(self, dims) -> int:
        r = 0
        for d in self._key(dims):  # row-major over the named dimensions
            r = r * self.sizes[d] + self.coord[d]
        return r

    def ranks(self, dims) -> list[int]:
        key = self._key(dims)
        strides, s = {}, 1
        for d in reversed(self.order):
            strides[d] = s
            s *= self.sizes[d]
        me = dist.get_rank()
        base = me - sum(self.coord[d] * strides[d] for d in key)
        out = [base]
        for d in key:
            out = [r + i * strides[d] for r in out for i in range(self.sizes[d])]
        return sorted(out)


def get_parallel_mesh(dims, order=("pp", "dp", "cp", "tp")):
    key = (id(dist.group.WORLD), tuple(sorted(dims.items())), tuple(order))
    if key not in _MESHES:
        _MESHES[key] = TorchMesh(dict(dims), order)
    return _MESHES[key]


# --- collectives with gradients ----------------------------------------------------------------


class _EnterTP(torch.autograd.Function):
    """Identity forward; the gradient summed over the TP group (its ranks' partial inputs)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _LeaveTP(torch.autograd.Function):
    """The TP ranks' partial outputs summed; the gradient passes through (it is replicated)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone(memory_format=torch.contiguous_format)  # summed in place: a copy, not the input
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherSequence(torch.autograd.Function):
    """Every cp rank's chunk concatenated along dim 2; backward: the summed gradient's own chunk."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.n = group, x.shape[2]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        i = dist.get_rank(ctx.group)
        return g[:, :, i * ctx.n:(i + 1) * ctx.n].contiguous(), None


# --- the local model ---------------------------------------------------------------------------


@dataclass
class Layout:
    tp: int
    tp_rank: int
    tp_group: object
    cp: int
    cp_rank: int
    cp_group: object
    n_heads: int
    eps: float = 1e-5


def _rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def _tp_shards(name: str, shape, lay: Layout):
    """(dim, kind) of a parameter split over TP, or None if replicated."""
    if lay.tp == 1:
        return None
    if name.endswith("attn.qkv.weight"):
        return (0, "qkv")
    if name.endswith(("attn.proj.weight", "mlp.down.weight")):
        return (1, "cols")
    if name.endswith("mlp.up.weight"):
        return (0, "rows")
    return None


def _local_value(full: torch.Tensor, spec, lay: Layout) -> torch.Tensor:
    if spec is None:
        return full.detach().clone()
    dim, kind = spec
    if kind == "qkv":  # this rank's heads of Q, then of K, then of V
        c = full.shape[1]
        part = c // lay.tp
        return torch.cat([full[j * c + lay.tp_rank * part: j * c + (lay.tp_rank + 1) * part] for j in range(3)]).clone()
    return full.detach().chunk(lay.tp, dim=dim)[lay.tp_rank].clone()


def _dense_value(local: torch.Tensor, spec, lay: Layout) -> torch.Tensor:
    if spec is None:
        return local.detach().clone()
    parts = [torch.empty_like(local) for _ in range(lay.tp)]
    dist.all_gather(parts, local.detach().contiguous(), group=lay.tp_group)
    dim, kind = spec
    if kind == "qkv":
        return torch.cat([p.chunk(3, dim=0)[j] for j in range(3) for p in parts])
    return torch.cat(parts, dim=dim)


class Stage(nn.Module):
    """Blocks [lo, hi) of the model, the embeddings on the first stage, the norm and head on the last."""

    def __init__(self, params: dict, lo: int, hi: int, first: bool, last: bool, lay: Layout, seq_total: int):
        super().__init__()
        self.names = sorted(params)
        self.weights = nn.ParameterDict({n.replace(".", "__"): params[n] for n in self.names})
        self.lo, self.hi, self.first, self.last, self.lay, self.seq_total = lo, hi, first, last, lay, seq_total

    def w(self, name):
        return self.weights[name.replace(".", "__")]

    def attention(self, i, x):
        lay = self.lay
        b, n, _ = x.shape
        a = _rms(x, self.w(f"blocks.{i}.ln1.weight"), lay.eps)
        if lay.tp > 1:
            a = _EnterTP.apply(a, lay.tp_group)
        qkv = F.linear(a, self.w(f"blocks.{i}.attn.qkv.weight"))
        heads = lay.n_heads // lay.tp
        q, k, v = (t.reshape(b, n, heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        if lay.cp > 1:
            k, v = _GatherSequence.apply(k, lay.cp_group), _GatherSequence.apply(v, lay.cp_group)
        rows = lay.cp_rank * n + torch.arange(n, device=x.device)  # this chunk's absolute positions
        cols = torch.arange(k.shape[2], device=x.device)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, n, -1)
        out = F.linear(y, self.w(f"blocks.{i}.attn.proj.weight"))
        return _LeaveTP.apply(out, lay.tp_group) if lay.tp > 1 else out

    def mlp(self, i, x):
        lay = self.lay
        a = _rms(x, self.w(f"blocks.{i}.ln2.weight"), lay.eps)
        if lay.tp > 1:
            a = _EnterTP.apply(a, lay.tp_group)
        out = F.linear(F.gelu(F.linear(a, self.w(f"blocks.{i}.mlp.up.weight"))), self.w(f"blocks.{i}.mlp.down.weight"))
        return _LeaveTP.apply(out, lay.tp_group) if lay.tp > 1 else out

    def forward(self, x):
        if self.first:
            n = x.shape[1]
            pos = self.lay.cp_rank * n + torch.arange(n, device=x.device)
            x = F.embedding(x, self.w("tok.weight")) + F.embedding(pos, self.w("pos.weight"))
        for i in range(self.lo, self.hi):
            x = x + self.attention(i, x)
            x = x + self.mlp(i, x)
        if self.last:
            x = F.linear(_rms(x, self.w("ln_f.weight"), self.lay.eps), self.w("head.weight"))
        return x


# --- the step ----------------------------------------------------------------------------------


@dataclass
class ComposedResult:
    loss: torch.Tensor
    grads: dict
    params: dict


def _check(model, mesh, inputs, targets, data_parallel, n_microbatches):
    cfg = model.cfg
    dp, tp, pp, cp = (mesh.size(d) if d in mesh.order else 1 for d in ("dp", "tp", "pp", "cp"))
    if data_parallel not in ("ddp", "fsdp"):
        raise ValueError(f"data_parallel must be 'ddp' or 'fsdp', got {data_parallel!r}")
    if inputs.dim() != 2 or targets.shape != inputs.shape:
        raise ValueError(f"inputs and targets must be (B, N) of one shape, got {tuple(inputs.shape)} and {tuple(targets.shape)}")
    if inputs.shape[0] % dp or inputs.shape[1] % cp:
        raise ValueError(f"batch {inputs.shape[0]} and length {inputs.shape[1]} must divide by dp {dp} and cp {cp}")
    if cfg.n_heads % tp or cfg.d_ff % tp:
        raise ValueError(f"n_heads {cfg.n_heads} and d_ff {cfg.d_ff} must divide by the tensor-parallel size {tp}")
    if cfg.n_layers < pp:
        raise ValueError(f"{cfg.n_layers} blocks cannot fill {pp} pipeline stages")
    if pp > 1 and data_parallel == "fsdp":
        raise ValueError("FSDP with pipeline stages is not composed here")
    if pp > 1 and not 1 <= n_microbatches <= inputs.shape[0] // dp:
        raise ValueError(f"n_microbatches {n_microbatches} must lie in 1..{inputs.shape[0] // dp}")


def _pipeline(stage, lay_pp, x, y, loss_fn, n_mb, schedule, device, width, vocab):
    """Loss sum (last stage) of torch's pipelining schedule over this rank's pp group."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    group, s, p = lay_pp
    mb = x.shape[0] // n_mb
    n = x.shape[1]
    example_in = (torch.zeros(mb, n, dtype=torch.int64, device=device) if s == 0
                  else torch.zeros(mb, n, width, device=device, requires_grad=True))
    example_out = torch.zeros(mb, n, vocab if s == p - 1 else width, device=device, requires_grad=True)
    pipe = PipelineStage(stage, s, p, device, input_args=example_in, output_args=example_out, group=group)
    cls = Schedule1F1B if str(schedule).lower() == "1f1b" and n_mb >= p else ScheduleGPipe
    runner = cls(pipe, n_mb, loss_fn=loss_fn, scale_grads=False)
    losses = []
    if s == 0:
        runner.step(x)
    elif s == p - 1:
        runner.step(target=y, losses=losses)
    else:
        runner.step()
    return torch.stack([l.detach().reshape(()) for l in losses]).sum() if losses else None


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def _reduce_to_shard(flat, group, n):
    """This rank's chunk of the group's sum (flat is padded to n chunks)."""
    shard = torch.empty(flat.numel() // n, dtype=flat.dtype, device=flat.device)
    try:
        dist.reduce_scatter_tensor(shard, flat, group=group)
    except (RuntimeError, NotImplementedError, AttributeError):  # a backend without it: sum, then slice
        dist.all_reduce(flat, group=group)
        shard.copy_(flat.chunk(n)[dist.get_rank(group)])
    return shard


def _all_gather_flat(shard, group, n):
    full = torch.empty(shard.numel() * n, dtype=shard.dtype, device=shard.device)
    dist.all_gather_into_tensor(full, shard.contiguous(), group=group)
    return full


def composed_train_step(model, mesh, inputs, targets, *, lr=0.1, data_parallel="ddp", n_microbatches=1, schedule="1f1b",
                        ignore_index=-100):
    _check(model, mesh, inputs, targets, data_parallel, n_microbatches)
    size = lambda d: mesh.size(d) if d in mesh.order else 1  # noqa: E731
    rank = lambda d: mesh.rank(d) if d in mesh.order else 0  # noqa: E731
    dp, tp, pp, cp = size("dp"), size("tp"), size("pp"), size("cp")
    replica_dims = tuple(d for d in ("dp", "cp") if size(d) > 1)
    n_rep = dp * cp
    rep_group = mesh.group(replica_dims) if replica_dims else None
    device = next(model.parameters()).device
    cfg = model.cfg
    lay = Layout(tp, rank("tp"), mesh.group("tp") if tp > 1 else None, cp, rank("cp"), mesh.group("cp") if cp > 1 else None,
                 cfg.n_heads)

    # this rank's rows and columns of the replicated batch
    rows, cols = inputs.shape[0] // dp, inputs.shape[1] // cp
    r0, c0 = rank("dp") * rows, rank("cp") * cols
    x = inputs.to(device)[r0:r0 + rows, c0:c0 + cols]
    y = targets.to(device)[r0:r0 + rows, c0:c0 + cols]
    count = torch.tensor([float((y != ignore_index).sum())], dtype=torch.float64, device=device)
    if rep_group is not None:
        dist.all_reduce(count, group=rep_group)  # the whole batch's targets that count
    total = float(count)

    # this rank's stage and its parameters (tensor-parallel shards where split)
    s, L = rank("pp"), cfg.n_layers
    lo, hi = s * L // pp, (s + 1) * L // pp
    owned = []
    for name, p in model.named_parameters():
        parts = name.split(".")
        if parts[0] == "blocks":
            keep = lo <= int(parts[1]) < hi
        else:
            keep = (name.startswith(("tok.", "pos.")) and s == 0) or (name.startswith(("ln_f.", "head.")) and s == pp - 1)
        if keep:
            owned.append((name, p))
    specs = {n: _tp_shards(n, p.shape, lay) for n, p in owned}
    params = {n: nn.Parameter(_local_value(p.detach(), specs[n], lay)) for n, p in owned}
    stage = Stage(params, lo, hi, s == 0, s == pp - 1, lay, inputs.shape[1])

    fsdp = data_parallel == "fsdp" and n_rep > 1
    if fsdp:  # shard the flat parameters over the replicas, then gather them for the step
        flat = _flat([params[n].detach() for n in stage.names])
        chunk = -(-flat.numel() // n_rep)
        padded = torch.zeros(chunk * n_rep, dtype=flat.dtype, device=device)
        padded[:flat.numel()] = flat
        shard = padded.chunk(n_rep)[dist.get_rank(rep_group)].clone()
        gathered = _all_gather_flat(shard, rep_group, n_rep)
        with torch.no_grad():
            offset = 0
            for n in stage.names:
                k = params[n].numel()
                params[n].copy_(gathered[offset:offset + k].view_as(params[n]))
                offset += k

    def loss_sum(logits, tgt):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1), ignore_index=ignore_index,
                               reduction="sum")

    if pp > 1:
        local = _pipeline(stage, (mesh.group("pp"), s, pp), x, y, lambda out, tgt: loss_sum(out, tgt) / total,
                          n_microbatches, schedule, device, cfg.d_model, cfg.vocab_size)
        loss_part = local.reshape(()).float() if local is not None else torch.zeros((), device=device)
        dist.broadcast(loss_part, src=dist.get_global_rank(mesh.group("pp"), pp - 1), group=mesh.group("pp"))
    else:
        part = loss_sum(stage(x), y) / total
        part.backward()
        loss_part = part.detach().float()
    loss = loss_part.clone()
    if rep_group is not None:
        dist.all_reduce(loss, group=rep_group)  # the replicas' parts of sum / T

    grads_local = {n: (params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])) for n in stage.names}
    if fsdp:
        gflat = torch.zeros(chunk * n_rep, dtype=torch.float32, device=device)
        gflat[:flat.numel()] = _flat([grads_local[n] for n in stage.names])
        gshard = _reduce_to_shard(gflat, rep_group, n_rep)
        shard -= lr * gshard  # SGD on this rank's shard
        full_g = _all_gather_flat(gshard, rep_group, n_rep)
        full_p = _all_gather_flat(shard, rep_group, n_rep)
        offset = 0
        for n in stage.names:
            k = params[n].numel()
            grads_local[n] = full_g[offset:offset + k].view_as(params[n]).clone()
            with torch.no_grad():
                params[n].copy_(full_p[offset:offset + k].view_as(params[n]))
            offset += k
    else:
        if rep_group is not None:  # the replicas' gradients summed, in one buffer
            g = _flat([grads_local[n] for n in stage.names])
            dist.all_reduce(g, group=rep_group)
            offset = 0
            for n in stage.names:
                k = params[n].numel()
                grads_local[n] = g[offset:offset + k].view_as(params[n]).clone()
                offset += k
        with torch.no_grad():
            for n in stage.names:
                params[n] -= lr * grads_local[n]

    grads = {n: _dense_value(grads_local[n], specs[n], lay) for n in stage.names}
    after = {n: _dense_value(params[n].detach(), specs[n], lay) for n in stage.names}
    if pp > 1:  # every stage's names on every rank
        parts = [None] * pp
        dist.all_gather_object(parts, ({n: t.cpu() for n, t in grads.items()}, {n: t.cpu() for n, t in after.items()}),
                               group=mesh.group("pp"))
        grads = {n: t.to(device) for g_, _ in parts for n, t in g_.items()}
        after = {n: t.to(device) for _, p_ in parts for n, t in p_.items()}
    return ComposedResult(loss=loss.reshape(()), grads=grads, params=after)
