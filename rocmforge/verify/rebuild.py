"""Rebuild a wheel from what it records and compare: ``python -m rocmforge rebuild-check WHEEL``.

The wheel's ``rocmforge.json`` names everything that shapes its bytes (see
:mod:`rocmforge.build.provenance`). ``rebuild-check`` builds the package again in a fresh directory
(its own checkout, work dir and wheelhouse; no compile cache, so every object is compiled
again) from exactly those inputs:

- the source pin (commit, or sdist sha256) and the patches, each patch file checked against
  its recorded sha256 in this project's ``patches/<package>/``;
- the archs, backend, optimisation level and build environment (flags, compilers, arch list,
  ``SOURCE_DATE_EPOCH``) as recorded; PATH-like variables are this host's;
- the dependencies' wheels, found by their recorded sha256 next to WHEEL (or in the configured
  wheelhouse) and installed as they are.

The recipe and the package's other settings come from this project's config, which must
define the package. Identical sha256: exit 0. Different: exit 1, with the members that
differ, for ELF members the sections that differ, and for ``rocmforge.json`` the keys, which
is where a changed flag shows by name. With diffoscope installed, its report is added.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from rocmforge.build import package as build
from rocmforge.build import provenance
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.config import Config, Patch, load_config
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import file_sha256
from rocmforge.sources import patches

# Variables whose recorded value is where the toolchain lived on the first builder; the
# rebuild takes this host's (the ROCm root itself is replayed through ROCM_PATH).
_HOST_PATHS = ("PATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CMAKE_PREFIX_PATH")
_RECORD_MEMBER = ".dist-info/" + provenance.FILENAME


@dataclass
class MemberDiff:
    """One member of the wheel that differs between the original and the rebuild."""

    name: str
    change: str  # "content", "only in original", "only in rebuild"
    sections: list[str] = field(default_factory=list)  # ELF sections that differ
    keys: list[str] = field(default_factory=list)  # rocmforge.json keys that differ, with values


@dataclass
class Outcome:
    """The result of one rebuild-check."""

    wheel: Path
    sha256: str
    rebuilt: Path
    rebuilt_sha256: str
    members: list[MemberDiff]
    diffoscope: str | None  # its text report, or None when not installed / not run
    notes: list[str]
    work: Path  # the rebuild's directory

    @property
    def identical(self) -> bool:
        return self.sha256 == self.rebuilt_sha256

    def to_json(self) -> dict:
        return {
            "identical": self.identical,
            "wheel": str(self.wheel),
            "sha256": self.sha256,
            "rebuilt": str(self.rebuilt),
            "rebuilt_sha256": self.rebuilt_sha256,
            "members": [dataclasses.asdict(m) for m in self.members],
            "diffoscope": self.diffoscope,
            "notes": self.notes,
            "work_dir": str(self.work),
        }


def rebuild_config(cfg: Config, record: dict, wheel: Path, fresh: Path) -> Config:
    """``cfg`` turned into the config of a rebuild of ``wheel`` in the empty directory ``fresh``."""
    name = record.get("package")
    src = record.get("source") or {}
    if src.get("kind") == "prebuilt":
        raise UserError(
            f"{wheel.name}: was downloaded ({src.get('requirement')}), not built; "
            "compare its sha256 with the vendor's index instead"
        )
    if name not in cfg.packages:
        raise UserError(
            f"{wheel.name}: its package {name!r} is not in {cfg.path}; run rebuild-check from the "
            "rocmforge project that built it (or set ROCMFORGE_CONFIG)"
        )
    pkg = cfg.package(name)
    if pkg.source is None or pkg.source.kind != src.get("kind"):
        raise UserError(
            f"{wheel.name}: was built from a {src.get('kind')} source, but packages.{name} in {cfg.path} "
            "is not; check out the rocmforge commit that built it"
        )
    if src.get("kind") == "path":
        raise UserError(
            f"{wheel.name}: was built from a local tree (a path source), which has no pin to rebuild"
        )
    recorded_python = record.get("python")
    python = build.python_version(cfg)
    if recorded_python != python:
        raise UserError(
            f"{wheel.name}: was built with Python {recorded_python}, this config builds with "
            f"{python}; set build.python to a {recorded_python} interpreter"
        )
    source = dataclasses.replace(
        pkg.source,
        commit=src.get("commit") or pkg.source.commit,
        sha256=src.get("sha256") or pkg.source.sha256,
        version=src.get("version") if pkg.source.kind == "pypi" else pkg.source.version,
    )
    configured = {p.file: p for p in pkg.patches}
    replayed = []
    for entry in record.get("patches") or []:
        have = patches.patches_dir(cfg, name) / entry["file"]
        if not have.is_file() or file_sha256(have) != entry["sha256"]:
            raise UserError(
                f"{wheel.name}: was built with patch {entry['file']} (sha256 {entry['sha256'][:12]}...), "
                f"which {have} is not; check out the rocmforge commit that built the wheel"
            )
        target = fresh / "patches" / name / entry["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(have, target)
        base = configured.get(entry["file"]) or Patch(entry["file"], entry["sha256"], "recorded in the wheel")
        replayed.append(dataclasses.replace(base, sha256=entry["sha256"], versions=None))
    env = {k: v for k, v in (record.get("env") or {}).items() if k not in _HOST_PATHS}
    packages = dict(cfg.packages)
    packages[name] = dataclasses.replace(
        pkg,
        source=source,
        patches=tuple(replayed),
        env=MappingProxyType(env),
        # The recorded commit is the pin; the tree that once named it is not rebuilt.
        pin_from=None,
        local_version=record.get("local_version", pkg.local_version),
        options=MappingProxyType(dict(record.get("options", pkg.options))),
    )
    backend = record.get("backend", cfg.build.backend)
    archs = tuple(record.get("arch") or ())
    settings = dataclasses.replace(
        cfg.build,
        backend=backend,
        arch=archs if backend != "cuda" else cfg.build.arch,
        cuda_arch=archs if backend == "cuda" else cfg.build.cuda_arch,
        opt_level=record.get("opt_level", cfg.build.opt_level),
        compile_cache="none",  # compile everything again: a cache hit would only replay the first build
        work_dir=fresh / "work",
        wheelhouse=fresh / "wheelhouse",
        logs_dir=fresh / "logs",
        third_party=fresh / "third_party",
        signing_key=None,
    )
    # The root moves too: patches are read from the copies above and the lock written there,
    # so the project's own lock is left alone.
    return dataclasses.replace(
        cfg, path=fresh / cfg.path.name, root=fresh, build=settings, packages=MappingProxyType(packages)
    )


def seed_dependencies(cfg: Config, fresh_cfg: Config, record: dict, wheel: Path) -> None:
    """Publish the exact dependency wheels the record names (by sha256) into the fresh wheelhouse."""
    available: dict[str, Path] = {}
    for house in (Wheelhouse(wheel.parent), Wheelhouse(cfg.build.wheelhouse)):
        for e in house.entries():
            available.setdefault(e.sha256, e.path)
    for dep, sha in sorted((record.get("dependencies") or {}).items()):
        if sha not in available:
            raise UserError(
                f"{wheel.name}: was built against {dep}'s wheel with sha256 {sha[:12]}..., which is neither "
                f"next to it nor in {cfg.build.wheelhouse}; put that wheel beside {wheel.name}"
            )
        build.adopt_wheel(fresh_cfg, dep, available[sha])


def compare(original: Path, rebuilt: Path) -> list[MemberDiff]:
    """The members of two wheels that differ, with ELF sections and record keys named."""
    from rocmforge.verify.inspect import elf_section_digests

    found = []
    with zipfile.ZipFile(original) as za, zipfile.ZipFile(rebuilt) as zb:
        names_a, names_b = set(za.namelist()), set(zb.namelist())
        for name in sorted(names_a - names_b):
            found.append(MemberDiff(name, "only in original"))
        for name in sorted(names_b - names_a):
            found.append(MemberDiff(name, "only in rebuild"))
        for name in sorted(names_a & names_b):
            a, b = za.read(name), zb.read(name)
            if a == b:
                if _header(za.getinfo(name)) != _header(zb.getinfo(name)):
                    found.append(MemberDiff(name, "zip header (time, mode or compression)"))
                continue
            diff = MemberDiff(name, "content")
            sections_a, sections_b = elf_section_digests(a), elf_section_digests(b)
            if sections_a is not None and sections_b is not None:
                diff.sections = [
                    s
                    for s in [*sections_a, *(k for k in sections_b if k not in sections_a)]
                    if sections_a.get(s) != sections_b.get(s)
                ]
            elif name.endswith(_RECORD_MEMBER):
                diff.keys = _json_differences(_loads(a), _loads(b))
            found.append(diff)
        if not found and za.namelist() != zb.namelist():
            found.append(MemberDiff("(member order)", "zip layout"))
    if not found:  # same members, same headers: the deflate streams differ (another zlib)
        found.append(MemberDiff("(compressed data: equal members, other deflate output)", "zip layout"))
    return found


def _header(info: zipfile.ZipInfo) -> tuple:
    return (info.date_time, info.external_attr, info.compress_type, info.extra, info.comment)


def _loads(data: bytes):
    try:
        return json.loads(data)
    except ValueError:
        return None


def _json_differences(a, b, prefix: str = "") -> list[str]:
    """``key: old -> new`` for each leaf that differs between two JSON values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            where = f"{prefix}.{key}" if prefix else key
            if key not in a:
                out.append(f"{where}: (absent) -> {json.dumps(b[key])}")
            elif key not in b:
                out.append(f"{where}: {json.dumps(a[key])} -> (absent)")
            elif a[key] != b[key]:
                out += _json_differences(a[key], b[key], where)
        return out
    return [f"{prefix or '(record)'}: {json.dumps(a)} -> {json.dumps(b)}"]


def _diffoscope(original: Path, rebuilt: Path) -> str | None:
    """diffoscope's text report of the two wheels, or None when it is not installed."""
    tool = shutil.which("diffoscope")
    if tool is None:
        return None
    proc = subprocess.run([tool, "--text", "-", str(original), str(rebuilt)], capture_output=True, text=True)
    return proc.stdout or proc.stderr


def rebuild_check(wheel: Path, *, work: Path | None = None, cfg: Config | None = None) -> Outcome:
    """Rebuild ``wheel`` in ``work`` (default: a new temporary directory) and compare."""
    if not wheel.is_file():
        raise UserError(f"{wheel}: no such wheel; give the path of a wheel built by rocmforge")
    record = provenance.read(str(wheel))
    cfg = cfg or load_config()
    made_here = work is None
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="rocmforge-rebuild-"))
    elif work.exists() and (not work.is_dir() or any(work.iterdir())):
        raise UserError(f"--work-dir {work}: not an empty directory; a rebuild needs a fresh one")
    try:
        fresh = rebuild_config(cfg, record, wheel, work)
        seed_dependencies(cfg, fresh, record, wheel)
    except BaseException:
        if made_here:  # nothing was built: a refused rebuild leaves no directory behind
            shutil.rmtree(work, ignore_errors=True)
        raise
    notes = []
    extra = sorted(
        k for k in build.SHAPING_VARIABLES if k in os.environ and k not in (record.get("env") or {})
    )
    if extra:
        notes.append(
            f"this environment sets {', '.join(extra)}, which the original build did not; "
            "the rebuild uses them"
        )
    console.print(f"rebuild-check: rebuilding {record['package']} in {work}", soft_wrap=True)
    result = build.build_package(fresh, record["package"])
    original_sha, rebuilt_sha = file_sha256(wheel), file_sha256(result.wheel)
    members = [] if original_sha == rebuilt_sha else compare(wheel, result.wheel)
    report = None
    if members:
        report = _diffoscope(wheel, result.wheel)
        if report is None:
            notes.append("diffoscope is not installed; members and ELF sections compared by rocmforge")
    return Outcome(wheel, original_sha, result.wheel, rebuilt_sha, members, report, notes, work)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI: ``python -m rocmforge rebuild-check WHEEL [--json] [--work-dir DIR] [--keep]``."""
    parser.add_argument(
        "wheel", type=Path, help="a wheel built by rocmforge (its rocmforge.json is the recipe)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as a JSON object")
    parser.add_argument(
        "--work-dir", type=Path, help="build here (empty or new) instead of a temporary directory"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the rebuild's directory even when identical"
    )


def main(args: argparse.Namespace) -> int:
    """Rebuild, compare, report; exit 1 when the rebuild differs."""
    made_here = args.work_dir is None
    outcome = rebuild_check(args.wheel, work=args.work_dir)
    work = outcome.work
    if args.json:
        print(json.dumps(outcome.to_json(), indent=2))
    else:
        _print(outcome)
    if outcome.identical and made_here and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    elif not outcome.identical:
        console.print(f"rebuild-check: the rebuild is kept in {work}", soft_wrap=True)
    return 0 if outcome.identical else 1


def _print(outcome: Outcome) -> None:
    if outcome.identical:
        print(f"{outcome.wheel.name}: reproducible, the rebuild has the same sha256 {outcome.sha256}")
    else:
        print(f"{outcome.wheel.name}: DIFFERS: sha256 {outcome.sha256} != rebuild {outcome.rebuilt_sha256}")
    for m in outcome.members:
        print(f"  {m.name}: {m.change}")
        if m.sections:
            print(f"    ELF sections that differ: {', '.join(m.sections)}")
        for line in m.keys:
            print(f"    {line}")
    for note in outcome.notes:
        print(f"  note: {note}")
    if outcome.diffoscope:
        print(outcome.diffoscope)
