"""A TVM PagedKVCache whose attention is an attngen variant: a small multi-layer decode loop.

TVM's PagedKVCache keeps the sequences (pages, forks, rollback); ``create_paged_kv_cache``
(``attngen.tvm``) fills its attention slots with attngen's CPU functions for a Gemma-2-style variant (soft-capped
logits under a causal mask) and its merge slot with attngen's merge. The loop prefills two
prompts, decodes, forks a sequence for a second sample, drops rejected tokens with pop-n and
decodes on; every layer's attention is checked against a float64 reference that keeps its own
copy of each sequence's keys and values. RoPE is TVM's "normal" mode: applied to q and k
before the cache stores them.

The loop runs twice: once with the kernels built at run time, once ahead of time — the
same kernels compiled into a TVM model library (``paged_kv_cache_module`` +
``export_model_library``) whose Relax function ``create_kv_cache()`` creates the cache.
With ``--device cuda`` (float16) both caches use attngen's CUDA functions instead: built at run
time (``create_paged_kv_cache(..., target="cuda")``), and linked statically into a CUDA model
library as one object file (the same two calls with ``target="cuda", arch=...``).

    python examples/tvm_paged_kv_cache.py [--device cuda]
"""
import numpy as np
from tvm.script import tirx as T

from attngen import ScalarParam, Variant


@T.prim_func
def softcap(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
            kv_head: T.int32, soft_cap: T.float32) -> T.float32:
    return soft_cap * T.tanh(s / soft_cap)


@T.prim_func
def causal(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.bool:
    return kv_pos <= qo_pos


variant = Variant("softcap_causal", logits_transform=softcap, logits_mask=causal,
                  params=[ScalarParam("soft_cap", "float32", 50.0)])


def rope(x, positions, theta: float):
    """TVM's rotate-half RoPE of x [n, H, D] at positions [n] (rope_scale 1), in float64."""
    d = x.shape[-1]
    i = np.arange(d)
    angle = np.asarray(positions, np.float64)[:, None] / theta ** ((2 * i % d) / d)[None, :]
    partner = np.where(i < d // 2, -np.roll(x, -(d // 2), axis=-1), np.roll(x, d // 2, axis=-1))
    return np.cos(angle)[:, None] * x + np.sin(angle)[:, None] * partner


class Model:
    """Random layers around the cache: x -> qkv -> attention (the cache) -> x, and the reference."""

    def __init__(self, rng, num_layers, num_qo_heads, num_kv_heads, head_dim, soft_cap, theta):
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        hidden = num_qo_heads * head_dim
        width = (num_qo_heads + 2 * num_kv_heads) * head_dim
        self.w_qkv = [rng.standard_normal((hidden, width)) / np.sqrt(hidden) for _ in range(num_layers)]
        self.w_out = [rng.standard_normal((hidden, hidden)) / np.sqrt(hidden) for _ in range(num_layers)]
        self.params = {"soft_cap": soft_cap}
        self.theta = theta
        self.history = {}  # sequence -> per layer (keys [n, Hkv, D], values) after RoPE, float64

    def reference(self, layer, seq_ids, lens, qkv):
        """float64 attention of the new tokens of each sequence over its whole history."""
        from attngen.runtime import reference_attention

        hq, hkv, d = self.heads
        out, start = [], 0
        for s, n in zip(seq_ids, lens):
            keys, values = self.history[s][layer]
            pos = np.arange(len(keys), len(keys) + n)
            x = qkv[start:start + n].astype(np.float64)
            q, k = rope(x[:, :hq], pos, self.theta), rope(x[:, hq:hq + hkv], pos, self.theta)
            keys, values = np.concatenate([keys, k]), np.concatenate([values, x[:, hq + hkv:]])
            self.history[s][layer] = (keys, values)
            o, _ = reference_attention(variant, q, [keys], [values], np.array([0, n]), d ** -0.5, self.params)
            out.append(o)
            start += n
        return np.concatenate(out)


def main(head_dim: int = 64, num_layers: int = 3, num_qo_heads: int = 8, num_kv_heads: int = 2,
         decode_steps: int = 4, soft_cap: float = 20.0, seed: int = 0, cache=None, device: str = "cpu"):
    import tempfile
    from pathlib import Path

    import tvm
    from tvm import relax

    from attngen.tvm import CacheShape, create_paged_kv_cache, export_model_library, paged_kv_cache_module
    from attngen.variants import builtin

    shape = CacheShape(num_layers=num_layers, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, dtype="float32" if device == "cpu" else "float16", max_batch=4,
                       max_total_tokens=512, prefill_chunk=128, rope_mode="normal", rope_theta=1e4)
    params = {"soft_cap": soft_cap}
    results = {}
    # attngen's CUDA slots serve position-free variants: the built-in soft cap, TVM's own causal flag as mask
    attn = variant if device == "cpu" else builtin("logits_softcap")
    kv = create_paged_kv_cache(shape, attn, params=params, cache=cache, target=device)
    results["runtime-built kernels"] = decode_loop(kv, seed, decode_steps, shape, params, device)
    with tempfile.TemporaryDirectory() as tmp:
        # on CUDA, attngen's functions become one object file linked into the model library
        where = {"target": device}
        if device == "cuda":
            from attngen.runtime.cuda import current_arch

            where["arch"] = current_arch()
        mod = paged_kv_cache_module(shape, attn, params=params, cache=cache, **where)
        library = export_model_library(mod, Path(tmp) / "model.so", **where)
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.device(device))
        results["model library (AOT)"] = decode_loop(vm["create_kv_cache"](), seed, decode_steps, shape, params,
                                                     device)
    for how, errors in results.items():
        print(f"{how}:")
        for phase, err in errors.items():
            print(f"  {phase:18s} max|O-ref| {err['out_err']:.2e}")
    return results["model library (AOT)"]


def decode_loop(kv, seed, decode_steps, shape, params, device):
    """Add sequences, prefill, decode, fork, pop-n and append through ``kv`` (a cache of ``shape``), checking every
    layer."""
    import tvm
    from tvm.runtime import ShapeTuple

    G = tvm.get_global_func
    rng = np.random.default_rng(seed)
    num_layers, num_qo_heads, num_kv_heads = shape.num_layers, shape.num_qo_heads, shape.num_kv_heads
    head_dim, dtype, theta = shape.head_dim, shape.dtype, shape.rope_theta
    model = Model(rng, num_layers, num_qo_heads, num_kv_heads, head_dim, params["soft_cap"], theta)
    errors: dict[str, float] = {}

    def forward(phase, seq_ids, lens):
        """One batch step through every layer; records the worst error against the reference."""
        n = sum(lens)
        x = rng.standard_normal((n, num_qo_heads * head_dim))
        G("vm.builtin.kv_state_begin_forward")(kv, ShapeTuple(seq_ids), ShapeTuple(lens))
        for layer in range(num_layers):
            qkv = (x @ model.w_qkv[layer]).reshape(n, -1, head_dim).astype(dtype)
            out = tvm.runtime.empty((n, num_qo_heads, head_dim), dtype, device=tvm.device(device))
            G("vm.builtin.attention_kv_cache_attention_with_fused_qkv")(
                kv, layer, head_dim ** -0.5, tvm.runtime.tensor(qkv, device=tvm.device(device)), out)
            o = out.numpy().astype(np.float64)
            err = float(np.abs(o - model.reference(layer, seq_ids, lens, qkv.astype(np.float64))).max())
            errors[phase] = max(errors.get(phase, 0.0), err)
            x = np.tanh(o.reshape(n, -1).astype(np.float64) @ model.w_out[layer])
        G("vm.builtin.kv_state_end_forward")(kv)

    for s in (0, 1):
        G("vm.builtin.kv_state_add_sequence")(kv, s)
        model.history[s] = [(np.zeros((0, num_kv_heads, head_dim)),) * 2 for _ in range(num_layers)]
    forward("prefill", [0, 1], [13, 7])
    for _ in range(decode_steps):
        forward("decode", [0, 1], [1, 1])
    G("vm.builtin.kv_state_fork_sequence")(kv, 0, 2, -1)  # a second sample continuing sequence 0
    model.history[2] = list(model.history[0])
    for _ in range(decode_steps):
        forward("decode_after_fork", [0, 1, 2], [1, 1, 1])
    G("vm.builtin.kv_state_popn")(kv, 2, 2)  # sequence 2 rejects its last two tokens
    model.history[2] = [(k[:-2], v[:-2]) for k, v in model.history[2]]
    forward("append_after_popn", [2, 0], [3, 1])
    lengths = [G("vm.builtin.attention_kv_cache_get_sequence_length")(kv, s) for s in (0, 1, 2)]
    assert lengths == [len(model.history[s][0][0]) for s in (0, 1, 2)], lengths

    print(f"soft-capped causal attention on {device} in TVM's PagedKVCache: {num_layers} layers, {num_qo_heads}/{num_kv_heads} heads, "
          f"head_dim {head_dim}, sequence lengths {lengths}")
    tol = 1e-4 if dtype == "float32" else 1e-2  # float16: q, k, v, pages and outputs rounded to 11 bits
    assert all(err < tol for err in errors.values()), errors
    return {phase: {"out_err": err} for phase, err in errors.items()}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    main(device=ap.parse_args().device)
