"""TVM PagedKVCache attention slots (the ``("tirx", fn)`` convention) as CPU TIR programs.

TVM 0.27's ``vm.builtin.paged_attention_kv_cache_create`` takes its attention kernels as
``["tirx", fn]`` slots and calls each ``fn`` with a fixed argument list
(``src/runtime/vm/attn_backend.h``, ``relax/frontend/nn/llm/kv_cache.py``)::

    ragged prefill  fn(q, qo_indptr, k, v, kv_indptr, q_rope_position, k_rope_pos_offset,
                       o, lse, causal, rotary_mode, rope_scale, rope_theta, sm_scale)
    paged prefill   fn(q, qo_indptr, pages, page_indptr, page_indices, length_info,
                       k_rope_pos_offset, q_rope_position, o, lse, causal, rotary_mode,
                       rope_scale, rope_theta, sm_scale)
    decode          fn(q, pages, page_indptr, page_indices, length_info, k_rope_pos_offset,
                       q_rope_position, o, lse, rotary_mode, rope_scale, rope_theta, sm_scale)

(the two RoPE position arrays swap places between ragged and paged). ``slot_program`` writes
one such function with ``attngen_hook_*`` placeholders; ``lower_slot`` inlines a variant's
hooks (:mod:`.inline_hooks`), compiles its scalar parameters in as constants and leaves its
tensor parameters as trailing arguments; ``build_slot_library`` builds every slot for one
(variant, head_dim, dtype, RoPE mode, window) into one cached library.

What the functions assume and produce (TVM's conventions, checked against its runtime):

- ``pages[P, 2, Hkv, S, D]`` (HND, S = page size); every index array may be a view with a
  nonzero byte offset (their buffers have symbolic ``elem_offset``);
- ``length_info`` is ``last_page_len[B]``, or for the sliding-window slots ``[3, B]`` =
  (last_page_len, sliding_window_offset, sink_size): key j of a request lives at sequence
  offset ``j`` if ``j < sink_size`` else ``j - sink_size + sliding_window_offset``;
- positions are TVM's: query row r sits at ``q_rope_position[r]``, key j of request b at
  ``k_rope_pos_offset[b] + j``. The variant's hooks, ``causal`` (a key is visible when
  ``kv_pos <= qo_pos``) and the window of the sliding-window prefill slot (visible when also
  ``qo_pos - kv_pos < window``) all use these positions, so the ragged and paged parts of one
  row agree however TVM splits them (prefix sharing, forks);
- ``rotary_mode == 1``: TVM's RoPE (rotate-half, angle = pos * rope_scale /
  rope_theta^(2 (d mod D/2) / D)) is applied to q and k before the variant's transforms; a
  function is built for one rotary mode and asserts it at run time;
- scores in float32, an online softmax, lse in base 2; a row that sees no key gets o = 0 and
  lse = -5e4 (TVM's "no key" value, merged as weight 0), never NaN.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

import tvm
import tvm.tirx as tir
from tvm.script import tirx as T

from attngen.codegen.cache import BuildCache, content_key, hash_files
from attngen.ir import ConfigError, ScalarParam, StateAlgebra
from attngen.ir import tir_utils as tu
from attngen.schedules.build_config import DTYPE_SHORT

from .attention_tir import LOG2E
from .build import build_cpu_library, hook_flags
from .inline_hooks import inline_hooks

NO_KEY_LSE = -5.0e4  # TVM's lse for a row that sees no key
SLOT_DTYPES = ("float32", "float16")
SLOT_KINDS = ("ragged", "paged", "decode")

# slot_program's parameters, in its own order ...
_GENERIC_PARAMS = ("q", "qo_indptr", "k", "v", "kv_indptr", "pages", "page_indptr", "page_indices",
                   "length_info", "q_rope_position", "k_rope_pos_offset", "o", "lse", "causal",
                   "rotary_mode", "rope_scale", "rope_theta", "sm_scale")
# ... and the subset, in TVM's order, that each slot kind is called with.
SLOT_SIGNATURES = {
    "ragged": ("q", "qo_indptr", "k", "v", "kv_indptr", "q_rope_position", "k_rope_pos_offset", "o",
               "lse", "causal", "rotary_mode", "rope_scale", "rope_theta", "sm_scale"),
    "paged": ("q", "qo_indptr", "pages", "page_indptr", "page_indices", "length_info",
              "k_rope_pos_offset", "q_rope_position", "o", "lse", "causal", "rotary_mode", "rope_scale",
              "rope_theta", "sm_scale"),
    "decode": ("q", "pages", "page_indptr", "page_indices", "length_info", "k_rope_pos_offset",
               "q_rope_position", "o", "lse", "rotary_mode", "rope_scale", "rope_theta", "sm_scale"),
}


@dataclass(frozen=True)
class SlotSpec:
    """What one TVM-slot function is specialised for."""

    kind: str  # "ragged" | "paged" | "decode"
    head_dim: int
    dtype: str  # q/k/v/o element type: "float32" | "float16"
    sliding_window: bool = False  # length_info[3, B] (paged and decode only)
    window: int = 0  # paged sliding-window prefill: with causal, keys closer than this many positions
    inline_rope: bool = False  # built for rotary_mode 1 (TVM's RopeMode.INLINE), else rotary_mode 0
    has_query_transform: bool = False
    has_key_transform: bool = False
    has_logits_transform: bool = False
    has_mask: bool = False
    q_scale_log2e: bool = True  # fold log2(e) into the query scale (no logits transform)

    def __post_init__(self):
        if self.kind not in SLOT_KINDS:
            raise ConfigError(f"slot kind {self.kind!r}: use one of {list(SLOT_KINDS)}")
        if self.sliding_window and self.kind == "ragged":
            raise ConfigError("the ragged slot has no sliding-window form; TVM calls it with causal only")
        if self.window and not (self.sliding_window and self.kind == "paged"):
            raise ConfigError("window: only the paged sliding-window prefill slot takes a window")
        if self.inline_rope and self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim}: inline RoPE rotates halves and needs an even "
                              "head_dim")

    @property
    def func_name(self) -> str:
        sw = "_sliding_window" if self.sliding_window else ""
        return f"tvm_slot_{self.kind}{sw}_{DTYPE_SHORT[self.dtype]}_d{self.head_dim}"


def _rope(x, d, pos, rope_scale, rope_theta, head_dim: int):
    """TVM's rotate-half RoPE of element ``d`` of the float32 row ``x`` at position ``pos``."""
    half = head_dim // 2
    angle = T.Cast("float32", pos) * rope_scale / T.pow(
        rope_theta, T.Cast("float32", (d * 2) % head_dim) / T.float32(head_dim))
    partner = T.if_then_else(d < half, -x[d + half], x[d - half])
    return T.cos(angle) * x[d] + T.sin(angle) * partner


def slot_program(spec: SlotSpec) -> tir.PrimFunc:
    """The generic slot function (all of ``_GENERIC_PARAMS``); ``lower_slot`` picks TVM's signature."""
    D, dt = spec.head_dim, spec.dtype
    ragged, decode, sliding = spec.kind == "ragged", spec.kind == "decode", spec.sliding_window
    rope, window = spec.inline_rope, spec.window
    has_qt, has_kt = spec.has_query_transform, spec.has_key_transform
    has_lt, has_mask = spec.has_logits_transform, spec.has_mask
    use_kt = rope or has_kt  # keys are transformed once per call into KT, not once per score
    log2e_q, log2e_s = spec.q_scale_log2e, not spec.q_scale_log2e
    neg_inf = tir.const(float("-inf"), "float32")
    want_rotary = 1 if rope else 0
    rotary_msg = (f"attngen {spec.func_name} was built for rotary_mode={want_rotary} but TVM called it "
                  f"with another: rebuild the slots with the cache's rope_mode")

    def seq_offset(length_info, j, b):
        """Sequence offset of chunk key j: sink keys first, then the window after its offset."""
        if not sliding:
            return j
        return T.if_then_else(j < length_info[2, b], j, j - length_info[2, b] + length_info[1, b])

    def visible(causal, qo_pos, kv_pos, b, h, hk):
        conds = []
        if not decode:  # TVM's decode slots attend to every key they are given
            order = tir.LE(kv_pos, qo_pos)
            if window:
                order = tir.And(order, tir.LT(qo_pos - kv_pos, window))
            conds.append(tir.Or(tir.EQ(causal, 0), order))
        if has_mask:
            conds.append(T.call_extern("bool", "attngen_hook_logits_mask", b, qo_pos, kv_pos, h, hk))
        return functools.reduce(tir.And, conds) if conds else tir.const(True, "bool")

    # fmt: off
    @T.prim_func
    def slot(q_ptr: T.handle,  # [total_q, Hq, D] (decode: [B, Hq, D])
             qo_indptr_ptr: T.handle,  # [B+1] (not decode)
             k_ptr: T.handle,  # ragged: [total_kv, Hkv, D]
             v_ptr: T.handle,  # ragged: [total_kv, Hkv, D]
             kv_indptr_ptr: T.handle,  # ragged: [B+1]
             pages_ptr: T.handle,  # paged, decode: [P, 2, Hkv, S, D]
             page_indptr_ptr: T.handle,  # paged, decode: [B+1]
             page_indices_ptr: T.handle,  # paged, decode: [nnz_pages]
             length_info_ptr: T.handle,  # paged, decode: last_page_len [B], sliding window: [3, B]
             q_rope_position_ptr: T.handle,  # [total_q] (decode: [B])
             k_rope_pos_offset_ptr: T.handle,  # [B]
             o_ptr: T.handle,  # like q
             lse_ptr: T.handle,  # [total_q, Hq] float32, base 2
             causal: T.int32,
             rotary_mode: T.int32,
             rope_scale: T.float32,
             rope_theta: T.float32,
             sm_scale: T.float32):
        batch = T.int32()
        total_q = T.int32()
        n_qo_heads = T.int32()
        n_kv_heads = T.int32()
        n_kv_rows = T.int32()
        n_pages_total = T.int32()
        page_size = T.int32()
        nnz_pages = T.int32()
        qo_indptr_off = T.int32()
        kv_indptr_off = T.int32()
        page_indptr_off = T.int32()
        page_indices_off = T.int32()
        length_info_off = T.int32()
        q_pos_off = T.int32()
        k_pos_off = T.int32()
        if decode:
            Q = T.match_buffer(q_ptr, (batch, n_qo_heads, D), dt)
            O = T.match_buffer(o_ptr, (batch, n_qo_heads, D), dt)
            LSE = T.match_buffer(lse_ptr, (batch, n_qo_heads), "float32")
            Q_POS = T.match_buffer(q_rope_position_ptr, (batch,), "int32", elem_offset=q_pos_off)
        else:
            Q = T.match_buffer(q_ptr, (total_q, n_qo_heads, D), dt)
            O = T.match_buffer(o_ptr, (total_q, n_qo_heads, D), dt)
            LSE = T.match_buffer(lse_ptr, (total_q, n_qo_heads), "float32")
            Q_POS = T.match_buffer(q_rope_position_ptr, (total_q,), "int32", elem_offset=q_pos_off)
            QO_INDPTR = T.match_buffer(qo_indptr_ptr, (batch + 1,), "int32", elem_offset=qo_indptr_off)
        K_POS0 = T.match_buffer(k_rope_pos_offset_ptr, (batch,), "int32", elem_offset=k_pos_off)
        if ragged:
            K = T.match_buffer(k_ptr, (n_kv_rows, n_kv_heads, D), dt)
            V = T.match_buffer(v_ptr, (n_kv_rows, n_kv_heads, D), dt)
            KV_INDPTR = T.match_buffer(kv_indptr_ptr, (batch + 1,), "int32", elem_offset=kv_indptr_off)
        else:
            PAGES = T.match_buffer(pages_ptr, (n_pages_total, 2, n_kv_heads, page_size, D), dt)
            PAGE_INDPTR = T.match_buffer(page_indptr_ptr, (batch + 1,), "int32", elem_offset=page_indptr_off)
            PAGE_IDX = T.match_buffer(page_indices_ptr, (nnz_pages,), "int32", elem_offset=page_indices_off)
            if sliding:
                LENGTH_INFO = T.match_buffer(length_info_ptr, (3, batch), "int32", elem_offset=length_info_off)
            else:
                LENGTH_INFO = T.match_buffer(length_info_ptr, (batch,), "int32", elem_offset=length_info_off)
        assert rotary_mode == want_rotary, rotary_msg
        group: T.let = n_qo_heads // n_kv_heads
        if use_kt:
            if ragged:
                KT = T.alloc_buffer((n_kv_rows, n_kv_heads, D), "float32")
            else:
                KT = T.alloc_buffer((nnz_pages * page_size, n_kv_heads, D), "float32")
        for b in range(batch):
            if ragged:
                kv_len: T.let = KV_INDPTR[b + 1] - KV_INDPTR[b]
                k_base: T.let = KV_INDPTR[b]
            else:
                n_pages: T.let = PAGE_INDPTR[b + 1] - PAGE_INDPTR[b]
                if sliding:
                    kv_len: T.let = T.if_then_else(n_pages > 0, (n_pages - 1) * page_size + LENGTH_INFO[0, b]
                                                   - LENGTH_INFO[1, b] + LENGTH_INFO[2, b], 0)
                else:
                    kv_len: T.let = T.if_then_else(n_pages > 0, (n_pages - 1) * page_size + LENGTH_INFO[b], 0)
                k_base: T.let = PAGE_INDPTR[b] * page_size
            if decode:
                qo_start: T.let = b
                qo_len: T.let = 1
            else:
                qo_start: T.let = QO_INDPTR[b]
                qo_len: T.let = QO_INDPTR[b + 1] - QO_INDPTR[b]
            kv_pos0: T.let = K_POS0[b]
            if use_kt:
                for jh in T.parallel(kv_len * n_kv_heads):
                    k_raw = T.alloc_buffer((D,), "float32", scope="local")
                    k_in = T.alloc_buffer((D,), "float32", scope="local")
                    k_out = T.alloc_buffer((D,), "float32", scope="local")
                    j: T.let = jh // n_kv_heads
                    hk: T.let = jh % n_kv_heads
                    kv_pos: T.let = kv_pos0 + j
                    if ragged:
                        for d in range(D):
                            k_raw[d] = T.Cast("float32", K[k_base + j, hk, d])
                    else:
                        seq_off: T.let = seq_offset(LENGTH_INFO, j, b)
                        page_no: T.let = PAGE_IDX[PAGE_INDPTR[b] + seq_off // page_size]
                        for d in range(D):
                            k_raw[d] = T.Cast("float32", PAGES[page_no, 0, hk, seq_off % page_size, d])
                    for d in range(D):
                        if rope:
                            k_in[d] = _rope(k_raw, d, kv_pos, rope_scale, rope_theta, D)
                        else:
                            k_in[d] = k_raw[d]
                    if has_kt:
                        T.evaluate(T.call_extern("int32", "attngen_hook_key_transform", kv_pos, hk))
                    else:
                        for d in range(D):
                            k_out[d] = k_in[d]
                    for d in range(D):
                        KT[k_base + j, hk, d] = k_out[d]
            for ih in T.parallel(qo_len * n_qo_heads):
                q_raw = T.alloc_buffer((D,), "float32", scope="local")
                q_in = T.alloc_buffer((D,), "float32", scope="local")
                q_out = T.alloc_buffer((D,), "float32", scope="local")
                acc = T.alloc_buffer((D,), "float32", scope="local")
                i: T.let = ih // n_qo_heads
                h: T.let = ih % n_qo_heads
                hk: T.let = h // group
                row: T.let = qo_start + i
                qo_pos: T.let = Q_POS[row]
                for d in range(D):
                    q_raw[d] = T.Cast("float32", Q[row, h, d])
                for d in range(D):
                    if rope:
                        q_in[d] = _rope(q_raw, d, qo_pos, rope_scale, rope_theta, D)
                    else:
                        q_in[d] = q_raw[d]
                if has_qt:
                    T.evaluate(T.call_extern("int32", "attngen_hook_query_transform", qo_pos, h))
                else:
                    for d in range(D):
                        q_out[d] = q_in[d]
                for d in range(D):
                    if log2e_q:
                        q_out[d] = q_out[d] * (sm_scale * T.float32(LOG2E))
                    else:
                        q_out[d] = q_out[d] * sm_scale
                    acc[d] = T.float32(0)
                m: T.float32 = neg_inf
                denom: T.float32 = T.float32(0)
                for j in range(kv_len):
                    kv_pos: T.let = kv_pos0 + j
                    if visible(causal, qo_pos, kv_pos, b, h, hk):
                        s: T.float32 = T.float32(0)
                        if ragged:
                            for d in range(D):
                                if use_kt:
                                    s = s + q_out[d] * KT[k_base + j, hk, d]
                                else:
                                    s = s + q_out[d] * T.Cast("float32", K[k_base + j, hk, d])
                        else:
                            seq_off: T.let = seq_offset(LENGTH_INFO, j, b)
                            page_no: T.let = PAGE_IDX[PAGE_INDPTR[b] + seq_off // page_size]
                            for d in range(D):
                                if use_kt:
                                    s = s + q_out[d] * KT[k_base + j, hk, d]
                                else:
                                    s = s + q_out[d] * T.Cast("float32", PAGES[page_no, 0, hk, seq_off % page_size, d])
                        if has_lt:
                            s = T.call_extern("float32", "attngen_hook_logits_transform", s, b, qo_pos, kv_pos, h, hk)
                        if log2e_s:
                            s = s * T.float32(LOG2E)
                        m_new: T.let = T.max(m, s)
                        live: T.let = m_new > neg_inf  # a -inf score must not turn into NaN
                        rescale: T.let = T.if_then_else(live, T.exp2(m - m_new), T.float32(1))
                        w: T.let = T.if_then_else(live, T.exp2(s - m_new), T.float32(0))
                        denom = denom * rescale + w
                        m = m_new
                        for d in range(D):
                            if ragged:
                                acc[d] = acc[d] * rescale + w * T.Cast("float32", V[k_base + j, hk, d])
                            else:
                                acc[d] = acc[d] * rescale + w * T.Cast(
                                    "float32", PAGES[page_no, 1, hk, seq_off % page_size, d])
                for d in range(D):
                    O[row, h, d] = T.Cast(dt, T.if_then_else(denom > T.float32(0), acc[d] / denom, T.float32(0)))
                LSE[row, h] = T.if_then_else(denom > T.float32(0), m + T.log2(denom), T.float32(NO_KEY_LSE))
    # fmt: on
    return slot


def check_slot_variant(variant) -> None:
    """Refuse variants whose result would be silently wrong inside TVM's PagedKVCache."""
    name = variant.name
    if variant.state != StateAlgebra.SOFTMAX:
        raise ConfigError(f"variant '{name}': its state is an unnormalised sum, but TVM's PagedKVCache merges "
                          "the ragged and paged parts of each row by their lse; use a softmax variant")
    if "output_transform" in variant.hooks:
        raise ConfigError(f"variant '{name}', hook 'output_transform': TVM's PagedKVCache computes a row in "
                          "parts (new tokens, cached pages per prefix depth) and merges them by lse, and an "
                          "output transform applied to each part does not compose; apply it to the cache's "
                          "output in the model instead")
    for hook, reads in variant.analysis.reads.items():
        if "batch" in reads.indices:
            raise ConfigError(f"variant '{name}', hook '{hook}': reads 'batch', but TVM's PagedKVCache calls "
                              "attention per prefix depth, where the batch index is not the sequence id "
                              "(shared prefixes group several sequences); index by positions or heads instead")


def lower_slot(spec: SlotSpec, variant, scalar_values: dict) -> tir.PrimFunc:
    """TVM's exact signature for ``spec.kind``, the variant's hooks inlined, its scalar parameters
    compiled in from ``scalar_values`` (name -> value); its tensor parameters stay as trailing
    arguments in declaration order."""
    generic = slot_program(spec)
    by_name = dict(zip(_GENERIC_PARAMS, generic.params))
    signature = SLOT_SIGNATURES[spec.kind]
    func = tir.PrimFunc([by_name[n] for n in signature], generic.body, generic.ret_type, generic.attrs)
    func = inline_hooks(func, variant, spec.head_dim)
    extras = func.params[len(signature):]
    consts = {}
    for p, decl in zip(extras, variant.params):
        if isinstance(decl, ScalarParam):
            if decl.name not in scalar_values:
                raise ConfigError(f"variant '{variant.name}': scalar parameter '{decl.name}' has no value "
                                  "and no default; pass it in params")
            consts[p] = tir.const(scalar_values[decl.name], tu.param_dtype(p))
    if consts:
        func = tu.fold_constant_casts(func.specialize(consts))
    return func.with_attr("global_symbol", spec.func_name)


def slot_specs(variant, head_dim: int, dtype: str, *, inline_rope: bool, window: int) -> dict[str, SlotSpec]:
    """The five attention slots of one cache: role -> spec (roles as in TVM's create call)."""
    if dtype not in SLOT_DTYPES:
        raise ConfigError(f"dtype {dtype!r}: the CPU slots serve {list(SLOT_DTYPES)}")
    flags = {k: v for k, v in hook_flags(variant).items() if k not in ("has_output_transform", "softmax")}
    common = dict(head_dim=head_dim, dtype=dtype, inline_rope=inline_rope, **flags)
    return {
        "prefill_ragged": SlotSpec("ragged", **common),
        "prefill": SlotSpec("paged", **common),
        "decode": SlotSpec("decode", **common),
        "prefill_sliding_window": SlotSpec("paged", sliding_window=True, window=window, **common),
        "decode_sliding_window": SlotSpec("decode", sliding_window=True, **common),
    }


LIBRARY_NAME = "libattngen_tvm_slots_cpu.so"


def build_slot_library(variant, specs: dict[str, SlotSpec], scalar_values: dict,
                       cache: BuildCache | None = None) -> Path:
    """One library holding every spec's function (named ``spec.func_name``), cached by content."""
    check_slot_variant(variant)
    cache = cache or BuildCache()
    here = Path(__file__).parent
    ir_dir = here.parent.parent / "ir"
    key = content_key({
        "what": "tvm_slots",
        "ir": variant.ir_text(),
        "specs": {role: asdict(s) for role, s in specs.items()},
        "scalars": {k: scalar_values[k] for k in sorted(scalar_values)},
        "sources": hash_files(list(here.glob("*.py")) + list(ir_dir.glob("*.py"))),
        "tvm": tvm.__version__,
    })

    def build(out: Path) -> None:
        funcs = {tvm.ir.GlobalVar(s.func_name): lower_slot(s, variant, scalar_values) for s in specs.values()}
        build_cpu_library(tvm.IRModule(funcs), out / LIBRARY_NAME)

    directory, _ = cache.get_or_build(key, build)
    return directory / LIBRARY_NAME
