"""Configurations run under compute-sanitizer by test_gpu_sanitizer.py: each decode template (CUDA cores,
tensor cores) whole and split (the merge path), and prefill over ragged and paged KV with both query
tiles of the mma.sync template and, on compute capability 9.0, the Hopper template, over a 16-bit cache and over
an fp8 one (the producer's in-place widening, csrc/hopper_fp8_stage.cuh), and for maskless variants a launch with a
tail split (csrc/hopper_tail.cuh). ``--hopper``: the Hopper prefill
alone, on the rope variant (query and key transforms)."""
import sys

import numpy as np
import torch

from attngen.runtime import CUDAAttention, PagedKV, RaggedKV
from attngen.testing import random_params, random_problem
from attngen.variants import builtin


def cuda(x, half=False):
    t = torch.from_numpy(np.ascontiguousarray(x))
    return (t.half() if half else t).cuda()


VARIANTS = ("rope", "custom_mask", "attention_sink")


def on_hopper() -> bool:
    """Compute capability 9.0: the case also runs the Hopper template (16-bit and fp8 caches)."""
    return torch.cuda.get_device_capability()[0] == 9


def build(name: str, hopper_only: bool = False, fp8: bool = False):
    """The libraries the case runs ``name`` on: over a 16-bit cache one per kernel kind ("decode", "prefill"),
    configured as tests/test_gpu_decode.py's ``cuda_module`` builds them at head_dim 128 / float16, so that the
    sanitizer's run finds them in the suite's cache; with ``fp8`` the Hopper fp8-KV prefill library."""
    if fp8:
        return CUDAAttention.build(builtin(name), head_dims=(128,), dtypes=("float16",), kv_dtypes=("float8_e4m3fn",),
                                   layouts=("NHD",), kernels=("prefill",))
    kinds = ("prefill",) if hopper_only else ("decode", "prefill")
    return {k: CUDAAttention.build(builtin(name), head_dims=(128,), dtypes=("float16",), kernels=(k,)) for k in kinds}


def main(hopper_only: bool = False):
    rng = np.random.default_rng(0)
    hopper = on_hopper()
    for name in ("rope",) if hopper_only else VARIANTS:
        v = builtin(name)
        libs = build(name, hopper_only)
        dec, pre = libs.get("decode"), libs["prefill"]  # (no decode library in the Hopper-only case)
        prob = random_problem(rng, [1, 1, 1], [700, 0, 33], 8, 2, 128, page_size=16)
        kv = PagedKV(cuda(prob.paged.pages, True), cuda(prob.paged.indptr), cuda(prob.paged.indices),
                     cuda(prob.paged.last_page_len))
        params = {k: cuda(x) if isinstance(x, np.ndarray) else x for k, x in random_params(v, rng, prob).items()}
        q = cuda(prob.q, True)
        for tensor_cores in (() if hopper_only else (False, True)):
            for chunks in (1, 4):
                dec.decode(q, kv, plan=dec.plan_decode(kv, 8, 128, num_chunks=chunks, tensor_cores=tensor_cores),
                           params=params)
        for fused in (() if hopper_only else (True, False)):  # the balanced plan splits the 700-key request
            dec.decode(q, kv, plan=dec.plan_decode(kv, 8, 128, fused_merge=fused), params=params)
        prob = random_problem(rng, [40, 0, 70], [40, 9, 150], 8, 2, 128, page_size=16)
        params = {k: cuda(x) if isinstance(x, np.ndarray) else x for k, x in random_params(v, rng, prob).items()}
        q, qo_indptr = cuda(prob.q, True), cuda(prob.qo_indptr)
        paged = PagedKV(cuda(prob.paged.pages, True), cuda(prob.paged.indptr), cuda(prob.paged.indices),
                        cuda(prob.paged.last_page_len))
        ragged = RaggedKV(cuda(prob.ragged.k, True), cuda(prob.ragged.v, True), cuda(prob.ragged.indptr))
        plans = [] if hopper_only else [dict(wide_tiles=False), dict(wide_tiles=True)]
        plans += [dict(template="hopper")] if hopper else []
        for kv in (paged, ragged):
            for how in plans:
                pre.prefill(q, kv, qo_indptr, plan=pre.plan_prefill(qo_indptr, kv, 128, **how), params=params)
        if hopper:
            hopper_fp8(name, q, qo_indptr, paged, ragged, params)
            if "logits_mask" not in v.hooks:
                hopper_tail(pre, v, rng)
    torch.cuda.synchronize()
    print("sanitizer case done")


def hopper_tail(att, v, rng):
    """The Hopper prefill with a tail split (runtime/work_tail.py): 138 items over 132 CTAs, the last six cut
    into key-tile pieces whose partial states merge in the kernel (csrc/hopper_tail.cuh); and an append of 8
    rows over 4000 keys, whose two items are cut in many pieces each (merged in two levels); each twice, so that
    the second call runs on the counters the first left."""
    for qo_len, kv_len in ((2200, 2200), (8, 4000)):
        prob = random_problem(rng, [qo_len], [kv_len], 8, 2, 128, page_size=16)
        params = {k: cuda(x) if isinstance(x, np.ndarray) else x for k, x in random_params(v, rng, prob).items()}
        q, qo_indptr = cuda(prob.q, True), cuda(prob.qo_indptr)
        ragged = RaggedKV(cuda(prob.ragged.k, True), cuda(prob.ragged.v, True), cuda(prob.ragged.indptr))
        plan = att.plan_prefill(qo_indptr, ragged, 128, template="hopper")
        for _ in range(2):
            att.prefill(q, ragged, qo_indptr, plan=plan, params=params)


def hopper_fp8(name, q, qo_indptr, paged, ragged, params):
    """The Hopper prefill over the same caches rounded to e4m3 (paged and ragged, per-tensor scales)."""
    fp8 = torch.float8_e4m3fn
    att = build(name, fp8=True)
    caches = (PagedKV(paged.pages.to(fp8), paged.indptr, paged.indices, paged.last_page_len),
              RaggedKV(ragged.k.to(fp8), ragged.v.to(fp8), ragged.indptr))
    for kv in caches:
        att.prefill(q, kv, qo_indptr, plan=att.plan_prefill(qo_indptr, kv, 128, template="hopper"), params=params,
                    k_scale=0.5, v_scale=2.0)


if __name__ == "__main__":
    if "--build" in sys.argv:  # build one variant's libraries and run nothing (the test's builds, side by side)
        name = sys.argv[sys.argv.index("--build") + 1]
        build(name)
        if on_hopper():
            build(name, fp8=True)
    else:
        main(hopper_only="--hopper" in sys.argv)
