"""Kernel factory: batch attention as one online-softmax TIR program for the CPU (LLVM) backend.

``online_softmax_program(spec)`` writes the program that both CPU consumers build: attngen's own
exported kernels (:func:`attention_program`: ragged, paged and decode) and TVM PagedKVCache's
attention slots (:mod:`.tvm_slots`). Its parameters are the union of what either calling
convention passes (``program_spec.PROGRAM_PARAMS``); each consumer keeps the ones its convention takes, in its
order (:func:`.program_spec.with_signature`), and the body reads only those. What a program is specialised for:
:mod:`.program_spec`.

One parallel iteration per (query row, KV head), serving the GQA group's query heads key by key (each key and
value row read once for the group, the rows a few keys ahead prefetched), scores in float32 as vectorised partial
sums, an online softmax with a base-2 LSE. Every hook kind is called at its site through a
placeholder that :mod:`.inline_hooks` replaces with the variant's hook or the kind's identity;
keys are transformed once per call into a float32 copy when a key hook (or TVM's inline RoPE)
applies.

fp8 K/V (``kv_dtype`` one of ``FP8_DTYPES``) arrive as ``uint8`` bits with per-KV-head float32
scales ``k_scale`` / ``v_scale`` [Hkv] and are decoded on load (:mod:`.fp8_tir`). Hooks see
dequantised rows: a key row is ``k * k_scale`` before the key hook, and without a key hook
``k_scale`` is folded into the query's scale (``q . (k * k_scale) = (q * k_scale) . k``); ``v_scale``
multiplies the normalised output row before the output hook (``sum_j p_j v_j * v_scale``), one
multiply per row instead of one per key. Positions are logical: in attngen's convention query row i of a
request with qo_len rows and kv_len keys sits at qo_pos = kv_len - qo_len + i and key j at kv_pos = j; in TVM's
they come from ``q_rope_position`` and ``k_rope_pos_offset``.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import tvm.tirx as tir
from tvm.tirx.analysis import verify_well_formed
from tvm.script import tirx as T

from attngen.ir.tir_utils import handle, substitute
from attngen.schedules.dtypes import DTYPE_BYTES

from .fp8_tir import FP8_STORAGE, fp8_to_float32
from .inline_hooks import hook_call, row_hook_call
from .program_spec import CPU_SIGNATURES, FP8_SCALE_PARAMS, CPUKernelSpec, ProgramSpec, with_signature

LOG2E = 1.4426950408889634
NO_KEY_LSE = -5.0e4  # TVM's lse for a row that sees no key (merged as weight 0)
# a score q . k is summed as LANES independent partial sums over the dims d = LANES * d0 + u, added pairwise at the
# end: one chain of D dependent float additions bounded the CPU kernels by the adder's latency (the compiler may
# not reassociate them); LANES chains run side by side
LANES = 8
# the CPU kernels fetch the key and value rows this many keys ahead into the cache: a paged cache's rows of one head
# lie a slot apart (page_size rows of every head in between) on pages in any order, which no hardware prefetcher
# follows, so each row was a cache miss the group's dot products waited on
PREFETCH_AHEAD = 4
CACHE_LINE = 64


def prefetch(element):
    """Prefetch the cache line of a buffer element for reading (LLVM's prefetch, high locality)."""
    return tir.call_intrin("", "tirx.prefetch", tir.call_intrin("handle", "tirx.address_of", element), 0, 3, 1)


def tree_sum(part, n: int):
    """part[0] + ... + part[n - 1], added pairwise."""
    terms = [part[u] for u in range(n)]
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)] + terms[len(terms) - len(terms) % 2:]
    return terms[0]


def tvm_rope(x, d, pos, rope_scale, rope_theta, head_dim: int):
    """TVM's rotate-half RoPE of element ``d`` of the float32 row ``x`` at position ``pos``."""
    half = head_dim // 2
    angle = T.Cast("float32", pos) * rope_scale / T.pow(
        rope_theta, T.Cast("float32", (d * 2) % head_dim) / T.float32(head_dim))
    partner = T.if_then_else(d < half, -x[d + half], x[d - half])
    return T.cos(angle) * x[d] + T.sin(angle) * partner


# the mask's constant bound in a parsed program of attngen's convention, and whether there is one (1) or not (0):
# online_softmax_program puts in each spec's values
KEY_BOUND = tir.Var("min_qo_minus_kv", "int32")
KEY_BOUNDED = tir.Var("key_loop_bounded", "int32")


@functools.lru_cache(maxsize=None)
def online_softmax_program(spec: ProgramSpec) -> tir.PrimFunc:
    """The program for ``spec``, taking every parameter of ``PROGRAM_PARAMS``, with hook placeholders: the
    parsed program of its structure (:func:`parsed_program`) with the mask's bound put in."""
    if spec.tvm is not None:  # (TVM's convention takes no bound)
        program = parsed_program(replace(spec, min_qo_minus_kv=None))
    else:
        bound = spec.min_qo_minus_kv
        program = substitute(parsed_program(replace(spec, min_qo_minus_kv=0)),
                             {handle(KEY_BOUND): tir.IntImm("int32", 0 if bound is None else bound),
                              handle(KEY_BOUNDED): tir.IntImm("int32", bound is not None)})
    verify_well_formed(program)
    return program


@functools.lru_cache(maxsize=None)
def parsed_program(spec: ProgramSpec) -> tir.PrimFunc:
    """The program of ``spec``'s structure, parsed once per process: TVMScript parses the program's source on
    every call (0.15-0.3 s), the program depends on the spec alone (the variant's hooks replace its placeholders
    afterwards), and TIR is immutable, so the builds of a process share it. In attngen's convention (``min_qo_minus_kv``
    0 here for any bound or none) the mask's bound is the variable ``KEY_BOUND`` and whether there is one
    ``KEY_BOUNDED``, so that causal, windowed and unmasked variants share one program."""
    D, dt = spec.head_dim, spec.dtype
    fp8 = spec.fp8
    kv_dt = FP8_STORAGE if fp8 else dt  # the K/V buffers' element type
    # K/V elements are read straight into float32 (kv_float, no let of the element): fp8 bits are decoded, and a
    # bfloat16 let breaks TVM's bfloat16 legalisation (the let keeps its type, the load becomes uint16)
    paged, decode, hnd = spec.kv == "paged", spec.decode, spec.page_layout == "HND"
    tvm_conv = spec.tvm is not None
    sliding = tvm_conv and spec.tvm.sliding_length_info
    either_li = tvm_conv and spec.tvm.length_info_ndim_at_run_time
    rope = tvm_conv and spec.tvm.inline_rope
    tree = tvm_conv and spec.tvm.tree_mask
    # TVM's decode slots attend to every key they are given; its tree slots have a mask, no causal flag
    causal_flag = tvm_conv and not decode and not tree
    if tree and decode:
        raise ValueError("a tree mask applies to prefill programs, not decode")
    ragged_tree = tree and not paged  # key positions from q_rope_position, no k_rope_pos_offset
    window = spec.tvm.window if tvm_conv else 0
    use_kt = rope or spec.transform_keys
    softmax = spec.softmax
    log2e_q = spec.q_scale_log2e
    log2e_s = softmax and not spec.q_scale_log2e
    empty_lse = NO_KEY_LSE if tvm_conv else float("-inf")
    neg_inf = tir.const(float("-inf"), "float32")
    want_rotary = 1 if rope else 0
    rotary_msg = (f"attngen {spec.tvm.name if tvm_conv else ''} was built for rotary_mode={want_rotary} but TVM "
                  "called it with another: rebuild the slots with the cache's rope_mode")

    def seq_offset(length_info, j, b, fields=None):
        """Sequence offset of chunk key j: sink keys first, then the window after its offset."""
        if either_li:
            _, window_offset, sink = fields
            return T.if_then_else(j < sink, j, j - sink + window_offset)
        if not sliding:
            return j
        return T.if_then_else(j < length_info[2, b], j, j - length_info[2, b] + length_info[1, b])

    def length_fields(length_info, b, batch, li_ndim):
        """(last_page_len, sliding_window_offset, sink_size) of request b from a length_info read as a flat
        [3 * batch] buffer: a [B] one is the first row of a [3, B] one."""
        two_rows = li_ndim == 2
        return (length_info[b], T.if_then_else(two_rows, length_info[batch + b], 0),
                T.if_then_else(two_rows, length_info[2 * batch + b], 0))

    def kv_element(storage, half: int, row, slot, hk, d):
        """Element d of KV head hk of a key (half 0) or value (half 1): ``storage`` is pages (``row`` a
        page, ``slot`` the place in it) or the ragged k / v (``row`` the key row, ``slot`` unused).
        Callers locate chunk key j of request b once per key (``seq_off``, ``kv_row``, ``kv_slot``)."""
        if not paged:
            return storage[row, hk, d]
        if hnd:
            return storage[row, half, hk, slot, d]
        return storage[row, half, slot, hk, d]

    def kv_float(storage, half: int, row, slot, hk, d):
        """``kv_element`` as float32, decoded from its fp8 bits when the cache is fp8 (not scaled)."""
        element = kv_element(storage, half, row, slot, hk, d)
        return fp8_to_float32(element, spec.kv_dtype) if fp8 else T.Cast("float32", element)

    def tree_visible(tree_indptr, tree_order, b, i, j, qo_len, kv_len):
        """TVM's token-tree mask: chunk key j is before the request's tree, or an ancestor of (or is)
        query row i's node. The tree is the last ``tree_len`` keys; the queries are its last ``qo_len``
        nodes; a node's (DFS order, end of its subtree's orders) pair says whom it descends from."""
        tree_len = tree_indptr[b + 1] - tree_indptr[b]
        tree_start = kv_len - tree_len
        child = tree_indptr[b] + i + tree_len - qo_len
        parent = tree_indptr[b] + j - tree_start
        # the branch keeps the tree's rows from being read for keys before the tree (no such row)
        return T.if_then_else(j < tree_start, True,
                              tir.And(tree_order[child, 0] >= tree_order[parent, 0],
                                      tree_order[child, 0] < tree_order[parent, 1]))

    def key_visible(causal, qo_pos, kv_pos, b, h, hk, tree_place=None, li_ndim=None):
        seen = hook_call("logits_mask", b, qo_pos, kv_pos, h, hk)
        if window:
            in_window = tir.LT(qo_pos - kv_pos, window)
            seen = tir.And(tir.Or(li_ndim != 2, in_window) if either_li else in_window, seen)
        if tree:
            return tir.And(tree_visible(*tree_place), seen)
        if not causal_flag:
            return seen
        return tir.And(tir.Or(tir.EQ(causal, 0), tir.LE(kv_pos, qo_pos)), seen)

    lanes = LANES if D % LANES == 0 else 1  # the score's partial sums (one where D is not a multiple)

    def kv_end(kv_len, qo_pos):
        """Keys a row tries: all of them, or (attngen's convention: key j at kv_pos = j) those up to kv_pos =
        qo_pos - KEY_BOUND where the mask bounds them (the condition a constant once put in: the build folds it)."""
        if tvm_conv:
            return kv_len
        return T.if_then_else(KEY_BOUNDED != 0, T.max(0, T.min(kv_len, qo_pos - KEY_BOUND + 1)), kv_len)
    kv_bytes = DTYPE_BYTES[spec.kv_dtype or dt]
    line_elems = CACHE_LINE // kv_bytes  # K / V elements per cache line
    row_lines = max(1, D // line_elems)  # cache lines of a key (value) row

    # fmt: off
    @T.prim_func(check_well_formed=False)  # (KEY_BOUND[ED] free here: online_softmax_program checks its result)
    def attention(q: T.handle,  # [total_q, Hq, D] (decode: [B, Hq, D])
                  qo_indptr: T.handle,  # [B+1] (not decode)
                  k: T.handle,  # ragged: [total_kv, Hkv, D]
                  v: T.handle,  # ragged: [total_kv, Hkv, D]
                  kv_indptr: T.handle,  # ragged: [B+1]
                  pages: T.handle,  # paged: [P, 2, S, Hkv, D] (NHD) | [P, 2, Hkv, S, D] (HND)
                  page_indptr: T.handle,  # paged: [B+1]
                  page_indices: T.handle,  # paged: [nnz_pages]
                  length_info: T.handle,  # paged: last_page_len [B] (TVM's sliding-window slots: [3, B])
                  q_rope_position: T.handle,  # TVM: [total_q] (decode: [B]) position of each query row
                  k_rope_pos_offset: T.handle,  # TVM: [B] position of each request's first key
                  o: T.handle,  # like q
                  lse: T.handle,  # [total_q, Hq] float32, base 2
                  k_scale: T.handle,  # fp8 K/V: [Hkv] float32, a stored key times its head's scale
                  v_scale: T.handle,  # fp8 K/V: [Hkv] float32
                  causal: T.int32,  # TVM prefill: 0 lets every query see every key
                  rotary_mode: T.int32,  # TVM
                  rope_scale: T.float32,  # TVM, inline RoPE
                  rope_theta: T.float32,  # TVM, inline RoPE
                  sm_scale: T.float32,
                  tree_mn_indptr: T.handle,  # TVM tree slots: [B+1] start of each request's tree in tree_order
                  tree_order: T.handle):  # TVM tree slots: [tree nodes, 2] (DFS order, end of the subtree's orders)
        batch_plus_1 = T.int32()
        total_q = T.int32()
        n_qo_heads = T.int32()
        n_kv_heads = T.int32()
        n_kv_rows = T.int32()
        n_pages_total = T.int32()
        page_size = T.int32()
        nnz_pages = T.int32()
        # index arrays may be views with an element offset (TVM passes such views)
        qo_indptr_off = T.int32()
        kv_indptr_off = T.int32()
        page_indptr_off = T.int32()
        page_indices_off = T.int32()
        length_info_off = T.int32()
        q_pos_off = T.int32()
        k_pos_off = T.int32()
        tree_indptr_off = T.int32()
        tree_order_off = T.int32()
        n_tree_nodes = T.int32()
        if decode:
            Q = T.match_buffer(q, (batch_plus_1 - 1, n_qo_heads, D), dt)
            O = T.match_buffer(o, (batch_plus_1 - 1, n_qo_heads, D), dt)
            LSE = T.match_buffer(lse, (batch_plus_1 - 1, n_qo_heads), "float32")
        else:
            Q = T.match_buffer(q, (total_q, n_qo_heads, D), dt)
            O = T.match_buffer(o, (total_q, n_qo_heads, D), dt)
            LSE = T.match_buffer(lse, (total_q, n_qo_heads), "float32")
            QO_INDPTR = T.match_buffer(qo_indptr, (batch_plus_1,), "int32", elem_offset=qo_indptr_off)
        if paged:
            if hnd:
                PAGES = T.match_buffer(pages, (n_pages_total, 2, n_kv_heads, page_size, D), kv_dt)
            else:
                PAGES = T.match_buffer(pages, (n_pages_total, 2, page_size, n_kv_heads, D), kv_dt)
            PAGE_INDPTR = T.match_buffer(page_indptr, (batch_plus_1,), "int32", elem_offset=page_indptr_off)
            PAGE_IDX = T.match_buffer(page_indices, (nnz_pages,), "int32", elem_offset=page_indices_off)
            if sliding:
                LENGTH_INFO = T.match_buffer(length_info, (3, batch_plus_1 - 1), "int32", elem_offset=length_info_off)
            elif either_li:
                pass  # read through its DLTensor below, once every parameter is bound
            else:
                LENGTH_INFO = T.match_buffer(length_info, (batch_plus_1 - 1,), "int32", elem_offset=length_info_off)
        else:
            K = T.match_buffer(k, (n_kv_rows, n_kv_heads, D), kv_dt)
            V = T.match_buffer(v, (n_kv_rows, n_kv_heads, D), kv_dt)
            KV_INDPTR = T.match_buffer(kv_indptr, (batch_plus_1,), "int32", elem_offset=kv_indptr_off)
        if fp8:
            K_SCALE = T.match_buffer(k_scale, (n_kv_heads,), "float32")
            V_SCALE = T.match_buffer(v_scale, (n_kv_heads,), "float32")
        if tvm_conv:
            if decode:
                Q_POS = T.match_buffer(q_rope_position, (batch_plus_1 - 1,), "int32", elem_offset=q_pos_off)
            else:
                Q_POS = T.match_buffer(q_rope_position, (total_q,), "int32", elem_offset=q_pos_off)
            if not ragged_tree:
                K_POS0 = T.match_buffer(k_rope_pos_offset, (batch_plus_1 - 1,), "int32", elem_offset=k_pos_off)
            if tree:
                TREE_INDPTR = T.match_buffer(tree_mn_indptr, (batch_plus_1,), "int32", elem_offset=tree_indptr_off)
                TREE_ORDER = T.match_buffer(tree_order, (n_tree_nodes, 2), "int32", elem_offset=tree_order_off)
            assert rotary_mode == want_rotary, rotary_msg
        if either_li:  # DLTensor fields: 1 data, 4 ndim, 8 byte_offset; [B] or [3, B], compact
            li_ndim: T.let = T.tvm_struct_get(length_info, 0, 4, "int32")
            LENGTH_INFO = T.decl_buffer((3 * (batch_plus_1 - 1),), "int32",
                                        data=T.tvm_struct_get(length_info, 0, 1, "handle"),
                                        elem_offset=T.Cast("int32", T.tvm_struct_get(length_info, 0, 8, "uint64")
                                                           // T.uint64(4)))
        # Index arithmetic divides non-negative values by positive ones: truncating division, which lowers to one
        # instruction, where Python's // (floor division of int32 of unknown sign) lowers to sign selects that
        # TVM's simplifier takes up again at every let: the build's code generation took 4x longer with them
        group: T.let = T.truncdiv(n_qo_heads, n_kv_heads)
        if use_kt:  # keys after RoPE and the key hook, float32
            if paged:
                KT = T.alloc_buffer((nnz_pages * page_size, n_kv_heads, D), "float32")
            else:
                KT = T.alloc_buffer((n_kv_rows, n_kv_heads, D), "float32")
        for b in range(batch_plus_1 - 1):
            if paged:
                n_pages: T.let = PAGE_INDPTR[b + 1] - PAGE_INDPTR[b]
                if either_li:
                    fields = length_fields(LENGTH_INFO, b, batch_plus_1 - 1, li_ndim)
                    kv_len: T.let = T.if_then_else(n_pages > 0, (n_pages - 1) * page_size + fields[0] - fields[1]
                                                   + fields[2], 0)
                elif sliding:
                    kv_len: T.let = T.if_then_else(n_pages > 0, (n_pages - 1) * page_size + LENGTH_INFO[0, b]
                                                   - LENGTH_INFO[1, b] + LENGTH_INFO[2, b], 0)
                else:
                    kv_len: T.let = T.if_then_else(n_pages > 0, (n_pages - 1) * page_size + LENGTH_INFO[b], 0)
                k_base: T.let = PAGE_INDPTR[b] * page_size
            else:
                kv_len: T.let = KV_INDPTR[b + 1] - KV_INDPTR[b]
                k_base: T.let = KV_INDPTR[b]
            if decode:
                qo_start: T.let = b
                qo_len: T.let = 1
            else:
                qo_start: T.let = QO_INDPTR[b]
                qo_len: T.let = QO_INDPTR[b + 1] - QO_INDPTR[b]
            if ragged_tree:
                kv_pos0: T.let = 0  # unused: each key sits at its own token's q_rope_position
            elif tvm_conv:
                kv_pos0: T.let = K_POS0[b]
            else:
                kv_pos0: T.let = 0
            if use_kt:
                for jh in T.parallel(kv_len * n_kv_heads):
                    k_in = T.alloc_buffer((D,), "float32", scope="local")
                    k_out = T.alloc_buffer((D,), "float32", scope="local")
                    j: T.let = T.truncdiv(jh, n_kv_heads)
                    hk: T.let = T.truncmod(jh, n_kv_heads)
                    kv_pos: T.let = Q_POS[k_base + j] if ragged_tree else kv_pos0 + j
                    seq_off: T.let = seq_offset(LENGTH_INFO, j, b, fields if either_li else None) if paged else j
                    kv_row: T.let = PAGE_IDX[PAGE_INDPTR[b] + T.truncdiv(seq_off, page_size)] if paged else k_base + j
                    kv_slot: T.let = T.truncmod(seq_off, page_size) if paged else 0
                    if rope:
                        k_raw = T.alloc_buffer((D,), "float32", scope="local")
                        for d in range(D):
                            if fp8:
                                k_raw[d] = kv_float(PAGES if paged else K, 0, kv_row, kv_slot, hk, d) * K_SCALE[hk]
                            else:
                                k_raw[d] = T.Cast("float32", kv_element(PAGES if paged else K, 0, kv_row, kv_slot, hk, d))
                        for d in range(D):
                            k_in[d] = tvm_rope(k_raw, d, kv_pos, rope_scale, rope_theta, D)
                    else:
                        for d in range(D):
                            if fp8:
                                k_in[d] = kv_float(PAGES if paged else K, 0, kv_row, kv_slot, hk, d) * K_SCALE[hk]
                            else:
                                k_in[d] = T.Cast("float32", kv_element(PAGES if paged else K, 0, kv_row, kv_slot, hk, d))
                    T.evaluate(row_hook_call("key_transform", k_in, k_out, kv_pos, hk))
                    for d in range(D):
                        KT[k_base + j, hk, d] = k_out[d]
            # one parallel iteration per (query row, KV head): the group's query heads read each key and value
            # row once, in the order of the keys (one cache miss per row for the whole group, not one per head)
            for ik in T.parallel(qo_len * n_kv_heads):
                q_in = T.alloc_buffer((D,), "float32", scope="local")
                q_out = T.alloc_buffer((D,), "float32", scope="local")
                o_in = T.alloc_buffer((D,), "float32", scope="local")
                o_out = T.alloc_buffer((D,), "float32", scope="local")
                part = T.alloc_buffer((LANES,), "float32", scope="local")
                qs = T.alloc_buffer((group * D,), "float32")  # the group's scaled query rows
                acc = T.alloc_buffer((group * D,), "float32")  # their output rows
                m = T.alloc_buffer((group,), "float32")  # their running maxima
                denom = T.alloc_buffer((group,), "float32")  # and sums
                i: T.let = T.truncdiv(ik, n_kv_heads)
                hk: T.let = T.truncmod(ik, n_kv_heads)
                row: T.let = qo_start + i
                if tvm_conv:
                    qo_pos: T.let = Q_POS[row]
                else:
                    qo_pos: T.let = kv_len - qo_len + i
                for g in range(group):
                    h: T.let = hk * group + g
                    if rope:
                        q_raw = T.alloc_buffer((D,), "float32", scope="local")
                        for d in range(D):
                            q_raw[d] = T.Cast("float32", Q[row, h, d])
                        for d in range(D):
                            q_in[d] = tvm_rope(q_raw, d, qo_pos, rope_scale, rope_theta, D)
                    else:
                        for d in range(D):
                            q_in[d] = T.Cast("float32", Q[row, h, d])
                    T.evaluate(row_hook_call("query_transform", q_in, q_out, qo_pos, h))
                    for d in range(D):
                        if fp8 and not use_kt:  # keys are read unscaled in the score loop
                            if log2e_q:
                                qs[g * D + d] = q_out[d] * (sm_scale * T.float32(LOG2E) * K_SCALE[hk])
                            else:
                                qs[g * D + d] = q_out[d] * (sm_scale * K_SCALE[hk])
                        elif log2e_q:
                            qs[g * D + d] = q_out[d] * (sm_scale * T.float32(LOG2E))
                        else:
                            qs[g * D + d] = q_out[d] * sm_scale
                        acc[g * D + d] = T.float32(0)
                    m[g] = neg_inf
                    denom[g] = T.float32(0)
                for j in range(kv_end(kv_len, qo_pos)):
                    kv_pos: T.let = Q_POS[k_base + j] if ragged_tree else kv_pos0 + j
                    seq_off: T.let = seq_offset(LENGTH_INFO, j, b, fields if either_li else None) if paged else j
                    kv_row: T.let = PAGE_IDX[PAGE_INDPTR[b] + T.truncdiv(seq_off, page_size)] if paged else k_base + j
                    kv_slot: T.let = T.truncmod(seq_off, page_size) if paged else 0
                    if j + PREFETCH_AHEAD < kv_len:  # the key and value rows PREFETCH_AHEAD keys on, into the cache
                        nj: T.let = j + PREFETCH_AHEAD
                        n_off: T.let = seq_offset(LENGTH_INFO, nj, b, fields if either_li else None) if paged else nj
                        n_row: T.let = PAGE_IDX[PAGE_INDPTR[b] + T.truncdiv(n_off, page_size)] if paged else k_base + nj
                        n_slot: T.let = T.truncmod(n_off, page_size) if paged else 0
                        for c in T.unroll(row_lines):
                            if use_kt:
                                T.evaluate(prefetch(KT[k_base + nj, hk, c * line_elems]))
                            else:
                                T.evaluate(prefetch(kv_element(PAGES if paged else K, 0, n_row, n_slot, hk,
                                                               c * line_elems)))
                            T.evaluate(prefetch(kv_element(PAGES if paged else V, 1, n_row, n_slot, hk,
                                                           c * line_elems)))
                    for g in range(group):
                        h: T.let = hk * group + g
                        if key_visible(causal, qo_pos, kv_pos, b, h, hk,
                                       (TREE_INDPTR, TREE_ORDER, b, i, j, qo_len, kv_len) if tree else None,
                                       li_ndim if either_li else None):
                            if lanes > 1:  # LANES independent partial sums: no chain of D dependent adds
                                for u in T.unroll(lanes):
                                    part[u] = T.float32(0)
                                for d0 in range(D // lanes):
                                    for u in T.vectorized(lanes):
                                        if use_kt:
                                            part[u] = part[u] + qs[g * D + d0 * lanes + u] * KT[k_base + j, hk,
                                                                                                d0 * lanes + u]
                                        else:
                                            part[u] = part[u] + qs[g * D + d0 * lanes + u] * kv_float(
                                                PAGES if paged else K, 0, kv_row, kv_slot, hk, d0 * lanes + u)
                                s: T.float32 = tree_sum(part, lanes)
                            else:
                                s: T.float32 = T.float32(0)
                                for d in range(D):
                                    if use_kt:
                                        s = s + qs[g * D + d] * KT[k_base + j, hk, d]
                                    else:
                                        s = s + qs[g * D + d] * kv_float(PAGES if paged else K, 0, kv_row, kv_slot,
                                                                         hk, d)
                            s = hook_call("logits_transform", s, b, qo_pos, kv_pos, h, hk)
                            if log2e_s:
                                s = s * T.float32(LOG2E)
                            if softmax:
                                # Non-finite scores (see reference._softmax_rows): the base of the exponents is
                                # the running max, or 0 while it is -inf, so that a -inf score weighs 0 (not
                                # exp2(-inf + inf) = NaN) while a NaN score (whatever the max makes of it) or a
                                # +inf one (exp2(inf - inf)) turns the weight, and from there denom and acc,
                                # into NaN for good. One select per key, as the -inf guard always cost.
                                m_new: T.let = T.max(m[g], s)
                                base: T.let = T.if_then_else(m_new == neg_inf, T.float32(0), m_new)
                                rescale: T.let = T.exp2(m[g] - base)
                                w: T.let = T.exp2(s - base)
                                denom[g] = denom[g] * rescale + w
                                m[g] = m_new
                            else:
                                rescale: T.let = T.float32(1)
                                w: T.let = s
                            for d0 in range(D // lanes):
                                for u in T.vectorized(lanes):
                                    acc[g * D + d0 * lanes + u] = acc[g * D + d0 * lanes + u] * rescale + w * kv_float(
                                        PAGES if paged else V, 1, kv_row, kv_slot, hk, d0 * lanes + u)
                for g in range(group):
                    h: T.let = hk * group + g
                    # denom is 0 only for a row without a live key (O = 0, empty lse); a NaN denom (poisoned
                    # row) must reach O and lse, so the tests are "== 0", not "> 0"
                    if softmax:
                        row_lse: T.let = T.if_then_else(denom[g] == T.float32(0), T.float32(empty_lse),
                                                        m[g] + T.log2(denom[g]))
                    else:
                        row_lse: T.let = T.float32(0)
                    for d in range(D):
                        if softmax and fp8:
                            o_in[d] = T.if_then_else(denom[g] == T.float32(0), T.float32(0),
                                                     acc[g * D + d] / denom[g] * V_SCALE[hk])
                        elif softmax:
                            o_in[d] = T.if_then_else(denom[g] == T.float32(0), T.float32(0), acc[g * D + d] / denom[g])
                        elif fp8:
                            o_in[d] = acc[g * D + d] * V_SCALE[hk]
                        else:
                            o_in[d] = acc[g * D + d]
                    T.evaluate(row_hook_call("output_transform", o_in, o_out, b, qo_pos, h, row_lse))
                    for d in range(D):
                        O[row, h, d] = T.Cast(dt, o_out[d])
                    LSE[row, h] = row_lse
    # fmt: on
    return attention


def attention_program(spec: CPUKernelSpec) -> tir.PrimFunc:
    """The exported function of ``spec`` with hook placeholders, in attngen's CPU calling convention."""
    signature = CPU_SIGNATURES["decode" if spec.decode else spec.kv]
    if spec.program().fp8:  # the scales come after the outputs, before sm_scale
        signature = signature[:-1] + FP8_SCALE_PARAMS + signature[-1:]
    program = with_signature(online_softmax_program(spec.program()), signature)
    return program.with_attr("global_symbol", spec.func_name)
