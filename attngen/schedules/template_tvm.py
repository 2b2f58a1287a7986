"""The TVM PagedKVCache slot family (attngen/codegen/cuda_tvm_slots.py): functions with TVM 0.27's
attention-slot calling conventions, ("tirx", fn) and ("flashinfer", run, plan), running attngen's prefill
template (the token-tree slots on its mma.sync form; in a build for sm_90a alone the Hopper form serves the others
and no mma.sync instance of theirs is compiled) and its decode entry (tensor cores, falling back to CUDA cores on a
device whose shared memory may hold no tensor-core tile; none on sm_90a). No tiles of its own: what it launches is
checked and instantiated through ``requires``.
"""
from __future__ import annotations

from .templates import ArchNeeds, TemplateRecord

# ("tirx", fn); the sliding-window slots serve what BuildConfig.tvm_window says (and refuse a call without it), the
# prefill, decode and sliding-window slots inline RoPE where BuildConfig.tvm_rope says so (else they refuse it); the
# token-tree slots (speculative decoding) run on the mma.sync prefill template
SLOT_KINDS = ("tvm_prefill_paged", "tvm_prefill_ragged", "tvm_decode", "tvm_prefill_paged_sliding_window",
              "tvm_decode_sliding_window", "tvm_prefill_ragged_tree", "tvm_prefill_paged_tree")
FLASHINFER_KINDS = ("tvm_fi_decode_plan", "tvm_fi_decode_run", "tvm_fi_prefill_plan", "tvm_fi_prefill_paged_run",
                    "tvm_fi_prefill_ragged_run")  # ("flashinfer", run, plan)


def _none(_) -> tuple:
    return ()


def _no_smem(cfg, elems) -> int:
    return 0


def _no_section(element_sizes) -> str:
    return ""


TVM_SLOTS = TemplateRecord(
    name="tvm",
    role="TVM PagedKVCache attention slots over the prefill and decode templates",
    needs=ArchNeeds(),
    head_dims=(64, 128, 256),
    configs=_none,
    smem_bytes=_no_smem,
    must_fit=_none,
    header_section=_no_section,
    headers=("tvm_slots.h", "tvm_fi_slots.h"),
    exports=SLOT_KINDS + FLASHINFER_KINDS,
    emitter="tvm_slots",
    variant_check="tvm_slots",
    requires=("decode", "prefill"),  # the decode slot runs the decode entry, which brings decode_tc
)
