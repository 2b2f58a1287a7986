"""Build cache keyed by a content hash, safe under concurrent builds.

The key is SHA-256 over canonical JSON of everything that determines the output
(IR text, build config, template and code-generator sources, tool versions,
flags). Two tiers: an in-process dict, then a directory per key on disk, created
under a file lock with a second look after the lock is taken, written to a
temporary directory and renamed into place so readers never see half a build.
A finished build is sealed (every file flushed, then a record of each file's size
and digest) before the rename, and an entry is served only when its seal matches
its files; a dead build's temporary directory or an entry that fails its seal is
removed under the lock and built again.
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
        if entry_is_sealed(final):
            self._memory[key] = final
            return final, True
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if entry_is_sealed(final):  # another process finished it while we waited
                self._memory[key] = final
                return final, True
            # Under the lock no other process builds this key: what lies about is a dead build's
            # temporary directory or an entry that fails its seal; neither is ever served.
            discard_leftovers(final)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-{os.getpid()}-", dir=final.parent))
            try:
                build(tmp)
                seal_entry(tmp)
                os.replace(tmp, final)  # atomic: readers see no entry or a whole, sealed one
                _fsync_dir(final.parent)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            self.builds += 1
        self._memory[key] = final
        return final, False


# ---- the write / serve path: an entry is served only when its seal matches its files -------------------
SEAL = ".sealed.json"  # written last into a finished build: every file's size and SHA-256


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _entry_files(directory: Path) -> dict[str, Path]:
    return {str(p.relative_to(directory)): p for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != SEAL}


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal_entry(directory: Path) -> None:
    """Flush every file of a finished build to disk and record its size and digest in the seal, written
    (and flushed) last: a seal on disk vouches for files that are on disk too, even after a power cut."""
    files = _entry_files(directory)
    record = {}
    for name, path in files.items():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        record[name] = {"size": path.stat().st_size, "sha256": _file_digest(path)}
    with open(directory / SEAL, "w") as f:
        json.dump(record, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(directory)


def entry_is_sealed(directory: Path) -> bool:
    """Whether ``directory`` is a whole build: its seal parses and names exactly its files, with their
    sizes and digests (checked once per process: the in-process tier serves it after that)."""
    try:
        record = json.loads((directory / SEAL).read_text())
        files = _entry_files(directory)
        if not isinstance(record, dict) or set(record) != set(files):
            return False
        return all(files[n].stat().st_size == r["size"] and _file_digest(files[n]) == r["sha256"]
                   for n, r in record.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def discard_leftovers(final: Path) -> None:
    """Remove, under the entry's lock, the temporary directories of builds of this key that died (killed,
    out of memory) and an entry at ``final`` that fails its seal (moved aside first, so that the name is
    free at once)."""
    for tmp in final.parent.glob(f".{final.name}-*"):
        shutil.rmtree(tmp, ignore_errors=True)
    if final.exists():
        aside = final.parent / f".{final.name}-invalid-{os.getpid()}"
        os.replace(final, aside)
        shutil.rmtree(aside, ignore_errors=True)
