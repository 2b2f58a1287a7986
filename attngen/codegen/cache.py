"""Build cache keyed by a content hash, safe under concurrent builds.

The key is SHA-256 over canonical JSON of everything that determines the output
(IR text, build config, template and code-generator sources, tool versions,
flags). Two tiers: an in-process dict, then a directory per key on disk, created
under a file lock with a second look after the lock is taken, written to a
temporary directory and renamed into place so readers never see half a build.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from filelock import FileLock


def default_cache_dir() -> Path:
    env = os.environ.get("ATTNGEN_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attngen"


def content_key(parts: dict) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def hash_files(paths, root: Path | str | None = None) -> str:
    """SHA-256 over each file's name (its path below ``root`` when given, so that two files of one name in
    different directories stay apart) and its bytes, in path order."""
    h = hashlib.sha256()
    for p in sorted(Path(x) for x in paths):
        h.update(str(p.relative_to(root) if root is not None else p.name).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


class BuildCache:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self._memory: dict[str, Path] = {}
        self.builds = 0  # how many times this cache ran a build function (for tests and logs)

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get_or_build(self, key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """Directory holding the artifacts for ``key``, and whether it came from the cache."""
        if key in self._memory and self._memory[key].is_dir():
            return self._memory[key], True
        final = self.path_for(key)
        if final.is_dir():
            self._memory[key] = final
            return final, True
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if final.is_dir():  # another process finished it while we waited
                self._memory[key] = final
                return final, True
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=final.parent))
            try:
                build(tmp)
                os.replace(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            self.builds += 1
        self._memory[key] = final
        return final, False
