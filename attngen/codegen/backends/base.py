"""What the staged build hands a target backend (``BuildContext``) and what a backend provides
(``Backend``: the target's stage functions and the tool versions its outputs depend on)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from attngen.schedules.build_config import BuildConfig

if TYPE_CHECKING:  # a Variant's module imports TVM
    from attngen.ir import Variant


class Backend(ABC):
    """One build target's stages. Each takes the build context (with the artifacts of the stages before
    it) and returns its artifact; ``compile`` writes into ``ctx.out_dir`` and returns the manifest's
    target entries ("library", "functions", "objects", ...)."""

    target: str

    @abstractmethod
    def tool_versions(self, cfg=None) -> dict:
        """Versions of the tools beyond TVM whose output a build of ``cfg`` holds (part of the cache key)."""

    @abstractmethod
    def schedule(self, ctx: BuildContext) -> dict:
        """What will be instantiated, after refusing what the target cannot serve."""

    @abstractmethod
    def lower_hooks(self, ctx: BuildContext):
        """The variant's hooks in the target's form."""

    @abstractmethod
    def instantiate(self, ctx: BuildContext) -> dict[str, str]:
        """Source files to compile, by file name."""

    @abstractmethod
    def compile(self, ctx: BuildContext) -> dict:
        """Compile the written sources in ``ctx.out_dir``; the manifest entries of the result."""


@dataclass
class BuildContext:
    variant: Variant
    config: BuildConfig
    backend: Backend
    out_dir: Path | None = None
    artifacts: dict[str, object] = field(default_factory=dict)
    cache: object = None  # the build's BuildCache: where a backend keeps pieces shared across builds
