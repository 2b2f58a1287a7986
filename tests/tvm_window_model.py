"""A float64 model of TVM's PagedKVCache with sliding windows, and scripts that drive a cache and the model.

``CacheModel`` keeps per sequence and layer the kept tokens' k / v. A "mha_sliding" layer's query sees
the cached keys within ``window`` positions and its own step's tokens causally (TVM's split: a step's
self-attention part is never windowed); a sequence with a per-sequence window keeps its sinks and
latest tokens after each step (positions renumbered, as TVM does). ``run_script`` drives caches and
the model through the same steps. test_gpu_tvm_kv_cache_windows.py compares attngen's CUDA caches with
it; test_tvm_kv_cache_cuda_windows.py checks it against attngen's CPU cache (whose sliding windows were
checked against TVM's CPU kernels) and that its windows bite on the scripts. A shape whose RoPE TVM applies inside
attention (``inline_rope``) makes the model rotate queries and keys at their positions in the kept sequence
(test_gpu_tvm_kv_cache_rope.py, test_tvm_kv_cache_cuda_rope.py), with TVM's RoPE scalars per part.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from attngen.tvm import CacheShape

NO_KEY_LSE = -5e4
WINDOW = 13  # the "mha_sliding" layer's window (positions, the query included; the scripts' chunks cross it)
# the scripts' caches: a "mha_sliding" layer next to a full one; per-sequence windows (float16: the CUDA slots')
SHAPE = CacheShape(num_layers=2, num_qo_heads=8, num_kv_heads=2, head_dim=64, dtype="float16", page_size=16,
                   max_batch=8, max_total_tokens=4096, prefill_chunk=512)
LAYERS = replace(SHAPE, attn_kinds=("mha_sliding", "mha"), sliding_window=WINDOW)
PER_SEQUENCE = replace(SHAPE, support_sliding_window=True)

# prefill chunks longer (29, 17, 40) and shorter than a 13-position window, decode steps past it, pop-n, interleaved
# sequences
LAYER_SCRIPT = [("add", 0), ("add", 1), ("step", [0, 1], [29, 7]), ("step", [0], [5]),
                *[("step", [0, 1], [1, 1])] * 3, ("step", [1, 0], [17, 1]), ("popn", 1, 3), ("step", [0, 1], [2, 9]),
                ("add", 2), ("step", [2, 0, 1], [40, 1, 1]), *[("step", [2, 0, 1], [1, 1, 1])] * 3]
# a fork of a prefix longer than the window: the decode steps that follow attend to the shared prefix's last keys
# (one request holding rows of both sequences) and to each sequence's own tokens
FORK_SCRIPT = [("add", 5), ("step", [5], [37]), ("fork", 5, 6), *[("step", [5, 6], [1, 1])] * 4]
# per-sequence windows (sequence, window, sink): prefill, steps that slide the windows, decode steps past them
SEQUENCE_SCRIPT = [("add", 0), ("window", 0, 24, 4), ("add", 1), ("window", 1, 20, 2), ("add", 2), ("window", 2, 37, 5),
                   ("step", [0, 1, 2], [20, 9, 33]), ("step", [0], [5]), ("step", [0, 1, 2], [1, 1, 1]),
                   ("step", [0, 1], [9, 14]), *[("step", [0, 1, 2], [1, 1, 1])] * 4, ("step", [1, 0, 2], [1, 3, 6]),
                   *[("step", [2, 1, 0], [1, 1, 1])] * 3]


def rope(x, pos, scale: float, theta: float):
    """TVM's rotate-half RoPE of rows x [n, H, D] at positions pos [n], in float64."""
    d = x.shape[-1]
    angle = np.asarray(pos, np.float64)[:, None, None] * scale / theta ** ((2 * np.arange(d) % d) / d)
    partner = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return np.cos(angle) * x + np.sin(angle) * partner


def attend(q, k, v, visible, sm_scale):
    """float64 softmax attention of q [n, Hq, D] over k / v [m, Hkv, D], visible [n, m]; (o, lse base 2), rows with
    no key 0 and -5e4."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, 1), np.repeat(v, g, 1)
    s = np.where(visible[None], np.einsum("ihd,jhd->hij", q, k) * sm_scale, -np.inf)
    mx = s.max(-1, keepdims=True, initial=-np.inf)
    mx = np.where(np.isfinite(mx), mx, 0)
    p = np.where(visible[None], np.exp(s - mx), 0)
    den = p.sum(-1, keepdims=True)
    o = np.einsum("hij,jhd->ihd", p / np.where(den > 0, den, 1), v)
    with np.errstate(divide="ignore"):
        lse = np.where(den > 0, (np.log(den) + mx) / np.log(2), NO_KEY_LSE)[..., 0].T
    return o, lse


class CacheModel:
    """A float64 model of a cache of ``shape`` (a CacheShape: layers, heads, kinds, layer window)."""

    def __init__(self, shape):
        self.shape, self.seqs, self.windows = shape, {}, {}
        self.hq, self.hkv, self.d = shape.num_qo_heads, shape.num_kv_heads, shape.head_dim

    def op(self, name, *args):
        if name == "add":
            self.seqs[args[0]] = [(np.zeros((0, self.hkv, self.d)),) * 2 for _ in range(self.shape.num_layers)]
        elif name == "fork":
            self.seqs[args[1]] = list(self.seqs[args[0]])
        elif name == "popn":
            self.seqs[args[0]] = [(k[:-args[1]], v[:-args[1]]) for k, v in self.seqs[args[0]]]
        else:  # "window": (sequence, window, sink)
            self.windows[args[0]] = args[1:]

    def _rotate(self, q, k, qp, kp, cached: int, sliding: bool):
        """q and k rotated at TVM's positions (the tokens' places in the kept sequence). TVM passes the paged part
        of a "mha_sliding" layer (the cached keys) rope_scale 1 and rope_theta 1e4, whatever the cache's: there
        q and k take two rotations, [q_paged, q_step] against [k_cached, 0] and [0, k_step]."""
        sc, th = self.shape.rope_scale, self.shape.rope_theta
        if not sliding:
            return rope(q, qp, sc, th), rope(k, kp, sc, th)
        zeros = np.zeros_like(k)
        k_paged = np.where(kp[:, None, None] < cached, rope(k, kp, 1.0, 1e4), zeros)
        k_step = np.where(kp[:, None, None] >= cached, rope(k, kp, sc, th), zeros)
        return (np.concatenate([rope(q, qp, 1.0, 1e4), rope(q, qp, sc, th)], -1),
                np.concatenate([k_paged, k_step], -1))

    def step(self, ids, lens, qkvs) -> list:
        """Per layer the step's outputs [sum(lens), Hq, D]; appends the tokens (and slides per-sequence windows)."""
        hq, hkv, layers = self.hq, self.hkv, self.shape.num_layers
        outs = [[] for _ in range(layers)]
        start = 0
        for s, n in zip(ids, lens):
            for layer in range(layers):
                x = qkvs[layer][start:start + n].astype(np.float64)
                hist_k, hist_v = self.seqs[s][layer]
                k, v = np.concatenate([hist_k, x[:, hq:hq + hkv]]), np.concatenate([hist_v, x[:, hq + hkv:]])
                kp, qp = np.arange(len(k)), np.arange(len(hist_k), len(k))
                vis = kp[None] <= qp[:, None]
                if self.shape.attn_kinds[layer] == "mha_sliding":
                    vis &= (qp[:, None] - kp[None] < self.shape.sliding_window) | (kp[None] >= len(hist_k))
                q, kr = x[:, :hq], k
                if self.shape.inline_rope:
                    q, kr = self._rotate(q, k, qp, kp, len(hist_k), self.shape.attn_kinds[layer] == "mha_sliding")
                outs[layer].append(attend(q, kr, v, vis, self.d ** -0.5)[0])
                if s in self.windows and len(k) > self.windows[s][0]:
                    window, sink = self.windows[s]
                    k, v = (np.concatenate([a[:sink], a[len(a) - (window - sink):]]) for a in (k, v))
                self.seqs[s][layer] = (k, v)
            start += n
        return [np.concatenate(o) for o in outs]


def run_script(caches: dict, model: CacheModel, script, rng, device: str = "cuda") -> dict:
    """Drive every cache (on ``device``) and the model through ``script``; name -> per step and layer outputs as
    float64 (the model's under "reference")."""
    import tvm
    from tvm.runtime import ShapeTuple

    G = tvm.get_global_func
    dev = tvm.cuda() if device == "cuda" else tvm.cpu()
    shape = model.shape
    width = shape.num_qo_heads + 2 * shape.num_kv_heads
    outs = {name: [] for name in caches} | {"reference": []}
    builtins = {"add": "kv_state_add_sequence", "fork": "kv_state_fork_sequence", "popn": "kv_state_popn",
                "window": "attention_kv_cache_enable_sliding_window_for_seq"}
    for op, *args in script:
        if op != "step":
            for kv in caches.values():
                G(f"vm.builtin.{builtins[op]}")(kv, *args, *((-1,) if op == "fork" else ()))
            model.op(op, *args)
            continue
        ids, lens = args
        n = sum(lens)
        qkvs = [rng.standard_normal((n, width, shape.head_dim)).astype(shape.dtype) for _ in range(shape.num_layers)]
        for name, kv in caches.items():
            G("vm.builtin.kv_state_begin_forward")(kv, ShapeTuple(ids), ShapeTuple(lens))
            for layer in range(shape.num_layers):
                out = tvm.runtime.tensor(np.full((n, shape.num_qo_heads, shape.head_dim), np.nan, shape.dtype),
                                         device=dev)
                G("vm.builtin.attention_kv_cache_attention_with_fused_qkv")(
                    kv, layer, shape.head_dim ** -0.5, tvm.runtime.tensor(qkvs[layer], device=dev), out)
                outs[name].append(out.numpy().astype(np.float64))
            G("vm.builtin.kv_state_end_forward")(kv)
        outs["reference"] += model.step(ids, lens, qkvs)
    return outs


def max_err(outs: dict, a: str, b: str, finite_only: bool = False) -> float:
    """Largest |outs[a] - outs[b]| over every step and layer (only where outs[b] is finite, if asked)."""
    errs = []
    for x, y in zip(outs[a], outs[b]):
        keep = np.isfinite(y) if finite_only else np.ones(x.shape, bool)
        errs.append(float(np.abs(x - y)[keep].max()) if keep.any() else 0.0)
    return max(errs)
