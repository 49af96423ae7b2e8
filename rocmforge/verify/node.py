"""``python -m rocmforge check-node``: can this node run the wheelhouse? Asked before installing.

The wheelhouse's ``stack.json`` (written with the index, :mod:`rocmforge.build.contract`) says what its
wheels need; this module compares a node with it:

- **ROCm**: the install a process finds (``ROCM_PATH``, ``/opt/rocm``, ...) and its version
  against the stack's range, then every ROCm soname the wheels link, looked up the way the
  dynamic loader looks (``LD_LIBRARY_PATH``, its cache ``/etc/ld.so.cache``, the default
  directories); our wheels carry no RUNPATH into a ROCm tree. A directory ``/etc/ld.so.conf``
  names whose library the cache lacks means ldconfig has not run;
- **GPUs**: each GPU's arch (KFD topology, rocminfo, amd-smi; or saved output with ``--gpus``)
  against the archs of each wheel with GPU code;
- **glibc and libstdc++**: the newest ``GLIBC_``, ``GLIBCXX_``, ``CXXABI_`` versions the
  loader's libc.so.6 and libstdc++.so.6 define, against the stack's floors;
- **Python**: the interpreter that will install (``--python``) against each wheel's tag;
- **/dev/kfd and /dev/dri**: opened by this user.

Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed, 2 when the stack
file cannot be read. ``--json`` prints ``{"ok", "stack", "checks": [{"name", "status", "found",
"fix"}]}``; keep it stable.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmforge import arch_detect, host
from rocmforge.build import contract
from rocmforge.build.doctor import FAIL, JOIN_FIX, OK, WARN, Check, render
from rocmforge.errors import UserError
from rocmforge.fsutil import refuse_special
from rocmforge.verify import checks as verify
from rocmforge.verify import inspect

DEFAULT_STACK = "wheelhouse/stack.json"

NO_GPU_FIX = (
    "load the amdgpu driver (amdgpu-dkms) or start the container with --device=/dev/kfd "
    "--device=/dev/dri; to check another node's GPUs, pass its saved rocminfo with --gpus FILE"
)


def load_stack(source: str) -> dict:
    """The stack document at ``source`` (a path, or an http(s)/file URL of an index's stack.json).

    Anything unreadable is a one-line ``UserError`` (exit status 2).
    """
    hint = "write it with `nox -s index` (or any build) and pass --stack PATH"
    try:
        if "://" in source:
            with urllib.request.urlopen(source, timeout=30) as response:
                raw = response.read()
        else:
            refuse_special(source, "the wheelhouse's stack.json")
            raw = Path(source).read_bytes()
    except (OSError, urllib.error.URLError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise UserError(f"--stack {source}: cannot read ({why}); {hint}", exit_code=2) from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise UserError(f"--stack {source}: not JSON; {hint}", exit_code=2) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("stack"), dict) or "format" not in doc:
        raise UserError(f"--stack {source}: not a rocmforge stack.json (no format/stack keys); {hint}")
    if doc["format"] != contract.STACK_FORMAT:
        raise UserError(
            f"--stack {source}: format {doc['format']!r}, this rocmforge reads format "
            f"{contract.STACK_FORMAT}; use the rocmforge that wrote it",
            exit_code=2,
        )
    return doc


def ld_so_conf_dirs(root: Path) -> dict[Path, str]:
    """Directories ``/etc/ld.so.conf`` names (its ``include`` globs followed) -> the file naming
    each. ldconfig turns them into the loader's cache; they say *why* a directory is searched."""
    dirs: dict[Path, str] = {}
    pending, seen = [root / "etc/ld.so.conf"], set()
    while pending:
        conf = pending.pop(0)
        if conf in seen:
            continue
        seen.add(conf)
        try:
            lines = conf.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if line.startswith("include "):
                pattern = line.split(None, 1)[1]
                base = conf.parent if not pattern.startswith("/") else root
                pending += [Path(p) for p in sorted(glob.glob(str(base / pattern.lstrip("/"))))]
            elif line:
                dirs.setdefault(root / line.lstrip("/"), f"/{conf.relative_to(root)}")
    return dirs


class Loader:
    """Where ld.so finds a library our wheels need, on the node under ``root``.

    Our wheels' RUNPATHs hold only ``$ORIGIN`` entries, so the loader's order is
    ``LD_LIBRARY_PATH``, its cache (``/etc/ld.so.cache``, read with ``ldconfig -p`` as verify
    reads it), then the default directories.
    """

    def __init__(self, root: Path, environ: Mapping[str, str]):
        self.root = root
        self.ld_library_path = [
            root / d.lstrip("/") for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d
        ]
        self.cache = verify.ld_cache(root / "etc/ld.so.cache")
        self.conf = ld_so_conf_dirs(root)

    def find(self, soname: str) -> tuple[Path, str] | None:
        """The file the loader opens for ``soname`` (under ``root``) and why it is searched there."""
        for d in self.ld_library_path:
            if (d / soname).exists():
                return d / soname, "LD_LIBRARY_PATH"
        if soname in self.cache:
            path = self.root / self.cache[soname].lstrip("/")
            conf = self.conf.get(path.parent)
            return path, f"ld.so cache{f', {conf}' if conf else ''}"
        for d in verify.DEFAULT_LIB_DIRS:
            if (self.root / d.lstrip("/") / soname).exists():
                return self.root / d.lstrip("/") / soname, "default directory"
        return None

    def stale(self, soname: str) -> tuple[Path, str] | None:
        """An ld.so.conf directory holding ``soname`` that the cache lacks: ldconfig has not run."""
        return next(((d, conf) for d, conf in self.conf.items() if (d / soname).exists()), None)


def _version_in(version: str | None, spec: str) -> bool:
    try:
        return version is not None and Version(version) in SpecifierSet(spec)
    except (InvalidVersion, InvalidSpecifier):
        return False


def python_fits(tags: list[str], python: str) -> bool:
    """Whether a Python ``X.Y`` may install a wheel with ``interpreter-abi`` tags like
    ``cp311-cp311`` (exactly 3.11), ``cp38-abi3`` (3.8 or newer) or ``py3-none`` (any 3)."""
    major, minor = (int(x) for x in python.split(".")[:2])
    for tag in tags:
        interpreter, _, abi = tag.partition("-")
        if interpreter in ("py3", f"py{major}{minor}") or interpreter == "py2.py3":
            return True
        if interpreter.startswith("cp") and interpreter[2:].isdigit():
            want = (int(interpreter[2]), int(interpreter[3:] or 0))
            if (major, minor) == want or (abi == "abi3" and (major, minor) >= want):
                return True
    return False


def _rocm_checks(stack: dict, root: Path, environ: Mapping[str, str]) -> list[Check]:
    wanted = stack.get("rocm")
    libs = stack.get("node_libraries") or []
    if stack.get("rocm_conflict"):
        ranges = " and ".join(stack["rocm_conflict"])
        return [
            Check(
                "ROCm",
                FAIL,
                f"the wheels were built against different ROCm series ({ranges})",
                "rebuild the wheelhouse against one ROCm",
            )
        ]
    if not wanted and not libs:
        return [Check("ROCm", OK, "the stack links no ROCm library")]
    installs = host.find_rocm_installs(root, environ)
    rocm = installs[0] if installs else None
    checks = []
    if rocm is None:
        checks.append(Check("ROCm", FAIL, "no ROCm found", f"install ROCm {wanted} (amdgpu-install)"))
    else:
        where = f"ROCm {rocm.version or '?'} at {_shown(rocm.root, root)} ({rocm.origin})"
        if not wanted or _version_in(rocm.version, wanted):
            checks.append(Check("ROCm", OK, f"{where}; the stack needs {wanted or 'any'}"))
        else:
            checks.append(
                Check(
                    "ROCm",
                    FAIL,
                    f"{where}; the stack needs {wanted}",
                    f"install ROCm {wanted} and set ROCM_PATH to it, or use a wheelhouse built for this ROCm",
                )
            )
    loader = Loader(root, environ)
    lib_dir = Path(rocm.lib_dir) if rocm and rocm.lib_dir else None
    for soname in libs:
        hit = loader.find(soname)
        if hit is None:
            checks.append(_unresolved(soname, loader, lib_dir, wanted, root))
            continue
        path, why = hit
        found = f"{_shown(str(path), root)} ({why})"
        other = lib_dir is not None and os.path.realpath(path.parent) != os.path.realpath(lib_dir)
        if other:
            checks.append(
                Check(
                    f"library {soname}",
                    WARN,
                    f"{found}, not from {_shown(str(lib_dir), root)}",
                    "two ROCm installs mixed: point ld.so.conf / LD_LIBRARY_PATH at one of them",
                )
            )
        else:
            checks.append(Check(f"library {soname}", OK, found))
    return checks


def _unresolved(soname: str, loader: Loader, lib_dir: Path | None, wanted: str | None, root: Path) -> Check:
    """The failed check of a ROCm library the loader does not find, with the fix that applies."""
    name = f"library {soname}"
    stale = loader.stale(soname)
    if stale:
        where = _shown(str(stale[0]), root)
        return Check(
            name,
            FAIL,
            f"not in the loader's cache; {where} ({stale[1]}) holds it",
            "ldconfig has not run since that file was written: sudo ldconfig",
        )
    if lib_dir is not None and (lib_dir / soname).exists():
        shown = _shown(str(lib_dir), root)
        return Check(
            name,
            FAIL,
            f"not found by the loader; present in {shown}",
            f"the loader does not search {shown}: echo {shown} | sudo tee /etc/ld.so.conf.d/rocm.conf "
            f"&& sudo ldconfig (or export LD_LIBRARY_PATH={shown})",
        )
    return Check(
        name, FAIL, "not found", f"install the ROCm {wanted or ''} libraries (rocm-libs) that provide it"
    )


def _shown(path: str, root: Path) -> str:
    """``path`` as the node sees it (fake roots in tests are stripped)."""
    try:
        return "/" + str(Path(path).relative_to(root)) if str(root) != "/" else path
    except ValueError:
        return path


def _gpu_checks(doc: dict, gpus: list[arch_detect.Gpu], notes: list[str]) -> list[Check]:
    """Every GPU against every wheel with GPU code (a wheel built for ``gfx9-4-generic`` runs on
    a gfx942: :func:`rocmforge.verify.inspect.covers` decides, as for ``inspect --require``)."""
    archs = doc["stack"].get("gpu_archs") or []
    per_wheel = {
        w["project"]: w["contract"]["gpu_archs"]
        for w in doc.get("wheels", [])
        if (w.get("contract") or {}).get("gpu_archs")
    }
    if not per_wheel:
        return [Check("GPUs", OK, "the stack holds no GPU code")]
    if not gpus:
        why = "; ".join(notes) or "no GPU agent"
        return [Check("GPUs", FAIL, f"none found ({why})", NO_GPU_FIX)]
    names = ", ".join(f"{g.arch} ({g.name})" if g.name else g.arch for g in gpus)
    found = f"{names}; the wheels hold code for {' '.join(archs) or 'no common arch'}"
    lacking = {
        arch: sorted(p for p, targets in per_wheel.items() if not inspect.covers(targets, arch))
        for arch in sorted({g.arch for g in gpus})
    }
    lacking = {arch: projects for arch, projects in lacking.items() if projects}
    if lacking:
        which = "; ".join(f"{arch}: {', '.join(projects)}" for arch, projects in lacking.items())
        return [
            Check(
                "GPUs",
                FAIL,
                found,
                f"no code for {which} (hipErrorNoBinaryForGpu): use a wheelhouse built with these "
                "archs (PYTORCH_ROCM_ARCH) or hide those GPUs (HIP_VISIBLE_DEVICES)",
            )
        ]
    return [Check("GPUs", OK, found)]


def _runtime_checks(stack: dict, root: Path, environ: Mapping[str, str]) -> list[Check]:
    loader = Loader(root, environ)
    checks = []
    for soname, floors in (("libc.so.6", ("GLIBC",)), ("libstdc++.so.6", ("GLIBCXX", "CXXABI"))):
        hit = loader.find(soname)
        for namespace in floors:
            need = stack.get(namespace.lower())
            have = host.newest_symbol_version(hit[0], namespace) if hit else None
            where = f" in {_shown(str(hit[0]), root)}" if hit else ""
            name = f"{namespace} >= {need}" if need else namespace
            if not need:
                checks.append(Check(name, OK, f"{namespace} {have or '?'}{where}; the stack needs none"))
            elif have and Version(have) >= Version(need):
                checks.append(Check(name, OK, f"{namespace} {have}{where}"))
            else:
                fix = (
                    "a newer distribution (glibc cannot be upgraded alone)"
                    if namespace == "GLIBC"
                    else "a newer libstdc++6 (distribution package, or conda-forge's libstdcxx-ng "
                    "on LD_LIBRARY_PATH)"
                )
                checks.append(Check(name, FAIL, f"{namespace} {have or 'not found'}{where}", fix))
    return checks


def _python_checks(doc: dict, python: str) -> list[Check]:
    wrong = [
        f"{w['project']} ({' '.join(w['contract']['python'])})"
        for w in doc.get("wheels", [])
        if w.get("contract")
        and w["contract"].get("python")
        and not python_fits(w["contract"]["python"], python)
    ]
    if wrong:
        return [
            Check(
                "Python",
                FAIL,
                f"Python {python}; wheels for other Pythons: {', '.join(wrong)}",
                "install with the Python the wheels were built for (uv python install X.Y), or rebuild",
            )
        ]
    return [Check("Python", OK, f"Python {python} fits every wheel")]


def _device_checks(root: Path, environ: Mapping[str, str]) -> list[Check]:
    user, groups, kfd, dri, device_groups = host.probe_access(root, environ)
    checks = []
    if kfd == "ok":
        checks.append(Check("/dev/kfd", OK, "read/write"))
    else:
        what = "absent (no amdgpu driver, or not passed into the container)" if kfd == "absent" else kfd
        checks.append(Check("/dev/kfd", FAIL, what, JOIN_FIX))
    if dri == "denied":
        checks.append(Check("/dev/dri", FAIL, "render nodes not accessible", JOIN_FIX))
    needed = [g for g in device_groups if g not in groups]
    if needed and user != "root":
        checks.append(Check("groups", WARN, f"{user} is not in {', '.join(needed)}", JOIN_FIX))
    return checks


def check_node(
    doc: dict,
    *,
    root: Path | str = "/",
    environ: Mapping[str, str] | None = None,
    gpus: list[arch_detect.Gpu] | None = None,
    python: str | None = None,
) -> list[Check]:
    """Every check of this node against the stack document ``doc`` (see the module doc).

    ``gpus`` (parsed saved output) replaces detection; ``python`` is the ``X.Y[.Z]`` version of
    the interpreter that will install (default: this one).
    """
    root = Path(root)
    environ = os.environ if environ is None else environ
    stack = doc["stack"]
    notes: list[str] = []
    if gpus is None:
        gpus, notes = arch_detect.detect_local(root=root, environ=environ)
    checks = [
        *_rocm_checks(stack, root, environ),
        *_gpu_checks(doc, gpus, notes),
        *_runtime_checks(stack, root, environ),
        *_python_checks(doc, python or platform.python_version()),
        *_device_checks(root, environ),
    ]
    if stack.get("unknown"):
        checks.append(
            Check(
                "contract",
                WARN,
                f"no contract for {', '.join(stack['unknown'])} (a vendor's wheel published as is)",
                "their needs are not checked here; see their vendor's documentation",
            )
        )
    return checks


def _python_version(exe: str) -> str:
    version = host.interpreter_version(exe)
    if version is None:
        raise UserError(f"--python {exe}: cannot run it as a Python interpreter", exit_code=2)
    return version


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m rocmforge check-node``."""
    parser.add_argument(
        "--stack",
        default=DEFAULT_STACK,
        help=f"the wheelhouse's stack.json, a path or URL (default {DEFAULT_STACK})",
    )
    parser.add_argument("--python", help="the interpreter that will install the wheels (default: this one)")
    parser.add_argument(
        "--gpus", metavar="FILE", help="saved rocminfo / amd-smi / rocm-smi output instead of detecting GPUs"
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def main(args: argparse.Namespace) -> int:
    """Check this node against the stack; exit 0 ok, 1 a check failed, 2 unreadable input."""
    doc = load_stack(args.stack)
    gpus = None
    if args.gpus:
        _fmt, gpus = arch_detect.parse_text(arch_detect.read_input(args.gpus), source=args.gpus)
    python = _python_version(args.python) if args.python else None
    checks = check_node(doc, gpus=gpus, python=python)
    failed = [c for c in checks if c.status == FAIL]
    if args.json:
        print(
            json.dumps(
                {"ok": not failed, "stack": args.stack, "checks": [asdict(c) for c in checks]}, indent=2
            )
        )
    else:
        from rocmforge.console import console

        render(checks, title="rocmforge check-node")
        verdict = (
            f"this node cannot run the stack: {len(failed)} check(s) failed; apply the fixes in the "
            f"table's fix column, then check again with `python -m rocmforge check-node --stack {args.stack}`"
            if failed
            else "this node can run the stack"
        )
        console.print(verdict, style="bold red" if failed else "green", markup=False, soft_wrap=True)
    return 1 if failed else 0
