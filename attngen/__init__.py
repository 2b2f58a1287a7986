"""attngen: an attention-kernel compiler for variants written as TVM TensorIR hooks."""
from .ir import (ConfigError, MaskKind, ScalarParam, StateAlgebra, TensorParam, Variant,
                 VariantError)

__version__ = "0.1.0"

__all__ = ["ConfigError", "MaskKind", "ScalarParam", "StateAlgebra", "TensorParam", "Variant",
           "VariantError", "__version__"]
