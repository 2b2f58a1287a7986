"""The CUDA-core decode's even split (runtime/cuda.py choose_num_chunks): a uniform batch fills the GPU about
twice without chunks under the floor, and a skewed batch spreads its longest request over the GPU."""
import math

import pytest

from attngen.runtime.cuda import choose_num_chunks

SMS = 132


@pytest.mark.parametrize("batch,heads,length", [(1, 8, 65536), (16, 8, 16384), (64, 8, 4096), (4, 32, 2048),
                                                (2, 1, 300), (128, 8, 100)])
def test_uniform_batch_fills_the_gpu_about_twice(batch, heads, length):
    c = choose_num_chunks(batch, heads, length, SMS)
    assert c >= 1
    assert c <= max(1, math.ceil(length / 256))  # no more chunks than the 256-key floor allows
    if batch * heads * c < 2 * SMS:  # too few CTAs only where the floor stops the split
        assert c == math.ceil(length / 256) or length <= 256
    # one fewer chunk would leave the GPU short of two CTAs per SM (the split is as small as it can be)
    if c > 1:
        assert batch * heads * (c - 1) < 2 * SMS


def test_skewed_batch_splits_its_long_request():
    lens = [32768] + [512] * 63
    c = choose_num_chunks(len(lens), 8, max(lens), SMS, total_kv_len=sum(lens))
    # 64 x 8 CTAs fill the GPU, but one request holds half the keys: its chunks are no longer than the
    # batch's mean work per CTA slot (sum x heads / (2 x SMs) keys)
    per_slot = sum(lens) * 8 / (2 * SMS)
    assert math.ceil(32768 / c) <= per_slot
    assert choose_num_chunks(len(lens), 8, max(lens), SMS) == 1  # (read as uniform it would not split)
