"""The consumer contract: what a node must provide before a wheel of ours can load on it.

Every wheel rocmforge publishes states, from its own ELF members (never from the build config):

- the **ROCm** it needs: the ROCm sonames its shared objects list in ``DT_NEEDED`` and the
  version range of the ROCm it was built with (``>=7.2,<7.3``: same major.minor; AMD's own
  wheels are built per ROCm minor, and the math libraries' kernels are not promised across
  minors);
- the **glibc** and **libstdc++** floors: the newest ``GLIBC_``, ``GLIBCXX_`` and ``CXXABI_``
  symbol versions its members reference (``.gnu.version_r``), so a wheel compiled with gcc 13
  says ``GLIBCXX (>=3.4.32)`` only when it really uses a gcc-13 symbol;
- the **Python** tag and the **GPU archs** its offload bundles hold;
- an honest **platform tag**: auditwheel (``repair --exclude`` for the libraries the node
  provides) picks the manylinux policy and vendors the few other libraries it finds; a wheel
  it cannot repair keeps ``linux_x86_64`` and the contract says why;
- **no build-host paths in RUNPATH**: entries that are not ``$ORIGIN``-relative (the build
  host's ``/opt/rocm-7.2.0/lib``, a pyenv's lib dir) are removed with patchelf. The node's
  ROCm is then found the way ROCm's own packages find it: ``/etc/ld.so.conf.d/rocm.conf``
  (written by the ROCm packages) or ``LD_LIBRARY_PATH=$ROCM_PATH/lib``. auditwheel already
  drops outside-wheel entries of the files it grafts a library for; ``runpath_removed`` in
  the record lists what rocmforge removed from the others.

Where it is written: ``Requires-External`` lines in METADATA (convention below), the
``contract`` key of ``<dist-info>/rocmforge.json``, and, for the whole wheelhouse,
``wheelhouse/stack.json`` plus a table on the index page (:func:`stack_document`).

``Requires-External`` convention (core metadata 1.2: a name, optionally a version in
parentheses)::

    Requires-External: rocm (>=7.2,<7.3)         the ROCm release series
    Requires-External: libamdhip64.so.7          each ROCm soname linked, exactly as in DT_NEEDED
    Requires-External: GLIBC (>=2.34)            newest symbol version referenced, per namespace
    Requires-External: GLIBCXX (>=3.4.32)
    Requires-External: CXXABI (>=1.3.15)

The upper-case names are the ELF symbol-version namespaces themselves, so a reader compares
them with ``strings libstdc++.so.6 | grep GLIBCXX_`` without a table of gcc releases.
"""

from __future__ import annotations

import fnmatch
import html
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

from packaging.utils import parse_wheel_filename

from rocmforge.build.wheelfile import read_member
from rocmforge.verify import inspect

STACK_FILE = "stack.json"
STACK_FORMAT = 1

# Libraries the node provides, by build backend: auditwheel never vendors them (--exclude),
# and the ones a wheel links are named in its Requires-External. ROCm's runtime, its math and
# communication libraries, and the kernel driver's thunk; CUDA's driver and toolkit runtime.
PROVIDED: dict[str, tuple[str, ...]] = {
    "rocm": (
        "libamdhip64.so*",
        "libhiprtc.so*",
        "libhsa-runtime64.so*",
        "libhsakmt.so*",
        "libamd_comgr.so*",
        "librocm-core.so*",
        "librocm_smi64.so*",
        "libamd_smi.so*",
        "librocblas.so*",
        "libhipblas.so*",
        "libhipblaslt.so*",
        "libhipblas-common.so*",
        "librocroller.so*",
        "librocsolver.so*",
        "libhipsolver.so*",
        "librocsparse.so*",
        "libhipsparse.so*",
        "libhipsparselt.so*",
        "librocfft.so*",
        "libhipfft.so*",
        "librocrand.so*",
        "libhiprand.so*",
        "libMIOpen.so*",
        "librccl.so*",
        "libroctx64.so*",
        "libroctracer64.so*",
        "librocprofiler*.so*",
        "libhiptensor.so*",
    ),
    "cuda": ("libcuda.so*", "libcudart.so*", "libcublas*.so*", "libcudnn*.so*", "libnccl.so*", "libnv*.so*"),
    "cpu": (),
}
_ELF_HOST_MACHINES = {62: "x86_64", 183: "aarch64"}  # members for the CPU; AMDGPU code objects are not
_VERSION_RE = re.compile(r"^(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)+)$")
_FLOORS = {"GLIBC": "glibc", "GLIBCXX": "glibcxx", "CXXABI": "cxxabi"}


@dataclass(frozen=True)
class Prepared:
    """A wheel made portable, before its final rewrite (metadata, provenance, version)."""

    wheel: Path  # auditwheel's repaired copy, or the input when it was kept
    contract: dict  # the record: provenance's "contract" key, source of Requires-External
    replaced: dict[str, Path]  # wheel members whose RUNPATH patchelf rewrote -> the new file


def rocm_range(version: str | None) -> str | None:
    """The ROCm release series a build with ROCm ``version`` runs on: ``7.2.1`` -> ``>=7.2,<7.3``."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if not m:
        return None
    major, minor = int(m[1]), int(m[2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _newest(versions: Iterable[str | None]) -> str | None:
    found = [v for v in versions if v]
    return max(found, key=_version_key) if found else None


def provided(soname: str, backend: str) -> bool:
    """Whether the node provides ``soname`` for a ``backend`` build (ROCm's libraries for rocm)."""
    return any(fnmatch.fnmatch(soname, pattern) for pattern in PROVIDED.get(backend, ()))


def _tool_env() -> dict[str, str]:
    """The environment for auditwheel and patchelf: this interpreter's bin dir first on PATH,
    where the ``patchelf`` wheel puts its binary (a venv not activated has it only there)."""
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([bindir, os.environ.get("PATH", os.defpath)])}


def _patchelf() -> str:
    exe = shutil.which("patchelf", path=_tool_env()["PATH"])
    if exe is None:  # a dependency of rocmforge: missing means a broken install, not a user error
        raise RuntimeError("patchelf not found; reinstall rocmforge (pip install -e .)")
    return exe


def _library_names(wheel: Path) -> set[str]:
    """File names of the shared libraries inside ``wheel`` (what it provides to its dependents)."""
    with zipfile.ZipFile(wheel) as zf:
        return {Path(n).name for n in zf.namelist() if re.search(r"\.so(\.|$)", Path(n).name)}


def _host_elf_members(zf: zipfile.ZipFile) -> Iterable[zipfile.ZipInfo]:
    """Members that are ELF files for the CPU (not AMDGPU code objects, not scripts)."""
    for info in zf.infolist():
        if not info.is_dir() and info.file_size >= 20:
            with zf.open(info) as fh:  # inflates only the first bytes
                head = fh.read(20)
            machine = int.from_bytes(head[18:20], "little")
            if head[:4] == inspect.ELF_MAGIC and machine in _ELF_HOST_MACHINES:
                yield info


def _has_host_elf(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return next(iter(_host_elf_members(zf)), None) is not None


def repair(wheel: Path, out_dir: Path, excludes: list[str]) -> tuple[Path, dict]:
    """``auditwheel repair --exclude ...``: the repaired wheel and what auditwheel decided.

    A wheel auditwheel cannot repair (a library it cannot find or vendor) is returned as it
    is, with auditwheel's own reason: its ``linux_x86_64`` tag is then the honest one.
    """
    from importlib.metadata import version

    label = f"auditwheel {version('auditwheel')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "auditwheel", "repair", "-w", str(out_dir)]
    for pattern in excludes:
        argv += ["--exclude", pattern]
    proc = subprocess.run([*argv, str(wheel)], capture_output=True, text=True, env=_tool_env())
    repaired = sorted(out_dir.glob("*.whl"))
    if proc.returncode != 0 or len(repaired) != 1:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        reason = next((ln for ln in reversed(lines) if "Error" in ln or "cannot" in ln.lower()), None)
        reason = reason or (lines[-1] if lines else f"exit {proc.returncode}")
        return wheel, {
            "repaired": False,
            "by": label,
            "reason": reason.removeprefix("ValueError: "),
            "show": _show(wheel),
        }
    before = _library_names(wheel)
    vendored = sorted(_library_names(repaired[0]) - before)
    return repaired[0], {"repaired": True, "by": label, "excluded": excludes, "vendored": vendored}


def _show(wheel: Path) -> dict | None:
    """``auditwheel show --json``'s policy for a wheel it could not repair: the tag its symbol
    versions alone would allow and the libraries it could not locate (None if show fails)."""
    argv = [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_tool_env())
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return None
    missing = sorted(k for k, v in (data.get("external_libs") or {}).items() if v is None)
    return {"overall_tag": data.get("overall_tag"), "sym_tag": data.get("sym_tag"), "not_found": missing}


def _extract_elf(wheel: Path, dest: Path) -> dict[str, Path]:
    """Every host ELF member of ``wheel`` written under ``dest`` (permissions kept)."""
    members: dict[str, Path] = {}
    with zipfile.ZipFile(wheel) as zf:
        for info in _host_elf_members(zf):
            if info.filename.startswith("/") or ".." in Path(info.filename).parts:
                raise ValueError(f"{wheel}: member {info.filename!r} points outside the wheel")
            target = dest / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            target.chmod(((info.external_attr >> 16) & 0o777) | 0o600)  # patchelf writes it
            members[info.filename] = target
    return members


def _relative(entry: str) -> bool:
    return entry.startswith(("$ORIGIN", "${ORIGIN}"))


def strip_runpath(path: Path, info: inspect.ElfDynamic) -> list[str]:
    """Remove the entries of ``path``'s RUNPATH/RPATH that are not ``$ORIGIN``-relative.

    Returns the removed entries (none: the file is left untouched). A DT_RPATH stays a
    DT_RPATH (``--force-rpath``): it is searched before LD_LIBRARY_PATH, a RUNPATH after.
    """
    removed = [e for e in (*info.rpath, *info.runpath) if not _relative(e)]
    if not removed:
        return []
    kept = ":".join(e for e in (*info.rpath, *info.runpath) if _relative(e))
    patchelf = _patchelf()
    if not kept:
        argv = [patchelf, "--remove-rpath", str(path)]
    else:
        argv = [patchelf, *(["--force-rpath"] if info.rpath else []), "--set-rpath", kept, str(path)]
    subprocess.run(argv, check=True, capture_output=True, env=_tool_env())
    return removed


def prepare(
    wheel: str | os.PathLike[str],
    work: str | os.PathLike[str],
    *,
    backend: str,
    rocm_version: str | None,
    dependency_wheels: Iterable[Path] = (),
    repair_tags: bool = True,
) -> Prepared:
    """Make ``wheel`` portable under ``work`` and work out its contract (see the module doc).

    ``dependency_wheels`` (torch's wheel for vLLM) provide libraries the wheel links
    (``libc10.so``): they are neither vendored nor external. ``repair_tags=False`` (a vendor's
    prebuilt wheel) only reads the contract.
    """
    wheel, work = Path(wheel), Path(work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    from_deps = sorted({n for dep in dependency_wheels for n in _library_names(dep)})
    audit: dict = {"repaired": False, "reason": "no shared object inside: nothing for auditwheel to check"}
    if not _has_host_elf(wheel):
        pass  # py3-none-any, or a platform tag the build chose (vLLM's empty target): kept
    elif repair_tags:
        wheel, audit = repair(wheel, work / "repaired", [*PROVIDED.get(backend, ()), *from_deps])
    else:
        audit = {"repaired": False, "reason": "a prebuilt wheel is published as its vendor built it"}
    members = _extract_elf(wheel, work / "elf")
    infos = {arc: inspect.elf_dynamic(path) for arc, path in members.items()}
    removed = {arc: strip_runpath(members[arc], info) for arc, info in infos.items() if info}
    removed = {arc: entries for arc, entries in removed.items() if entries}
    contract = _contract(wheel, infos, backend, rocm_version, set(from_deps), audit)
    contract["runpath_removed"] = removed
    return Prepared(wheel, contract, {arc: members[arc] for arc in removed})


def _contract(
    wheel: Path,
    infos: dict[str, inspect.ElfDynamic | None],
    backend: str,
    rocm_version: str | None,
    from_deps: set[str],
    audit: dict,
) -> dict:
    inside = {Path(arc).name for arc in infos}
    needed = sorted({n for info in infos.values() if info for n in info.needed} - inside - from_deps)
    node_libs = [n for n in needed if provided(n, backend)]
    floors: dict[str, list[str]] = {}
    for info in infos.values():
        for versions in (info.version_needs if info else {}).values():
            for text in versions:
                m = _VERSION_RE.match(text)
                if m:
                    floors.setdefault(_FLOORS[m[1]], []).append(m[2])
    _name, _version, _build, tags = parse_wheel_filename(wheel.name)
    archs = [
        set(report.archs)
        for report in inspect.iter_reports([wheel])
        if report.bundles and not any(t.startswith(("sm_", "compute_")) for t in report.targets)
    ]
    contract = {
        "python": sorted({f"{t.interpreter}-{t.abi}" for t in tags}),
        "platform": sorted({t.platform for t in tags}),
        "auditwheel": audit,
        "backend": backend,
        "rocm": rocm_range(rocm_version) if backend == "rocm" and node_libs else None,
        "rocm_built_with": rocm_version if backend == "rocm" else None,
        "node_libraries": node_libs,
        "system_libraries": [n for n in needed if n not in node_libs],
        "glibc": _newest(floors.get("glibc", ())),
        "glibcxx": _newest(floors.get("glibcxx", ())),
        "cxxabi": _newest(floors.get("cxxabi", ())),
        "gpu_archs": sorted(set.intersection(*archs)) if archs else [],
    }
    contract["requires_external"] = requires_external(contract)
    return contract


def requires_external(contract: dict) -> list[str]:
    """The ``Requires-External`` lines of a contract (the convention in the module doc)."""
    lines = []
    if contract.get("rocm"):
        lines.append(f"rocm ({contract['rocm']})")
    if contract.get("backend") != "cpu":
        lines += contract.get("node_libraries", [])
    for key, namespace in (("glibc", "GLIBC"), ("glibcxx", "GLIBCXX"), ("cxxabi", "CXXABI")):
        if contract.get(key):
            lines.append(f"{namespace} (>={contract[key]})")
    return lines


def add_requires_external(metadata: Message, contract: dict) -> None:
    """Append the contract's ``Requires-External`` lines to METADATA (keeping any already there)."""
    present = set(metadata.get_all("Requires-External") or [])
    for line in contract["requires_external"]:
        if line not in present:
            metadata["Requires-External"] = line


# ------------------------------------------------------------------------- the wheelhouse


def _wheel_contract(path: Path) -> dict | None:
    try:
        data = read_member(path, "rocmforge.json")
        return json.loads(data).get("contract") if data else None
    except (ValueError, zipfile.BadZipFile, OSError):
        return None


def stack_document(entries: Iterable, rocmforge_version: str | None = None) -> dict:
    """``wheelhouse/stack.json``: each wheel's contract and what the whole stack needs.

    ``entries`` are wheelhouse entries (``project``, ``version``, ``path``, ``sha256``). The
    stack needs the union of the wheels' needs: the narrowest ROCm range, every ROCm soname,
    the newest glibc/GLIBCXX/CXXABI floor, every Python tag, and the GPU archs every wheel
    with GPU code covers. A wheel without a contract (a vendor's prebuilt wheel published
    unchanged) is listed with ``contract: null``: its needs are unknown, not empty.
    """
    from rocmforge import __version__

    wheels, contracts = [], []
    for e in entries:
        contract = _wheel_contract(e.path)
        wheels.append(
            {"project": e.project, "version": e.version, "filename": e.path.name, "sha256": e.sha256}
            | {"contract": contract}
        )
        if contract:
            contracts.append(contract)
    ranges = sorted({c["rocm"] for c in contracts if c.get("rocm")})
    gpu = [set(c["gpu_archs"]) for c in contracts if c.get("gpu_archs")]
    stack = {
        "rocm": ranges[0] if len(ranges) == 1 else None,
        "rocm_conflict": ranges if len(ranges) > 1 else [],
        "node_libraries": sorted({n for c in contracts for n in c.get("node_libraries", [])}),
        "glibc": _newest(c.get("glibc") for c in contracts),
        "glibcxx": _newest(c.get("glibcxx") for c in contracts),
        "cxxabi": _newest(c.get("cxxabi") for c in contracts),
        "python": sorted({p for c in contracts for p in c.get("python", [])}),
        "gpu_archs": sorted(set.intersection(*gpu)) if gpu else [],
        "unknown": [w["project"] for w in wheels if w["contract"] is None],
    }
    return {
        "format": STACK_FORMAT,
        "generated_by": f"rocmforge {rocmforge_version or __version__}",
        "stack": stack,
        "wheels": wheels,
    }


def html_table(document: dict) -> str:
    """The stack document as an HTML table for the index page (text only: no links for pip)."""
    head = ["project", "version", "python", "platform", "ROCm", "ROCm libraries", "glibc", "GLIBCXX", "GPU"]
    rows = []
    for w in document["wheels"]:
        c = w["contract"] or {}
        cells = [
            w["project"],
            w["version"],
            " ".join(c.get("python", [])) or "?",
            " ".join(c.get("platform", [])) or "?",
            c.get("rocm") or "-",
            " ".join(c.get("node_libraries", [])) or "-",
            c.get("glibc") or "-",
            c.get("glibcxx") or "-",
            " ".join(c.get("gpu_archs", [])) or "-",
        ]
        if not c:
            cells[2:] = ["unknown (no rocmforge contract)"] + [""] * (len(head) - 3)
        rows.append("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in cells) + "</tr>")
    s = document["stack"]
    summary = (
        f"ROCm {s['rocm'] or 'any'}, glibc >= {s['glibc'] or '-'}, GLIBCXX >= {s['glibcxx'] or '-'}, "
        f"GPU archs {' '.join(s['gpu_archs']) or '-'}; check a node with "
        "`python -m rocmforge check-node --stack stack.json`"
    )
    header = "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
    return (
        f"<h2>What a node needs</h2>\n<p>{html.escape(summary)}</p>\n"
        f"<table>\n{header}\n" + "\n".join(rows) + "\n</table>"
    )
