"""The doctor: checks over the host facts, each with a status, what was found and the fix.

Version requirements tied to the pins (torch >= 2.12 needs gcc >= 13, vLLM needs
cmake >= 3.26.1,<4, ...) are data in ``build_config.toml`` (``packages.*.requires``); this
module only knows how to look a tool's version up and what the usual fix is. ROCm checks
apply to the ``rocm`` backend only; the CUDA and CPU backends skip them.

``python -m rocmforge doctor [--json]`` and ``nox -s toolchain`` print the same table and exit
non-zero when any check fails.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from rocmforge.build.environment import GIB, parallel_jobs, pick_compilers, rocm_for_build, satisfies
from rocmforge.config import VENV_TOOLS, Config, Package
from rocmforge.errors import UserError
from rocmforge.hints import install_hint
from rocmforge.host import KEY_LIBRARIES, HostFacts, install_of
from rocmforge.host import tool_version as run_tool_version

OK, WARN, FAIL = "ok", "warn", "fail"
RECHECK = "python -m rocmforge doctor"  # what the CLI's verdict tells to run after the fixes
# Free space where builds go: a PyTorch tree with its build dir and ccache takes ~40 GB.
DISK_FAIL_GB, DISK_WARN_GB = 20, 60
# Libraries every ROCm build links; the math/communication libraries only PyTorch's needs.
CORE_LIBRARIES = ("amdhip64", "hsa-runtime64")
# The fix for a GPU device node this user cannot open (the doctor and check-node give it).
JOIN_FIX = (
    "sudo usermod -aG video,render $USER, then log in again (containers: --device=/dev/kfd --device=/dev/dri)"
)


@dataclass(frozen=True)
class Check:
    """One line of the doctor's table."""

    name: str
    status: str  # ok | warn | fail
    found: str
    fix: str = ""


@dataclass(frozen=True)
class _Context:
    cfg: Config
    facts: HostFacts
    packages: tuple[Package, ...]  # the packages built from source

    @property
    def rocm(self) -> bool:
        return self.cfg.build.backend == "rocm"


def _gb(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.0f} GB"


def _host(ctx: _Context) -> list[Check]:
    f = ctx.facts
    quota = f"cgroup quota {f.cpu_quota:g}" if f.cpu_quota else "no cgroup quota"
    limit = f"cgroup limit {_gb(f.mem_limit_bytes)}" if f.mem_limit_bytes else "no cgroup limit"
    checks = [
        Check("host", OK, f"{f.os}, kernel {f.kernel}, Python {f.python}"),
        Check("cpus", OK, f"{f.cpus} usable ({f.cpus_online} online, {quota})"),
    ]
    jobs = [(p, parallel_jobs(ctx.cfg, p, f)) for p in ctx.packages]
    summary = ", ".join(f"{p.name} {n} x {p.gb_per_job:g} GB" for p, n in jobs) or "nothing to build"
    found = f"{_gb(f.mem_bytes)} usable ({limit}); jobs: {summary}"
    too_many = [(p, n) for p, n in jobs if n * p.gb_per_job * GIB > f.mem_bytes]
    if any(p.gb_per_job * GIB > f.mem_bytes for p, _ in jobs):
        checks.append(
            Check("memory", FAIL, found, "not enough RAM for even one compile job; use a bigger machine")
        )
    elif too_many:
        p, n = too_many[0]
        fit = max(1, int(f.mem_bytes / (p.gb_per_job * GIB)))
        checks.append(
            Check(
                "memory",
                WARN,
                found,
                f"{n} jobs of {p.name} need {n * p.gb_per_job:g} GB: cc1plus gets OOM-killed; "
                f"unset MAX_JOBS/build.jobs or use MAX_JOBS={fit}",
            )
        )
    else:
        checks.append(Check("memory", OK, found))
    free_gb = (f.disk_free_bytes or 0) / GIB
    disk_found = f"{_gb(f.disk_free_bytes)} free at {f.disk_path}"
    fix = f"free space or point build.work_dir elsewhere (a PyTorch build takes ~{DISK_FAIL_GB * 2} GB)"
    if f.disk_free_bytes is not None and free_gb < DISK_FAIL_GB:
        checks.append(Check("disk", FAIL, disk_found, fix))
    elif f.disk_free_bytes is not None and free_gb < DISK_WARN_GB:
        checks.append(Check("disk", WARN, disk_found, fix))
    else:
        checks.append(Check("disk", OK, disk_found))
    return checks


def _tools(ctx: _Context) -> list[Check]:
    checks = []
    for tool in ("cmake", "ninja", "git"):
        version = ctx.facts.tools.get(tool)
        if version:
            checks.append(Check(tool, OK, version))
        else:
            checks.append(Check(tool, FAIL, "not found", install_hint(tool, ctx.facts.os_id)))
    for var, value, version in (
        ("CC", ctx.facts.cc, ctx.facts.cc_version),
        ("CXX", ctx.facts.cxx, ctx.facts.cxx_version),
    ):
        if value and not version:
            checks.append(Check(var, FAIL, f"{var}={value} does not run", f"fix or unset {var}"))
    tool = ctx.cfg.build.compile_cache
    if tool != "none":
        path = getattr(ctx.facts, tool)
        checks.append(
            Check("compile cache", OK, path)
            if path
            else Check(
                "compile cache",
                FAIL,
                f"{tool} not found",
                f"{install_hint(tool, ctx.facts.os_id)}, or set build.compile_cache = 'none'",
            )
        )
    return checks


def tool_version(ctx: _Context, package: Package, tool: str) -> str | None:
    """The version of ``tool`` that ``package``'s build would use."""
    f = ctx.facts
    if tool in ("gcc", "g++"):
        cc, cxx = pick_compilers(package, f)
        chosen = cc if tool == "gcc" else cxx
        if chosen in (f.cc, f.cxx) and chosen:
            return f.cc_version if chosen == f.cc else f.cxx_version
        return f.compilers.get(chosen or "")
    if tool == "python":
        return f.python
    if tool == "rocm":
        return f.rocm_version
    return f.compilers.get(tool) or f.tools.get(tool)


def _venv_tool(ctx: _Context, package: Package, req) -> Check:
    """A tool the build venv installs (``VENV_TOOLS``): the build runs that one, not the host's.

    An existing venv is asked for its version; otherwise (or when that one misses the pin, so
    the venv predates it and is remade) the venv will get a version inside the pin.
    """
    name = f"{package.name}: {req.tool} {req.spec}"
    host = ctx.facts.tools.get(req.tool)
    exe = ctx.cfg.build.work_dir / package.name / "venv" / "bin" / req.tool
    version = run_tool_version(str(exe), req.tool, ctx.facts.environ) if exe.is_file() else None
    if satisfies(version, req.spec):
        return Check(name, OK, f"{req.tool} {version} in the build venv ({exe})")
    not_used = f"host {req.tool} {host}" if host else f"no {req.tool} on the host"
    return Check(name, OK, f"pip '{req.tool}{req.spec}' into the build venv ({not_used}: not used)")


def _requirements(ctx: _Context) -> list[Check]:
    checks = []
    for package in ctx.packages:
        for req in package.requires:
            if req.tool == "rocm" and not ctx.rocm:
                continue
            if req.tool in VENV_TOOLS:
                checks.append(_venv_tool(ctx, package, req))
                continue
            version = tool_version(ctx, package, req.tool)
            name = f"{package.name}: {req.tool} {req.spec}"
            found = f"{req.tool} {version}" if version else f"no {req.tool}"
            if satisfies(version, req.spec):
                checks.append(Check(name, OK, found))
            else:
                hint = install_hint(req.tool, ctx.facts.os_id, spec=req.spec)
                checks.append(Check(name, FAIL, found, f"{hint} - {req.why}"))
    return checks


def _rocm(ctx: _Context) -> list[Check]:
    f, cfg = ctx.facts, ctx.cfg
    pinned = cfg.rocm_version
    checks = []
    try:
        rocm = rocm_for_build(cfg, f)
    except UserError as exc:
        return [
            Check(
                "ROCm", FAIL, "no ROCm found" if "no ROCm" in str(exc) else str(exc).split(";")[0], str(exc)
            )
        ]
    where = f"ROCm {rocm.version or '?'} at {rocm.root} ({rocm.origin})"
    others = [i for i in f.rocm_installs if i is not rocm]
    if others:
        listed = "; ".join(f"{i.version or '?'} at {i.root}" for i in others)
        checks.append(
            Check(
                "ROCm installs",
                WARN,
                f"{where}; also {listed}",
                "builds use the first; set ROCM_PATH to choose",
            )
        )
    else:
        checks.append(Check("ROCm installs", OK, where))
    if rocm.kind == "pip":
        # Nothing here builds against it or tests it (its device libraries and CMake config live
        # elsewhere than /opt/rocm's; PyPI's `rocm` is a placeholder), so it is not suggested.
        checks.append(
            Check(
                "ROCm layout",
                WARN,
                f"{where} is AMD's pip SDK (TheRock's rocm[devel] wheels), a layout rocmforge does not test",
                "install ROCm from AMD's packages (amdgpu-install) and set ROCM_PATH to it",
            )
        )
    if pinned:
        if not rocm.version or not satisfies(rocm.version, f">={pinned}"):
            checks.append(
                Check(
                    "ROCm version",
                    FAIL,
                    # Without a version the tree is no ROCm install at all ("ROCm ? ... older" misled).
                    f"no ROCm {pinned}: found {where}, older than the pinned {pinned}"
                    if rocm.version
                    else f"no ROCm {pinned}: {rocm.root} ({rocm.origin}) has no ROCm version; "
                    "not a ROCm install",
                    install_hint("rocm", f.os_id, spec=pinned),
                )
            )
        elif not rocm.version.startswith(pinned):
            checks.append(
                Check(
                    "ROCm version",
                    WARN,
                    f"ROCm {rocm.version}; the stack is validated with {pinned}",
                    "builds may work; pin the matching versions if they do not",
                )
            )
        else:
            checks.append(Check("ROCm version", OK, f"ROCm {rocm.version} (pinned {pinned})"))
    hipcc_owner = install_of(f, f.first_hipcc)
    if f.first_hipcc is None:
        checks.append(Check("hipcc on PATH", OK, f"none; builds put {rocm.root}/bin first"))
    elif hipcc_owner is not rocm:
        owner = f"ROCm {hipcc_owner.version} at {hipcc_owner.root}" if hipcc_owner else "no known ROCm"
        checks.append(
            Check(
                "hipcc on PATH",
                WARN,
                f"{f.first_hipcc} belongs to {owner}, builds use {rocm.root}",
                "two ROCm installs mixed: remove the other one from PATH or set ROCM_PATH",
            )
        )
    else:
        checks.append(Check("hipcc on PATH", OK, f.first_hipcc))
    # options.rocm_libraries = false: a torch-like tree linking only the HIP runtime (the
    # stack rehearsal's minitorch); real PyTorch links them all.
    builds_torch = any(p.recipe == "pytorch" and p.options.get("rocm_libraries", True) for p in ctx.packages)
    missing = [n for n in KEY_LIBRARIES if not rocm.libraries.get(n)]
    if missing:
        severe = [n for n in missing if n in CORE_LIBRARIES or builds_torch]
        checks.append(
            Check(
                "ROCm libraries",
                FAIL if severe else WARN,
                f"missing in {rocm.lib_dir or rocm.root}: {', '.join(missing)}",
                "install the ROCm math and communication libraries (the rocm-libs package)",
            )
        )
    else:
        checks.append(Check("ROCm libraries", OK, ", ".join(KEY_LIBRARIES)))
    return checks


def _gpus(ctx: _Context) -> list[Check]:
    f, arch = ctx.facts, ctx.cfg.build.arch
    checks = [Check("arch list", OK, ";".join(arch))]
    if not f.gpus:
        checks.append(
            Check(
                "GPUs",
                WARN,
                "none visible",
                "fine for building (archs come from build.arch); wheels can only be verified on a GPU host",
            )
        )
    else:
        seen = sorted({g.arch for g in f.gpus})
        names = ", ".join(f"{g.arch} ({g.name})" if g.name else g.arch for g in f.gpus)
        absent = [a for a in seen if not any(t.split(":")[0] == a for t in arch)]
        checks.append(
            Check(
                "GPUs",
                WARN if absent else OK,
                names,
                f"{', '.join(absent)} not in build.arch: the wheels will not run here "
                "(hipErrorNoBinaryForGpu); add it or set PYTORCH_ROCM_ARCH"
                if absent
                else "",
            )
        )
    join_fix = JOIN_FIX
    if f.kfd == "absent":
        checks.append(
            Check("/dev/kfd", WARN, "absent (no amdgpu driver, or not passed into the container)", join_fix)
        )
    else:
        checks.append(
            Check("/dev/kfd", OK if f.kfd == "ok" else FAIL, f"{f.kfd}", "" if f.kfd == "ok" else join_fix)
        )
    if f.dri == "denied":
        checks.append(Check("/dev/dri", FAIL, "render nodes not accessible", join_fix))
    needed = [g for g in f.device_groups if g not in f.groups]
    if needed and f.user != "root":
        checks.append(Check("groups", WARN, f"{f.user} is not in {', '.join(needed)}", join_fix))
    return checks


def _conda(ctx: _Context) -> list[Check]:
    f = ctx.facts
    if not f.conda_prefix or not f.conda_libstdcxx:
        return []
    found = f"{f.conda_libstdcxx} (GLIBCXX {f.conda_glibcxx or '?'}; system {f.system_glibcxx or '?'})"
    fix = (
        "conda deactivate before building, or `conda install -c conda-forge 'libstdcxx-ng>=13'`, "
        "or drop $CONDA_PREFIX/lib from LD_LIBRARY_PATH"
    )
    older = bool(f.conda_glibcxx and f.system_glibcxx and satisfies(f.conda_glibcxx, f"<{f.system_glibcxx}"))
    if f.conda_shadows and older:
        return [Check("conda libstdc++", FAIL, f"shadows the system's: {found}", fix)]
    if f.conda_shadows:
        return [Check("conda libstdc++", WARN, f"shadows the system's: {found}", fix)]
    return [Check("conda libstdc++", OK, f"present, not on the library path: {found}")]


def _cuda(ctx: _Context) -> list[Check]:
    f = ctx.facts
    if not f.cuda_home or not f.tools.get("nvcc"):
        return [Check("CUDA", FAIL, "no CUDA toolkit (nvcc) found", install_hint("nvcc", f.os_id))]
    return [Check("CUDA", OK, f"nvcc {f.tools['nvcc']} at {f.cuda_home}")]


def _rocm_sources(ctx: _Context) -> list[Check]:
    """Sources that live in the ROCm install (amdsmi's share/amd_smi): present in the one used?"""
    from rocmforge.sources.archives import rocm_tree

    checks = []
    for package in ctx.packages:
        if package.source.kind != "rocm":
            continue
        name = f"{package.name}: source in ROCm"
        try:
            checks.append(Check(name, OK, str(rocm_tree(package, ctx.facts.rocm_installs))))
        except UserError as exc:
            found, _, fix = str(exc).partition("; ")
            checks.append(Check(name, FAIL, found.split(": ", 1)[-1], fix))
    return checks


# Check groups in table order; the bool says whether a group runs for a backend.
CHECKS: tuple[tuple[Callable[[_Context], list[Check]], Callable[[str], bool]], ...] = (
    (_host, lambda backend: True),
    (_tools, lambda backend: True),
    (_requirements, lambda backend: True),
    (_rocm, lambda backend: backend == "rocm"),
    (_rocm_sources, lambda backend: backend == "rocm"),
    (_gpus, lambda backend: backend == "rocm"),
    (_cuda, lambda backend: backend == "cuda"),
    (_conda, lambda backend: True),
)


def run_checks(cfg: Config, facts: HostFacts, packages: list[str] | None = None) -> list[Check]:
    """All checks for building ``packages`` (default: every configured one) on this host."""
    names = cfg.build_order(packages)
    ctx = _Context(cfg, facts, tuple(cfg.package(n) for n in names if cfg.package(n).source is not None))
    checks: list[Check] = [Check("config", OK, note) for note in cfg.overrides]
    for group, applies in CHECKS:
        if applies(cfg.build.backend):
            checks.extend(group(ctx))
    return checks


def verdict(checks: list[Check], recheck: str = "nox -s toolchain") -> str:
    """One sentence: ready, or what failed and what to do (``recheck``: the command to run after)."""
    fails = [c for c in checks if c.status == FAIL]
    warns = [c for c in checks if c.status == WARN]
    if not fails:
        return f"ready to build ({len(warns)} warning{'s' if len(warns) != 1 else ''})"
    names = "; ".join(f"{c.name}: {c.found}" for c in fails)
    return (
        f"not ready to build: {len(fails)} check(s) failed ({names}); apply the fixes in the table's "
        f"fix column, then check again with `{recheck}`"
    )


def require_ok(cfg: Config, facts: HostFacts, packages: list[str] | None) -> list[Check]:
    """Run the checks; raise a one-line ``UserError`` with the verdict when any fails."""
    checks = run_checks(cfg, facts, packages)
    if any(c.status == FAIL for c in checks):
        # Show the rows that matter (with their fixes) before the one-line verdict.
        render([c for c in checks if c.status != OK])
        raise UserError(verdict(checks), exit_code=1)
    return checks


def render(checks: list[Check], title: str = "rocmforge doctor") -> None:
    """Print the checks as a table on the shared console."""
    from rich.markup import escape
    from rich.table import Table

    from rocmforge.console import console

    style = {OK: "green", WARN: "yellow", FAIL: "bold red"}
    table = Table(title=title, show_lines=False)
    for column in ("check", "status", "found", "fix"):
        table.add_column(column, overflow="fold")
    for c in checks:
        table.add_row(escape(c.name), f"[{style[c.status]}]{c.status}[/]", escape(c.found), escape(c.fix))
    console.print(table)


def report(cfg: Config, facts: HostFacts, *, as_json: bool = False) -> int:
    """Run, print (table or JSON on stdout) and return the exit status: 1 when a check fails."""
    checks = run_checks(cfg, facts)
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        doc = {"ok": not failed, "verdict": verdict(checks, RECHECK), "checks": [asdict(c) for c in checks]}
        print(json.dumps({**doc, "facts": facts.to_json()}, indent=2))
    else:
        from rocmforge.console import console

        render(checks)
        # soft_wrap: one line in a log too, however long (a verdict is grepped and tail -1ed)
        console.print(
            verdict(checks, RECHECK), style="bold red" if failed else "green", markup=False, soft_wrap=True
        )
    return 1 if failed else 0


def toolchain_session(session, cfg: Config) -> None:
    """``nox -s toolchain``: gather facts, print the table, fail the session on any failed check."""
    from rocmforge import host

    facts = host.facts(cfg.build.work_dir)  # the package sessions of this run reuse them
    checks = run_checks(cfg, facts)
    render(checks)
    if any(c.status == FAIL for c in checks):
        session.error(verdict(checks))
    session.log(verdict(checks))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m rocmforge doctor``."""
    parser.add_argument("--json", action="store_true", help="print checks and host facts as JSON (for CI)")


def main(args: argparse.Namespace) -> int:
    """Check this host; exit 1 when any check fails."""
    from rocmforge import host
    from rocmforge.config import load_config

    cfg = load_config()
    return report(cfg, host.gather(build_dir=cfg.build.work_dir), as_json=args.json)
