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
    ragged tree     fn(q, qo_indptr, k, v, kv_indptr, q_rope_position, tree_mn_indptr, tree_order,
                       o, lse, rotary_mode, rope_scale, rope_theta, sm_scale)
    paged tree      fn(q, qo_indptr, pages, page_indptr, page_indices, length_info,
                       k_rope_pos_offset, q_rope_position, o, lse, rotary_mode, rope_scale,
                       rope_theta, sm_scale, tree_mn_indptr, tree_order)

(the two RoPE position arrays swap places between ragged and paged). ``slot_program`` is the
CPU backend's one online-softmax program (:mod:`.attention_tir`) in TVM's convention and one
such signature, with hook placeholders; ``lower_slot`` inlines a variant's hooks
(:mod:`.inline_hooks`), compiles its scalar parameters in as constants and leaves its tensor
parameters as trailing arguments; ``build_slot_library`` builds every slot for one (variant,
head_dim, dtype, RoPE mode, window) into one cached library.

What the functions assume and produce (TVM's conventions, checked against its runtime):

- ``pages[P, 2, Hkv, S, D]`` (HND, S = page size); every index array may be a view with a
  nonzero byte offset (their buffers have symbolic ``elem_offset``);
- ``length_info`` is ``last_page_len[B]``, or for the sliding-window slots ``[3, B]`` =
  (last_page_len, sliding_window_offset, sink_size): key j of a request lives at sequence
  offset ``j`` if ``j < sink_size`` else ``j - sink_size + sliding_window_offset``;
- positions are TVM's: query row r sits at ``q_rope_position[r]``, key j of request b at
  ``k_rope_pos_offset[b] + j``. The variant's hooks, ``causal`` (a key is visible when
  ``kv_pos <= qo_pos``) and the window of the sliding-window slots of "mha_sliding" layers
  (visible when also ``qo_pos - kv_pos < window``, whatever ``causal`` says: TVM's page trimming
  alone leaves keys beyond the window in a shared prefix) all use these positions, so the ragged and paged parts of one
  row agree however TVM splits them (prefix sharing, forks);
- ``rotary_mode == 1``: TVM's RoPE (rotate-half, angle = pos * rope_scale /
  rope_theta^(2 (d mod D/2) / D)) is applied to q and k before the variant's transforms; a
  function is built for one rotary mode and asserts it at run time;
- the tree slots (token-tree attention, speculative decoding) see TVM's tree mask instead of
  ``causal``: request b's tree is its last ``tree_mn_indptr[b+1] - tree_mn_indptr[b]`` keys, its
  queries are the tree's last nodes, and a query sees every key before the tree and, inside it,
  its own node and its ancestors (``tree_order[n] = (DFS order, end of the subtree's orders)``).
  The ragged tree slot has no ``k_rope_pos_offset``: key j sits at ``q_rope_position`` of its
  token, as its query does. TVM calls the paged tree slot for every layer, with ``length_info``
  ``[B]`` ("mha") or ``[3, B]`` ("mha_sliding"): the function reads it through its DLTensor and
  tells the two apart by ndim, applying the layer window to the ``[3, B]`` calls;
- scores in float32, an online softmax, lse in base 2; a row that sees no key gets o = 0 and
  lse = -5e4 (TVM's "no key" value, merged as weight 0), never NaN.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import tvm
import tvm.tirx as tir

from attngen.codegen.cache import BuildCache, content_key, hash_files
from attngen.ir import HOOKS, ConfigError, ScalarParam, Site, StateAlgebra
from attngen.ir import tir_utils as tu
from attngen.schedules.build_config import DTYPE_SHORT

from .attention_tir import online_softmax_program
from .program_spec import ProgramSpec, TVMConvention, kernel_flags, with_signature
from .build import build_cpu_library
from .inline_hooks import inline_hooks

SLOT_DTYPES = ("float32", "float16")
SLOT_KINDS = ("ragged", "paged", "decode")

# The parameters, in TVM's order, that each slot kind is called with.
SLOT_SIGNATURES = {
    "ragged": ("q", "qo_indptr", "k", "v", "kv_indptr", "q_rope_position", "k_rope_pos_offset", "o",
               "lse", "causal", "rotary_mode", "rope_scale", "rope_theta", "sm_scale"),
    "paged": ("q", "qo_indptr", "pages", "page_indptr", "page_indices", "length_info",
              "k_rope_pos_offset", "q_rope_position", "o", "lse", "causal", "rotary_mode", "rope_scale",
              "rope_theta", "sm_scale"),
    "ragged_tree": ("q", "qo_indptr", "k", "v", "kv_indptr", "q_rope_position", "tree_mn_indptr", "tree_order",
                    "o", "lse", "rotary_mode", "rope_scale", "rope_theta", "sm_scale"),
    "paged_tree": ("q", "qo_indptr", "pages", "page_indptr", "page_indices", "length_info", "k_rope_pos_offset",
                   "q_rope_position", "o", "lse", "rotary_mode", "rope_scale", "rope_theta", "sm_scale",
                   "tree_mn_indptr", "tree_order"),
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
    window: int = 0  # the sliding-window slots of "mha_sliding" layers: keys closer than this many positions
    inline_rope: bool = False  # built for rotary_mode 1 (TVM's RopeMode.INLINE), else rotary_mode 0
    transform_keys: bool = False  # the variant's keys pass a hook at load
    q_scale_log2e: bool = True  # fold log2(e) into the query scale (no hook rewrites scores)
    tree_mask: bool = False  # TVM's token-tree slots (ragged or paged prefill): the tree mask, no causal flag

    def __post_init__(self):
        if self.tree_mask and (self.kind == "decode" or self.sliding_window):
            raise ConfigError("tree_mask: the tree slots are ragged or paged prefill, with TVM's length_info")
        if self.tree_mask and self.window and self.kind != "paged":
            raise ConfigError("tree_mask: only the paged tree slot takes a window (for 'mha_sliding' layers)")
        if self.kind not in SLOT_KINDS:
            raise ConfigError(f"slot kind {self.kind!r}: use one of {list(SLOT_KINDS)}")
        if self.sliding_window and self.kind == "ragged":
            raise ConfigError("the ragged slot has no sliding-window form; TVM calls it with causal only")
        if self.window and not (self.sliding_window or self.tree_mask):
            raise ConfigError("window: only the sliding-window slots (paged prefill, decode) and the paged tree "
                              "slot take a window")
        if self.inline_rope and self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim}: inline RoPE rotates halves and needs an even "
                              "head_dim")

    @property
    def func_name(self) -> str:
        sw = "_sliding_window" if self.sliding_window else ""
        tree = "_tree_mask" if self.tree_mask else ""
        return f"tvm_slot_{self.kind}{tree}{sw}_{DTYPE_SHORT[self.dtype]}_d{self.head_dim}"

    @property
    def signature_kind(self) -> str:
        """The key of ``SLOT_SIGNATURES`` that TVM calls this slot with."""
        return f"{self.kind}_tree" if self.tree_mask else self.kind

    def program(self) -> ProgramSpec:
        # TVM calls the paged tree slot for "mha" layers (length_info [B]) and "mha_sliding" ones ([3, B])
        convention = TVMConvention(self.sliding_window, self.window, self.inline_rope, self.func_name,
                                   tree_mask=self.tree_mask,
                                   length_info_ndim_at_run_time=self.tree_mask and self.kind == "paged")
        return ProgramSpec(self.head_dim, self.dtype, "ragged" if self.kind == "ragged" else "paged",
                           decode=self.kind == "decode", page_layout="HND", tvm=convention,
                           transform_keys=self.transform_keys, q_scale_log2e=self.q_scale_log2e)


def slot_program(spec: SlotSpec) -> tir.PrimFunc:
    """The slot function of ``spec`` with hook placeholders, in TVM's signature for its kind."""
    return with_signature(online_softmax_program(spec.program()), SLOT_SIGNATURES[spec.signature_kind])


def check_slot_variant(variant) -> None:
    """Refuse variants whose result would be silently wrong inside TVM's PagedKVCache."""
    name = variant.name
    if variant.state != StateAlgebra.SOFTMAX:
        raise ConfigError(f"variant '{name}': its state is an unnormalised sum, but TVM's PagedKVCache merges "
                          "the ragged and paged parts of each row by their lse; use a softmax variant")
    for hook in variant.hooks:
        if HOOKS[hook].site is Site.EPILOGUE:
            raise ConfigError(f"variant '{name}', hook '{hook}': TVM's PagedKVCache computes a row in parts "
                              "(new tokens, cached pages per prefix depth) and merges them by lse, and a hook "
                              "applied to each part's output does not compose; apply it to the cache's output "
                              "in the model instead")
    for hook, reads in variant.analysis.reads.items():
        if "batch" in reads.indices:
            raise ConfigError(f"variant '{name}', hook '{hook}': reads 'batch', but TVM's PagedKVCache calls "
                              "attention per prefix depth, where the batch index is not the sequence id "
                              "(shared prefixes group several sequences); index by positions or heads instead")


def lower_slot(spec: SlotSpec, variant, scalar_values: dict) -> tir.PrimFunc:
    """TVM's exact signature for ``spec.kind``, the variant's hooks inlined, its scalar parameters
    compiled in from ``scalar_values`` (name -> value); its tensor parameters stay as trailing
    arguments in declaration order."""
    func = inline_hooks(slot_program(spec), variant, spec.head_dim)
    extras = func.params[len(SLOT_SIGNATURES[spec.signature_kind]):]
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
    """The seven attention slots of one cache: role -> spec (roles as in TVM's create call; the two tree
    slots last). TVM refuses token trees under inline RoPE, so the tree slots are built for rotary_mode 0."""
    if dtype not in SLOT_DTYPES:
        raise ConfigError(f"dtype {dtype!r}: the CPU slots serve {list(SLOT_DTYPES)}")
    flags = kernel_flags(variant)
    common = dict(head_dim=head_dim, dtype=dtype, inline_rope=inline_rope, transform_keys=flags["transform_keys"],
                  q_scale_log2e=flags["q_scale_log2e"])
    return {
        "prefill_ragged": SlotSpec("ragged", **common),
        "prefill": SlotSpec("paged", **common),
        "decode": SlotSpec("decode", **common),
        "prefill_sliding_window": SlotSpec("paged", sliding_window=True, window=window, **common),
        "decode_sliding_window": SlotSpec("decode", sliding_window=True, window=window, **common),
        "prefill_tree_mask_paged": SlotSpec("paged", tree_mask=True, window=window,
                                            **(common | {"inline_rope": False})),
        "prefill_tree_mask": SlotSpec("ragged", tree_mask=True, **(common | {"inline_rope": False})),
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
