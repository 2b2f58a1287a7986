"""attngen.schedules: per-arch specs and the tables that pick templates and tile configs."""
from .arch import ARCHS, ArchSpec, arch_spec
from .build_config import BuildConfig

__all__ = ["ARCHS", "ArchSpec", "BuildConfig", "arch_spec"]
