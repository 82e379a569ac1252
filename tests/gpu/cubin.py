"""What a CUBIN NVRTC made is for, read from its ELF header."""
from __future__ import annotations

import struct


def cubin_arch(cubin: bytes) -> int:
    """The SM number an ELF CUBIN is for: e_machine is EM_CUDA (190); NVRTC 13 writes the
    SM in bits 8-15 of e_flags, older ones in bits 0-7."""
    assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18)[0] == 190
    flags = struct.unpack_from("<I", cubin, 48)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 7 else flags & 0xFF
