"""Cutting a model into consecutive stages, and point-to-point transfers between neighbours.

``partition(n_layers, n_stages)`` -> the (start, stop) layer range of each stage:
consecutive, non-empty, sizes differing by at most one (earlier stages get the extra
layer).  ``stage_module(layers, stage, n_stages)`` -> the ``nn.Sequential`` of that range
(it shares the layers' parameters).

Transfers (``send_tensor`` / ``recv_tensor``): a header of ``HEADER_LEN`` int64 values
(dtype code, number of dimensions, the sizes) then the tensor itself, both tagged, so the
receiver needs to know nothing in advance.  Sends are non-blocking (``isend``; the caller
keeps the handles and the tensors alive until it waits on them); receives block.  Tags
identify (what, micro-batch), so a message can only be consumed by the action it is for.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

HEADER_LEN = 10  # dtype, ndim, up to 8 sizes
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8, torch.int16]

ACTIVATION, GRADIENT = 0, 1


def partition(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    if n_stages < 1:
        raise ValueError(f"n_stages must be at least 1, got {n_stages}")
    if n_layers < n_stages:
        raise ValueError(f"cannot cut {n_layers} layers into {n_stages} non-empty stages")
    base, extra = divmod(n_layers, n_stages)
    bounds, start = [], 0
    for s in range(n_stages):
        stop = start + base + (1 if s < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def stage_module(layers, stage: int, n_stages: int) -> nn.Sequential:
    layers = list(layers)
    if not 0 <= stage < n_stages:
        raise ValueError(f"stage {stage} is outside 0..{n_stages - 1}")
    start, stop = partition(len(layers), n_stages)[stage]
    return nn.Sequential(*layers[start:stop])


def tag(what: int, microbatch: int, header: bool) -> int:
    return (microbatch * 2 + what) * 2 + int(header)


def send_tensor(t: torch.Tensor, dst: int, what: int, microbatch: int, group=None) -> list:
    """Post the header and the tensor to global rank ``dst``; returns (handles, buffers)."""
    if t.dim() > HEADER_LEN - 2:
        raise ValueError(f"cannot send a {t.dim()}-dimensional tensor (at most {HEADER_LEN - 2})")
    if t.dtype not in _DTYPES:
        raise TypeError(f"cannot send a tensor of dtype {t.dtype}")
    header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=t.device)
    header[0], header[1] = _DTYPES.index(t.dtype), t.dim()
    if t.dim():
        header[2 : 2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    payload = t.detach().contiguous()
    handles = [
        dist.isend(header, dst, group=group, tag=tag(what, microbatch, True)),
        dist.isend(payload, dst, group=group, tag=tag(what, microbatch, False)),
    ]
    return [(h, buf) for h, buf in zip(handles, (header, payload))]


def recv_tensor(src: int, what: int, microbatch: int, device, group=None) -> torch.Tensor:
    header = torch.empty(HEADER_LEN, dtype=torch.int64, device=device)
    dist.recv(header, src, group=group, tag=tag(what, microbatch, True))
    dtype, ndim = _DTYPES[int(header[0])], int(header[1])
    shape = tuple(int(x) for x in header[2 : 2 + ndim])
    out = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(out, src, group=group, tag=tag(what, microbatch, False))
    return out
