"""Registers per thread of every kernel in a compiled CUDA object, as ptxas wrote them into its cubin.

nvcc embeds each architecture's cubin (an ELF file) in the object; the cubin's `.nv.info` section holds, per
kernel, the attribute EIATTR_REGCOUNT (what `cuobjdump --dump-resource-usage` prints as REG): read here with
the standard library, so no CUDA binary utilities (which a toolkit may lack) are needed. Names come back
demangled by c++filt and without namespaces and parameters, as the emulated build's launch log spells them
(`stats_channels_last_kernel<c10::BFloat16, 8>`).
"""
from __future__ import annotations

import struct
import subprocess
from pathlib import Path

EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 4  # an attribute with a 16-bit size and that many bytes of value; other formats have 2 bytes


def _sections(data: bytes, base: int) -> dict[str, tuple[int, int]]:
    """name -> (file offset, size) of the sections of the 64-bit little-endian ELF file at `base`."""
    shoff, = struct.unpack_from("<Q", data, base + 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", data, base + 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, base + shoff + k * entsize) for k in range(count)]
    names_at = base + heads[names_index][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return data[start:data.index(b"\0", start)].decode()

    return {name(h[0]): (base + h[4], h[5]) for h in heads}


def _mangled_registers(data: bytes) -> dict[str, int]:
    out: dict[str, int] = {}
    start = data.find(b"\x7fELF", 1)  # the object itself is the ELF at 0; cubins are inside it
    while start != -1:
        try:
            sections = _sections(data, start)
        except (struct.error, ValueError, UnicodeDecodeError):
            sections = {}
        if {".nv.info", ".symtab", ".strtab"} <= sections.keys():
            symtab, strtab = sections[".symtab"][0], sections[".strtab"][0]
            at, size = sections[".nv.info"]
            end = at + size
            while at < end:
                fmt, attr = data[at], data[at + 1]
                if fmt != EIFMT_SVAL:
                    at += 4
                    continue
                length, = struct.unpack_from("<H", data, at + 2)
                if attr == EIATTR_REGCOUNT:
                    symbol, registers = struct.unpack_from("<II", data, at + 4)
                    name_at = strtab + struct.unpack_from("<I", data, symtab + 24 * symbol)[0]
                    out[data[name_at:data.index(b"\0", name_at)].decode()] = registers
                at += 4 + length
        start = data.find(b"\x7fELF", start + 1)
    return out


def _short(demangled: str) -> str:
    """`void ns::(anonymous namespace)::k<float, 4>(float const*, ...)` -> `k<float, 4>`."""
    head = demangled.removeprefix("void ")
    depth, cut = 0, len(head)
    for i, ch in enumerate(head):  # the parameters start at the first '(' outside <...> after the name
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and not head.startswith("(anonymous namespace)", i):
            cut = i
            break
    name = head[:cut]
    depth, last = 0, -1
    for i, ch in enumerate(name):  # drop the namespaces: up to the last "::" outside <...>
        depth += ch == "<"
        depth -= ch == ">"
        if depth == 0 and name.startswith("::", i):
            last = i + 2
    return name[last:] if last >= 0 else name


def kernel_registers(objects: list[Path]) -> dict[str, int]:
    """Kernel name (launch-log spelling) -> registers per thread, over the cubins of `objects`."""
    mangled: dict[str, int] = {}
    for obj in objects:
        mangled.update(_mangled_registers(obj.read_bytes()))
    names = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return {_short(name): registers for name, registers in zip(names, mangled.values())}
