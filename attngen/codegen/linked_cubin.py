"""What a linked library embeds beside its host code: its cubins (one per template object and arch), and the
table from each kernel's key (``decode_kernel<__half, 128, 4>``, as csrc/cubin_launch.h spells it) to its
mangled name, read from the cubin's ELF sections and demangled by c++filt, and the part holding it."""
from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path


def _section_headers(cubin: bytes) -> list[tuple[str, int, int, int]]:
    """(name, type, offset, size) of each section of an ELF64 cubin."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)

    def header(i):  # (name offset, type, offset, size)
        base = shoff + i * shentsize
        return (*struct.unpack_from("<II", cubin, base), *struct.unpack_from("<QQ", cubin, base + 0x18))

    _, _, str_off, str_size = header(shstrndx)
    strtab = cubin[str_off:str_off + str_size]
    return [(strtab[n:strtab.index(b"\0", n)].decode(), kind, off, size)
            for n, kind, off, size in (header(i) for i in range(shnum))]


def cubin_section_names(cubin: bytes) -> list[str]:
    """The section names of an ELF64 cubin."""
    return [name for name, _, _, _ in _section_headers(cubin)]


def cubin_code(cubin: bytes) -> dict[str, bytes]:
    """Each kernel's and device function's machine code: its ``.text.<name>`` section's bytes."""
    return {name[len(".text."):]: cubin[off:off + size] for name, _, off, size in _section_headers(cubin)
            if name.startswith(".text.")}


def cubin_kernels(cubin: bytes) -> list[str]:
    """Mangled names of a cubin's kernels (each has its ``.nv.info.<name>`` section)."""
    prefix = ".nv.info."
    return sorted(n[len(prefix):] for n in cubin_section_names(cubin) if n.startswith(prefix + "_Z"))


def kernel_table(mangled: list[str]) -> dict[str, str]:
    """Key -> mangled name of each kernel, demangled by c++filt: the key is the kernel's unqualified
    name with its template arguments after the first (the traits), e.g. ``decode_kernel<__half, 128, 4>``
    (csrc/cubin_launch.h builds the same string)."""
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                               check=True).stdout.splitlines()
    return {kernel_key(d): m for m, d in zip(mangled, demangled)}


def kernel_key(demangled: str) -> str:
    """``void attngen::decode_kernel<attngen_gen::Hooks_d128, __half, 128, 4>(...)`` ->
    ``decode_kernel<__half, 128, 4>``."""
    m = re.match(r"(?:void )?(?:[\w:]+::)?(\w+)<", demangled)
    if not m:
        raise ValueError(f"not a kernel template instance: {demangled!r}")
    depth, args, cur = 0, [], ""
    for ch in demangled[m.end():]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    args.append(cur.strip())
    return f"{m.group(1)}<{', '.join(args[1:])}>"


def link_object_source(cubins: list[tuple[Path, int, int]], table: dict[str, tuple[str, int]]) -> str:
    """C source embedding the cubins (path, arch as major * 10 + minor, part) and the kernel table (key ->
    mangled name and the part of the cubin holding it); hidden: each library keeps its own."""
    lines = ['#define HIDDEN __attribute__((visibility("hidden")))']
    for i, (path, _, _) in enumerate(cubins):
        lines.append(f'__asm__(".section .rodata\\n.balign 128\\nattngen_cubin_{i}:\\n'
                     f'.incbin \\"{path}\\"\\n.byte 0\\n.previous\\n");')
        lines.append(f"extern const unsigned char attngen_cubin_{i}[];")
    lines.append("struct AttngenLinkedCubin { const unsigned char* data; int sm; int part; };")
    rows = "".join(f"{{attngen_cubin_{i}, {sm}, {part}}}, " for i, (_, sm, part) in enumerate(cubins))
    lines.append(f"HIDDEN const struct AttngenLinkedCubin attngen_linked_cubins[] = {{{rows}{{0, 0, 0}}}};")
    pairs = "".join(f'  "{k}", "{m}",\n' for k, (m, _) in sorted(table.items()))
    lines.append(f"HIDDEN const char* const attngen_linked_kernels[] = {{\n{pairs}  0}};")
    parts = ", ".join(str(p) for _, (_, p) in sorted(table.items()))
    lines.append(f"HIDDEN const int attngen_linked_kernel_parts[] = {{{parts}{', ' if parts else ''}-1}};")
    return "\n".join(lines) + "\n" + EXTRA_CUBINS_SOURCE


# The registry of cubins linked on first use (codegen/lto.py link_deferred), appended to the link object: the
# exports' attngen_register_linked_cubin (csrc/linked_register.h) copies one in; csrc/cubin_launch.h reads
# attngen_extra_count (acquire) and the entries below it, which never change once published.
EXTRA_CUBINS_SOURCE = """#include <pthread.h>
#include <stdlib.h>
#include <string.h>
struct AttngenExtraCubin { const unsigned char* data; int sm; int num_kernels; const char* const* kernels; };
#define ATTNGEN_MAX_EXTRA_CUBINS 64
HIDDEN struct AttngenExtraCubin attngen_extra_cubins[ATTNGEN_MAX_EXTRA_CUBINS];
HIDDEN int attngen_extra_count = 0;
static pthread_mutex_t attngen_extra_mu = PTHREAD_MUTEX_INITIALIZER;

/* Copies the cubin (128-byte aligned, as the embedded ones) and its key / mangled-name pairs; returns the
   number of registered cubins, or -1 when the registry is full or memory is short. */
HIDDEN int attngen_register_extra_cubin(const unsigned char* data, unsigned long size, int sm,
                                        const char* const* kernels, int num_kernels) {
  pthread_mutex_lock(&attngen_extra_mu);
  int n = attngen_extra_count;
  unsigned char* copy = n < ATTNGEN_MAX_EXTRA_CUBINS ? aligned_alloc(128, (size + 127) / 128 * 128) : 0;
  const char** names = copy ? malloc(sizeof(char*) * (2 * (size_t)num_kernels + 1)) : 0;
  if (!names) {
    free(copy);
    pthread_mutex_unlock(&attngen_extra_mu);
    return -1;
  }
  memcpy(copy, data, size);
  int ok = 1;
  for (int i = 0; i < 2 * num_kernels; ++i) ok &= (names[i] = strdup(kernels[i])) != 0;
  names[2 * num_kernels] = 0;
  if (!ok) {
    for (int i = 0; i < 2 * num_kernels; ++i) free((void*)names[i]);
    free(names);
    free(copy);
    pthread_mutex_unlock(&attngen_extra_mu);
    return -1;
  }
  attngen_extra_cubins[n].data = copy;
  attngen_extra_cubins[n].sm = sm;
  attngen_extra_cubins[n].num_kernels = num_kernels;
  attngen_extra_cubins[n].kernels = names;
  __atomic_store_n(&attngen_extra_count, n + 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&attngen_extra_mu);
  return n + 1;
}
"""
