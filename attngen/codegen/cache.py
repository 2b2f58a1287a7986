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

Records are the cache's small JSON notes (``records/<key>.json``), each valid while the files it lists
still hash as they did when it was written (a depfile, by content). The command line keeps one per build
request, keyed by the variant's source text instead of its IR, pointing at the build's entry: a repeated
``attngen build`` finds its library without importing TVM to print the IR. What such a record cannot
see is what a variant file reads at import time other than Python modules (a data file, an environment
variable); ``--dump`` (or ``ATTNGEN_DUMP``) always runs the stages, and so keys by the IR.
This module and its helpers import nothing heavy: they run before anything is lowered.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Callable

from filelock import FileLock


PREBUILT_ENV = "ATTNGEN_PREBUILT_DIRS"  # read-only caches (e.g. shipped with a deployment), os.pathsep-separated


def prebuilt_dirs() -> tuple[Path, ...]:
    """The read-only caches ``ATTNGEN_PREBUILT_DIRS`` names (``attngen prebuild`` fills one)."""
    return tuple(Path(p) for p in os.environ.get(PREBUILT_ENV, "").split(os.pathsep) if p)


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


ABSENT = "none"  # the version a key holds for a tool or a package that is not installed
STAND_IN = "stand_in.json"  # what a stand-in entry holds: {"key": the key of the entry it names}


class ToolsMissingError(RuntimeError):
    """A build's tools are not installed and no cache holds what they would make."""


def package_version(distribution: str) -> str:
    """An installed distribution's version, read from its metadata (importing the package, as
    ``tvm_ffi.__version__`` would, costs seconds: tvm-ffi imports torch); ABSENT when not installed."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ABSENT


def python_environment() -> dict:
    """The interpreter and the installed distributions (the names of the ``*.dist-info`` directories on
    ``sys.path``, which carry their versions): what a variant file may import from outside itself."""
    dists = set()
    for entry in sys.path:
        try:
            dists.update(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
    return {"python": sys.version, "platform": sys.platform,
            "distributions": hashlib.sha256("\n".join(sorted(dists)).encode()).hexdigest()}


def local_module_files(exclude: tuple[Path, ...] = ()) -> list[Path]:
    """Source files of the imported modules outside the standard library and the installed packages (and
    outside ``exclude``): the user's own modules, whose text a record keyed by a variant file must watch.
    Installed packages are keyed by their versions instead (:func:`python_environment`); a package
    installed in editable mode lives outside ``site-packages`` and is watched file by file."""
    skip = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    skip |= {Path(p).resolve() for p in exclude}
    files = set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not name or not name.endswith(".py"):
            continue
        path = Path(name).resolve()
        installed = "site-packages" in path.parts or "dist-packages" in path.parts
        if path.is_file() and not installed and not any(path.is_relative_to(s) for s in skip):
            files.add(path)
    return sorted(files)


def file_digests(paths) -> dict[str, str]:
    return {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


class BuildCache:
    """``root``: the writable cache. ``prebuilt``: read-only caches consulted after it (default: those
    ``ATTNGEN_PREBUILT_DIRS`` names); an entry there is served when its seal matches and is never written,
    so a cache filled by ``attngen prebuild`` can ship read-only with a deployment."""

    def __init__(self, root: Path | str | None = None, prebuilt: tuple[Path | str, ...] | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.prebuilt = tuple(Path(p) for p in (prebuilt_dirs() if prebuilt is None else prebuilt))
        self._memory: dict[str, Path] = {}
        self.builds = 0  # how many times this cache ran a build function (for tests and logs)
        self._builds_lock = threading.Lock()  # a linked build compiles its pieces in threads

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / key

    def record_path(self, key: str) -> Path:
        return self.root / "records" / key[:2] / f"{key}.json"

    def write_record(self, key: str, data: dict, depends_on=()) -> None:
        """Keep ``data`` under ``key`` while the files ``depends_on`` keep their present content."""
        path = self.record_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:8]}-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"data": data, "depends_on": file_digests(depends_on)}, f)
        os.replace(tmp, path)

    def read_record(self, key: str) -> dict | None:
        """The data written under ``key``, or None when there is none or a file it depends on changed."""
        try:
            record = json.loads(self.record_path(key).read_text())
            current = file_digests(record["depends_on"])
        except (OSError, ValueError, KeyError):
            return None
        return record["data"] if current == record["depends_on"] else None

    def find_sealed(self, key: str) -> Path | None:
        """The whole entry of ``key`` in this cache or a prebuilt one, or None."""
        if key in self._memory and self._memory[key].is_dir():
            return self._memory[key]
        for root in (self.root, *self.prebuilt):
            entry = root / key[:2] / key
            if entry_is_sealed(entry):
                self._memory[key] = entry
                return entry
        return None

    def get_or_build_with_tools(self, key: str, build: Callable[[Path], None], *, stand_in: str, tools: dict,
                                what: str) -> tuple[Path, bool]:
        """:meth:`get_or_build` for a build whose ``key`` holds its tools' versions (``tools``: name -> version,
        ABSENT where not installed). With every tool installed: the entry of ``key``, and an entry under
        ``stand_in`` (a key of the same inputs without the tools) that names it. With one missing: the entry the
        stand-in names, so that a cache filled where the tools were (``attngen prebuild``) serves a machine
        without them; ToolsMissingError naming ``what`` and the missing tools when no cache holds one."""
        missing = sorted(name for name, version in tools.items() if version == ABSENT)
        if not missing:
            found = self.get_or_build(key, build)
            named = self.find_sealed(stand_in)
            if named is not None and self._stand_in_target(named) is None and named.is_relative_to(self.root):
                self._memory.pop(stand_in, None)  # (it names an entry since removed: it names this one now)
                with FileLock(str(named) + ".lock"):
                    if not entry_is_sealed(named) or self._stand_in_target(named) is None:  # (not remade meanwhile)
                        discard_leftovers(named)
                named = None
            if named is None:
                self.get_or_build(stand_in, lambda out: (out / STAND_IN).write_text(json.dumps({"key": key})),
                                  counted=False)
            return found
        named = self.find_sealed(stand_in)
        entry = self._stand_in_target(named) if named else None
        if entry is None:
            raise ToolsMissingError(
                f"{what}: {', '.join(missing)} not installed, and neither the build cache ({self.root}) nor a "
                f"prebuilt one ({PREBUILT_ENV}) holds it: install {' and '.join(missing)}, or build it where they "
                f"are ('attngen prebuild --cache-dir DIR', or any build into DIR) and set {PREBUILT_ENV}=DIR here")
        return entry, True

    def _stand_in_target(self, named: Path) -> Path | None:
        """The whole entry a stand-in entry names, or None where no cache holds it (any more)."""
        return self.find_sealed(json.loads((named / STAND_IN).read_text())["key"])

    def get_or_build(self, key: str, build: Callable[[Path], None], *, counted: bool = True) -> tuple[Path, bool]:
        """Directory holding the artifacts for ``key``, and whether it came from the cache (``counted``: whether a
        build here counts in ``builds``)."""
        found = self.find_sealed(key)
        if found is not None:
            return found, True
        final = self.path_for(key)
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
            with self._builds_lock:
                self.builds += counted
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
