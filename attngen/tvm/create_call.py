"""The one place that knows the argument list of ``vm.builtin.paged_attention_kv_cache_create``.

TVM 0.27's create call takes, in order: sizes, layer range, head counts and dims, per-layer attention
kinds, RoPE settings, a dtype token, the append kernel, the attention slots, the merge slot and TVM's
other data-moving kernels. ``create_arguments`` writes that list from a :class:`CacheShape` and the
cache's :class:`CacheParts` in one of two forms: ``RunTimeValues`` (plain values and functions, for a
call in this process) or ``RelaxValues`` (Relax expressions, for a call emitted into a model).
"""
from __future__ import annotations

from dataclasses import dataclass

from .shape import ATTN_KINDS, CacheShape

CREATE_FUNCTION = "vm.builtin.paged_attention_kv_cache_create"
# the five attention slots, in the create call's order
SLOT_ROLES = ("prefill_ragged", "prefill", "decode", "prefill_sliding_window", "decode_sliding_window")
# the token-tree attention slots (speculative decoding), in the create call's order: paged, then ragged;
# a backend that leaves them out leaves them empty (TVM then refuses a token tree on the first forward)
TREE_ROLES = ("prefill_tree_mask_paged", "prefill_tree_mask")
# TVM's own data-moving kernels a cache needs (helper_kernels.py builds them)
HELPER_ROLES = ("transpose_append", "debug_get_kv", "split_rotary", "copy_single_page", "compact_copy")


@dataclass(frozen=True)
class CacheParts:
    """The functions a cache is created with, as values or as Relax expressions.

    attention: role (``SLOT_ROLES``, optionally ``TREE_ROLES``) -> (convention, function[, plan function]),
    e.g. ("tirx", fn) or ("flashinfer", run, plan); helpers: role (``HELPER_ROLES``) -> function; merge: the merge function."""

    attention: dict
    helpers: dict
    merge: object

    def __post_init__(self):
        missing = [r for r in SLOT_ROLES if r not in self.attention] + [r for r in HELPER_ROLES
                                                                          if r not in self.helpers]
        if missing:
            raise ValueError(f"cache parts: no function for {missing}")


class RunTimeValues:
    """Arguments of a create call made in this process (the cache lives on ``device``)."""

    def __init__(self, device):
        self.device = device

    def shape(self, values: list):
        from tvm.runtime import ShapeTuple

        return ShapeTuple(values)

    def scalar(self, value):
        return value

    def null(self):
        return None

    def dtype_token(self, dtype: str):
        import tvm

        return tvm.runtime.empty((), dtype, device=self.device)

    def group(self, items: list):
        return list(items)

    def name(self, text: str):
        return text


class RelaxValues:
    """Arguments of a create call emitted into a Relax function."""

    def shape(self, values: list):
        from tvm import relax as rx

        return rx.ShapeExpr(values)

    def scalar(self, value):
        from tvm import relax as rx

        return rx.prim_value(value)

    def null(self):
        from tvm import relax as rx

        return rx.op.null_value()

    def dtype_token(self, dtype: str):
        from tvm import relax as rx

        return rx.op.zeros((), dtype)

    def group(self, items: list):
        from tvm import relax as rx

        return rx.Tuple(list(items))

    def name(self, text: str):
        import tvm

        return tvm.ir.StringImm(text)


def create_arguments(shape: CacheShape, parts: CacheParts, form) -> list:
    """The create call's arguments in ``form`` (``RunTimeValues`` or ``RelaxValues``)."""
    def slot(entry):
        convention, *functions = entry
        return form.group([form.name(convention), *functions])

    h = parts.helpers
    return [
        form.shape(shape.sizes), form.shape([0, shape.num_layers]), form.scalar(shape.num_qo_heads),
        form.scalar(shape.num_kv_heads), form.scalar(shape.head_dim), form.scalar(shape.head_dim),
        form.shape([ATTN_KINDS[k] for k in shape.attn_kinds]), form.scalar(False), form.scalar(shape.rope_mode),
        form.scalar(float(shape.rope_scale)), form.scalar(float(shape.rope_theta)), form.null(),
        form.dtype_token(shape.dtype), h["transpose_append"], form.null(),  # no MLA append
        *(slot(parts.attention[role]) for role in SLOT_ROLES),
        *(slot(parts.attention[role]) if role in parts.attention else form.group([]) for role in TREE_ROLES),
        form.group([]),  # MLA: not served (CacheShape refuses MLA layers)
        form.group([parts.merge]), h["split_rotary"], h["copy_single_page"], h["debug_get_kv"], h["compact_copy"],
    ]


def create_cache(shape: CacheShape, parts: CacheParts, device):
    """Create the cache in this process, on ``device``."""
    import tvm

    return tvm.get_global_func(CREATE_FUNCTION)(*create_arguments(shape, parts, RunTimeValues(device)))


def emit_create(bb, shape: CacheShape, parts: CacheParts):
    """Emit the create call into ``bb``'s current function; returns the Relax var holding the cache."""
    from tvm import relax as rx

    args = create_arguments(shape, parts, RelaxValues())
    return bb.emit(rx.call_pure_packed(CREATE_FUNCTION, *args, ty_args=rx.AnyType()))
