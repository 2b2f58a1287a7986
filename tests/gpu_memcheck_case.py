"""Configurations run under compute-sanitizer by test_gpu_sanitizer.py: each decode template (CUDA cores,
tensor cores) whole and split (the merge path), and prefill over ragged and paged KV with both query
tiles."""
import numpy as np
import torch

from attngen.runtime import CUDAAttention, PagedKV, RaggedKV
from attngen.testing import random_params, random_problem
from attngen.variants import builtin


def cuda(x, half=False):
    t = torch.from_numpy(np.ascontiguousarray(x))
    return (t.half() if half else t).cuda()


def main():
    rng = np.random.default_rng(0)
    for name in ("rope", "custom_mask", "attention_sink"):
        v = builtin(name)
        att = CUDAAttention.build(v, head_dims=(128,), dtypes=("float16",), layouts=("NHD",))
        prob = random_problem(rng, [1, 1, 1], [700, 0, 33], 8, 2, 128, page_size=16)
        kv = PagedKV(cuda(prob.paged.pages, True), cuda(prob.paged.indptr), cuda(prob.paged.indices),
                     cuda(prob.paged.last_page_len))
        params = {k: cuda(x) if isinstance(x, np.ndarray) else x for k, x in random_params(v, rng, prob).items()}
        q = cuda(prob.q, True)
        for tensor_cores in (False, True):
            for chunks in (1, 4):
                att.decode(q, kv, plan=att.plan_decode(kv, 8, 128, num_chunks=chunks, tensor_cores=tensor_cores),
                           params=params)
        for fused in (True, False):  # the load-balanced plan splits the 700-key request: both merge paths
            att.decode(q, kv, plan=att.plan_decode(kv, 8, 128, fused_merge=fused), params=params)
        prob = random_problem(rng, [40, 0, 70], [40, 9, 150], 8, 2, 128, page_size=16)
        params = {k: cuda(x) if isinstance(x, np.ndarray) else x for k, x in random_params(v, rng, prob).items()}
        q, qo_indptr = cuda(prob.q, True), cuda(prob.qo_indptr)
        paged = PagedKV(cuda(prob.paged.pages, True), cuda(prob.paged.indptr), cuda(prob.paged.indices),
                        cuda(prob.paged.last_page_len))
        ragged = RaggedKV(cuda(prob.ragged.k, True), cuda(prob.ragged.v, True), cuda(prob.ragged.indptr))
        for kv in (paged, ragged):
            for wide in (False, True):
                att.prefill(q, kv, qo_indptr, plan=att.plan_prefill(qo_indptr, kv, 128, wide_tiles=wide),
                            params=params)
    torch.cuda.synchronize()
    print("sanitizer case done")


if __name__ == "__main__":
    main()
