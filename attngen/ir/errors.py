"""Errors raised while checking and analysing a variant.

Every error names the variant, the hook, the source line of the offending TIR
(when TVM recorded one) and what to change.
"""
from __future__ import annotations


class VariantError(ValueError):
    """A variant definition is malformed; the message says where and how to fix it."""

    def __init__(self, variant: str, hook: str | None, problem: str, fix: str, where: str | None = None):
        self.variant = variant
        self.hook = hook
        self.problem = problem
        self.fix = fix
        self.where = where
        subject = f"variant '{variant}'" + (f", hook '{hook}'" if hook else "")
        loc = f" ({where})" if where else ""
        super().__init__(f"{subject}{loc}: {problem}. Fix: {fix}")


class ConfigError(ValueError):
    """A build configuration (head dim, dtype, arch, ...) that attngen cannot serve."""


def repeated(names) -> list[str]:
    """The names that occur more than once in ``names``, sorted (for the messages that refuse them)."""
    names = list(names)
    return sorted({n for n in names if names.count(n) > 1})
