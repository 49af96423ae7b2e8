"""AMD GPU architecture names: the known targets, target-ID parsing and user-input validation.

A *target ID* is a processor name plus optional feature settings, as LLVM's AMDGPU docs define
it: ``gfx942``, ``gfx942:sramecc+:xnack-``, ``gfx90a:xnack+``. ``PYTORCH_ROCM_ARCH`` takes a
semicolon-separated list of these; a comma-separated string is read by PyTorch as one bogus
arch, so we refuse it with the fix instead.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from rocmforge.errors import UserError

# Processor -> product family. Source: LLVM AMDGPUUsage "Processors" table.
KNOWN_PROCESSORS: dict[str, str] = {
    "gfx803": "Fiji/Polaris (GCN 3/4)",
    "gfx900": "Vega 10 (MI25)",
    "gfx906": "Vega 20 (MI50/MI60, Radeon VII)",
    "gfx908": "CDNA 1 (MI100)",
    "gfx90a": "CDNA 2 (MI210/MI250/MI250X)",
    "gfx90c": "Renoir/Cezanne APU",
    "gfx940": "CDNA 3 (MI300 early)",
    "gfx941": "CDNA 3 (MI300 early)",
    "gfx942": "CDNA 3 (MI300A/MI300X/MI325X)",
    "gfx950": "CDNA 4 (MI350X/MI355X)",
    "gfx1010": "RDNA 1 (RX 5700)",
    "gfx1011": "RDNA 1",
    "gfx1012": "RDNA 1",
    "gfx1030": "RDNA 2 (RX 6800/6900, W6800)",
    "gfx1031": "RDNA 2 (RX 6700)",
    "gfx1032": "RDNA 2 (RX 6600)",
    "gfx1034": "RDNA 2 (RX 6500)",
    "gfx1035": "RDNA 2 APU (Rembrandt)",
    "gfx1036": "RDNA 2 APU (Raphael iGPU)",
    "gfx1100": "RDNA 3 (RX 7900 XTX, W7900)",
    "gfx1101": "RDNA 3 (RX 7800/7700, W7800)",
    "gfx1102": "RDNA 3 (RX 7600)",
    "gfx1103": "RDNA 3 APU (Phoenix)",
    "gfx1150": "RDNA 3.5 APU (Strix Point)",
    "gfx1151": "RDNA 3.5 APU (Strix Halo)",
    "gfx1152": "RDNA 3.5 APU (Krackan)",
    "gfx1200": "RDNA 4 (RX 9060)",
    "gfx1201": "RDNA 4 (RX 9070, R9700)",
}

# Generic targets and the processors whose code objects they can run on (LLVM AMDGPUUsage,
# "Generic processors"). gfx9-4-generic covers gfx940-942 but *not* gfx950.
GENERIC_TARGETS: dict[str, frozenset[str]] = {
    "gfx9-generic": frozenset({"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"}),
    "gfx9-4-generic": frozenset({"gfx940", "gfx941", "gfx942"}),
    "gfx10-1-generic": frozenset({"gfx1010", "gfx1011", "gfx1012", "gfx1013"}),
    "gfx10-3-generic": frozenset(
        {"gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"}
    ),
    "gfx11-generic": frozenset(
        {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"}
    ),
    "gfx12-generic": frozenset({"gfx1200", "gfx1201"}),
}

FEATURES = ("sramecc", "xnack")
_TARGET_RE = re.compile(r"^(gfx[0-9a-f]+(?:-[0-9]+)*(?:-generic)?)((?::[a-z]+[+-])*)$")


@dataclass(frozen=True, order=True)
class TargetID:
    """A parsed target ID: processor plus feature settings (``None`` = any)."""

    processor: str
    sramecc: bool | None = None
    xnack: bool | None = None

    def __str__(self) -> str:
        parts = [self.processor]
        for name in FEATURES:
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}{'+' if value else '-'}")
        return ":".join(parts)


def parse_target_id(text: str) -> TargetID:
    """Parse ``gfx942:sramecc+:xnack-`` (or a bare ``gfx942``) into a ``TargetID``.

    Raises ``ValueError`` for text that is not shaped like a target ID at all; whether the
    processor is a known one is checked by :func:`validate_arch`.
    """
    text = text.strip()
    m = _TARGET_RE.match(text)
    if not m:
        raise ValueError(f"not a target ID: {text!r}")
    features: dict[str, bool] = {}
    for feat in filter(None, m.group(2).split(":")):
        name, sign = feat[:-1], feat[-1]
        if name not in FEATURES:
            raise ValueError(f"unknown target feature {name!r} in {text!r}")
        features[name] = sign == "+"
    return TargetID(m.group(1), **features)


def known_arch_names() -> list[str]:
    """Every processor and generic target name we accept."""
    return sorted(KNOWN_PROCESSORS) + sorted(GENERIC_TARGETS)


def validate_arch(text: str, *, key: str = "arch") -> str:
    """Return the normalised target ID for a user-given arch, or raise a one-line ``UserError``.

    ``key`` names where the value came from (``build.arch``, ``PYTORCH_ROCM_ARCH``) so the
    message points at the thing to edit.
    """
    raw = text.strip()
    try:
        tid = parse_target_id(raw.lower())
    except ValueError as exc:
        raise UserError(f"{key}: {exc}; use a name such as gfx942 or gfx90a:xnack-") from None
    if tid.processor not in KNOWN_PROCESSORS and tid.processor not in GENERIC_TARGETS:
        close = difflib.get_close_matches(tid.processor, known_arch_names(), n=3, cutoff=0.6)
        hint = (
            f"did you mean {' or '.join(close)}?"
            if close
            else "known: " + ", ".join(sorted(KNOWN_PROCESSORS))
        )
        raise UserError(f"{key}: unknown GPU arch {raw!r}; {hint}")
    return str(tid)


def parse_arch_list(value: str | list[str] | tuple[str, ...], *, key: str) -> tuple[str, ...]:
    """Parse an arch list from a config array or a ``PYTORCH_ROCM_ARCH``-style string.

    Strings are semicolon-separated (also accepting spaces, as PyTorch's CMake does). Commas
    are refused with the fix, because PyTorch would take ``gfx90a,gfx942`` as one bogus arch.
    An empty list is an error: without archs hipcc silently targets its default (gfx803).
    """
    if isinstance(value, str):
        if "," in value:
            fixed = ";".join(p.strip() for p in value.split(",") if p.strip())
            raise UserError(f"{key}: {value!r} is comma-separated; separate archs with ';' (e.g. {fixed!r})")
        items = [p for p in re.split(r"[;\s]+", value) if p]
    else:
        items = list(value)
    if not items:
        raise UserError(
            f"{key}: the arch list is empty; name the GPUs to build for, e.g. gfx942 or "
            "gfx90a;gfx942 (`python -m rocmforge arch` shows this machine's)"
        )
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UserError(f"{key}: expected arch names as strings, got {item!r}")
        arch = validate_arch(item, key=key)
        if arch not in out:
            out.append(arch)
    return tuple(out)


def arch_from_gfx_target_version(value: int | str) -> str | None:
    """Decode KFD's decimal ``gfx_target_version`` (``90402`` -> ``gfx942``); ``None`` for CPUs.

    The kernel encodes major * 10000 + minor * 100 + stepping, and the gfx name spells minor and
    stepping as one hex digit each: ``90010`` is gfx90a, ``110000`` gfx1100, ``90012`` gfx90c.
    """
    try:
        number = int(str(value).strip())
    except ValueError:
        return None
    major, minor, stepping = number // 10000, (number // 100) % 100, number % 100
    if number <= 0 or major == 0 or minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


# Product names that identify the processor when a tool prints no gfx name (old rocm-smi,
# amd-smi pastes cut before TARGET_GRAPHICS_VERSION). Source: LLVM AMDGPUUsage "Processors"
# table; ROCm "GPU hardware specifications" table.
PRODUCT_ARCH: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), arch)
    for pattern, arch in (
        (r"\bMI35[05]X?\b", "gfx950"),
        (r"\bMI3(?:00[AX]?|25X?)\b", "gfx942"),
        (r"\bMI2(?:10|50X?)\b", "gfx90a"),
        (r"\bMI100\b", "gfx908"),
        (r"\bMI(?:50|60)\b|\bRadeon (?:Pro )?VII\b", "gfx906"),
        (r"\bRX 79\d0\b|\bW7900\b", "gfx1100"),
        (r"\bRX 7[78]\d0\b|\bW7[78]00\b", "gfx1101"),
        (r"\bRX 76\d0\b|\bW7600\b", "gfx1102"),
        (r"\bRX 90[67]0\b|\bR9700\b", "gfx1201"),
        (r"\bRX 6[89]\d0\b|\bW6800\b", "gfx1030"),
    )
)

# PCI device IDs seen in real tool output (rocm-smi's concise table, old "Card series" lines,
# amd-smi DEVICE_ID), each checked against a rocminfo/amd-smi paste that printed both.
DEVICE_ID_ARCH: dict[int, str] = {
    0x738C: "gfx908",  # MI100
    0x740C: "gfx90a",  # MI250X/MI250 (rocminfo Chip ID 0x740c, Name gfx90a)
    0x740F: "gfx90a",  # MI210
    0x74A1: "gfx942",  # MI300X (rocminfo Chip ID 0x74a1, Name gfx942)
    0x75A0: "gfx950",  # MI350X (amd-smi DEVICE_ID 0x75a0, TARGET_GRAPHICS_VERSION gfx950)
    0x744C: "gfx1100",  # RX 7900 XTX (rocminfo Chip ID 0x744c, Name gfx1100)
    0x747E: "gfx1101",  # RX 7800 XT (amd-smi device_id 0x747e, gfx1101)
}


def arch_from_product(text: str | None) -> str | None:
    """The processor a product name or PCI device ID (``0x74a1``) stands for, if we know it."""
    if not text:
        return None
    hex_id = re.fullmatch(r"\s*0x([0-9a-fA-F]{3,4})\s*", text)
    if hex_id:
        return DEVICE_ID_ARCH.get(int(hex_id.group(1), 16))
    for pattern, arch in PRODUCT_ARCH:
        if pattern.search(text):
            return arch
    return None
