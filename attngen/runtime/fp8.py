"""fp8 KV caches: storage, scales, quantisation (the append path, on the tensors' device) and dequantisation.

Storage. An fp8 cache is a tensor of torch's ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``, or a
NumPy array of the ``ml_dtypes`` types of the same names (NumPy has no fp8 dtype of its own;
``ml_dtypes`` comes with TVM). The kernels take the bits: a ``uint8`` view of the same memory
(:func:`kv_bits`), so the dtype the caller's tensor carries is what says which format it holds; a
bare ``uint8`` tensor is refused, since it does not say.

Scales. A stored element ``x`` stands for ``x * scale``: ``k_scale`` for keys, ``v_scale`` for values,
each a Python float (one scale for the whole cache) or a float32 tensor of ``num_kv_heads`` entries
(or a single entry), as serving runtimes pass them. :func:`kv_scales` turns either into the
kernels' per-head float32 arrays [Hkv].

Quantisation (:func:`quantize_kv`, :func:`append_paged_kv_fp8`): ``x / scale`` in float32, then
round to nearest, ties to even, saturating at the format's largest finite value (448 for e4m3fn,
which has no infinity; 57344 for e5m2), NaN kept NaN: what ``(x.float() / scale).clamp(-max,
max).to(torch.float8_*)`` gives.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from attngen.schedules.dtypes import FP8_DTYPES, is_fp8

from .checks import AttentionArgumentError, as_numpy, check_layout, check_tensor, check_writable, dtype_name
from .cuda_stream import stream_capturing
from .views import write_at_slots

Tensor = Any  # numpy.ndarray or torch.Tensor


@dataclass(frozen=True)
class FP8Format:
    """What rounding to one fp8 format needs."""

    mantissa_bits: int
    min_normal_exponent: int  # the exponent of the smallest normal number (subnormals share its spacing)
    max_finite: float


FP8_FORMATS = {
    "float8_e4m3fn": FP8Format(3, -6, 448.0),
    "float8_e5m2": FP8Format(2, -14, 57344.0),
}
ROW_DTYPES = ("float32", "float16", "bfloat16", "float64")  # rows append_paged_kv_fp8 quantises
SCALE_HELP = ("a float, or a float32 tensor of num_kv_heads entries, the scale the cache was quantised with "
              "(attngen.runtime.fp8.quantize_kv / append_paged_kv_fp8); 1.0 for an unscaled cache")


def _is_torch(x) -> bool:
    return hasattr(x, "detach")


def kv_bits(x: Tensor) -> Tensor:
    """The ``uint8`` view of an fp8 tensor (same memory), as the kernels take it."""
    if _is_torch(x):
        import torch

        return x.view(torch.uint8)
    return x.view(np.uint8)


def _fp8_like(ref: Tensor, bits: np.ndarray, dtype: str) -> Tensor:
    """``bits`` (uint8) as an fp8 tensor of ``ref``'s library and device."""
    if _is_torch(ref):
        import torch

        return torch.from_numpy(np.ascontiguousarray(bits)).view(getattr(torch, dtype)).to(ref.device)
    return np.ascontiguousarray(bits).view(getattr(ml_dtypes, dtype))


def _float_numpy(x: Tensor, dtype=np.float32) -> np.ndarray:
    if _is_torch(x):
        return x.detach().cpu().float().numpy().astype(dtype)
    return np.asarray(x).astype(dtype)


def _check_fp8(dtype: str, name: str) -> FP8Format:
    if not is_fp8(dtype):
        raise AttentionArgumentError(f"{name}: {dtype} is not an fp8 format; use one of {list(FP8_DTYPES)}")
    return FP8_FORMATS[dtype]


def _check_scale(scale, name: str, *, kv_dtype: str, num_kv_heads: int) -> bool:
    """Refuse a missing scale, or a scale of another type, dtype or shape (the host and device forms alike);
    True for a number (one scale for the cache), False for a float32 tensor of [], [1] or [Hkv] entries."""
    if scale is None:
        raise AttentionArgumentError(f"{name}: the KV cache is fp8 ({kv_dtype}) and needs {name}: pass "
                                     f"{name}= with {SCALE_HELP}")
    if isinstance(scale, (int, float, np.floating, np.integer)):
        try:
            float(scale)
        except OverflowError:  # (an int past float64's range)
            raise AttentionArgumentError(f"{name}: the integer given overflows float32; scales must be finite and "
                                         f"positive: pass {SCALE_HELP}") from None
        return True
    if not hasattr(scale, "shape"):
        raise AttentionArgumentError(f"{name}: expected {SCALE_HELP}; got {type(scale).__name__}")
    if dtype_name(scale) != "float32":
        raise AttentionArgumentError(f"{name}: expected a float32 tensor, got {dtype_name(scale)}")
    if len(scale.shape) > 1 or int(np.prod(scale.shape)) not in (1, num_kv_heads):
        raise AttentionArgumentError(f"{name}: shape {tuple(scale.shape)}; expected [] or [1] (one scale) or "
                                     f"[num_kv_heads={num_kv_heads}] (one per KV head)")
    return False


def kv_scales(scale, name: str, *, kv_dtype: str, num_kv_heads: int, like: Tensor) -> Tensor:
    """``scale`` (a float, or a tensor of 1 or ``num_kv_heads`` entries) of a ``kv_dtype`` cache as the
    kernels' float32 [Hkv], in the library and on the device of ``like``; refuses a missing, misshapen,
    non-finite or non-positive scale."""
    if _check_scale(scale, name, kv_dtype=kv_dtype, num_kv_heads=num_kv_heads):
        values = np.full(num_kv_heads, float(scale), np.float32)
    else:
        values = np.broadcast_to(as_numpy(scale, name).reshape(-1), (num_kv_heads,)).astype(np.float32)
    if not np.all(np.isfinite(values) & (values > 0)):
        raise AttentionArgumentError(f"{name}: scales must be finite and positive, got {values.tolist()}")
    if _is_torch(like):
        import torch

        return torch.from_numpy(values).to(like.device)
    return values


def device_kv_scales(scale, name: str, *, kv_dtype: str, num_kv_heads: int, like):
    """``scale`` of a ``kv_dtype`` cache as the CUDA fp8 functions' float32 [Hkv] or [1] on ``like``'s device (a torch
    CUDA tensor), without a host round trip (decode and prefill never synchronise): a float is checked on the
    host and filled on the device; a float32 CUDA tensor of [], [1] or [Hkv] entries on that device is passed
    as [1] or [Hkv] (the kernels read a one-entry scale for every KV head: no copy per call), its values
    unread: reading them would synchronise the device, so a zero, negative or non-finite entry is the
    caller's to avoid (it gives wrong or non-finite outputs, not an error)."""
    if _check_scale(scale, name, kv_dtype=kv_dtype, num_kv_heads=num_kv_heads):
        if not (math.isfinite(float(scale)) and float(scale) > 0):
            raise AttentionArgumentError(f"{name}: scales must be finite and positive, got {float(scale)}")
        return _filled_scales(float(scale), num_kv_heads, like.device)
    device = getattr(scale, "device", None)
    if getattr(device, "type", None) != "cuda" or device != like.device:
        raise AttentionArgumentError(f"{name}: must be a CUDA tensor on q's device ({like.device}), or a float")
    return scale.reshape(-1).contiguous()  # ([1]: every KV head reads it; csrc/fp8_kv.cuh KVScales)


_FILLED: dict = {}  # (scale, Hkv, device, stream) -> float32 [Hkv] of that scale on that device, kept for good
_FILLED_MAX = 64  # tensors kept; a scale past them is filled on each call


def _filled_scales(scale: float, num_kv_heads: int, device):
    """float32 [Hkv] of ``scale`` on ``device``, filled on the current stream once and kept for later calls on
    that stream: two fill kernels per call cost a short decode more than a tenth of its time (B1 L64k fp8:
    the decode kernel takes 51 us of a 61 us call). Kept tensors live as long as the process, so a CUDA graph
    may capture one; a tensor filled during a capture belongs to the graph's memory pool and is not kept. The
    capture test runs on a miss only: a hit costs a stream query and a dict lookup."""
    import torch

    key = (scale, num_kv_heads, device, torch.cuda.current_stream(device).cuda_stream)
    filled = _FILLED.get(key)
    if filled is None:
        filled = torch.full((num_kv_heads,), scale, dtype=torch.float32, device=device)
        if len(_FILLED) < _FILLED_MAX and not stream_capturing(device):
            _FILLED[key] = filled
    return filled


def check_no_scales(kv_dtype: str, k_scale, v_scale) -> None:
    if k_scale is not None or v_scale is not None:
        raise AttentionArgumentError(f"k_scale/v_scale: the KV cache is {kv_dtype}, not fp8 "
                                     f"({list(FP8_DTYPES)}); scales apply to fp8 caches only, leave them out")


def round_to_fp8(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``x`` rounded to ``dtype``'s values (nearest, ties to even, saturating), still float32."""
    fmt = _check_fp8(dtype, "dtype")
    mag = np.abs(x.astype(np.float64))
    _, exp = np.frexp(mag)  # mag = m * 2**exp, m in [0.5, 1)
    exp = np.maximum(exp - 1, fmt.min_normal_exponent)
    quantum = np.ldexp(1.0, exp - fmt.mantissa_bits)  # the spacing of the format's values around mag
    with np.errstate(invalid="ignore"):
        rounded = np.minimum(np.rint(mag / quantum) * quantum, fmt.max_finite)
    rounded = np.where(np.isinf(mag), fmt.max_finite, rounded)
    return np.where(np.isnan(x), np.nan, np.copysign(rounded, x)).astype(np.float32)


def _per_head(scale, num_kv_heads: int) -> np.ndarray:
    """A float or a 1 / Hkv-entry tensor as float32 [Hkv, 1], broadcasting over [..., Hkv, D]."""
    s = np.asarray(_float_numpy(scale) if hasattr(scale, "shape") else scale, np.float32).reshape(-1)
    return np.broadcast_to(s, (num_kv_heads,))[:, None]


def quantize_kv(x: Tensor, dtype: str, scale=1.0) -> Tensor:
    """``x`` [..., Hkv, D] (float32/float16/bfloat16) stored as ``dtype`` with ``scale`` (a float or [Hkv]):
    ``round_to_fp8(x / scale)``, an fp8 tensor of ``x``'s library and device. A torch tensor is quantised
    where it lies (on the GPU: no copy to the host), by PyTorch's own rounding after a saturating clamp, which
    gives round_to_fp8's bits (tests/test_fp8_quantize.py)."""
    fmt = _check_fp8(dtype, "dtype")
    heads = int(x.shape[-2]) if len(x.shape) >= 2 else 1
    if _is_torch(x):
        return _quantize_torch(x, dtype, fmt, _per_head(scale, heads))
    scaled = _float_numpy(x) / _per_head(scale, heads)
    grid = round_to_fp8(scaled.astype(np.float32), dtype)
    return _fp8_like(x, grid.astype(getattr(ml_dtypes, dtype)).view(np.uint8), dtype)


def _quantize_torch(x, dtype: str, fmt: FP8Format, scale: np.ndarray):
    """``x`` / ``scale`` (float32 [Hkv, 1] on the host) in float32 on ``x``'s device, clamped to the format's
    finite range (NaN stays NaN), cast by PyTorch (nearest, ties to even)."""
    import torch

    s = torch.from_numpy(np.array(scale, dtype=np.float32)).to(x.device)  # (a copy: scale may be a read-only view)
    scaled = (x.detach().float() / s).clamp(-fmt.max_finite, fmt.max_finite)
    return scaled.to(getattr(torch, dtype))


def kv_scale_for(x: Tensor, dtype: str) -> np.ndarray:
    """Per-KV-head scales [Hkv] float32 that map each head's largest |x| of ``x`` [N, Hkv, D] onto the
    format's largest finite value (1.0 for an all-zero head)."""
    fmt = _check_fp8(dtype, "dtype")
    amax = np.abs(_float_numpy(x)).max(axis=(0, 2)) if int(x.shape[0]) else np.zeros(int(x.shape[1]))
    return np.where(amax > 0, amax / fmt.max_finite, 1.0).astype(np.float32)


def dequantize_kv(x: Tensor, scale=1.0) -> np.ndarray:
    """float64 values of an fp8 ``x`` [..., Hkv, D] with ``scale`` (a float or [Hkv]): exact products."""
    values = _float_numpy(x, np.float64)  # every fp8 value is a float32 value
    if not len(x.shape):
        return values * float(np.asarray(scale).reshape(-1)[0])
    return values * _per_head(scale, int(x.shape[-2])).astype(np.float64)


def append_paged_kv_fp8(pages: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor, *, k_scale, v_scale,
                        layout: str = "NHD") -> None:
    """Quantise ``k``, ``v`` [N, Hkv, D] and write row i into cache slot ``slot_mapping[i]`` (page
    ``slot // page_size``, place ``slot % page_size``) of the fp8 ``pages`` [P, 2, S, Hkv, D] (NHD) or
    [P, 2, Hkv, S, D] (HND), in place. Torch pages on the GPU are written there, the rows quantised on the
    device; ``slot_mapping`` is checked on the host (a host array costs no synchronisation, a device one is
    copied back)."""
    check_tensor(pages, "pages", 5, strided="any")  # (rows are written by index, where the pool lies)
    dtype = dtype_name(pages)
    _check_fp8(dtype, "pages")
    check_layout(layout)
    heads, page_size = (pages.shape[3], pages.shape[2]) if layout == "NHD" else (pages.shape[2], pages.shape[3])
    row_shape = (int(heads), int(pages.shape[4]))
    check_writable(pages, "pages", "pass a writable array (the rows are written into the cache in place)")
    for name, x in (("k", k), ("v", v)):
        check_tensor(x, name, 3, strided="any")
        if dtype_name(x) not in ROW_DTYPES:
            raise AttentionArgumentError(f"{name}: dtype {dtype_name(x)}; append quantises rows of {list(ROW_DTYPES)} "
                                         "(the unquantised keys and values): convert the rows")
        if tuple(int(n) for n in x.shape[1:]) != row_shape:
            raise AttentionArgumentError(f"{name}: shape {tuple(x.shape)}, expected [N, {row_shape[0]}, "
                                         f"{row_shape[1]}] (the cache's heads and head_dim)")
    slots = as_numpy(slot_mapping, "slot_mapping").astype(np.int64).reshape(-1)
    if len(slots) != int(k.shape[0]) or int(v.shape[0]) != len(slots):
        raise AttentionArgumentError(f"slot_mapping: {len(slots)} entries for {int(k.shape[0])} keys and "
                                     f"{int(v.shape[0])} values")
    capacity = int(pages.shape[0]) * int(page_size)
    if len(slots) and (slots.min() < 0 or slots.max() >= capacity):
        raise AttentionArgumentError(f"slot_mapping: slots must be in [0, {capacity}) (num_pages * page_size)")
    bits = kv_bits(pages)
    for half, (x, scale) in enumerate(((k, k_scale), (v, v_scale))):
        # refuses a missing or bad scale
        kv_scales(scale, ("k_scale", "v_scale")[half], kv_dtype=dtype, num_kv_heads=row_shape[0], like=pages)
        rows = kv_bits(quantize_kv(x, dtype, scale))
        write_at_slots(bits, half, rows.to(pages.device) if _is_torch(pages) else rows, slots, layout)


def scale_args(kv_dtype: str, k_scale, v_scale, to_scales) -> tuple:
    """What an fp8 function takes for the cache's scales, ``(to_scales(k_scale, "k_scale"), to_scales(v_scale,
    "v_scale"))``; () for a cache in the query dtype, which refuses scales. ``to_scales`` is the backend's
    conversion (``kv_scales`` on the host, ``device_kv_scales`` on the GPU)."""
    if not is_fp8(kv_dtype):
        check_no_scales(kv_dtype, k_scale, v_scale)
        return ()
    return tuple(to_scales(scale, name) for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)))

