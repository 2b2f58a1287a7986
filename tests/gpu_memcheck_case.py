"""One decode configuration per code path, run under compute-sanitizer by test_gpu_sanitizer.py."""
import numpy as np
import torch

from attngen.runtime import CUDAAttention, PagedKV
from attngen.testing import random_params, random_problem
from attngen.variants import builtin


def main():
    rng = np.random.default_rng(0)
    for name in ("rope", "custom_mask", "attention_sink"):
        v = builtin(name)
        att = CUDAAttention.build(v, head_dims=(128,), dtypes=("float16",), layouts=("NHD",))
        prob = random_problem(rng, [1, 1, 1], [700, 0, 33], 8, 2, 128, page_size=16)
        kv = PagedKV(torch.from_numpy(prob.paged.pages).half().cuda(), torch.from_numpy(prob.paged.indptr).cuda(),
                     torch.from_numpy(prob.paged.indices).cuda(), torch.from_numpy(prob.paged.last_page_len).cuda())
        params = {k: torch.from_numpy(x).cuda() if isinstance(x, np.ndarray) else x
                  for k, x in random_params(v, rng, prob).items()}
        q = torch.from_numpy(prob.q).half().cuda()
        for chunks in (1, 4):
            att.decode(q, kv, plan=att.plan_decode(kv, 8, 128, num_chunks=chunks), params=params)
    torch.cuda.synchronize()
    print("memcheck case done")


if __name__ == "__main__":
    main()
