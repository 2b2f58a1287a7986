"""A whole model whose KV cache is attngen's (CPU or CUDA): Llama- and Gemma-2-shaped decoders in TVM's Relax.

The model is written with ``tvm.relax.frontend.nn`` (random weights): embedding, per layer
RMSNorm -> fused qkv -> ``PagedKVCache.attention_with_fused_qkv`` (RoPE applied by the cache,
TVM's "normal" mode) -> output projection -> MLP, then the LM head. The Gemma-2 shape adds what
makes Gemma 2 different: a scaled embedding, norms after attention and MLP, a GeGLU MLP, a
soft-capped final logit, soft-capped attention logits (attngen's ``logits_softcap`` variant) and
sliding-window attention on every other layer (TVM's "mha_sliding" layers).

The model's ``create_kv_cache`` emits attngen's cache (``emit_paged_kv_cache``: attngen's kernels
become PrimFuncs of the model), ``export_model_library`` compiles it for LLVM, and the Relax VM
runs it from the library alone through prefill, batch decode, a forked sequence, a speculative
token-tree step (TVM's tree-mask slots) with the commit of its accepted path, and decode again.
The logits of every step are compared with the same model whose cache has TVM's own TIR kernels
(where TVM's kernels can express the model: they have no attention soft-cap) and with a float64
NumPy forward of the model that recomputes each sequence from its tokens.

    python examples/tvm_model_e2e.py
    python examples/tvm_model_e2e.py --device cuda                  # the Llama shape in float16 on a GPU
    python examples/tvm_model_e2e.py --device cuda --model gemma2   # the Gemma-2 shape in float16 on a GPU

On CUDA (``main_cuda``) the models are float16 at head_dim 64 (the CUDA slots serve 64, 128 and 256): the
Llama shape with a sliding window (20 positions) on its first layer (``cuda_model``), so that the CUDA caches'
sliding-window slots run too, or the Gemma-2 shape with the same window on every other layer and soft-capped
attention logits (``cuda_gemma2``), through the same steps, the token-tree step included (TVM's own CUDA tree
kernels in the baseline's cache).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class ModelConfig:
    """A decoder's shape; the Gemma-2 features are switched on by their fields."""

    name: str
    vocab: int = 96
    hidden: int = 64
    num_layers: int = 2
    num_qo_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 96
    rope_theta: float = 1e4
    # Gemma 2
    sliding_window: int = 0  # > 0: even layers attend to this many positions (the query included)
    attn_soft_cap: float = 0.0  # > 0: soft-capped attention logits (attngen's logits_softcap variant)
    final_soft_cap: float = 0.0  # > 0: soft-capped output logits
    gemma_block: bool = False  # scaled embedding, post-attention / post-MLP norms, GeGLU instead of SwiGLU
    # the cache's capacity
    max_batch: int = 4
    max_total_tokens: int = 512
    prefill_chunk: int = 64

    @property
    def attn_kinds(self) -> tuple:
        return tuple("mha_sliding" if self.sliding_window and i % 2 == 0 else "mha" for i in range(self.num_layers))


def llama(head_dim: int = 16) -> ModelConfig:
    return ModelConfig("llama", head_dim=head_dim)


def gemma2(head_dim: int = 16, attn_soft_cap: float = 5.0) -> ModelConfig:
    return ModelConfig("gemma2", head_dim=head_dim, num_layers=4, sliding_window=24, attn_soft_cap=attn_soft_cap,
                       final_soft_cap=3.0, gemma_block=True)


def cuda_model(sliding_window: int = 20) -> ModelConfig:
    """The CUDA run's model: the Llama shape at head_dim 64 (the CUDA slots' smallest), its first layer a
    "mha_sliding" one when ``sliding_window`` > 0 (20: the script's longest chunk fits it, its forked sequences
    stay within it and sequence 1 grows past it)."""
    return ModelConfig("llama", head_dim=64, sliding_window=sliding_window)


def cuda_gemma2(sliding_window: int = 20) -> ModelConfig:
    """The CUDA run's Gemma-2 shape: ``gemma2`` at head_dim 64, its even layers "mha_sliding" ones with the CUDA
    Llama's window (so that both models' caches without soft cap share one CUDA slot library)."""
    return replace(gemma2(head_dim=64), sliding_window=sliding_window)


EPS = 1e-5
PAGE_SIZE = 16  # TVM's CPU tree kernels assume 16-token pages


# ---------------------------------------------------------------------------------------------
# the model in Relax


def build_model(cfg: ModelConfig, kv_cache: str, cache=None, device: str = "cpu", arch: str | None = None,
                convention: str = "tirx"):
    """(IRModule with ``forward`` and ``create_kv_cache``, parameter names in order); ``kv_cache`` is
    "attngen" or "tvm" (TVM's TIR kernels). On "cuda" the model is float16 and its kernels are built for
    ``arch``; attngen's cache uses the slot ``convention`` ("tirx" or "flashinfer")."""
    from tvm import relax as rx
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

    from attngen.tvm import CacheShape, emit_paged_kv_cache
    from attngen.tvm.baseline import emit_tvm_tir_cache_cpu, emit_tvm_tir_cache_cuda
    from attngen.variants import builtin

    hq, hkv, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
    external = []  # attngen's CUDA object, linked into the model library

    class Layer(nn.Module):
        def __init__(self):
            self.attn_norm = nn.RMSNorm(cfg.hidden, -1, EPS, bias=False)
            self.qkv = nn.Linear(cfg.hidden, (hq + 2 * hkv) * d, bias=False)
            self.o = nn.Linear(hq * d, cfg.hidden, bias=False)
            self.mlp_norm = nn.RMSNorm(cfg.hidden, -1, EPS, bias=False)
            self.gate = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
            self.up = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
            self.down = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)
            if cfg.gemma_block:
                self.post_attn_norm = nn.RMSNorm(cfg.hidden, -1, EPS, bias=False)
                self.post_mlp_norm = nn.RMSNorm(cfg.hidden, -1, EPS, bias=False)

        def forward(self, h, kv, layer_id: int):
            b, s = h.shape[0], h.shape[1]
            qkv = nn.op.reshape(self.qkv(self.attn_norm(h)), (b, s, hq + 2 * hkv, d))
            a = self.o(nn.op.reshape(kv.attention_with_fused_qkv(layer_id, qkv, hq, d ** -0.5), (b, s, hq * d)))
            h = h + (self.post_attn_norm(a) if cfg.gemma_block else a)
            x = self.mlp_norm(h)
            act = nn.op.gelu(self.gate(x), approximate="tanh") if cfg.gemma_block else nn.op.silu(self.gate(x))
            m = self.down(act * self.up(x))
            return h + (self.post_mlp_norm(m) if cfg.gemma_block else m)

    class Decoder(nn.Module):
        def __init__(self):
            self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
            self.layers = nn.ModuleList([Layer() for _ in range(cfg.num_layers)])
            self.norm = nn.RMSNorm(cfg.hidden, -1, EPS, bias=False)
            self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

        def forward(self, input_ids, kv):
            h = self.embed(input_ids)
            if cfg.gemma_block:
                h = h * float(np.sqrt(cfg.hidden))
            for i, layer in enumerate(self.layers):
                h = layer(h, kv, i)
            logits = self.head(self.norm(h))
            if cfg.final_soft_cap:
                logits = nn.op.tanh(logits / cfg.final_soft_cap) * cfg.final_soft_cap
            return logits

        def create_kv_cache(self):
            shape = CacheShape(num_layers=cfg.num_layers, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
                               max_batch=cfg.max_batch, max_total_tokens=cfg.max_total_tokens,
                               prefill_chunk=cfg.prefill_chunk, page_size=PAGE_SIZE,
                               dtype=model_dtype(device), rope_mode="normal", rope_theta=cfg.rope_theta,
                               attn_kinds=cfg.attn_kinds, sliding_window=cfg.sliding_window or 1024)
            bb = rx.BlockBuilder.current()
            if kv_cache == "tvm":
                # TVM's own kernels, each in its slot (TIRPagedKVCache swaps the CPU tree slots; baseline.py)
                created = emit_tvm_tir_cache_cpu(bb, shape) if device == "cpu" else \
                    emit_tvm_tir_cache_cuda(bb, shape, arch, trees=True)
                return PagedKVCache(_expr=created, _name="kv_cache")
            if cfg.attn_soft_cap:
                variant, params = builtin("logits_softcap"), {"soft_cap": cfg.attn_soft_cap}
            else:
                variant, params = builtin("vanilla"), None
            emitted = emit_paged_kv_cache(bb, shape, variant, params=params, cache=cache, target=device, arch=arch,
                                          convention=convention)
            external.extend(emitted.external_mods)
            return PagedKVCache(_expr=emitted.cache, _name="kv_cache")

    spec = {"forward": {"input_ids": nn.spec.Tensor([1, "n"], "int32"), "kv": nn.spec.Object(object_type=PagedKVCache),
                        "$": {"param_mode": "packed", "effect_mode": "none"}},
            "create_kv_cache": {"$": {"param_mode": "none", "effect_mode": "none"}}}
    decoder = Decoder()
    if device == "cuda":
        decoder.to(model_dtype(device))
    mod, named_params = decoder.export_tvm(spec=spec)
    if external:
        mod = mod.with_attr("external_mods", external)
    return mod, [name for name, _ in named_params]


def model_dtype(device: str) -> str:
    """The weights', activations' and cache's dtype: float32 on the CPU, float16 on CUDA (attngen's CUDA slots
    serve 16-bit caches)."""
    return "float16" if device == "cuda" else "float32"


def random_weights(cfg: ModelConfig, names: list, seed: int) -> dict:
    """name -> float32 array (nn.Linear weights are [out, in]); q/k weights large enough that a soft cap bites."""
    rng = np.random.default_rng(seed)
    shapes = {"embed.weight": (cfg.vocab, cfg.hidden), "norm.weight": (cfg.hidden,),
              "head.weight": (cfg.vocab, cfg.hidden)}
    hq, hkv, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes |= {p + "qkv.weight": ((hq + 2 * hkv) * d, cfg.hidden), p + "o.weight": (cfg.hidden, hq * d),
                   p + "gate.weight": (cfg.intermediate, cfg.hidden), p + "up.weight": (cfg.intermediate, cfg.hidden),
                   p + "down.weight": (cfg.hidden, cfg.intermediate)}
        shapes |= {p + n + ".weight": (cfg.hidden,) for n in ("attn_norm", "mlp_norm", "post_attn_norm",
                                                                "post_mlp_norm")}
    weights = {}
    for name in names:
        shape = shapes[name]
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "embed.weight":
            w = rng.standard_normal(shape) / (np.sqrt(cfg.hidden) if cfg.gemma_block else 1.0)
        else:
            w = rng.standard_normal(shape) * ((2.5 if name.endswith("qkv.weight") else 1.0) / np.sqrt(shape[1]))
        weights[name] = w.astype("float32")
    return weights


# ---------------------------------------------------------------------------------------------
# the float64 reference: the model recomputed from each sequence's tokens


def _rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def _rope(x, pos, theta):
    d = x.shape[-1]
    i = np.arange(d)
    angle = np.asarray(pos, np.float64)[:, None] / theta ** ((2 * i % d) / d)[None, :]
    partner = np.where(i < d // 2, -np.roll(x, -(d // 2), axis=-1), np.roll(x, d // 2, axis=-1))
    return np.cos(angle)[:, None] * x + np.sin(angle)[:, None] * partner


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def reference_logits(cfg: ModelConfig, w: dict, tokens, positions, visible) -> np.ndarray:
    """Logits [m, vocab] of tokens [m] at positions [m], row i attending to the keys visible[i] (bool [m, m])."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    hq, hkv, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
    pos = np.asarray(positions)
    h = w["embed.weight"][np.asarray(tokens)] * (np.sqrt(cfg.hidden) if cfg.gemma_block else 1.0)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        qkv = (_rms(h, w[p + "attn_norm.weight"]) @ w[p + "qkv.weight"].T).reshape(len(h), hq + 2 * hkv, d)
        q, k, v = _rope(qkv[:, :hq], pos, cfg.rope_theta), _rope(qkv[:, hq:hq + hkv], pos, cfg.rope_theta), qkv[:, hq + hkv:]
        k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
        s = np.einsum("ihd,jhd->hij", q, k) * d ** -0.5
        if cfg.attn_soft_cap:
            s = cfg.attn_soft_cap * np.tanh(s / cfg.attn_soft_cap)
        mask = visible.copy()
        if cfg.attn_kinds[i] == "mha_sliding":
            mask &= pos[:, None] - pos[None, :] < cfg.sliding_window
        s = np.where(mask[None], s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        a = np.einsum("hij,jhd->ihd", e / e.sum(-1, keepdims=True), v).reshape(len(h), hq * d) @ w[p + "o.weight"].T
        h = h + (_rms(a, w[p + "post_attn_norm.weight"]) if cfg.gemma_block else a)
        x = _rms(h, w[p + "mlp_norm.weight"])
        g = x @ w[p + "gate.weight"].T
        act = _gelu_tanh(g) if cfg.gemma_block else g / (1 + np.exp(-g))
        m = (act * (x @ w[p + "up.weight"].T)) @ w[p + "down.weight"].T
        h = h + (_rms(m, w[p + "post_mlp_norm.weight"]) if cfg.gemma_block else m)
    logits = _rms(h, w["norm.weight"]) @ w["head.weight"].T
    return cfg.final_soft_cap * np.tanh(logits / cfg.final_soft_cap) if cfg.final_soft_cap else logits


class ReferenceModel:
    """Each sequence's committed tokens; a step's logits recomputed from them."""

    def __init__(self, cfg: ModelConfig, weights: dict):
        self.cfg, self.weights = cfg, weights
        self.tokens: dict[int, list] = {}
        self.tree: dict[int, tuple] = {}  # sequence -> (tokens, parents) of its last token-tree step

    def step(self, ids, tokens_per_seq, parents_per_seq=None) -> np.ndarray:
        out = []
        for n_seq, s in enumerate(ids):
            past, new = self.tokens[s], list(tokens_per_seq[n_seq])
            m, n = len(past) + len(new), len(new)
            visible = np.tril(np.ones((m, m), bool))
            positions = np.arange(m)
            if parents_per_seq is not None:
                parents = parents_per_seq[n_seq]
                for r in range(n):
                    up, depth = r, -1
                    visible[len(past) + r, len(past):] = False
                    while up != -1:
                        visible[len(past) + r, len(past) + up] = True
                        up, depth = parents[up], depth + 1
                    positions[len(past) + r] = len(past) + depth
                self.tree[s] = (new, parents)
            else:
                self.tokens[s] = past + new
            out.append(reference_logits(self.cfg, self.weights, past + new, positions, visible)[len(past):])
        return np.concatenate(out)

    def commit(self, s, leaf):
        tokens, parents = self.tree.pop(s)
        path = []
        while leaf != -1:
            path.append(leaf)
            leaf = parents[leaf]
        self.tokens[s] += [tokens[i] for i in reversed(path)]


# ---------------------------------------------------------------------------------------------
# driving a model library


class RunningModel:
    """A compiled model in the Relax VM with its cache."""

    def __init__(self, executable, weights: dict, names: list, device: str = "cpu"):
        import tvm
        from tvm import relax

        self.dev = tvm.cuda(0) if device == "cuda" else tvm.cpu()
        self.vm = relax.VirtualMachine(executable, self.dev)
        self.params = [tvm.runtime.tensor(weights[n].astype(model_dtype(device)), device=self.dev) for n in names]
        self.kv = self.vm["create_kv_cache"]()

    def builtin(self, name, *args):
        import tvm

        return tvm.get_global_func(f"vm.builtin.{name}")(self.kv, *args)

    def step(self, ids, tokens_per_seq, parents=None) -> np.ndarray:
        import tvm
        from tvm.runtime import ShapeTuple

        lens = [len(t) for t in tokens_per_seq]
        tree = (ShapeTuple([p for ps in parents for p in ps]),) if parents is not None else ()
        self.builtin("kv_state_begin_forward", ShapeTuple(ids), ShapeTuple(lens), *tree)
        ids_array = np.concatenate([np.asarray(t, np.int32) for t in tokens_per_seq])[None]
        logits = self.vm["forward"](tvm.runtime.tensor(ids_array, device=self.dev), self.kv, self.params).numpy()[0]
        self.builtin("kv_state_end_forward")
        return logits.astype(np.float64)


def script(rng, vocab: int, decode_steps: int):
    """The steps every model runs: (op, args) with the tokens drawn here.

    Sequence 1 grows past the Gemma-2 window (24; the CUDA models' 20) and stays unforked; sequence 0 and its fork
    stay within it.
    TVM 0.27's cache gives a sliding-window layer wrong key positions in a forked sequence's own blocks
    (``k_rope_pos_offset_sliding_window`` = max(0, block start + block length - window) where the first kept key
    sits at block start + max(0, block length - window)), which no kernel can undo; with windows that never
    bite after a fork those positions do not matter (docs/tvm.md)."""
    def tokens(n):
        return [int(t) for t in rng.integers(0, vocab, n)]

    steps = [("add", 0), ("step", [0], [tokens(4)]), ("add", 1), ("step", [1, 0], [tokens(20), tokens(1)])]
    steps += [("step", [0, 1], [tokens(1), tokens(1)]) for _ in range(decode_steps)]
    steps += [("fork", 0, 2), ("step", [0, 1, 2], [tokens(1), tokens(1), tokens(1)]),
              ("step", [2, 0], [tokens(3), tokens(1)])]
    # a speculative step: sequence 2 drafts a tree of 6 tokens, sequence 1 a chain of 2; then the verifier
    # accepts the path to node 4 in sequence 2 and the first token of sequence 1
    steps += [("tree", [1, 2], [tokens(2), tokens(6)], [[-1, 0], [-1, 0, 0, 1, 1, 2]]), ("commit", [1, 2], [0, 4])]
    steps += [("step", [0, 1, 2], [tokens(1), tokens(1), tokens(1)]) for _ in range(2)]
    return steps


def run(models: dict, ref: ReferenceModel | None, steps) -> dict:
    """Run ``steps`` on every model; (name -> list of logits per step), the reference under "reference"."""
    from tvm.runtime import ShapeTuple

    out = {name: [] for name in models} | ({"reference": []} if ref else {})
    for op, *args in steps:
        if op in ("step", "tree"):
            ids, toks, *parents = args
            for name, model in models.items():
                out[name].append(model.step(ids, toks, *parents))
            if ref:
                out["reference"].append(ref.step(ids, toks, *parents))
        elif op == "commit":
            ids, leaves = args
            for model in models.values():
                model.builtin("attention_kv_cache_commit_accepted_token_tree_nodes", ShapeTuple(ids), ShapeTuple(leaves))
            if ref:
                for s, leaf in zip(ids, leaves):
                    ref.commit(s, leaf)
        else:
            for model in models.values():
                model.builtin({"add": "kv_state_add_sequence", "fork": "kv_state_fork_sequence"}[op], *args,
                              *((-1,) if op == "fork" else ()))
            if ref:
                if op == "add":
                    ref.tokens[args[0]] = []
                else:
                    ref.tokens[args[1]] = list(ref.tokens[args[0]])
    return out


def max_diff(a: list, b: list) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def compile_model(cfg: ModelConfig, kv_cache: str, directory, cache=None, device: str = "cpu", arch: str | None = None,
                  convention: str = "tirx"):
    """(the model library, loaded; parameter names): compiled for LLVM (or CUDA ``arch``) and exported to disk
    (the ahead-of-time path), the Relax VM then runs it from that library alone."""
    import tvm

    from attngen.tvm import export_model_library

    mod, names = build_model(cfg, kv_cache, cache, device, arch, convention)
    path = export_model_library(mod, directory / f"{cfg.name}_{kv_cache}_{cfg.attn_soft_cap}_{device}_{convention}.so",
                                target=device, arch=arch)
    return tvm.runtime.load_module(str(path)), names


def main(head_dim: int = 16, decode_steps: int = 4, seed: int = 0, cache=None, compare_tvm: bool = True):
    import tempfile
    from pathlib import Path

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in (llama(head_dim), gemma2(head_dim)):
            steps = script(np.random.default_rng(seed), cfg.vocab, decode_steps)
            executable, names = compile_model(cfg, "attngen", Path(tmp), cache)
            weights = random_weights(cfg, names, seed)
            out = run({"attngen": RunningModel(executable, weights, names)}, ReferenceModel(cfg, weights), steps)
            results[f"{cfg.name} vs float64"] = {"out_err": max_diff(out["attngen"], out["reference"])}
            if compare_tvm:
                # TVM's kernels have no attention soft-cap: the comparison drops it from both models
                tvm_cfg = replace(cfg, attn_soft_cap=0.0)
                ours = executable if tvm_cfg == cfg else compile_model(tvm_cfg, "attngen", Path(tmp), cache)[0]
                theirs = compile_model(tvm_cfg, "tvm", Path(tmp))[0]
                models = {"attngen": RunningModel(ours, weights, names), "tvm": RunningModel(theirs, weights, names)}
                both = run(models, None, steps)
                results[f"{cfg.name} vs TVM's kernels"] = {"out_err": max_diff(both["attngen"], both["tvm"])}
            # the soft cap and the windows bite: without them the logits differ
            for feature in ("attn_soft_cap", "sliding_window"):
                if getattr(cfg, feature):
                    without = run({}, ReferenceModel(replace(cfg, **{feature: 0}), weights), steps)["reference"]
                    assert max_diff(out["reference"], without) > 1e-2, feature
    for name, r in results.items():
        print(f"{name:28s} max |logit difference| {r['out_err']:.2e}")
    assert all(r["out_err"] < 1e-4 for r in results.values()), results
    return results


CUDA_MODELS = {"llama": cuda_model, "gemma2": cuda_gemma2}


def main_cuda(arch: str | None = None, decode_steps: int = 4, seed: int = 0, cache=None, sliding_window: int = 20,
              model: str = "llama", conventions: tuple = ("tirx", "flashinfer")):
    """A model of ``CUDA_MODELS`` in float16 on this machine's GPU (head_dim 64, a sliding window of
    ``sliding_window`` positions on its first layer, or every other layer for "gemma2"; none when 0), its cache
    attngen's in each slot convention of ``conventions`` and TVM's own CUDA kernels, through prefill, batch
    decode, a fork and a speculative token-tree step with its commit: each cache's logits against the float64
    forward of the same float16-rounded weights, attngen's errors bounded by twice TVM's own (the same float16
    model around a different attention) plus 1e-3, and attngen's logits against TVM's. (Sequence 1 grows past
    the window, unforked; the forked ones stay within it.)

    TVM's kernels have no attention soft-cap, so for "gemma2" TVM's cache runs the model without it, and so does
    one more attngen cache per convention ("attngen <convention> no soft cap": the comparison with TVM's
    logits). The soft-capped models, which TVM cannot run, are held to the same bound: TVM's float16 error on
    the model without the cap is a measurement in the same dtype of the same model (every matmul, norm and
    activation, the float16 K/V the attention reads) but for the cap, which only squashes the scores (its
    slope is at most 1)."""
    import tempfile
    from pathlib import Path

    from attngen.runtime.cuda import current_arch

    arch = arch or current_arch()
    cfg = CUDA_MODELS[model](sliding_window)
    plain = replace(cfg, attn_soft_cap=0.0)  # the model TVM's kernels can run
    builds = {f"attngen {c}": (cfg, "attngen", c) for c in conventions}
    if plain != cfg:
        builds |= {f"attngen {c} no soft cap": (plain, "attngen", c) for c in conventions}
    builds["tvm kernels"] = (plain, "tvm", "tirx")
    steps = script(np.random.default_rng(seed), cfg.vocab, decode_steps)
    out, reference = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        compiled = {name: compile_model(c, kv_cache, Path(tmp), cache, "cuda", arch, convention)
                    for name, (c, kv_cache, convention) in builds.items()}
        # the float64 forward on the weights the GPU models hold (rounded to float16): only the forward differs
        names = compiled["tvm kernels"][1]
        weights = {n: w.astype(np.float16).astype(np.float32) for n, w in random_weights(cfg, names, seed).items()}
        for c in dict.fromkeys((cfg, plain)):  # the models of one config run beside its float64 forward
            group = {name: RunningModel(compiled[name][0], weights, compiled[name][1], "cuda")
                     for name, (model_cfg, _, _) in builds.items() if model_cfg == c}
            got = run(group, ReferenceModel(c, weights), steps)
            reference[c] = got.pop("reference")
            out |= got
    # the window and the soft cap bite: without them the logits differ
    for feature in ("sliding_window", "attn_soft_cap"):
        if getattr(cfg, feature):
            without = run({}, ReferenceModel(replace(cfg, **{feature: 0}), weights), steps)["reference"]
            assert max_diff(reference[cfg], without) > 1e-2, feature
    results = {}
    for name, (c, _, _) in builds.items():
        results[name] = {"out_err": max_diff(out[name], reference[c]), "attn_soft_cap": c.attn_soft_cap,
                         "max_ref_logit": max(float(np.abs(x).max()) for x in reference[c]),
                         "vs_tvm": max_diff(out[name], out["tvm kernels"]) if c == plain else None}
    for name, r in results.items():
        vs_tvm = "n/a (soft cap)" if r["vs_tvm"] is None else f"{r['vs_tvm']:.2e}"
        print(f"{name:32s} max |logit difference| vs float64 {r['out_err']:.2e}, vs TVM's kernels {vs_tvm}")
    bound = 2 * results["tvm kernels"]["out_err"] + 1e-3
    assert all(r["out_err"] <= bound for r in results.values()), results
    return results


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", choices=tuple(CUDA_MODELS), default="llama", help="the CUDA run's model")
    args = ap.parse_args()
    main_cuda(model=args.model) if args.device == "cuda" else main()
