"""attngen.ir: the Variant (TIR hooks, extra params, state algebra) and its checks and analyses."""
from .analysis import HookReads, ScaleFold, VariantAnalysis
from .declarations import Param, ScalarParam, StateAlgebra, TensorParam
from .errors import ConfigError, VariantError
from .hook_spec import HOOK_ORDER, HOOKS, HookSpec, Site
from .mask_class import MaskInfo, MaskKind, classify_mask
from .variant import Variant

__all__ = [
    "ConfigError", "HOOKS", "HOOK_ORDER", "HookReads", "HookSpec", "MaskInfo", "MaskKind", "Param",
    "ScalarParam", "ScaleFold", "Site", "StateAlgebra", "TensorParam", "Variant", "VariantAnalysis",
    "VariantError", "classify_mask",
]
