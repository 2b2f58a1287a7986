"""A variant with tensor parameters that attngen's CUDA TVM slots serve, and the float64 model of a cache running it.

``head_scaled()`` multiplies each logit by head_scale[qo_head] * kv_scale[kv_head] / temperature: position-free
(the CUDA slots refuse hooks that read positions or the batch index), two tensor parameters around a scalar, so
that the slots' trailing tensors and the compiled-in scalar meet set_params in declaration order. A logit is
q . k times sm_scale, so the model (``ScaledModel``) scales each query head's rows by that head's factor instead.
test_tvm_kv_cache_cuda_tensor_params.py builds its CUDA slots and checks the model against attngen's CPU cache;
test_gpu_tvm_kv_cache_tensor_params.py runs the CUDA cache against the model.
"""
from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from attngen.ir import ScalarParam, TensorParam, Variant

from .tvm_window_model import CacheModel


@T.prim_func
def _scaled_logits(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                   kv_head: T.int32, head_ptr: T.handle, temperature: T.float32, kv_ptr: T.handle) -> T.float32:
    n = T.int32()
    m = T.int32()
    head_scale = T.match_buffer(head_ptr, (n,), "float32")
    kv_scale = T.match_buffer(kv_ptr, (m,), "float32")
    return s * head_scale[qo_head] * kv_scale[kv_head] / temperature


def head_scaled() -> Variant:
    return Variant("head_scaled", logits_transform=_scaled_logits,
                   params=[TensorParam("head_scale", "float32", ("num_qo_heads",), "logits scale per query head"),
                           ScalarParam("temperature", "float32", 1.0),
                           TensorParam("kv_scale", "float32", ("num_kv_heads",), "logits scale per KV head")])


def head_factors(head_scale, kv_scale, temperature: float = 1.0) -> np.ndarray:
    """Each query head's logits factor [Hq] in float64."""
    head_scale, kv_scale = (np.asarray(x, np.float64) for x in (head_scale, kv_scale))
    return head_scale * np.repeat(kv_scale, len(head_scale) // len(kv_scale)) / temperature


class ScaledModel(CacheModel):
    """``CacheModel`` of a cache running ``head_scaled()``: ``factors`` [Hq] (``head_factors``; reassign between
    steps as the cache's tensors change) scale the query heads."""

    def __init__(self, shape, factors):
        super().__init__(shape)
        self.factors = np.asarray(factors, np.float64)

    def step(self, ids, lens, qkvs) -> list:
        scaled = []
        for x in qkvs:
            x = x.astype(np.float64)
            x[:, :self.hq] *= self.factors[None, :, None]
            scaled.append(x)
        return super().step(ids, lens, scaled)


# prefill chunks, decode steps, a long chunk whose decode splits keys, a fork; then steps after the tensors change
SCRIPT = [("add", 0), ("add", 1), ("step", [0, 1], [29, 7]), ("step", [0], [5]), *[("step", [0, 1], [1, 1])] * 2,
          ("add", 2), ("step", [2, 0, 1], [40, 1, 1]), ("step", [1], [300]), ("step", [1, 2], [1, 1]),
          ("fork", 0, 3), ("step", [3, 0], [1, 1])]
SCRIPT_AFTER = [("step", [0, 1, 2], [1, 1, 1]), ("step", [2], [9]), ("step", [0, 1, 2, 3], [1, 1, 1, 1])]
