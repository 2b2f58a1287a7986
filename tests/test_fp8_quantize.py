"""The fp8 KV append path (``attngen.runtime.fp8``) against torch's own conversion.

Every float16 value and random float32 values over the whole range, divided by per-head scales,
round to the same fp8 bits as ``(x.float() / scale).clamp(-max, max).to(torch.float8_*)`` by both of
quantize_kv's paths: NumPy's (round_to_fp8, for NumPy arrays) and the torch one (for torch tensors, on their
device); the paged append writes them to the slots it is given, in both layouts, for torch and NumPy caches.
"""
import ml_dtypes
import numpy as np
import pytest
import torch

from attngen.runtime import AttentionArgumentError
from attngen.runtime.fp8 import (FP8_FORMATS, append_paged_kv_fp8, dequantize_kv, kv_bits, kv_scale_for, kv_scales,
                                 quantize_kv)

FORMATS = list(FP8_FORMATS)


def torch_quantize(x: torch.Tensor, dtype: str, scale) -> torch.Tensor:
    limit = FP8_FORMATS[dtype].max_finite
    return (x.float() / scale).clamp(-limit, limit).to(getattr(torch, dtype))


def numpy_path(x: torch.Tensor, dtype: str, scale) -> torch.Tensor:
    """quantize_kv of x's float32 values as a NumPy array (round_to_fp8), back as a torch fp8 tensor."""
    scale = scale.numpy() if hasattr(scale, "numpy") else scale
    bits = kv_bits(quantize_kv(x.float().numpy(), dtype, scale))
    return torch.from_numpy(np.ascontiguousarray(bits)).view(getattr(torch, dtype))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal fp8 tensors, counting any two NaNs as equal (the formats have several NaN codes)."""
    both_nan = a.float().isnan() & b.float().isnan()
    return bool(torch.all((kv_bits(a) == kv_bits(b)) | both_nan))


@pytest.mark.parametrize("dtype", FORMATS)
def test_every_float16_value_rounds_like_torch(dtype):
    x = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(-1, 1, 1)
    assert same_bits(quantize_kv(x, dtype), torch_quantize(x, dtype, 1.0))
    assert same_bits(numpy_path(x, dtype, 1.0), torch_quantize(x, dtype, 1.0))


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("source", ["float32", "bfloat16"])
def test_random_values_with_per_head_scales_round_like_torch(dtype, source):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(257, 4, 16, generator=gen) * torch.exp2(torch.randint(-30, 30, (257, 4, 16), generator=gen)))
    x[0, 0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    x = x.to(getattr(torch, source))
    scale = torch.tensor([0.5, 1.0, 3.0, 1e-3])
    got = quantize_kv(x, dtype, scale)
    assert got.dtype == getattr(torch, dtype) and got.shape == x.shape
    assert same_bits(got, torch_quantize(x, dtype, scale[:, None]))
    assert same_bits(numpy_path(x, dtype, scale), torch_quantize(x, dtype, scale[:, None]))
    assert same_bits(quantize_kv(x, dtype, 2.5), torch_quantize(x, dtype, 2.5))
    assert same_bits(numpy_path(x, dtype, 2.5), torch_quantize(x, dtype, 2.5))


def test_e4m3_saturates_and_ties_go_to_even():
    x = torch.tensor([448.0, 460.0, 1e9, float("inf"), -1e9, 0.5 * (1 + 1.125), 2.0 ** -10, 2.0 ** -9 * 1.5])
    got = quantize_kv(x.reshape(-1, 1, 1), "float8_e4m3fn").float().reshape(-1)
    # 1.0625 lies halfway between 1.0 and 1.125: even mantissa 1.0; 2**-10 is half the smallest subnormal
    assert got.tolist() == [448.0, 448.0, 448.0, 448.0, -448.0, 1.0, 0.0, 2.0 ** -8]
    assert numpy_path(x.reshape(-1, 1, 1), "float8_e4m3fn", 1.0).float().reshape(-1).tolist() == got.tolist()
    big = quantize_kv(torch.tensor([1e6, -float("inf")]).reshape(-1, 1, 1), "float8_e5m2").float().reshape(-1)
    assert big.tolist() == [57344.0, -57344.0]


def test_numpy_arrays_hold_ml_dtypes_fp8():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 2, 8)).astype(np.float16)
    got = quantize_kv(x, "float8_e5m2", np.array([0.25, 2.0], np.float32))
    assert got.dtype == ml_dtypes.float8_e5m2
    want = torch_quantize(torch.from_numpy(x), "float8_e5m2", torch.tensor([0.25, 2.0])[:, None])
    assert np.array_equal(got.view(np.uint8), kv_bits(want).numpy())
    np.testing.assert_array_equal(dequantize_kv(got, [0.25, 2.0]), want.double().numpy() * [[0.25], [2.0]])


def test_scales_from_the_largest_magnitude_fill_the_range():
    x = torch.tensor([[[1.0, -896.0]], [[3.0, 2.0]]]).expand(2, 1, 2).contiguous()
    scale = kv_scale_for(x, "float8_e4m3fn")
    assert scale.tolist() == [2.0]
    assert quantize_kv(x, "float8_e4m3fn", scale).float().abs().max().item() == 448.0


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_append_writes_quantised_rows_to_their_slots(layout, lib):
    gen = torch.Generator().manual_seed(3)
    num_pages, page_size, heads, d = 5, 4, 2, 8
    k, v = torch.randn(6, heads, d, generator=gen), torch.randn(6, heads, d, generator=gen) * 40
    slots = torch.tensor([17, 0, 5, 6, 7, 12], dtype=torch.int64)
    shape = (num_pages, 2, page_size, heads, d) if layout == "NHD" else (num_pages, 2, heads, page_size, d)
    pages = torch.zeros(shape, dtype=torch.float8_e4m3fn)
    k_scale, v_scale = torch.tensor([0.5, 0.125]), 0.25
    if lib == "numpy":
        pages, k, v, slots = pages.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn), k.numpy(), v.numpy(), \
            slots.numpy()
    append_paged_kv_fp8(pages, k, v, slots, k_scale=k_scale, v_scale=v_scale, layout=layout)
    cache = torch.from_numpy(pages.view(np.uint8)).view(torch.float8_e4m3fn) if lib == "numpy" else pages
    order = (0, 2, 1, 3, 4) if layout == "NHD" else (0, 3, 1, 2, 4)  # [P, S, 2, H, D]: a slot's rows together
    flat = kv_bits(cache).permute(order).reshape(num_pages * page_size, 2, heads, d).view(torch.float8_e4m3fn)
    k_t, v_t = torch.as_tensor(k), torch.as_tensor(v)
    assert same_bits(flat[torch.as_tensor(slots), 0], torch_quantize(k_t, "float8_e4m3fn", k_scale[:, None]))
    assert same_bits(flat[torch.as_tensor(slots), 1], torch_quantize(v_t, "float8_e4m3fn", v_scale))
    untouched = torch.ones(num_pages * page_size, dtype=torch.bool)
    untouched[torch.as_tensor(slots)] = False
    assert torch.all(kv_bits(flat[untouched]) == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_on_the_gpu_writes_the_host_bits(layout):
    """A CUDA cache: the rows quantised on the device (bfloat16 keys and values there, per-head and per-tensor
    scales, a host slot mapping) give the bits of the same append to a host cache."""
    gen = torch.Generator().manual_seed(5)
    num_pages, page_size, heads, d = 9, 16, 4, 64
    k = (torch.randn(40, heads, d, generator=gen) * 30).bfloat16()
    v = (torch.randn(40, heads, d, generator=gen) * 3).bfloat16()
    slots = torch.randperm(num_pages * page_size, generator=gen)[:40]
    shape = (num_pages, 2, page_size, heads, d) if layout == "NHD" else (num_pages, 2, heads, page_size, d)
    host = torch.zeros(shape, dtype=torch.float8_e5m2)
    dev = host.cuda()
    k_scale = torch.tensor([0.5, 1.0, 2.0, 0.01])
    append_paged_kv_fp8(host, k, v, slots, k_scale=k_scale, v_scale=0.125, layout=layout)
    append_paged_kv_fp8(dev, k.cuda(), v.cuda(), slots, k_scale=k_scale, v_scale=0.125, layout=layout)
    assert torch.equal(kv_bits(dev).cpu(), kv_bits(host)) and kv_bits(host).any()


def test_append_and_scale_errors_name_the_fix():
    pages = torch.zeros(2, 2, 4, 1, 8, dtype=torch.float8_e5m2)
    k = torch.randn(1, 1, 8)
    with pytest.raises(AttentionArgumentError, match=r"v_scale: the KV cache is fp8 \(float8_e5m2\) and needs "
                                                     r"v_scale: pass v_scale="):
        append_paged_kv_fp8(pages, k, k, torch.tensor([3]), k_scale=1.0, v_scale=None)
    with pytest.raises(AttentionArgumentError, match=r"slot_mapping: slots must be in \[0, 8\)"):
        append_paged_kv_fp8(pages, k, k, torch.tensor([8]), k_scale=1.0, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match="pages: float16 is not an fp8 format"):
        append_paged_kv_fp8(pages.to(torch.float16), k, k, torch.tensor([3]), k_scale=1.0, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match=r"k_scale: shape \(3,\); expected \[\] or \[1\]"):
        kv_scales(torch.ones(3), "k_scale", kv_dtype="float8_e5m2", num_kv_heads=2, like=pages)
    with pytest.raises(AttentionArgumentError, match="k_scale: scales must be finite and positive"):
        kv_scales(0.0, "k_scale", kv_dtype="float8_e5m2", num_kv_heads=2, like=pages)
    with pytest.raises(AttentionArgumentError, match="k_scale: expected a float32 tensor, got float16"):
        kv_scales(torch.ones(2, dtype=torch.float16), "k_scale", kv_dtype="float8_e5m2", num_kv_heads=2,
                  like=pages)
    assert kv_scales(torch.tensor(0.5), "k_scale", kv_dtype="float8_e5m2", num_kv_heads=3, like=pages).tolist() == [0.5, 0.5, 0.5]
