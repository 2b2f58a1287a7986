"""Child process of test_cache_safety: build one built-in variant for the CPU into a given cache directory,
run it on a small batch against the float64 reference, print one JSON line (builds run, error)."""
import json
import sys

import numpy as np

from attngen.codegen.cache import BuildCache
from attngen.runtime import CPUAttention
from attngen.runtime.reference import reference_attention
from attngen.testing import random_params, random_problem
from attngen.variants import builtin


def main(name: str, cache_dir: str) -> None:
    cache = BuildCache(cache_dir)
    variant = builtin(name)
    att = CPUAttention.build(variant, head_dims=(32,), dtypes=("float32",), layouts=("NHD",), cache=cache)
    rng = np.random.default_rng(0)
    prob = random_problem(rng, [3, 1], [7, 5], 4, 2, 32)
    params = random_params(variant, rng, prob)
    out, lse = att.prefill(prob.q, prob.paged, prob.qo_indptr, sm_scale=0.2, params=params)
    ref_o, ref_l = reference_attention(variant, prob.q, prob.keys, prob.values, prob.qo_indptr, 0.2, params)
    err = float(max(np.abs(out - ref_o).max(), np.abs(lse - ref_l).max()))
    print(json.dumps({"builds": cache.builds, "err": err}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
