"""``python -m rocmforge inspect``: which GPUs the code inside .so files, objects and wheels runs on.

The HIP runtime registers every clang offload bundle of a shared object on its own, and fails
with ``hipErrorNoBinaryForGpu`` when *one* of them lacks the device's arch. So coverage is
checked per bundle, not per file. What is read:

- ELF shared and relocatable objects: every offload bundle at any offset, uncompressed
  (``__CLANG_OFFLOAD_BUNDLE__``) or compressed (``CCOB`` v1-v3, zlib or zstd); ``-fgpu-rdc``
  objects' ``__CLANG_OFFLOAD_BUNDLE__<target>`` sections; CUDA ``.nv_fatbin`` sections;
- bare AMDGPU code objects (``e_machine`` EM_AMDGPU), their target taken from ``e_flags``;
- static archives (``.a``) member by member; wheels and other zips member by member,
  nothing extracted; directories recursively.

Files are memory-mapped and only headers are decoded: a compressed bundle is decompressed
as a stream and abandoned as soon as its entry table is complete, because the CCOB header
itself holds no target names. A stored wheel member is scanned in place in the mapped
wheel; a deflated one is inflated ``STREAM_CHUNK`` bytes at a time into the same scanner,
so memory stays bounded whatever the member's size.

JSON contract (other tools read it; keep it stable, add keys only)::

    {"files": [{"path", "member", "bundles": [{"targets": [...]}], "targets", "archs"}],
     "missing": [{"path", "member", "bundle", "arch"}]}
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import itertools
import json
import mmap
import os
import re
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import zstandard

from rocmforge.arch import GENERIC_TARGETS, TargetID, parse_target_id, validate_arch
from rocmforge.errors import UserError
from rocmforge.fsutil import refuse_special

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"
ELF_MAGIC = b"\x7fELF"
AR_MAGIC = b"!<arch>\n"
ZIP_MAGIC = b"PK\x03\x04"
FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
EM_AMDGPU = 224
EM_CUDA = 190

# CCOB header sizes by format version (clang's OffloadBundler.cpp): magic, u16 version,
# u16 method, then v1: u32 uncompressed size; v2: u32 total size, u32 uncompressed size;
# v3: u64 total size, u64 uncompressed size; all followed by a u64 truncated MD5.
_CCOB_HEADER = {1: 20, 2: 24, 3: 32}
_CCOB_METHODS = {0: "zlib", 1: "zstd"}  # llvm::compression::Format
# A deflated wheel member is inflated this much at a time (tests shrink it to cross chunk
# boundaries); memory stays near this, whatever the member's size.
STREAM_CHUNK = 2 << 20
_COMPRESSED_FEED = 64 << 10  # compressed bytes per zlib call; a checkpoint keeps what is unused
_CCOB_FEED = 4096  # compressed bytes fed per step while waiting for a complete entry table

# EF_AMDGPU_MACH values (LLVM AMDGPUUsage, "AMDGPU ELF Header" table).
_AMDGPU_MACH: dict[int, str] = {
    0x28: "gfx801", 0x29: "gfx802", 0x2A: "gfx803", 0x2B: "gfx810", 0x2C: "gfx900",
    0x2D: "gfx902", 0x2E: "gfx904", 0x2F: "gfx906", 0x30: "gfx908", 0x31: "gfx909",
    0x32: "gfx90c", 0x33: "gfx1010", 0x34: "gfx1011", 0x35: "gfx1012", 0x36: "gfx1030",
    0x37: "gfx1031", 0x38: "gfx1032", 0x39: "gfx1033", 0x3C: "gfx805", 0x3D: "gfx1035",
    0x3E: "gfx1034", 0x3F: "gfx90a", 0x40: "gfx940", 0x41: "gfx1100", 0x42: "gfx1013",
    0x43: "gfx1150", 0x44: "gfx1103", 0x45: "gfx1036", 0x46: "gfx1101", 0x47: "gfx1102",
    0x48: "gfx1200", 0x49: "gfx1250", 0x4A: "gfx1151", 0x4B: "gfx941", 0x4C: "gfx942",
    0x4E: "gfx1201", 0x4F: "gfx950", 0x51: "gfx9-generic", 0x52: "gfx10-1-generic",
    0x53: "gfx10-3-generic", 0x54: "gfx11-generic", 0x55: "gfx1152", 0x58: "gfx1153",
    0x59: "gfx12-generic", 0x5F: "gfx9-4-generic",
}  # fmt: skip
_ELFABIVERSION_AMDGPU_HSA_V3 = 1
# Sections that never embed an offload bundle: symbol/string tables, relocations, hash and
# version tables, dynamic info (by sh_type), machine code (SHF_EXECINSTR), unwind and debug
# info (by name). Section names live in a string table, which is skipped too.
_NO_DATA_TYPES = frozenset({2, 3, 4, 5, 6, 9, 11, 0x6FFFFFF6, 0x6FFFFFFE, 0x6FFFFFFF, 0x6FFFFFFD})
_NO_DATA_PREFIXES = (".eh_frame", ".gcc_except_table", ".debug_")
_SHF_EXECINSTR = 0x4
_SHT_NOBITS = 8
_SHT_DYNAMIC = 6
_SHT_GNU_VERNEED = 0x6FFFFFFE
_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29
# Code object v4+: two bits per feature, 0 = unsupported, 1 = any, 2 = off, 3 = on.
_V4_FEATURES = (("xnack", 8), ("sramecc", 10))

_ENTRY_RE = re.compile(r"^(?P<kind>[a-z0-9]+)-(?P<triple>[^-]+-[^-]*-[^-]*(?:-[^-]*)?)-(?P<target>.*)$")
_SM_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")  # sm_90, sm_90a, sm_100f


@dataclass(frozen=True)
class Bundle:
    """One unit the GPU runtime loads on its own: an offload bundle, a code object, a fatbin."""

    offset: int  # where it starts in the file (or archive member)
    format: str  # "bundle", "ccob-v3-zstd", "code-object", "rdc-sections", "nv_fatbin"
    entries: tuple[str, ...]  # the entry IDs as written (``hipv4-amdgcn-amd-amdhsa--gfx942``)

    @property
    def targets(self) -> list[str]:
        """Device target IDs, sorted, without the ``hipv4-amdgcn-amd-amdhsa--`` prefix."""
        return sorted({t for t in map(entry_target, self.entries) if t})


@dataclass(frozen=True)
class FileReport:
    """Everything found in one shared object, object file or code object."""

    path: str  # the file on disk (a wheel, an archive or the object itself)
    member: str | None  # path inside the wheel/archive, ``lib.a(obj.o)`` for archive members
    bundles: tuple[Bundle, ...] = ()

    @property
    def targets(self) -> list[str]:
        return sorted({t for b in self.bundles for t in b.targets})

    @property
    def archs(self) -> list[str]:
        return sorted({_processor(t) for t in self.targets})

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "member": self.member,
            "bundles": [{"targets": b.targets, "offset": b.offset, "format": b.format} for b in self.bundles],
            "targets": self.targets,
            "archs": self.archs,
        }


@dataclass(frozen=True)
class Missing:
    """A required arch that one bundle of one file cannot run on."""

    path: str
    member: str | None
    bundle: int
    arch: str

    def to_json(self) -> dict:
        return {"path": self.path, "member": self.member, "bundle": self.bundle, "arch": self.arch}


@dataclass
class Report:
    """The result of inspecting some paths, with the coverage check against ``required``."""

    files: list[FileReport] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"files": [f.to_json() for f in self.files], "missing": [m.to_json() for m in self.missing]}


# ---------------------------------------------------------------------------- target IDs


def entry_target(entry: str) -> str | None:
    """The device target of a bundle entry ID, or ``None`` for the host entry.

    ``hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`` -> ``gfx942:sramecc+:xnack-``;
    ``hip-nvptx64-nvidia-cuda--sm_80`` -> ``sm_80``; ``host-x86_64-unknown-linux-gnu-`` -> None.
    """
    m = _ENTRY_RE.match(entry)
    if not m or m["kind"] == "host" or not m["target"]:
        return None
    return m["target"]


def _processor(target: str) -> str:
    return target.split(":", 1)[0]


def _is_cuda(name: str) -> bool:
    return name.startswith(("sm_", "compute_"))


def covers(targets: list[str], required: str) -> bool:
    """Whether a unit holding code for ``targets`` can run on every device ``required`` names.

    AMD: a target matches a processor by name or through its generic target (gfx9-4-generic
    runs on gfx940-942, not gfx950). A feature the code object leaves open (``gfx942``) runs
    in either device mode; ``gfx942:xnack+`` runs only on a device in xnack+ mode. A
    requirement that leaves a feature open stands for both modes, so it needs an open target
    or one target per mode. CUDA: SASS ``sm_XY`` runs on ``sm_XZ`` with Z >= Y; PTX
    ``compute_XY`` is JIT-compiled for any ``sm_`` >= XY.
    """
    if _is_cuda(required):
        return _covers_cuda(targets, required)
    want = parse_target_id(required)
    candidates = []
    for text in targets:
        if _is_cuda(text):
            continue
        t = parse_target_id(text)
        if t.processor == want.processor or want.processor in GENERIC_TARGETS.get(t.processor, ()):
            candidates.append(t)
    modes = itertools.product(
        *[(True, False) if getattr(want, f) is None else (getattr(want, f),) for f in ("sramecc", "xnack")]
    )
    return all(any(_runs_in_mode(t, sramecc, xnack) for t in candidates) for sramecc, xnack in modes)


def _runs_in_mode(target: TargetID, sramecc: bool, xnack: bool) -> bool:
    return target.sramecc in (None, sramecc) and target.xnack in (None, xnack)


def _covers_cuda(targets: list[str], required: str) -> bool:
    want = int(_SM_RE.match(required)[1])
    for text in targets:
        kind, _, num = text.partition("_")
        digits = int(re.sub(r"\D", "", num) or 0)
        if kind == "sm" and digits // 10 == want // 10 and digits <= want:
            return True
        if kind == "compute" and digits <= want:
            return True
    return False


def parse_required(text: str, *, key: str = "--require") -> tuple[str, ...]:
    """``gfx90a,gfx942`` (commas or semicolons) -> normalised target IDs and sm_XX names.

    ``key`` names the option the text came from, for the error message.
    """
    out = []
    for item in filter(None, (p.strip() for p in re.split(r"[,;\s]+", text))):
        if _is_cuda(item):
            if not _SM_RE.match(item):
                raise UserError(f"{key}: {item!r} is not a CUDA device arch; write it as sm_90")
            out.append(item)
            continue
        # validate_arch, not just the shape: an unknown name (gfx9420) can never be covered, so
        # it was reported as "missing" everywhere (exit 1) instead of as the typo it is (exit 2).
        out.append(validate_arch(item, key=key))
    if not out:
        raise UserError(f"{key}: no arch given; use names such as gfx90a,gfx942")
    return tuple(out)


# ------------------------------------------------------------------------ bundle decoding


class _Truncated(Exception):
    """A decoder needs bytes that the window it was given does not hold yet (streams only)."""


def _need(buf, pos: int, n: int, end: int) -> bool:
    """Whether ``n`` bytes at ``pos`` lie inside the object, which ends at ``end``.

    Raises _Truncated when they do but ``buf`` (a window on a stream) ends first: the scanner
    then appends the next chunk and decodes again, so no header is lost at a chunk boundary.
    """
    if pos + n > end:
        return False
    if pos + n > len(buf):
        raise _Truncated
    return True


def _parse_entry_table(buf, start: int, end: int) -> tuple[tuple[str, ...], int] | None:
    """Entry IDs and total size of the uncompressed bundle at ``start``; None if not one.

    Offsets are relative to ``start`` and must lie inside ``[start, end)``.
    """
    head = start + len(BUNDLE_MAGIC)
    if not _need(buf, head, 8, end):
        return None
    (count,) = struct.unpack_from("<Q", buf, head)
    if not 0 < count <= 4096:
        return None
    pos, entries, extent = head + 8, [], 0
    for _ in range(count):
        if not _need(buf, pos, 24, end):
            return None
        offset, size, id_len = struct.unpack_from("<QQQ", buf, pos)
        pos += 24
        if id_len > 1024 or not _need(buf, pos, id_len, end):
            return None
        try:
            entries.append(bytes(buf[pos : pos + id_len]).decode("ascii"))
        except UnicodeDecodeError:
            return None
        pos += id_len
        extent = max(extent, offset + size)
    return tuple(entries), max(extent, pos - start)


def _bundle_at(buf, start: int, end: int) -> tuple[Bundle, int] | None:
    parsed = _parse_entry_table(buf, start, end)
    if parsed is None or parsed[1] > end - start:
        return None
    entries, size = parsed
    return Bundle(start, "bundle", entries), size


def _ccob_at(buf, start: int, end: int) -> tuple[Bundle, int] | None:
    """Decode the compressed bundle at ``start``: header, then just enough of the stream.

    The entry table sits at the start of the compressed payload, so decompression stops as
    soon as it is complete; the payload behind it (the code objects) is never inflated.
    """
    if not _need(buf, start, 8, end):
        return None
    version, method = struct.unpack_from("<HH", buf, start + 4)
    if version not in _CCOB_HEADER or method not in _CCOB_METHODS:
        return None
    header = _CCOB_HEADER[version]
    if not _need(buf, start, header, end):
        return None
    if version == 1:
        total = end - start  # v1 does not record its size: the stream ends where it ends
    else:
        total = struct.unpack_from("<I" if version == 2 else "<Q", buf, start + 8)[0]
        if not header < total <= end - start:
            return None
    payload_end = start + total
    if method == 0:
        inflater = zlib.decompressobj()
    else:
        inflater = zstandard.ZstdDecompressor().decompressobj()
    out = bytearray()
    pos = start + header
    try:
        while pos < payload_end:
            stop = min(pos + _CCOB_FEED, payload_end)
            _need(buf, pos, stop - pos, end)
            out += inflater.decompress(bytes(buf[pos:stop]))
            pos = stop
            if len(out) >= len(BUNDLE_MAGIC):
                if not out.startswith(BUNDLE_MAGIC):
                    return None
                try:
                    parsed = _parse_entry_table(out, 0, sys.maxsize)
                except _Truncated:  # the table goes on in compressed bytes not fed yet
                    parsed = None
                else:
                    if parsed is None:
                        return None
                    fmt = f"ccob-v{version}-{_CCOB_METHODS[method]}"
                    return Bundle(start, fmt, parsed[0]), (total if version > 1 else header)
            if getattr(inflater, "eof", False):
                return None
    except (zlib.error, zstandard.ZstdError):
        return None
    return None


def _fatbin_at(buf, start: int, end: int) -> tuple[Bundle, int] | None:
    """The CUDA fat binary at ``start`` (one per translation unit): its entries and size."""
    if not _need(buf, start, 16, end):
        return None
    header_size, fat_size = struct.unpack_from("<HQ", buf, start + 6)
    stop = min(start + header_size + fat_size, end)
    entries, p = [], start + header_size
    while _need(buf, p, 32, stop):
        kind, entry_header, payload = struct.unpack_from("<HxxIQ", buf, p)
        (sm,) = struct.unpack_from("<I", buf, p + 28)
        # kind 1 is PTX (JIT-compiled on the device), 2 is an ELF cubin (SASS)
        entries.append(f"cuda-nvptx64-nvidia-cuda--{'compute' if kind == 1 else 'sm'}_{sm}")
        if entry_header == 0:
            break
        p += entry_header + payload
    return Bundle(start, "nv_fatbin", tuple(entries)), stop - start


_Decoder = Callable[[object, int, int], "tuple[Bundle, int] | None"]
_OFFLOAD = ((BUNDLE_MAGIC, _bundle_at), (CCOB_MAGIC, _ccob_at))
_FATBIN = ((FATBIN_MAGIC, _fatbin_at),)


def _scan(
    windows: Generator[tuple[int, bytes], int | None, None],
    lo: int,
    hi: int,
    end: int,
    decoders: tuple[tuple[bytes, _Decoder], ...],
) -> list[Bundle]:
    """The one scanner: every unit whose magic starts in ``[lo, hi)``, decoded, in order.

    ``windows`` yields ``(offset, bytes)`` pieces of one object, in order and contiguous: a
    mapped file is one window holding everything (scanned in place); a deflated wheel member
    arrives a chunk at a time. Decoders may read up to ``end``; one that needs bytes the
    window lacks gets the next chunk appended and runs again (a compressed bundle's entry
    table may lie past the chunk its header is in). A magic string that is not followed by
    a valid header (text that mentions it, a stray ``CCOB``) is passed over; a decoded unit
    is jumped over.
    """
    base, buf = next(windows)
    cut = max(len(m) for m, _ in decoders) - 1  # a magic may straddle a window's end
    found: list[Bundle] = []
    hits: dict[bytes, tuple[int, int]] = {}  # magic -> (next hit or -1, searched up to)
    pos = lo
    while True:
        limit = min(hi, base + len(buf))
        for magic, _ in decoders:
            hit, upto = hits.get(magic, (-1, -1))
            if hit < pos and (hit >= 0 or upto != limit):
                at = buf.find(magic, max(pos - base, 0), limit - base)
                hits[magic] = (at + base if at >= 0 else -1, limit)
        ready = [(hits[m][0], decode) for m, decode in decoders if hits[m][0] >= 0]
        if ready:
            hit, decode = min(ready, key=lambda r: r[0])
            try:
                decoded = decode(buf, hit - base, end - base)
            except _Truncated:
                more = next(windows, None)
                if more is not None:
                    buf = bytes(buf) + more[1]
                    continue
                decoded = None
            if decoded is None:
                pos = hit + 1
            else:
                unit, size = decoded
                found.append(replace(unit, offset=unit.offset + base))
                pos = hit + max(size, 1)
            continue
        if limit >= hi:
            return found
        slid = _slide(windows, base, buf, max(pos, base + len(buf) - cut))
        if slid is None:
            return found
        base, buf = slid


def _slide(windows, base: int, buf, keep: int) -> tuple[int, bytes] | None:
    """The next window, starting at offset ``keep`` (the unscanned tail of ``buf`` included).

    ``keep`` is sent to the window source: past a decoded unit, a stream resumes at the last
    checkpoint before it instead of inflating the whole unit again.
    """
    try:
        start, data = windows.send(keep)
        while start + len(data) <= keep:
            start, data = next(windows)
    except StopIteration:
        return None
    if keep < start:
        return keep, bytes(buf[keep - base :]) + data
    return keep, data[keep - start :]


def _complement(start: int, end: int, skip) -> Iterator[tuple[int, int]]:
    """The parts of ``[start, end)`` outside the ``skip`` ranges."""
    pos = start
    for lo, hi in sorted(skip):
        if lo > pos:
            yield pos, min(lo, end)
        pos = max(pos, hi)
    if pos < end:
        yield pos, end


# ------------------------------------------------------------------------------ sources


class _Mapped:
    """A file, or a wheel member stored without compression, mapped: scanned in place."""

    def __init__(self, buf, origin: int = 0, size: int | None = None):
        self.buf, self.origin = buf, origin
        self.size = len(buf) - origin if size is None else size

    def read(self, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of the object (fewer at its end)."""
        return bytes(self.buf[self.origin + lo : self.origin + min(hi, self.size)])

    def windows(self, lo: int) -> Generator[tuple[int, bytes], int | None, None]:
        """One window: the whole mapping, positioned so that object offsets index it."""
        yield -self.origin, self.buf


class _Inflated:
    """A deflated wheel member, inflated ``STREAM_CHUNK`` bytes at a time, never whole.

    Each chunk boundary passed is a checkpoint (a copy of the zlib state, under 100 KB), so
    going back (to the section names after the section table at the end, to each data
    section) re-inflates from the checkpoint before the wanted offset, not from the start.
    """

    def __init__(self, fd: int, start: int, compressed_size: int, size: int):
        # Compressed bytes are read with pread, not through a mapping of the wheel: mapped
        # pages would stay resident (and counted) for the whole member.
        self._fd, self._stop, self.size = fd, start + compressed_size, size
        self._step = STREAM_CHUNK
        # (output offset, compressed offset consumed, zlib state)
        self._marks = [(0, start, zlib.decompressobj(-zlib.MAX_WBITS))]
        self._restore(self._marks[0])

    def _restore(self, mark) -> None:
        self._out, self._in, state = mark
        self._inflater, self._tail = state.copy(), b""
        self._last = (self._out, b"")  # the chunk that ends at self._out, kept for going back

    def _chunk(self) -> bytes:
        """Output up to the next chunk boundary; b"" at the end of the member."""
        if self._out % self._step == 0 and self._out > self._marks[-1][0]:
            self._marks.append((self._out, self._in - len(self._tail), self._inflater.copy()))
        pieces, want = [], self._step - self._out % self._step
        while want and not self._inflater.eof:
            if not self._tail:
                if self._in >= self._stop:
                    raise zlib.error("compressed data ends before the member does")
                self._tail = os.pread(self._fd, min(_COMPRESSED_FEED, self._stop - self._in), self._in)
                if not self._tail:
                    raise zlib.error("the wheel ends inside a member")
                self._in += len(self._tail)
            piece = self._inflater.decompress(self._tail, want)
            self._tail = self._inflater.unconsumed_tail
            pieces.append(piece)
            want -= len(piece)
        data = b"".join(pieces)
        if not data and self._out < self.size:  # a short table read would be a struct.error
            raise zlib.error(f"inflates to {self._out} bytes, not the {self.size} the zip lists")
        self._last = (self._out, data)
        self._out += len(data)
        return data

    def windows(self, lo: int) -> Generator[tuple[int, bytes], int | None, None]:
        """Chunks from the one holding offset ``lo`` to the end of the member.

        Sending an offset moves ``lo`` ahead: chunks before it are not yielded, and are not
        inflated at all when a checkpoint lies between.
        """
        while True:
            self._seek(lo)
            start, data = self._last
            if start + len(data) <= lo:
                data = self._chunk()
                if not data:
                    return
                start = self._out - len(data)
                if start + len(data) <= lo:
                    continue
            ahead = yield start, data
            lo = max(start + len(data), ahead or 0)  # the next window follows this one

    def _seek(self, lo: int) -> None:
        """Make offset ``lo`` the chunk at hand or the next one inflated, from the nearest point.

        That is the chunk just inflated if it holds ``lo`` (the ELF reader goes back to the
        section names, the scanner to the next data section), else the current position or
        the last checkpoint before ``lo``, whichever is nearer.
        """
        start, data = self._last
        if start <= lo < start + len(data):
            return
        mark = self._marks[bisect.bisect_right([m[0] for m in self._marks], lo) - 1]
        if not mark[0] <= self._out <= lo:
            self._restore(mark)

    def read(self, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of the member (fewer at its end)."""
        pieces = []
        for start, data in self.windows(lo):
            pieces.append(data[max(lo - start, 0) : hi - start])
            if start + len(data) >= hi:
                break
        return b"".join(pieces)


# ------------------------------------------------------------------------------ ELF files


@dataclass(frozen=True)
class _Section:
    name: str
    offset: int
    size: int
    holds_data: bool  # False for code, symbols, relocations, unwind tables: no bundle inside
    type: int


def _elf_sections(src, base: int, end: int) -> list[_Section]:
    """Section headers of the 64-bit little-endian ELF at ``base`` (empty if unreadable)."""
    header = src.read(base, base + 64)
    if len(header) < 64 or header[4] != 2 or header[5] != 1:
        return []
    (shoff,) = struct.unpack_from("<Q", header, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", header, 0x3A)
    if not shoff or shentsize < 64 or base + shoff + shnum * shentsize > end or shstrndx >= shnum:
        return []
    table = src.read(base + shoff, base + shoff + shnum * shentsize)
    raw = []
    for i in range(shnum):
        name, sh_type, flags = struct.unpack_from("<IIQ", table, i * shentsize)
        offset, size = struct.unpack_from("<QQ", table, i * shentsize + 0x18)
        raw.append((name, sh_type, flags, offset, size))
    strtab_off, strtab_size = raw[shstrndx][3], raw[shstrndx][4]
    names = src.read(base + strtab_off, min(base + strtab_off + strtab_size, end))
    sections = []
    for name, sh_type, flags, offset, size in raw:
        stop = names.find(b"\0", name)
        text = names[name:stop].decode("ascii", "replace") if stop >= 0 else ""
        holds_data = (
            sh_type not in _NO_DATA_TYPES
            and not flags & _SHF_EXECINSTR
            and not text.startswith(_NO_DATA_PREFIXES)
        )
        size = 0 if sh_type == _SHT_NOBITS else size
        sections.append(_Section(text, base + offset, size, holds_data, sh_type))
    return sections


def elf_section_digests(data: bytes) -> dict[str, str] | None:
    """sha256 of each section of a 64-bit little-endian ELF image, by section name (a repeated
    name gets ``#2``, ``#3``...), plus ``(ELF and program headers)`` for the bytes before the
    first section; None when ``data`` is not such an ELF. Comparing two builds' digests names
    the sections that differ (``.text``, ``.rodata``, ``.note.gnu.build-id``...)."""
    if not data.startswith(ELF_MAGIC):
        return None
    sections = _elf_sections(_Mapped(data), 0, len(data))
    if not sections:
        return None
    digests: dict[str, str] = {}
    first = min((s.offset for s in sections if s.size), default=len(data))
    digests["(ELF and program headers)"] = hashlib.sha256(data[:first]).hexdigest()
    for s in sections:
        key, n = s.name or "(unnamed)", 1
        while key in digests:
            n += 1
            key = f"{s.name}#{n}"
        digests[key] = hashlib.sha256(data[s.offset : s.offset + s.size]).hexdigest()
    return digests


def _amdgpu_target(header: bytes) -> str:
    """The target ID a bare AMDGPU code object was built for, from its ELF header flags."""
    (flags,) = struct.unpack_from("<I", header, 0x30)
    name = _AMDGPU_MACH.get(flags & 0xFF, f"gfx-unknown-mach-{flags & 0xFF:#x}")
    features = {}
    if header[8] == _ELFABIVERSION_AMDGPU_HSA_V3:
        if flags & 0x200:
            features["sramecc"] = True
        if flags & 0x100:
            features["xnack"] = True
    else:
        for feature, shift in _V4_FEATURES:
            setting = (flags >> shift) & 3
            if setting in (2, 3):
                features[feature] = setting == 3
    return str(TargetID(name, **features))


def _elf_units(src, base: int, end: int) -> list[Bundle]:
    """The GPU units of the ELF object at ``[base, end)`` of ``src``: bundles, code object or fatbins."""
    header = src.read(base, base + 64)
    if len(header) < 64:
        return []
    (machine,) = struct.unpack_from("<H", header, 18)
    if machine == EM_AMDGPU:
        return [Bundle(base, "code-object", (f"hipv4-amdgcn-amd-amdhsa--{_amdgpu_target(header)}",))]
    sections = _elf_sections(src, base, end)
    skip = [(s.offset, s.offset + s.size) for s in sections if not s.holds_data]
    units = [
        u for lo, hi in _complement(base, end, skip) for u in _scan(src.windows(lo), lo, hi, end, _OFFLOAD)
    ]
    prefix = BUNDLE_MAGIC.decode()
    rdc = [s.name[len(prefix) :] for s in sections if s.name.startswith(prefix)]
    if rdc:  # -fgpu-rdc: one section of device bitcode per target instead of a bundle
        units.append(Bundle(base, "rdc-sections", tuple(rdc)))
    for s in sections:
        if s.name == ".nv_fatbin":
            stop = s.offset + s.size
            units.extend(_scan(src.windows(s.offset), s.offset, stop, stop, _FATBIN))
    return sorted(units, key=lambda b: b.offset)


@dataclass(frozen=True)
class ElfDynamic:
    """What the dynamic loader reads from one ELF file before it can load it."""

    machine: int  # e_machine: 62 x86-64, 183 aarch64, 224 AMDGPU (a GPU code object)
    needed: tuple[str, ...] = ()  # DT_NEEDED sonames, in order
    rpath: tuple[str, ...] = ()  # DT_RPATH directories (searched before LD_LIBRARY_PATH)
    runpath: tuple[str, ...] = ()  # DT_RUNPATH directories (searched after it)
    # .gnu.version_r: library -> symbol versions it must define (libc.so.6 -> GLIBC_2.34, ...)
    version_needs: dict[str, tuple[str, ...]] = field(default_factory=dict)


def elf_dynamic(path: str | os.PathLike[str]) -> ElfDynamic | None:
    """The dynamic section and version needs of an ELF file; None when ``path`` is not ELF.

    A file without a dynamic section (a static binary, a relocatable object) has empty fields.
    """
    with open(path, "rb") as fh:
        if fh.read(4) != ELF_MAGIC:
            return None
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    with buf:
        (machine,) = struct.unpack_from("<H", buf, 18) if len(buf) >= 20 else (0,)
        sections = _elf_sections(_Mapped(buf), 0, len(buf))
        strtab = next((s for s in sections if s.name == ".dynstr"), None)
        if strtab is None:
            return ElfDynamic(machine)

        def string(offset: int) -> str:
            start = strtab.offset + offset
            return bytes(buf[start : buf.find(b"\0", start)]).decode("utf-8", "replace")

        found: dict[int, list[str]] = {_DT_NEEDED: [], _DT_RPATH: [], _DT_RUNPATH: []}
        dynamic = next((s for s in sections if s.type == _SHT_DYNAMIC), None)
        for pos in range(dynamic.offset, dynamic.offset + dynamic.size - 15, 16) if dynamic else ():
            tag, value = struct.unpack_from("<qQ", buf, pos)
            if tag == 0:  # DT_NULL ends the table
                break
            if tag == _DT_NEEDED:
                found[tag].append(string(value))
            elif tag in found:
                found[tag].extend(p for p in string(value).split(":") if p)
        needs: dict[str, tuple[str, ...]] = {}
        verneed = next((s for s in sections if s.type == _SHT_GNU_VERNEED), None)
        pos = verneed.offset if verneed else 0
        # Elf64_Verneed {u16 version, u16 cnt, u32 file, u32 aux, u32 next}, each followed
        # (at +aux) by cnt Elf64_Vernaux {u32 hash, u16 flags, u16 other, u32 name, u32 next}.
        while verneed and verneed.offset <= pos <= verneed.offset + verneed.size - 16:
            _version, count, file, aux, step = struct.unpack_from("<HHIII", buf, pos)
            names, at = [], pos + aux
            for _ in range(count):
                if at + 16 > len(buf):
                    break
                _hash, _flags, _other, name, next_aux = struct.unpack_from("<IHHII", buf, at)
                names.append(string(name))
                if not next_aux:
                    break
                at += next_aux
            needs[string(file)] = tuple(names)
            if not step:
                break
            pos += step
        return ElfDynamic(
            machine, tuple(found[_DT_NEEDED]), tuple(found[_DT_RPATH]), tuple(found[_DT_RUNPATH]), needs
        )


# -------------------------------------------------------------------------- containers


def _archive_members(src, start: int, end: int) -> Iterator[tuple[str, int, int]]:
    """(name, start, end) of each member of the ``ar`` archive at ``[start, end)`` of ``src``."""
    pos, long_names = start + len(AR_MAGIC), b""
    while pos + 60 <= end:
        header = src.read(pos, pos + 60)
        name = header[:16].decode("ascii", "replace").rstrip()
        try:
            size = int(header[48:58].decode("ascii").strip() or 0)
        except ValueError:
            return
        data = pos + 60
        if name == "//":
            long_names = src.read(data, data + size)
        elif name not in ("/", "/SYM64/", "__.SYMDEF"):
            if name.startswith("/") and name[1:].isdigit():
                idx = int(name[1:])
                name = long_names[idx : long_names.find(b"/\n", idx)].decode("ascii", "replace")
            yield name.rstrip("/"), data, min(data + size, end)
        pos = data + size + (size & 1)


def _report(src, path: str, member: str | None, start: int, end: int) -> Iterator[FileReport]:
    head = src.read(start, start + 8)
    if head.startswith(ELF_MAGIC):
        yield FileReport(path, member, tuple(_elf_units(src, start, end)))
    elif head.startswith(AR_MAGIC):
        for name, s, e in _archive_members(src, start, end):
            yield from _report(src, path, f"{member or Path(path).name}({name})", s, e)
    elif head.startswith((BUNDLE_MAGIC, CCOB_MAGIC)):
        yield FileReport(path, member, tuple(_scan(src.windows(start), start, end, end, _OFFLOAD)))


def _member_source(wheel: mmap.mmap, fd: int, info: zipfile.ZipInfo) -> _Mapped | _Inflated:
    """A zip member read where it lies: mapped if stored, inflated chunk by chunk if deflated."""
    if info.flag_bits & 1:
        raise UserError(f"cannot read {info.filename}: it is encrypted")
    sig, name_len, extra_len = struct.unpack_from("<4s22xHH", wheel, info.header_offset)
    start = info.header_offset + 30 + name_len + extra_len
    if sig != ZIP_MAGIC or start + info.compress_size > len(wheel):
        raise zipfile.BadZipFile("local header or data out of place")
    if info.compress_type == zipfile.ZIP_STORED:
        return _Mapped(wheel, start, info.file_size)
    if info.compress_type == zipfile.ZIP_DEFLATED:
        return _Inflated(fd, start, info.compress_size, info.file_size)
    raise zipfile.BadZipFile(f"compression method {info.compress_type}; wheels use stored or deflated")


def _report_zip(path: Path, *, explicit: bool) -> Iterator[FileReport]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"cannot read {path} as a wheel/zip: {exc}") from None
    # Any zip passed as "0 with GPU code": one that is not a wheel must at least hold objects.
    not_wheel = explicit and not any(".dist-info/" in name for name in archive.namelist())
    found = False
    with archive, open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as wheel:
        for info in archive.infolist():
            if info.is_dir() or info.file_size < 64:
                continue
            try:
                with archive.open(info) as member:  # inflates only the first bytes of a member we skip
                    if not member.read(8).startswith((ELF_MAGIC, AR_MAGIC, BUNDLE_MAGIC, CCOB_MAGIC)):
                        continue
                src = _member_source(wheel, fh.fileno(), info)
                found = True
                yield from _report(src, str(path), info.filename, 0, info.file_size)
            except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                raise UserError(f"cannot read {info.filename} in {path}: {exc}") from None
    if not_wheel and not found:
        raise UserError(
            f"{path}: a zip archive but not a wheel (no .dist-info/), and no objects inside; {_WHAT}"
        )


def _report_file(path: Path, *, explicit: bool) -> Iterator[FileReport]:
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if head.startswith(ZIP_MAGIC):
                yield from _report_zip(path, explicit=explicit)
                return
            if path.suffix == ".whl":  # was scanned as a blob: "no GPU code", exit 0, for a broken wheel
                raise UserError(
                    f"cannot read {path} as a wheel/zip: no zip header; download or build it again"
                )
            known = head.startswith((ELF_MAGIC, AR_MAGIC, BUNDLE_MAGIC, CCOB_MAGIC))
            if not known and not explicit:
                return
            size = os.fstat(fh.fileno()).st_size
            if size == 0:  # a mistyped path must not pass --require as "no GPU code"
                raise UserError(f"{path}: empty file; {_WHAT}")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                src = _Mapped(buf)
                if known:
                    yield from _report(src, str(path), None, 0, size)
                    return
                # A raw blob named on the command line (a section dumped by objcopy): bundles
                # anywhere inside make it one; none, and it is the wrong file.
                bundles = tuple(_scan(src.windows(0), 0, size, size, _OFFLOAD))
                if not bundles:
                    raise UserError(f"{path}: not an ELF object, archive, code object or wheel; {_WHAT}")
                yield FileReport(str(path), None, bundles)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


_WHAT = "give a .so, .o, .a, code object (.co, .hsaco), wheel or a directory of them"


def iter_reports(paths: list[str | os.PathLike[str]]) -> Iterator[FileReport]:
    """Reports for every object in ``paths`` (files, wheels, archives, directories)."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for sub in sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
                yield from _report_file(sub, explicit=False)
        elif path.exists():
            refuse_special(path, _WHAT.removeprefix("give "))
            yield from _report_file(path, explicit=True)
        else:
            raise UserError(f"{path}: no such file or directory")


def inspect_paths(
    paths: list[str | os.PathLike[str]],
    required: tuple[str, ...] = (),
    *,
    on_file: Callable[[FileReport], None] | None = None,
) -> Report:
    """Inspect ``paths`` and check every bundle against ``required`` (target IDs, sm_XX)."""
    report = Report()
    for fr in iter_reports(paths):
        report.files.append(fr)
        report.missing.extend(missing_archs(fr, required))
        if on_file:
            on_file(fr)
    return report


def missing_archs(fr: FileReport, required: tuple[str, ...]) -> list[Missing]:
    """Required archs that some bundle of ``fr`` holds no code for.

    A bundle is checked only against requirements of its own vendor (AMD targets against
    gfx names, CUDA fatbins against sm_XX), and only if it holds device code at all.
    """
    out = []
    for index, bundle in enumerate(fr.bundles):
        targets = bundle.targets
        for want in required:
            relevant = [t for t in targets if _is_cuda(t) == _is_cuda(want)]
            if relevant and not covers(relevant, want):
                out.append(Missing(fr.path, fr.member, index, want))
    return out


# -------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m rocmforge inspect``."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".so, .o, .a, code object, wheel or dir")
    parser.add_argument(
        "--require",
        metavar="ARCHS",
        help="comma-separated archs every bundle must cover (gfx90a,gfx942 or sm_90); exit 1 if not",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON report on stdout")


def main(args: argparse.Namespace) -> int:
    """Print what each object holds; exit 1 when a required arch is missing from a bundle, or
    when ``--require`` finds no GPU code to check at all."""
    # `is not None`: an empty --require "" is a mistake to report, not "nothing required".
    required = parse_required(args.require) if args.require is not None else ()
    report = inspect_paths(args.paths, required)
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_table(report, required)
    # No GPU code at all cannot satisfy --require: the wrong directory must not pass the gate.
    unchecked = bool(required) and not any(f.bundles for f in report.files)
    return 1 if report.missing or unchecked else 0


def _print_table(report: Report, required: tuple[str, ...]) -> None:
    from rich.table import Table

    from rocmforge.console import console

    table = Table(title="GPU code objects", show_lines=False)
    for column in ("file", "bundles", "archs", "missing"):
        table.add_column(column)
    missing: dict[tuple[str, str | None], set[str]] = {}
    for m in report.missing:
        missing.setdefault((m.path, m.member), set()).add(m.arch)
    for fr in report.files:
        name = f"{fr.path}:{fr.member}" if fr.member else fr.path
        lost = missing.get((fr.path, fr.member), set())
        table.add_row(
            name,
            str(len(fr.bundles)),
            " ".join(fr.archs) or "-",
            f"[red]{' '.join(sorted(lost))}[/]" if lost else ("ok" if required and fr.bundles else ""),
        )
    console.print(table)
    with_code = sum(1 for f in report.files if f.bundles)
    console.print(f"{len(report.files)} objects, {with_code} with GPU code, {len(report.missing)} gaps")
    if not required:
        return
    # The verdict of --require in one line, last, where a log reader (or `tail -1`) looks.
    wanted = ",".join(required)
    if report.missing:
        archs = ",".join(sorted({m.arch for m in report.missing}))
        where = sorted({f"{m.path}:{m.member}" if m.member else m.path for m in report.missing})
        console.print(
            f"FAIL: --require {wanted}: {archs} missing from {len(where)} object(s): {', '.join(where)}",
            style="bold red",
            markup=False,
            soft_wrap=True,
        )
    elif with_code:
        console.print(f"OK: --require {wanted}: every GPU bundle covers it", style="green", markup=False)
    else:
        verdict = f"FAIL: --require {wanted}: no GPU code found, so nothing covers it"
        console.print(verdict, style="bold red", markup=False)
