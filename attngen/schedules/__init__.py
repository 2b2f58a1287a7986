"""attngen.schedules: per-arch specs, the template registry (one record per CUDA kernel role: arch
predicate, tile table, shared memory, entry headers, exports), dtypes, and the build configuration."""
from .arch import ARCHS, ArchSpec, arch_spec
from .build_config import BuildConfig
from .dtypes import DtypePair
from .registry import TEMPLATES, template
from .templates import TemplateRecord

__all__ = ["ARCHS", "ArchSpec", "BuildConfig", "DtypePair", "TEMPLATES", "TemplateRecord", "arch_spec", "template"]
