"""``python -m rocmforge arch``: which GPUs a machine has, from sysfs, tools or saved tool output.

Sources, best first: the KFD topology in sysfs (``gfx_target_version``), ``rocminfo``, ``amd-smi``
and ``rocm-smi``. Saved output of those tools is what users paste into tickets, so the parsers
read real, messy text: padded columns, many GPUs, CPU agents first, integrated GPUs beside
discrete ones, summaries cut with grep, pastes whose newlines were lost, decimal
``gfx_target_version`` numbers in place of gfx names, and the digit-wise names some rocm-smi and
amd-smi releases printed (``gfx9008`` for gfx908, ``gfx11003`` for gfx1103).

CLI contract (other tools parse it; keep it stable)::

    python -m rocmforge arch [FILE ...] [--json]
    {"gpus": [{"arch": "gfx942", "target_id": "gfx942:sramecc+:xnack-" | null,
               "name": "AMD Instinct MI300X" | null}, ...],
     "archs": ["gfx942"]}

Exit status: 0 when a GPU was found, 1 when none, 2 when the input cannot be read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rocmforge.arch import KNOWN_PROCESSORS, arch_from_gfx_target_version, arch_from_product, parse_target_id
from rocmforge.errors import UserError
from rocmforge.fsutil import looks_binary, refuse_special

KFD_TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"
TOOL_TIMEOUT_S = 15


@dataclass(frozen=True)
class Gpu:
    """One GPU agent: its processor, full target ID when the source prints one, product name."""

    arch: str
    target_id: str | None = None
    name: str | None = None
    source: str = ""  # where it was read: "kfd", "rocminfo", a file name, ...

    def to_json(self) -> dict[str, str | None]:
        """The CLI contract's per-GPU object."""
        return {"arch": self.arch, "target_id": self.target_id, "name": self.name}


@dataclass
class _Agent:
    """A GPU being assembled while a parser walks the text."""

    arch: str | None = None
    target_id: str | None = None
    name: str | None = None
    device_id: str | None = None

    def finish(self, source: str) -> Gpu | None:
        arch = self.arch or arch_from_product(self.device_id) or arch_from_product(self.name)
        return Gpu(arch, self.target_id, self.name or None, source) if arch else None


def _digitwise_names() -> dict[str, str]:
    """Names some tools made of ``gfx_target_version`` digit by digit -> the real processor.

    rocm-smi (ROCm 6.1, ``GFX Version``/``GFX VER``) and amd-smi before ROCm 6.3.2
    (``TARGET_GRAPHICS_VERSION``) wrote major, a two-digit minor and the stepping in decimal:
    ``gfx9008`` for gfx908, ``gfx11003`` for gfx1103, ``gfx90010`` for gfx90a. Other tools joined
    the three fields in decimal (``gfx9010`` for gfx90a). The gfx name spells minor and stepping
    as one hex digit each, so the forms differ from the real name exactly when one of those
    spellings is not the name itself; a form that is a real processor name is never remapped.
    """
    names: dict[str, str] = {}
    for processor in KNOWN_PROCESSORS:
        major, minor, stepping = processor[3:-2], int(processor[-2], 16), int(processor[-1], 16)
        for form in (f"gfx{major}{minor:02d}{stepping}", f"gfx{major}{minor}{stepping}"):
            if form != processor and form not in KNOWN_PROCESSORS:
                names[form] = processor
    return names


DIGITWISE_NAMES = _digitwise_names()


def _normalise_arch(token: str) -> str | None:
    """``gfx942``, ``gfx942:sramecc+``, a decimal ``90402`` or a digit-wise ``gfx9042`` -> processor."""
    token = token.strip().strip("'\"").lower()
    if token.isdigit():
        return arch_from_gfx_target_version(token)
    try:
        processor = parse_target_id(token).processor
    except ValueError:
        return None
    return DIGITWISE_NAMES.get(processor, processor)


# --- rocminfo -----------------------------------------------------------------------------
# One token stream instead of line parsing, so pastes with lost newlines read the same.
# "Marketing Name" ends at a run of padding, a newline or the key rocminfo prints after it.
_ROCMINFO_TOKENS = re.compile(
    r"(?P<agent>\bAgent\s+\d+\b)"
    r"|Marketing Name:[ \t]*(?P<mkt>.*?)(?=[ \t]{2,}|\n|\s+(?:Vendor Name|Uuid|Feature):|$)"
    r"|(?<!Vendor )\bName:\s*(?P<name>\S*)"
    r"|(?P<isa>amdgcn-amd-amdhsa--\S+)"
)


def parse_rocminfo(text: str, source: str = "rocminfo") -> list[Gpu]:
    """GPU agents in ``rocminfo`` output, whole or cut (grep, excerpts, lost newlines)."""
    agents: list[_Agent] = []
    current: _Agent | None = None  # None: outside any agent, or inside a CPU agent
    for m in _ROCMINFO_TOKENS.finditer(text):
        if m.group("agent"):
            current = None
        elif m.group("mkt") is not None:
            if current is not None and current.name is None:
                current.name = m.group("mkt").strip() or None
        else:
            value = m.group("name") if m.group("name") is not None else m.group("isa")
            isa = value.split("amdgcn-amd-amdhsa--", 1)[1] if "amdgcn-amd-amdhsa--" in value else None
            if isa is not None:
                if "generic" in isa:  # ROCm 6.3+ lists the generic ISA after the real one
                    continue
                arch = _normalise_arch(isa)
                if arch is None:
                    continue
                # An ISA line belongs to the agent above it, unless that agent already has one
                # or is another processor: then it is a grep'ed summary and starts a GPU.
                if current is None or current.target_id or current.arch != arch:
                    current = _Agent(arch=arch)
                    agents.append(current)
                current.target_id = str(parse_target_id(isa))
            elif value.lower().startswith("gfx") and _normalise_arch(value):
                current = _Agent(arch=_normalise_arch(value))
                agents.append(current)
            else:
                current = None  # a CPU (or other non-GPU) agent's name
    return [g for a in agents if (g := a.finish(source))]


# --- amd-smi (text and JSON) ----------------------------------------------------------------
_AMDSMI_TOKENS = re.compile(
    r"(?P<gpu>(?:^|\s)GPU:\s*(?P<index>\d+)\b|\"gpu\":\s*(?P<jindex>\d+))"
    r"|(?P<other>(?:^|\s)(?:AI_NIC|NIC|CPU|CPU_CORE):\s*\d+\b)"
    r"|\"?(?P<key>market_name|target_graphics_version|device_id)\"?\s*:\s*"
    r"(?:\"(?P<jvalue>[^\"]*)\"|(?P<value>.*?)(?=\s+[A-Z][A-Z_]{2,}:|\n|$))",
    re.IGNORECASE | re.MULTILINE,
)


def parse_amdsmi(text: str, source: str = "amd-smi") -> list[Gpu]:
    """GPUs in ``amd-smi static``/``list`` text or ``--json`` output (also truncated JSON).

    Blocks with the same GPU index (``amd-smi list`` then ``amd-smi static`` in one paste) are
    one GPU. ``amd-smi static | grep TARGET_GRAPHICS_VERSION`` (no ``GPU:`` lines) lists one GPU
    per line.
    """
    agents: dict[str, _Agent] = {}
    current: _Agent | None = None
    headers = False  # a "GPU: n" or another device's header was seen: fields belong to it
    for m in _AMDSMI_TOKENS.finditer(text):
        if m.group("gpu"):
            index = m.group("index") or m.group("jindex")
            current = agents.setdefault(index, _Agent())
            headers = True
        elif m.group("other"):
            current, headers = None, True
        elif not headers and m.group("key").lower() == "target_graphics_version":
            current = agents.setdefault(f"line{len(agents)}", _Agent())
            current.arch = _normalise_arch(m.group("jvalue") or m.group("value") or "")
        elif current is not None:
            value = (m.group("jvalue") if m.group("jvalue") is not None else m.group("value")).strip()
            key = m.group("key").lower()
            if not value or value.upper() == "N/A":
                continue
            if key == "market_name":
                current.name = current.name or value
            elif key == "device_id":
                current.device_id = value
            else:
                current.arch = _normalise_arch(value) or current.arch
    return [g for a in agents.values() if (g := a.finish(source))]


# --- rocm-smi (text, --json, --csv, concise table) ----------------------------------------------
_ROCMSMI_KEYS = "Card [Ss]eries|Card [Mm]odel|Device Name|Marketing Name|GFX Version|Device ID"
_ROCMSMI_TOKENS = re.compile(
    rf"(?P<gpu>GPU\[(?P<index>\d+)\]|\"card(?P<jindex>\d+)\")"
    rf"|(?P<key>{_ROCMSMI_KEYS})\"?\s*:\s*(?:\"(?P<jvalue>[^\"]*)\"|(?P<value>[^\n]*?)(?=\s*GPU\[|\n|$))"
)
# Concise table rows of ROCm 6: "0       2     0x74a1,   32700  39.0°C ..."
_CONCISE_ROW = re.compile(r"(?<!\S)(?P<index>\d+)\s+\d+\s+(?P<did>0x[0-9a-fA-F]{4}),")


def parse_rocmsmi(text: str, source: str = "rocm-smi") -> list[Gpu]:
    """GPUs in ``rocm-smi`` output: ``--showproductname`` (text, --json, --csv) or the table."""
    agents: dict[str, _Agent] = {}
    current: _Agent | None = None
    for m in _ROCMSMI_TOKENS.finditer(text):
        if m.group("gpu"):
            current = agents.setdefault(m.group("index") or m.group("jindex"), _Agent())
        elif current is not None:
            _rocmsmi_field(current, m.group("key"), m.group("jvalue") or m.group("value") or "")
    agents_csv = _rocmsmi_csv(text)
    for index, agent in agents_csv.items():
        agents.setdefault(f"csv{index}", agent)
    if not agents:
        for row in _CONCISE_ROW.finditer(text):
            agents[row.group("index")] = _Agent(device_id=row.group("did"))
    return [g for a in agents.values() if (g := a.finish(source))]


def _rocmsmi_field(agent: _Agent, key: str, value: str) -> None:
    value = value.strip()
    key = key.lower()
    if not value or value.upper() == "N/A":
        return
    if key == "gfx version":
        # One token: a paste whose newlines were lost runs on into the next "=====" banner.
        agent.arch = _normalise_arch(value.split()[0]) or agent.arch
    elif re.fullmatch(r"0x[0-9a-fA-F]{3,4}", value):
        # Old rocm-smi printed the PCI device ID as "Card series"; keep it for the arch lookup.
        agent.device_id = agent.device_id or (value if key in ("card series", "device id") else None)
    elif agent.name is None:
        agent.name = value


def _rocmsmi_csv(text: str) -> dict[str, _Agent]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("device,") and ("Card" in line or "GFX" in line):
            header = [h.strip() for h in line.split(",")]
            agents: dict[str, _Agent] = {}
            for row in lines[i + 1 :]:
                if not row.startswith("card"):
                    break
                # A paste cut mid-row has fewer cells than the header: zip without strict.
                cells = row.split(",", len(header) - 1)
                agent = agents.setdefault(cells[0], _Agent())
                for key, value in zip(header[1:], cells[1:], strict=False):
                    if re.fullmatch(_ROCMSMI_KEYS, key):
                        _rocmsmi_field(agent, key, value)
            return agents
    return {}


# --- KFD properties, PyTorch device properties, anything else ----------------------------------
_KFD_TOKEN = re.compile(r"\bgfx_target_version\s+(\d+)")
_TORCH_TOKEN = re.compile(
    r"(?:name=['\"](?P<name>[^'\"]+)['\"]|GPU:\s+(?P<gpu>[A-Za-z][^\n]*?)(?=\s+\w+:|\n|$))"
    r"|gcnArchName\W+(?P<target>gfx[0-9a-z]+(?::[a-z]+[+-])*)"
)
_LOOSE_TOKEN = re.compile(r"\bgfx[0-9a-f]{3,4}(?::(?:sramecc|xnack)[+-])*(?![\w-])")


def parse_kfd_properties(text: str, source: str = "kfd") -> list[Gpu]:
    """GPUs in KFD topology ``properties`` text (CPU nodes have ``gfx_target_version 0``)."""
    archs = (arch_from_gfx_target_version(m.group(1)) for m in _KFD_TOKEN.finditer(text))
    return [Gpu(a, None, None, source) for a in archs if a]


def parse_torch(text: str, source: str = "torch") -> list[Gpu]:
    """GPUs in printed PyTorch device properties (``gcnArchName='gfx942:sramecc+:xnack-'``)."""
    gpus: list[Gpu] = []
    name = None
    for m in _TORCH_TOKEN.finditer(text):
        if m.group("target"):
            tid = parse_target_id(m.group("target"))
            full = str(tid) if ":" in m.group("target") else None
            gpus.append(Gpu(tid.processor, full, name, source))
            name = None
        else:
            name = (m.group("name") or m.group("gpu")).strip()
    return gpus


def parse_loose(text: str, source: str = "text") -> list[Gpu]:
    """Last resort for text of no known format: each gfx name mentioned, once, in order."""
    seen: dict[str, Gpu] = {}
    for m in _LOOSE_TOKEN.finditer(text):
        tid = parse_target_id(m.group(0))
        if tid.processor not in seen:
            seen[tid.processor] = Gpu(tid.processor, str(tid) if ":" in m.group(0) else None, None, source)
    return list(seen.values())


# Formats, most informative first; a paste holding several tools' output of one machine is
# read with the first format that finds a GPU, so nothing is counted twice.
FORMATS: tuple[tuple[str, re.Pattern[str], Callable[[str, str], list[Gpu]]], ...] = (
    (
        "rocminfo",
        re.compile(r"HSA Agents|amdgcn-amd-amdhsa--|Marketing Name:|\bName:\s+gfx"),
        parse_rocminfo,
    ),
    ("amd-smi", re.compile(r"target_graphics_version|market_name|\bGPU:\s*\d", re.I), parse_amdsmi),
    (
        "rocm-smi",
        re.compile(r"ROCm System Management|GPU\[\d+\]|\"card\d+\"|^device,Card", re.M),
        parse_rocmsmi,
    ),
    ("kfd", _KFD_TOKEN, parse_kfd_properties),
    ("torch", re.compile(r"gcnArchName"), parse_torch),
)


def parse_text(text: str, source: str = "text") -> tuple[str, list[Gpu]]:
    """Detect the format of saved tool output and return ``(format, gpus)``.

    ``format`` is the first one whose markers the text carries, even when it lists no GPU
    (rocminfo with only a CPU agent); ``"text"`` when only loose gfx names were found.
    """
    first = None
    for name, marker, parser in FORMATS:
        if marker.search(text):
            first = first or name
            gpus = parser(text, source)
            if gpus:
                return name, gpus
    if first:
        return first, []
    gpus = parse_loose(text, source)
    return ("text" if gpus else "unknown"), gpus


def read_kfd_topology(root: Path | str = "/") -> list[Gpu] | None:
    """GPUs from the KFD topology under ``root`` (``None`` when there is no KFD at all).

    Nodes are read in numeric order, which is the order rocminfo lists agents in. The product
    name comes from the DRM render node when the driver publishes one.
    """
    nodes_dir = Path(root) / KFD_TOPOLOGY
    if not nodes_dir.is_dir():
        return None
    gpus: list[Gpu] = []
    nodes = sorted((p for p in nodes_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    for node in nodes:
        try:
            props = dict(
                line.split(None, 1) for line in (node / "properties").read_text().splitlines() if " " in line
            )
        except OSError:
            continue
        arch = arch_from_gfx_target_version(props.get("gfx_target_version", "0"))
        if arch is None:
            continue
        name = None
        minor = props.get("drm_render_minor", "").strip()
        if minor.isdigit():
            product = Path(root) / f"sys/class/drm/renderD{minor}/device/product_name"
            try:
                name = product.read_text().strip() or None
            except OSError:
                name = None
        gpus.append(Gpu(arch, None, name, "kfd"))
    return gpus


# Tools tried, in order, when the machine has no KFD topology we can read.
TOOLS: tuple[tuple[str, tuple[str, ...], Callable[[str, str], list[Gpu]]], ...] = (
    ("rocminfo", (), parse_rocminfo),
    ("amd-smi", ("static", "--asic"), parse_amdsmi),
    ("rocm-smi", ("--showproductname",), parse_rocmsmi),
)


def detect_local(
    *, root: Path | str = "/", environ: Mapping[str, str] | None = None
) -> tuple[list[Gpu], list[str]]:
    """This machine's GPUs and, when there are none, the notes that say why."""
    environ = os.environ if environ is None else environ
    notes: list[str] = []
    gpus = read_kfd_topology(root)
    if gpus:
        return gpus, notes
    if gpus is None:
        notes.append(
            f"no KFD topology at /{KFD_TOPOLOGY} (amdgpu driver not loaded, or a container "
            "started without --device=/dev/kfd)"
        )
    else:
        notes.append("the KFD topology lists no GPU node")
    search_path = environ.get("PATH", os.defpath)
    for tool, args, parser in TOOLS:
        exe = shutil.which(tool, path=search_path)
        if exe is None:
            continue
        try:
            proc = subprocess.run(
                [exe, *args],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=TOOL_TIMEOUT_S,
                env=dict(environ),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            notes.append(f"{tool}: {exc}")
            continue
        found = parser(proc.stdout, tool)
        if found:
            return found, notes
        # The tool's own last word (rocminfo: "ROCk module is NOT loaded") says why.
        last = next(
            (
                ln.strip()
                for out in (proc.stdout, proc.stderr)
                for ln in reversed(out.splitlines())
                if ln.strip()
            ),
            "",
        )
        notes.append(f"{tool}: no GPU agent" + (f" ({_strip_ansi(last)})" if last else ""))
    return [], notes


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# rocminfo for a node of 8 GPUs is about 300 KiB, amd-smi's JSON less: anything far larger is
# another file, and reading it whole cost 42 s and 414 MB for a 200 MB one.
MAX_INPUT = 16 << 20


def read_input(path: str) -> str:
    """A saved tool output (``-`` = stdin) as text; unreadable input is a ``UserError`` (exit 2).

    Read in blocks, at most :data:`MAX_INPUT` bytes, stopping at the first binary block.
    """
    what = "the saved text output of rocminfo, amd-smi or rocm-smi"
    if path != "-":
        refuse_special(path, what)
    blocks, size = [], 0
    try:
        with contextlib.nullcontext(sys.stdin.buffer) if path == "-" else open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                if looks_binary(block):
                    raise UserError(f"{path}: binary file; pass {what}")
                size += len(block)
                if size > MAX_INPUT:
                    raise UserError(
                        f"{path}: larger than {MAX_INPUT >> 20} MiB, not tool output; pass {what}"
                    )
                blocks.append(block)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})", exit_code=2) from None
    return b"".join(blocks).decode("utf-8", errors="replace")


def result_json(gpus: list[Gpu]) -> dict:
    """The ``--json`` document of the CLI contract."""
    return {"gpus": [g.to_json() for g in gpus], "archs": sorted({g.arch for g in gpus})}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m rocmforge arch``."""
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="saved output of rocminfo, amd-smi or rocm-smi ('-' = stdin); none = this machine",
    )
    parser.add_argument("--json", action="store_true", help="print the machine-readable result")


def main(args: argparse.Namespace) -> int:
    """List GPU archs; exit 0 when a GPU was found, 1 when none, 2 on unreadable input."""
    gpus: list[Gpu] = []
    notes: list[str] = []
    if args.files:
        for path in args.files:
            fmt, found = parse_text(read_input(path), source=path)
            if fmt == "text":
                notes.append(f"{path}: not rocminfo/amd-smi/rocm-smi output; listed each gfx name once")
            elif not found:
                notes.append(f"{path}: no GPU agent found (read as {fmt} output)")
            gpus.extend(found)
    else:
        gpus, notes = detect_local()
    if args.json:
        print(json.dumps(result_json(gpus), indent=2))
    else:
        for g in gpus:
            print(f"{g.arch:<9} {g.target_id or '-':<26} {g.name or '-'}  ({g.source})")
        # Only names the config accepts: the text may hold a typo or a GPU newer than our table.
        usable = [a for a in result_json(gpus)["archs"] if a in KNOWN_PROCESSORS]
        if usable:
            # Quoted and exported as `env --shell` prints it: pasted into a shell, an unquoted
            # "a;b" would set only a and run b as a command, and an unexported variable never
            # reaches nox.
            print(f"export PYTORCH_ROCM_ARCH={shlex.quote(';'.join(usable))}")
    for arch in sorted({g.arch for g in gpus} - set(KNOWN_PROCESSORS)):
        notes.append(
            f"{arch} is not a GPU arch rocmforge knows (a typo in the text, or a GPU newer than "
            "rocmforge/arch.py); left out of PYTORCH_ROCM_ARCH"
        )
    for note in notes:
        print(f"rocmforge arch: {note}", file=sys.stderr)
    if not gpus:
        print(
            "rocmforge arch: no GPU found; name the targets yourself in build.arch or "
            "PYTORCH_ROCM_ARCH (e.g. gfx942) - without them hipcc silently builds for gfx803",
            file=sys.stderr,
        )
        return 1
    return 0
