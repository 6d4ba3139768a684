"""The target protocol: what an implementation under test looks like, and how to load one.

A *target* is any object (usually a module) that hands out implementations through
factory functions with CS336 assignment 2 adapter names:

    get_flashattention_autograd_function_pytorch()   -> autograd.Function class
    get_flashattention_autograd_function_triton()    -> autograd.Function class
    get_ddp_individual_parameters(module)            -> wrapped module     (2025)
    ddp_individual_parameters_on_after_backward(model, optimizer)
    get_ddp_bucketed(module, bucket_size_mb)         -> wrapped module     (2025)
    ddp_bucketed_on_after_backward(model, optimizer)
    ddp_bucketed_on_train_batch_start(model, optimizer)
    get_ddp(module)                                  -> wrapped module     (2026)
    ddp_on_after_backward(model, optimizer)
    get_fsdp(module, compute_dtype=None), fsdp_on_after_backward(model, optimizer),
    fsdp_gather_full_params(model)                                         (2026)
    get_sharded_optimizer(params, optimizer_cls, **kwargs)                 (both)

Beyond the course, entry points of the same shape (stable: others write adapters for them):

  FSDP strategies and accumulation
    get_fsdp_strategy(module, strategy="FULL_SHARD", compute_dtype=None, reduce_dtype=None,
                      unit_classes=None, shard_group_size=None) -> wrapped module; strategy
        one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD; answers
        fsdp_on_after_backward and fsdp_gather_full_params like get_fsdp's
    fsdp_no_sync(model)                              -> context manager: accumulate, no reduction

  context parallelism (ring attention; every rank of the group calls, on its own shard)
    get_ring_attention_autograd_function()           -> autograd.Function class;
        .apply(q, k, v, is_causal, group, layout[, scale]) positional; q, k, v and the
        output are this rank's shard (..., N / W, d); group None = the default group;
        layout "contiguous" or "zigzag"; saves one logsumexp of shape q.shape[:-1]
    merge_attention_partials(o1, lse1, o2, lse2)     -> (o, lse), natural-log L
    context_parallel_shard(x, world_size, rank, layout="contiguous", dim=-2) -> Tensor
    context_parallel_unshard(shards, layout="contiguous", dim=-2)            -> Tensor
    context_parallel_positions(seq_len, world_size, rank, layout="contiguous", device=None)
                                                     -> int64 positions of the shard

  tensor parallelism (group None = the default group, W its size; rank r holds items
  [r * ceil(n / W), (r + 1) * ceil(n / W)) clipped to n)
    get_column_parallel_linear(linear, group=None, gather_output=False) -> module: input
        replicated; output the rank's out features, or all of them with gather_output
    get_row_parallel_linear(linear, group=None, input_is_parallel=True) -> module: input the
        rank's in features (or all); output replicated, the bias added once
    get_vocab_parallel_embedding(embedding, group=None) -> module: ids replicated, output replicated
    vocab_parallel_cross_entropy(local_logits, targets, group=None, *, vocab_size=None,
        ignore_index=-100, reduction="mean") -> F.cross_entropy of the full logits
    get_tensor_parallel_block(block, group=None, sequence_parallel=False),
    get_tensor_parallel_gpt(model, group=None, sequence_parallel=False) -> modules over
        impl.models.gpt's Block and GPT (the GPT's output: the rank's vocabulary shard)
    tensor_parallel_gather_full_params(module), tensor_parallel_gather_full_grads(module)
        -> {dense name: full tensor} on every rank (a collective)

  pipeline parallelism
    get_pipeline_schedule(name, n_stages, n_microbatches) -> one ordered tuple of actions per
        rank (rank r holds stage r); name "afab" (or "gpipe") or "1f1b"; an action is
        Action(kind, microbatch, stage) with kind "F" or "B" (plain triples accepted); any m >= 1
    pipeline_train_step(stage_module, schedule, inputs, targets, loss_fn, n_microbatches,
                        group=None, normalizer=None) -> the loss on the last stage, None elsewhere;
        every rank calls it with its own stage; inputs read on stage 0, targets on the last;
        micro-batches by torch.tensor_split along dim 0; loss_fn returns the micro-batch loss
        summed; the step's loss is their sum divided once by normalizer (default: the batch
        size); gradients add into .grad (accumulation: pass the count over all steps)

  activation checkpointing
    get_checkpointed_blocks(blocks, strategy, segment_size=None) -> module whose forward(x)
        runs the blocks in order; strategy "none", "every", "segments" (segment_size blocks a
        checkpoint, the last shorter), "sqrt" (one level, k near sqrt(N)) or "nested"; the
        blocks' own parameters, no copies

  ring collectives (every rank of the group calls, with its own tensor; group None = default)
    ring_all_reduce(tensor, group=None)            -> the element-wise sum, same shape and dtype
    ring_all_gather(tensor, group=None)            -> torch.cat of every rank's tensor along dim 0
    ring_reduce_scatter(tensor, group=None)        -> sum.flatten().tensor_split(W)[rank]
    ring_all_reduce_alternate(tensor, group=None)  -> the sum; every rank passes the original
        chunks on and accumulates (the handout's alternate ring)
    built from point-to-point calls (isend / irecv / send / recv / batch_isend_irecv, looked
    up on torch.distributed at call time), each rank messaging its two ring neighbours only.
    Declaration: a target whose collectives are not point-to-point rings (torch's own:
    conformance.adapters.torch_collectives) sets the module attribute
    RING_COLLECTIVES_NOT_POINT_TO_POINT = "<why>"; the checks of point-to-point messages
    (bounds, exact formulas, NCCL-safe exchanges) then read "not applicable: <why>" where its
    calls sent no message.  Without it, a collective that sends nothing fails them.

  mixed precision with data parallelism
    get_distributed_grad_scaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=2000, group=None) -> torch.amp.GradScaler's contract (scale, unscale_,
        step, update, get_scale) with the non-finite flag agreed across the group; step
        returns True if it stepped, False if it skipped; a second unscale_ before update raises
    first_nonfinite_gradient(model, group=None) -> name of the first parameter (named_parameters
        order) whose gradient holds a NaN or Inf on any rank, the same on every rank; or None

  data partitioning
    get_distributed_sampler(dataset_len, num_replicas, rank, shuffle=True, seed=0,
        drop_last=False) -> indices with set_epoch(epoch) and __len__ (torch's DistributedSampler
        contract; its exact padding and strided shares are an extra)
    ddp_join(model) -> context manager for a get_ddp model: ranks with fewer batches shadow
        the collectives; the average divides by the initial world size

  composed parallelism (every rank calls, with the same model and whole batch)
    get_parallel_mesh(dims, order=("pp", "dp", "cp", "tp")) -> mesh with .group(d), .size(d),
        .rank(d), .ranks(d) (d a dim name or a tuple of names); sizes multiply to W; ranks
        laid out row-major over order (the last dim's groups are neighbouring ranks)
    composed_train_step(model, mesh, inputs, targets, *, lr=0.1, data_parallel="ddp",
        n_microbatches=1, schedule="1f1b", ignore_index=-100) -> result with .loss, .grads
        (dense names, before the step) and .params (after one SGD step), gathered, the same
        on every rank; the loss normalised once by the global count of tokens that count

A factory that is missing, or that raises ``NotImplementedError``, means "not offered":
the checks that need it are reported as not offered, never as passed or crashed.

``load_target(spec)`` accepts a module path (``impl``), ``module:attr`` (an object whose
attributes are the factories) or a path to a Python file (a student's
``tests/adapters.py``).  The default target is this project's own ``impl``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from conformance.verdicts import NotOffered  # noqa: F401  (re-exported: the protocol's "not offered")

DEFAULT_TARGET = "impl"

# Capability -> the factory names that provide it, in order of preference.
ATTENTION_FACTORIES = {
    "pytorch": "get_flashattention_autograd_function_pytorch",
    "triton": "get_flashattention_autograd_function_triton",
    "gluon": "get_flashattention_autograd_function_gluon",
}
# Every capability of the protocol (a report row each) and the entry points that offer it.
CAPABILITY_FACTORIES = {
    "attention pytorch": ("get_flashattention_autograd_function_pytorch",),
    "attention triton": ("get_flashattention_autograd_function_triton",),
    "attention gluon": ("get_flashattention_autograd_function_gluon",),
    "DDP individual": ("get_ddp_individual_parameters", "ddp_individual_parameters_on_after_backward"),
    "DDP bucketed": ("get_ddp_bucketed", "ddp_bucketed_on_after_backward"),
    "DDP ddp2026": ("get_ddp", "ddp_on_after_backward"),
    "sharded optimizer": ("get_sharded_optimizer",),
    "FSDP": ("get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params"),
    "tensor parallel": ("get_column_parallel_linear", "get_row_parallel_linear", "get_vocab_parallel_embedding",
                        "vocab_parallel_cross_entropy"),
    "pipeline parallel": ("get_pipeline_schedule", "pipeline_train_step"),
    "context parallel": ("get_ring_attention_autograd_function", "merge_attention_partials", "context_parallel_shard",
                         "context_parallel_unshard", "context_parallel_positions"),
    "activation checkpointing": ("get_checkpointed_blocks",),
    "ring collectives": ("ring_all_reduce", "ring_all_gather", "ring_reduce_scatter", "ring_all_reduce_alternate"),
    "gradient scaler": ("get_distributed_grad_scaler", "first_nonfinite_gradient"),
    "distributed sampler": ("get_distributed_sampler",),
    "composed parallelism": ("get_parallel_mesh", "composed_train_step"),
}

ALL_FACTORY_NAMES = (
    "get_flashattention_autograd_function_pytorch",
    "get_flashattention_autograd_function_triton",
    "get_flashattention_autograd_function_gluon",
    "get_ddp_individual_parameters",
    "ddp_individual_parameters_on_after_backward",
    "get_ddp_bucketed",
    "ddp_bucketed_on_after_backward",
    "ddp_bucketed_on_train_batch_start",
    "get_ddp",
    "ddp_on_after_backward",
    "get_fsdp",
    "fsdp_on_after_backward",
    "fsdp_gather_full_params",
    "get_sharded_optimizer",
)


@dataclass
class Target:
    """A loaded target: a name for reports and the object holding the factories."""

    name: str
    obj: Any
    spec: str = ""

    def has(self, factory_name: str) -> bool:
        return callable(getattr(self.obj, factory_name, None))

    def factory(self, factory_name: str) -> Callable[..., Any]:
        """The factory, wrapped so that NotImplementedError becomes NotOffered."""
        fn = getattr(self.obj, factory_name, None)
        if not callable(fn):
            raise NotOffered(f"target {self.name!r} has no {factory_name}()")

        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except NotImplementedError as exc:
                raise NotOffered(
                    f"target {self.name!r}: {factory_name}() raised NotImplementedError"
                    + (f" ({exc})" if str(exc) else "")
                ) from None

        call.__name__ = factory_name
        return call

    def call(self, factory_name: str, *args, **kwargs) -> Any:
        return self.factory(factory_name)(*args, **kwargs)

    def attention(self, flavour: str):
        """The attention autograd.Function class of one flavour ('pytorch', 'triton' or 'gluon')."""
        if flavour not in ATTENTION_FACTORIES:
            raise ValueError(f"unknown attention flavour {flavour!r}; expected one of {sorted(ATTENTION_FACTORIES)}")
        fn_cls = self.call(ATTENTION_FACTORIES[flavour])
        if fn_cls is None:
            raise NotOffered(f"target {self.name!r}: {ATTENTION_FACTORIES[flavour]}() returned None")
        return fn_cls

    def offered(self) -> dict[str, bool]:
        return {name: self.has(name) for name in ALL_FACTORY_NAMES}

    def not_offered_reason(self, capability: str) -> str | None:
        """Why the capability is not offered, if that shows without calling anything: its entry
        point (the first of ``CAPABILITY_FACTORIES``) is absent, or is the course's stub whose
        body only raises NotImplementedError.  Checked in the test's own process, before a
        distributed check starts rank processes to find the same thing."""
        names = CAPABILITY_FACTORIES.get(capability)
        if not names:
            return None
        entry = names[0]
        fn = getattr(self.obj, entry, None)
        if not callable(fn):
            return f"target {self.name!r} has no {entry}()"
        if _only_raises_not_implemented(fn):
            return f"target {self.name!r}: {entry}() raised NotImplementedError (its body is that raise alone)"
        return None


def _only_raises_not_implemented(fn) -> bool:
    """Is ``fn`` a stub: a docstring at most, then ``raise NotImplementedError[(...)]``?"""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return False
    if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _import_file(path: Path):
    """Import a Python file as a module.

    If the file sits inside packages (``__init__.py`` up the tree), it is imported under
    its dotted package name with the first non-package ancestor on ``sys.path``, so its
    relative imports work.  Otherwise its own folder and that folder's parent go on
    ``sys.path`` (so a ``tests/adapters.py`` next to the student's package imports it).
    """
    path = path.resolve()
    parts = [path.stem]
    root = path.parent
    while (root / "__init__.py").exists():
        parts.insert(0, root.name)
        root = root.parent
    for entry in (str(root), str(path.parent), str(path.parent.parent)):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if len(parts) > 1:
        return importlib.import_module(".".join(parts))
    name = f"_conformance_target_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import target file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def probe_target(spec: str, timeout: float | None = None) -> str | None:
    """Load the target once in a child process; None if it loads, else one line saying why not.

    The child can crash or hang without taking the run with it: a target that cannot be
    found, does not parse, does not import (a missing dependency of the student's package),
    names a missing attribute, dies (a signal, ``os._exit``) or hangs while importing is a
    usage error at start-up, reported in one line, before any check runs.
    """
    import os
    import signal
    import subprocess

    timeout = timeout or float(os.environ.get("SUITE_TARGET_PROBE_TIMEOUT", "180"))
    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys\n"
        "from conformance.target import load_target\n"
        "try:\n"
        "    load_target(sys.argv[1])\n"
        "except BaseException as exc:\n"
        "    msg = ' '.join(f'{type(exc).__name__}: {exc}'.split())\n"
        "    if isinstance(exc, SyntaxError):\n"
        "        msg = f'SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})'\n"
        "        if sys.version_info < (3, 12):\n"
        "            msg += (f' (this environment runs Python {sys.version_info[0]}.{sys.version_info[1]}; the course '\n"
        "                    'asks for Python >= 3.12, whose syntax, such as type statements, an older Python cannot '\n"
        "                    'parse: run the suite under the Python the target was written for)')\n"
        "    print('TARGET-ERROR ' + msg[:400], flush=True)\n"
        "    sys.exit(3)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p))
    env.setdefault("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", ""))
    try:
        out = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, env=env,
                             cwd=os.getcwd(), timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"--target {spec}: importing it did not finish within {timeout:.0f} s (it hangs at import)"
    for line in out.stdout.splitlines():
        if line.startswith("TARGET-ERROR "):
            return f"--target {spec}: target does not load: {line.removeprefix('TARGET-ERROR ')}"
    if out.returncode < 0:
        name = signal.Signals(-out.returncode).name if -out.returncode in signal.Signals._value2member_map_ else str(-out.returncode)
        return f"--target {spec}: importing it killed the process with {name}"
    if out.returncode != 0:
        return f"--target {spec}: importing it exited with code {out.returncode}"
    return None


def _nvtx_annotations_as_no_ops() -> None:
    """On a torch build without NVTX (the CPU wheels), make ``torch.cuda.nvtx``'s range and
    mark calls do nothing instead of raising: they only annotate a profile, and a target
    that wraps its hooks in ``nvtx.range`` is still judged on what it computes."""
    import torch.cuda.nvtx as nvtx

    stub = nvtx._nvtx
    if type(stub).__name__ != "_NVTXStub":
        return  # a build with NVTX: leave it alone
    for name in ("rangePushA", "rangePop", "markA", "rangeStartA", "rangeEnd"):
        setattr(stub, name, staticmethod(lambda *args, **kwargs: 0))


def load_target(spec: str | None = None) -> Target:
    """Load a target from a module path, ``module:attr`` or a file path."""
    spec = spec or DEFAULT_TARGET
    _nvtx_annotations_as_no_ops()
    attr = None
    candidate = Path(spec)
    if spec.endswith(".py") or candidate.is_file():
        if not candidate.exists():
            raise FileNotFoundError(f"--target file not found: {spec}")
        obj = _import_file(candidate)
        return Target(name=str(candidate), obj=obj, spec=spec)
    if ":" in spec:
        spec_module, attr = spec.split(":", 1)
    else:
        spec_module = spec
    try:
        module = importlib.import_module(spec_module)
    except ImportError as exc:
        raise ImportError(f"--target {spec!r}: cannot import module {spec_module!r}: {exc}") from exc
    obj = module
    if attr:
        for piece in attr.split("."):
            if not hasattr(obj, piece):
                raise AttributeError(f"--target {spec!r}: {spec_module} has no attribute {attr!r}")
            obj = getattr(obj, piece)
    return Target(name=spec, obj=obj, spec=spec)
