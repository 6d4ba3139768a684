"""The tolerance oracle: one module decides what "close enough" means.

Law: element e of a result computed in precision ``p`` passes when

    |result_e - ref64_e|  <=  FACTOR * max|eager_p - ref64|  +  FLOOR_ULPS * eps(p) * mag_e

where ``ref64`` is the float64 reference computed from the same (already rounded) inputs,
``eager_p`` is the eager, materialised reference evaluated in precision ``p`` on the same
device, and ``mag_e`` is the magnitude of the terms summed into element e (|ref64_e| by
default; ``attention_magnitudes`` for attention).  The first term says: no worse than a
small multiple of the straightforward computation in its own precision.  The second is
the rounding floor of the element's own sum: a handful of ulps of the terms it adds up, so
a gradient that cancels to nearly zero (a causal row that sees one key) is judged against
the size of what cancelled, not against zero.

NaN or Inf where the reference is finite never passes.

The eager error is one sample of float32 rounding.  Where a computation amplifies rounding
(a LayerNorm or RMSNorm over two or four features), one sample can be far luckier than a
correct implementation adding in another order; laws there pass as ``eager`` the result
``farthest`` from float64 among several legitimate float32 runs (the pipeline's: CPU and GPU,
whole batch and micro-batches; the tensor-parallel GPT's: parameters ``nudged`` by one ulp).

Where the compared tensors are the same arithmetic (DDP replicas, a sharded optimizer
against the unsharded one) use ``assert_bitwise_equal`` instead.

Calibration (``python -m conformance.laws.attention.magnitudes`` re-measures it): over 120 random attention
cases in fp32, fp16 and bf16, the tiled PyTorch FA2's worst (|err| - floor) / eager error
was 0.5 (fp32 O) and 0 elsewhere; FACTOR = 4 leaves room for other summation orders while
every kept mutant misses by orders of magnitude.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

FACTOR = 4.0
FLOOR_ULPS = 4.0

LOW_PRECISION = (torch.float16, torch.bfloat16)


# Not a torch dtype: float32's range with 10 explicit mantissa bits, what float32 matrix
# products on NVIDIA tensor cores compute by default in Triton (conformance.laws.attention.tf32).
TF32 = "tf32"


def eps(dtype) -> float:
    return 2.0**-10 if dtype == TF32 else torch.finfo(dtype).eps


def tiny(dtype) -> float:
    """Smallest normal number: below it rounding is absolute (subnormals), not relative."""
    return torch.finfo(torch.float32 if dtype == TF32 else dtype).tiny


def max_abs_error(actual: torch.Tensor, ref64: torch.Tensor) -> float:
    """max|actual - ref64| in float64; inf if actual is non-finite where ref64 is finite."""
    a = actual.detach().to(device="cpu", dtype=torch.float64)
    r = ref64.detach().to(device="cpu", dtype=torch.float64)
    if a.shape != r.shape:
        raise AssertionError(f"shape mismatch: got {tuple(a.shape)}, reference {tuple(r.shape)}")
    finite_ref = torch.isfinite(r)
    if bool((~torch.isfinite(a) & finite_ref).any()):
        return float("inf")
    if a.numel() == 0:
        return 0.0
    diff = (a - r).abs()
    diff = torch.where(finite_ref, diff, torch.zeros_like(diff))
    return float(diff.max())


@dataclass
class Verdict:
    name: str
    error: float
    bound: float
    eager_error: float
    dtype: torch.dtype
    worst_index: tuple | None
    nonfinite: int

    @property
    def ok(self) -> bool:
        return self.error <= self.bound

    def message(self) -> str:
        parts = [
            f"{self.name}: |err| = {self.error:.3e} exceeds the oracle bound {self.bound:.3e}",
            f"(= {FACTOR:g} x eager {str(self.dtype).replace('torch.', '')} error {self.eager_error:.3e}"
            f" + {FLOOR_ULPS:g} ulp floor)",
        ]
        if self.nonfinite:
            parts.append(f"; {self.nonfinite} element(s) NaN/Inf where the float64 reference is finite")
        if self.worst_index is not None:
            parts.append(f"; worst element at index {self.worst_index}")
        return " ".join(parts)


def judge(
    name: str,
    actual: torch.Tensor,
    ref64: torch.Tensor,
    eager: torch.Tensor | None,
    dtype: torch.dtype | None = None,
    magnitude: torch.Tensor | None = None,
) -> Verdict:
    """Judge ``actual`` element by element against the float64 reference.

    Element e passes when ``|actual_e - ref_e| <= FACTOR * E + FLOOR_ULPS * eps * mag_e``
    where E = max|eager - ref64| is the eager reference's error in the tested precision
    and ``mag`` the magnitude of the terms summed to make the element (``|ref64|`` unless
    the caller knows better, e.g. ``attention_magnitudes``): a sum of large terms that
    cancels to nearly zero carries rounding error of the terms' size, not the result's.
    ``eager`` may be None only for float64.
    """
    dtype = dtype or actual.dtype
    if eager is None and dtype != torch.float64:
        raise ValueError(f"{name}: the oracle needs the eager reference in {dtype}")
    eager_error = 0.0 if eager is None else max_abs_error(eager, ref64)
    r = ref64.detach().to("cpu", torch.float64)
    a = actual.detach().to("cpu", torch.float64)
    if a.shape != r.shape:
        raise AssertionError(f"{name}: shape {tuple(a.shape)}, expected {tuple(r.shape)}")
    mag = r.abs() if magnitude is None else magnitude.detach().to("cpu", torch.float64).abs()
    finite = torch.isfinite(r)
    bound_e = FACTOR * eager_error + FLOOR_ULPS * (eps(dtype) * torch.where(finite, mag, torch.zeros_like(mag)) + tiny(dtype))
    diff = torch.where(torch.isfinite(a), (a - r).abs(), torch.full_like(a, float("inf")))
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    nonfinite = int((~torch.isfinite(a) & finite).sum())
    if a.numel() == 0:
        return Verdict(name, 0.0, 0.0, eager_error, dtype, None, 0)
    excess = diff - bound_e
    flat = int(torch.argmax(excess))
    worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    return Verdict(name, float(diff.reshape(-1)[flat]), float(bound_e.reshape(-1)[flat]), eager_error, dtype, worst, nonfinite)


def bound(ref64, eager, dtype, magnitude=None) -> torch.Tensor:
    """The elementwise oracle bound around ``ref64`` (see the module docstring), on the CPU."""
    eager_error = 0.0 if eager is None else max_abs_error(eager, ref64)
    r = ref64.detach().to("cpu", torch.float64)
    mag = r.abs() if magnitude is None else magnitude.detach().to("cpu", torch.float64).abs()
    mag = torch.where(torch.isfinite(r), mag, torch.zeros_like(mag))
    return FACTOR * eager_error + FLOOR_ULPS * (eps(dtype) * mag + tiny(dtype))


def farthest(ref64, candidates):
    """Of several float32 results computed in legitimately different ways (on other devices, in
    other orders, from inputs nudged by an ulp), per tensor the one farthest from ``ref64``
    (tensors, or dicts of them by name): the eager yardstick where one computation's rounding
    can be luckier than a correct implementation's."""
    def err(t, r):
        return float((t.detach().double().cpu() - r.detach().double().cpu()).abs().max()) if t.numel() else 0.0

    if isinstance(ref64, dict):
        return {n: max((c[n] for c in candidates), key=lambda t, r=ref64[n]: err(t, r)) for n in ref64}
    return max(candidates, key=lambda t: err(t, ref64))


def nudged(tensors: dict, seed: int) -> dict:
    """float32 copies of ``tensors`` (on the CPU), each element moved one ulp up or down (seeded):
    inputs whose float32 results sample how far rounding of that size carries a computation."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, v in tensors.items():
        v = v.detach().to("cpu", torch.float32)
        up = torch.rand(v.shape, generator=g) < 0.5
        out[name] = torch.nextafter(v, torch.where(up, torch.full_like(v, float("inf")), torch.full_like(v, float("-inf"))))
    return out


def assert_within(name: str, a: torch.Tensor, b: torch.Tensor, tolerance: torch.Tensor) -> None:
    """|a - b| <= tolerance elementwise (for metamorphic laws comparing two results)."""
    a64 = a.detach().to("cpu", torch.float64)
    b64 = b.detach().to("cpu", torch.float64)
    if a64.shape != b64.shape:
        raise AssertionError(f"{name}: shapes differ: {tuple(a64.shape)} vs {tuple(b64.shape)}")
    diff = (a64 - b64).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    excess = diff - tolerance
    if a64.numel() and bool((excess > 0).any()):
        flat = int(torch.argmax(excess))
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a64.shape))
        raise AssertionError(
            f"{name}: |difference| {float(diff.reshape(-1)[flat]):.3e} > tolerance "
            f"{float(tolerance.reshape(-1)[flat]):.3e} at index {idx}"
        )


def assert_close(name, actual, ref64, eager, dtype=None, magnitude=None) -> Verdict:
    verdict = judge(name, actual, ref64, eager, dtype, magnitude)
    if not verdict.ok:
        raise AssertionError(verdict.message())
    return verdict


def assert_bitwise_equal(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact equality, NaN payloads aside: the contract where the arithmetic is the same."""
    a = actual.detach().cpu()
    e = expected.detach().cpu()
    if a.shape != e.shape or a.dtype != e.dtype:
        raise AssertionError(f"{name}: got {tuple(a.shape)} {a.dtype}, expected {tuple(e.shape)} {e.dtype}")
    if not torch.equal(a, e):
        differ = (a != e) & ~(torch.isnan(a) & torch.isnan(e))
        n = int(differ.sum())
        idx = tuple(int(i) for i in torch.nonzero(differ)[0]) if n else None
        gap = float((a.double() - e.double()).abs().max())
        raise AssertionError(f"{name}: not bit-identical: {n} element(s) differ (max gap {gap:.3e}, first at {idx})")


# ---------------------------------------------------------------------------------------
# Poisoned outputs: anything an implementation allocates and never writes reads as NaN.
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def poisoned_allocations(device: torch.device | str | None = None):
    """Make uninitialised allocations (torch.empty and friends) NaN-filled while active.

    torch fills uninitialised float memory with NaN when deterministic algorithms are on
    and ``torch.utils.deterministic.fill_uninitialized_memory`` is set.  ``warn_only``
    keeps ops without a deterministic variant usable.  On CUDA the caching allocator's
    free blocks are also overwritten with NaN first, for kernels that allocate outside
    torch.empty's fill path.
    """
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    if device is not None and torch.device(device).type == "cuda":
        _poison_cuda_cache(torch.device(device))
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = prev_fill
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)


def _poison_cuda_cache(device: torch.device, nbytes: int = 64 << 20) -> None:
    with torch.cuda.device(device):
        block = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        block.fill_(float("nan"))
        del block
