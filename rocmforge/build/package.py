"""Build one configured package into the wheelhouse: the body of every package session.

For a package ``NAME`` (``nox -s NAME``), in order:

1. the toolchain checks that concern it (:func:`rocmforge.build.doctor.require_ok`);
2. its source, pinned and patched (:func:`rocmforge.sources.checkout.prepare`);
3. a fingerprint of everything that shapes the wheel (source, patches, environment, arch list,
   compilers, ROCm, Python, build requirements, the dependencies' wheels). Unchanged, with the
   wheel still in the wheelhouse: "up to date", done. Changed: the stale build directories are
   removed first, and the log says which inputs changed;
4. an isolated build venv (uv) under ``<work_dir>/NAME/venv`` with the recipe's build
   requirements and the dependencies' wheels from the wheelhouse;
5. the recipe's steps and the build, with live progress and a full log under ``logs_dir``;
   on failure the lines that matter, the log path, the diagnosis when one is known, and one
   retry when the diagnosis has a retry plan;
6. wheel fixups (dropped ``Requires-Dist``, local version label, provenance), written
   deterministically (:func:`rocmforge.build.wheelfile.rewrite_wheel`, dated ``SOURCE_DATE_EPOCH``),
   and publication to the wheelhouse with the provenance statement next to the wheel. Only a
   successful build publishes, so a failure leaves no wheel behind.

A ``[prebuilt]`` package skips 2-5: its wheel is downloaded instead.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rocmforge import __version__
from rocmforge.build import compile_cache, contract, killpoints, provenance, recipes
from rocmforge.build import log as buildlog
from rocmforge.build.install import uv_binary
from rocmforge.build.wheelfile import (
    drop_requirements,
    pin_requirements,
    read_metadata,
    rewrite_wheel,
    wheel_name,
    with_local_label,
)
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.config import VENV_TOOLS, Config, Package, package_archs
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_lock, file_sha256, json_sha256, read_json, remove_temp_files

# Variables of the caller's environment that change what a compiler produces.
SHAPING_VARIABLES = (
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "CC",
    "CXX",
    "HIPFLAGS",
    "HIPCC_COMPILE_FLAGS_APPEND",
)
# Variables rocmforge sets that change how fast a build runs or where this builder keeps its
# tools (whose versions are recorded), never what it produces: they go to the provenance
# statement, not into the wheel, whose bytes must not depend on the host's cores or paths.
HOST_VARIABLES = ("MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "PATH", "VIRTUAL_ENV")
STATE_FILE = "state.json"  # <work_dir>/<pkg>/state.json: what the published wheel was built from


@dataclass(frozen=True)
class Result:
    """What a package session did."""

    package: str
    status: str  # "built", "up to date", "downloaded"
    wheel: Path
    seconds: float
    # Where a build's seconds went, in order ("build venv": 23.0, ...): the build step alone
    # is a fraction of the total, and the rest must not look unexplained.
    phases: tuple[tuple[str, float], ...] = ()

    def summary(self) -> str:
        spent = ": " + ", ".join(f"{what} {secs:.1f}s" for what, secs in self.phases) if self.phases else ""
        return f"{self.package}: {self.status} ({self.wheel.name}, {self.seconds:.1f}s{spent})"


def run_session(session, cfg: Config, name: str) -> Result:
    """nox entry point of the ``NAME`` session: build ``name`` and log the outcome."""
    result = build_package(cfg, name)
    session.log(result.summary())
    return result


def build_package(cfg: Config, name: str, *, facts=None) -> Result:
    """Bring ``name``'s wheel in the wheelhouse up to date with the config; see the module doc."""
    from rocmforge.build import doctor

    start = time.monotonic()
    pkg = cfg.package(name)
    if facts is None:
        from rocmforge import host

        facts = host.facts(cfg.build.work_dir)
    doctor.require_ok(cfg, facts, [name])
    work = cfg.build.work_dir / name
    house = Wheelhouse(cfg.build.wheelhouse)
    with file_lock(work / ".lock", what=f"building {name}", on_wait=_say_waiting(name), inherit=True):
        remove_temp_files(work)  # a state.json write cut short by a kill
        house.tidy()  # and a publication cut short, even when nothing is rebuilt now
        if pkg.prebuilt is not None:
            return _prebuilt(cfg, pkg, house, work, start)
        return _build(cfg, pkg, house, work, facts, start)


def _build(cfg: Config, pkg: Package, house: Wheelhouse, work: Path, facts, start: float) -> Result:
    from rocmforge.build import environment as buildenv
    from rocmforge.sources import checkout as sources
    from rocmforge.sources import lock

    name = pkg.name
    checkout = sources.prepare(cfg, name)
    killpoints.reached("source", name)
    if checkout.dirty:
        console.print(
            f"{name}: {checkout.path} differs from its pin and patches (edits {checkout.dirty[:8]}); "
            f"the wheel is marked dirty.{checkout.dirty[:8]}",
            markup=False,
            soft_wrap=True,
        )
    recipe = recipes.get(pkg.recipe)
    deps = dependency_wheels(cfg, name)
    ctx = build_context(cfg, name, checkout, deps)
    venv, dist = work / "venv", ctx.dist_dir
    project_dir = recipe.project_dir(checkout)

    # The fingerprint takes what rocmforge decides plus the caller's variables that shape
    # compiled code; the rest of the caller's environment (PATH of this shell, ...) must not
    # force a rebuild. The build itself runs in the caller's whole environment.
    # The compile cache's variables are left out too: a cache hit is the object the compiler
    # would have made, and a store's endpoint may carry a password. So are HOST_VARIABLES.
    epoch = checkout.source_date_epoch
    shaping = {k: os.environ[k] for k in SHAPING_VARIABLES if k in os.environ}
    own_env = shaping_env(
        {**shaping, **buildenv.build_environment(cfg, name, facts, base_env=shaping, ctx=ctx, cache=False)},
        recipe,
    )
    requirements = venv_requirements(recipe, ctx)
    inputs = {
        "rocmforge": __version__,
        "recipe": recipe.name,
        "source": checkout.fingerprint(),
        "patches": [list(p) for p in checkout.patches],
        "package": {
            "version": pkg.version,
            "local_version": pkg.local_version,
            "options": dict(pkg.options),
        },
        "backend": cfg.build.backend,
        "arch": list(target_archs(cfg, pkg)),
        "compilers": compilers_used(own_env, facts),
        "rocm": facts.rocm_version,
        "python": python_version(cfg),
        "requirements": requirements,
        "dependencies": {dep: _sha256_of(house, wheel) for dep, wheel in deps.items()},
        # The published metadata depends on it: configuring our own Triton drops torch's pin.
        "dropped": sorted(_dropped_projects(recipe, ctx)),
        "pins": ctx.pins,
        "env": own_env,
    }
    fingerprint = json_sha256(inputs)
    state = read_json(work / STATE_FILE)
    current = _published(house, state)
    if state and state.get("fingerprint") == fingerprint and current:
        lock.record_build(cfg, checkout, facts)
        return Result(name, "up to date", current, time.monotonic() - start)
    if state:
        changed = _changed(state.get("inputs", {}), inputs)
        more = [f"{len(changed) - 6} more"] if len(changed) > 6 else []
        console.print(
            f"{name}: rebuilding, changed: {', '.join(changed[:6] + more)}", markup=False, soft_wrap=True
        )
    before = sources.current_state(cfg, checkout)  # what the build writes into its tree is not an edit
    for stale in [dist, work / "out", *recipe.stale_paths(ctx)]:
        _remove(stale)
    (work / STATE_FILE).unlink(missing_ok=True)

    log = buildlog.log_path(cfg.build.logs_dir, name)
    console.print(f"{name}: building from {checkout.path} (log: {log})", soft_wrap=True)
    phases = [("checks and sources", time.monotonic() - start)]
    _make_venv(cfg, venv, requirements, list(deps.values()), house, log, label=f"{name}: build venv")
    phases.append(("build venv", time.monotonic() - start - sum(t for _, t in phases)))
    killpoints.reached("venv", name)
    env = {**os.environ, **buildenv.build_environment(cfg, name, facts, base_env=dict(os.environ), ctx=ctx)}
    retries: list[str] = []
    started = time.time()
    env = compile_cache.begin(cfg, env, work / "compile-cache.log")
    first_env = dict(env)
    while True:
        failed = _run_steps(name, recipe, ctx, project_dir, env, log)
        # Failed too: its next run starts from the tree it left
        if written := sources.record_build_output(cfg, checkout, before):
            shown = written[:4] + ([f"{len(written) - 4} more"] if len(written) > 4 else [])
            console.print(
                f"{name}: the build changed tracked files in {checkout.path} ({', '.join(shown)}); "
                "taken as its output, not as edits",
                markup=False,
                soft_wrap=True,
            )
        if failed is None:
            break
        from rocmforge.diagnose import (
            engine as diagnose,  # its rules cost an import only a failed build needs
        )

        diagnosis = diagnose.diagnose_file(failed.log)
        _report_failure(name, failed, diagnosis)
        plan = None if retries else diagnose.retry_plan(diagnosis, env, cfg)
        if plan is None:
            _withdraw_stale(house, name, current)
            raise UserError(f"{name}: build failed; full log: {log}")
        env, note = plan
        retries.append(note)
        console.print(f"{name}: retrying once: {note}")
        for stale in [dist, *recipe.stale_paths(ctx)]:
            _remove(stale)
    phases.append(("build", time.monotonic() - start - sum(t for _, t in phases)))
    cache_stats, cache_line = compile_cache.finish(cfg, env)
    if cache_line:
        console.print(f"{name}: {cache_line}", markup=False)

    built = _single_wheel(dist, name, log)
    killpoints.reached("built", name)
    # A retry's remedy (-O3 -> -O2) shapes the bytes: the record says what the build really used.
    retried = {k: v for k, v in env.items() if first_env.get(k) != v}
    record = {
        "package": name,
        "version": wheel_name(built).version,
        "recipe": recipe.name,
        "local_version": pkg.local_version,
        "options": dict(pkg.options),
        "source": {
            "kind": checkout.kind,
            "url": checkout.url,
            "name": pkg.source.name,
            "commit": checkout.commit,
            "sha256": checkout.sha256,
            "version": checkout.version,
            "subdir": pkg.source.subdir,
            "submodules": dict(checkout.submodules),
            "pinned_by": _pinned_by(cfg, pkg, checkout.commit),
            # sha256 of the edits on top of commit + patches; None: the tree is exactly those
            "dirty": checkout.dirty,
        },
        "source_date_epoch": epoch,
        "patches": [{"file": f, "sha256": s} for f, s in checkout.patches],
        "dependencies": inputs["dependencies"],
        **_common_record(cfg, facts, {**own_env, **shaping_env(retried, recipe)}, fingerprint, pkg),
    }
    wheel, record = _fixup(ctx, recipe, built, work / "out", record, epoch=epoch)
    killpoints.reached("fixed", name)
    byproducts = [{"name": "retry", "annotations": {"note": note}} for note in retries]
    if cache_stats is not None:
        byproducts.append({"name": "compile cache", "annotations": cache_stats.to_record()})
    elif cache_line:
        byproducts.append({"name": "compile cache", "annotations": {"note": cache_line}})
    host_env = {k: env[k] for k in (*HOST_VARIABLES, *recipe.location_variables) if k in env}
    _attest(cfg, wheel, record, started, internal={"env": host_env}, byproducts=byproducts)
    entry = house.publish(wheel)
    killpoints.reached("published", name)
    _write_state(work, fingerprint, inputs, entry)
    lock.record_build(cfg, checkout, facts)
    _remove(work / "out")
    total = time.monotonic() - start
    phases.append(("wheel fixup and publish", total - sum(t for _, t in phases)))
    return Result(name, "built", entry.path, total, tuple(phases))


def _pinned_by(cfg: Config, pkg: Package, commit: str | None) -> str | None:
    """Where the commit came from when another package's tree pins it (Triton from PyTorch)."""
    if not pkg.pin_from or commit is None:
        return None
    from rocmforge.sources import checkout as sources

    derived, _version = sources.derived_pin(cfg, pkg)
    if commit.startswith(derived):
        return f"{pkg.pin_from}'s {sources.PYTORCH_TRITON_COMMIT}"
    return f"packages.{pkg.name}.source.commit (override_pin; {pkg.pin_from} pins {derived})"


def _run_steps(name: str, recipe, ctx, project_dir: Path, env: dict[str, str], log: Path):
    """The recipe's preparation commands and the build; the failed step's result, or None."""
    steps = [*recipe.prepare_commands(ctx), recipe.build_command(ctx)]
    for i, argv in enumerate(steps, 1):
        label = f"{name}: build" if i == len(steps) else f"{name}: {Path(argv[1]).name}"
        result = buildlog.run_step(label, argv, cwd=project_dir, env=env, log=log)
        if not result.ok:
            return result
    return None


def _report_failure(name: str, result: buildlog.StepResult, diagnosis=None) -> None:
    """The lines that matter, the diagnosis when one is known, and the log path."""
    console.print(f"[red]{name}: failed (exit {result.returncode}) after {result.seconds:.0f}s[/red]")
    for line in buildlog.lines_that_matter(result.tail):
        console.print(f"  {line}", markup=False)
    if diagnosis is not None:
        from rocmforge.diagnose.engine import summary  # loaded already: the caller diagnosed

        if (said := summary(diagnosis)) is not None:
            console.print(f"{name}: {said}", markup=False)
    console.print(f"{name}: full log: {result.log}", soft_wrap=True)


def _prebuilt(cfg: Config, pkg: Package, house: Wheelhouse, work: Path, start: float) -> Result:
    """Download ``[prebuilt]``'s wheel into the wheelhouse instead of building."""
    pre = pkg.prebuilt
    start_wall = time.time()
    inputs = {
        "rocmforge": __version__,
        "requirement": pre.requirement,
        "index": pre.index,
        "python": python_version(cfg),
        "dropped": sorted(recipes.get(pkg.recipe).dropped_requirements(_prebuilt_context(cfg, pkg))),
    }
    fingerprint = json_sha256(inputs)
    state = read_json(work / STATE_FILE)
    current = _published(house, state)
    if state and state.get("fingerprint") == fingerprint and current:
        return Result(pkg.name, "up to date", current, time.monotonic() - start)
    log = buildlog.log_path(cfg.build.logs_dir, pkg.name)
    download = work / "download"
    _remove(download)
    # pip picks the wheel for the build Python's tags; a seeded venv of that Python brings pip
    # along (the interpreter running rocmforge may be a uv venv without it).
    venv = work / "venv"
    if not (venv / "bin" / "pip").is_file():
        _remove(venv)
        seed = [uv_binary(), "venv", "--quiet", "--seed", "--python", _python(cfg), str(venv)]
        if not buildlog.run_step(f"{pkg.name}: venv", seed, cwd=work, env=dict(os.environ), log=log).ok:
            raise UserError(f"{pkg.name}: could not create a venv for {_python(cfg)}; full log: {log}")
    argv = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(download),
        *_index_args(pre.index),
        pre.requirement,
    ]
    result = buildlog.run_step(f"{pkg.name}: download", argv, cwd=cfg.root, env=dict(os.environ), log=log)
    if not result.ok:
        _report_failure(pkg.name, result)
        raise UserError(f"{pkg.name}: could not download {pre.requirement!r}; full log: {log}")
    original = _single_wheel(download, pkg.name, log)
    record = {
        "package": pkg.name,
        "version": wheel_name(original).version,
        "source": {
            "kind": "prebuilt",
            "requirement": pre.requirement,
            "index": pre.index,
            "filename": original.name,
            "sha256": file_sha256(original),
        },
        **_common_record(cfg, None, {}, fingerprint, pkg),
    }
    ctx = _prebuilt_context(cfg, pkg)
    recipe = recipes.get(pkg.recipe)
    if drop_requirements(read_metadata(original), recipe.dropped_requirements(ctx)):
        wheel, record = _fixup(ctx, recipe, original, work / "out", record, epoch=None)
        _attest(cfg, wheel, record, start_wall, internal={}, byproducts=[])
    else:
        # Nothing to fix: publish the vendor's bytes, whose sha256 the vendor's index vouches for.
        wheel = original
    entry = house.publish(wheel)
    _write_state(work, fingerprint, inputs, entry)
    _remove(work / "out")
    _remove(download)
    return Result(pkg.name, "downloaded", entry.path, time.monotonic() - start)


def _prebuilt_context(cfg: Config, pkg: Package) -> recipes.Context:
    return recipes.Context(cfg, pkg, None, Path(_python(cfg)), Path(), {})


def _index_args(index: str | None) -> list[str]:
    """pip arguments for a ``[prebuilt].index``: a URL is an index, a directory is find-links."""
    if index is None:
        return []
    if "://" in index and not index.startswith("file://"):
        return ["--index-url", index]
    path = Path(index.removeprefix("file://"))
    if (path / "index.html").is_file() or path.name == "simple":
        return ["--index-url", path.as_uri()]
    return ["--no-index", "--find-links", str(path)]


def _fixup(
    ctx: recipes.Context, recipe, wheel: Path, out: Path, record: dict, *, epoch: int | None
) -> tuple[Path, dict]:
    """The published form of ``wheel`` and the record inside it: repaired by auditwheel,
    build-host RUNPATHs removed, requirements dropped, our dependencies pinned exactly, label
    added, contract in METADATA, provenance inside. Our wheel writer writes last, every member
    dated ``epoch`` (the source's SOURCE_DATE_EPOCH), so the bytes are reproducible whatever
    the repair tool did to the zip."""
    pins = ctx.pins
    dropped_projects = _dropped_projects(recipe, ctx)
    portable = contract.prepare(
        wheel,
        out.parent / "contract",
        backend=ctx.cfg.build.backend,
        rocm_version=record.get("rocm_version"),
        dependency_wheels=ctx.dependencies.values(),
        repair_tags=ctx.checkout is not None,  # a prebuilt wheel keeps its vendor's tags
    )
    version = wheel_name(wheel).version
    label = ctx.package.local_version
    if label and not recipe.native_local_version(ctx):
        version = with_local_label(version, label)
    if ctx.checkout is not None and ctx.checkout.dirty:
        # Edited sources: said where every installer and `pip list` shows it.
        version = with_local_label(version, f"dirty.{ctx.checkout.dirty[:8]}")

    def requirements(metadata) -> tuple[list[str], list[str]]:
        return drop_requirements(metadata, dropped_projects), pin_requirements(metadata, pins)

    dropped, pinned_after = requirements(read_metadata(wheel))
    record = {
        **record,
        "version": version,
        "dropped_requirements": dropped,
        "exact_pins": {project: f"=={v}" for project, v in pins.items()},
        # Pins the build did not write itself, added to METADATA here.
        "pins_added": pinned_after,
        "contract": portable.contract,
    }

    def edit(metadata) -> None:
        requirements(metadata)
        contract.add_requires_external(metadata, portable.contract)

    published = rewrite_wheel(
        portable.wheel,
        out,
        edit_metadata=edit,
        add_files={provenance.FILENAME: provenance.record_bytes(record)},
        version=version if version != wheel_name(wheel).version else None,
        replace_files=portable.replaced,
        epoch=epoch,
    )
    _remove(out.parent / "contract")
    return published, record


def _attest(
    cfg: Config, wheel: Path, record: dict, started: float, *, internal: dict, byproducts: list
) -> None:
    """Write the provenance statement next to the finished ``wheel`` (where and when it was
    built); :meth:`Wheelhouse.publish` moves it into the wheelhouse with the wheel."""
    stmt = provenance.statement(
        wheel.name,
        file_sha256(wheel),
        record,
        started=started,
        finished=time.time(),
        internal=internal,
        byproducts=byproducts,
    )
    provenance.write_statement(wheel, stmt, signing_key=cfg.build.signing_key)


def shaping_env(env: Mapping[str, str], recipe) -> dict[str, str]:
    """The part of a build environment that can change the wheel's bytes: no compile-cache
    variables (a hit is the object the compiler would make), no parallelism, no tool paths,
    none of the recipe's ``location_variables``."""
    skip = {*HOST_VARIABLES, *recipe.location_variables}
    return {k: v for k, v in env.items() if not compile_cache.is_cache_variable(k) and k not in skip}


def _dropped_projects(recipe, ctx: recipes.Context) -> set[str]:
    """What the recipe drops from the wheel's requirements, never one of our exact pins."""
    return recipe.dropped_requirements(ctx) - {canonicalize_name(p) for p in ctx.pins}


def _common_record(cfg: Config, facts, env: Mapping[str, str], fingerprint: str, pkg: Package) -> dict:
    return {
        "backend": cfg.build.backend,
        "arch": list(target_archs(cfg, pkg)),
        "rocm_version": facts.rocm_version if facts is not None else None,
        "compilers": compilers_used(env, facts) if facts is not None else {},
        "opt_level": cfg.build.opt_level,
        "env": dict(env),
        "python": python_version(cfg),
        "fingerprint": fingerprint,
        "rocmforge": __version__,
    }


def build_context(cfg: Config, name: str, checkout, deps: Mapping[str, Path]) -> recipes.Context:
    """The recipe context of ``name``'s build: its venv under the work dir, its dependencies' wheels."""
    work = cfg.build.work_dir / name
    python = work / "venv" / "bin" / "python"
    return recipes.Context(cfg, cfg.package(name), checkout, python, work / "dist", deps)


def planned_context(cfg: Config, name: str) -> recipes.Context:
    """The recipe context a build of ``name`` would get, from what is on disk now: the checkout
    already made (or None), the dependency wheels already published. Fetches and builds nothing."""
    from rocmforge.sources import checkout as sources

    house = Wheelhouse(cfg.build.wheelhouse)
    deps = {}
    depends = list(cfg.package(name).depends)
    for dep in cfg.build_order(depends) if depends else []:
        wheel = _published(house, read_json(cfg.build.work_dir / dep / STATE_FILE))
        if wheel is not None:
            deps[dep] = wheel
    return build_context(cfg, name, sources.existing(cfg, name), deps)


def venv_requirements(recipe, ctx: recipes.Context) -> list[str]:
    """What the build venv installs from the index: the recipe's build requirements minus the
    projects our dependency wheels provide, plus the package's tool pins (``cmake>=3.27,<4``,
    :func:`tool_requirements`). The air-gapped export downloads exactly this list."""
    return [
        *_without(recipe.build_requirements(ctx), ctx.dependencies.values()),
        *tool_requirements(ctx.package),
    ]


def tool_requirements(package: Package) -> list[str]:
    """``[[packages.X.requires]]`` on a tool PyPI ships (``VENV_TOOLS``) as requirements: resolved
    together with the build requirements, a bare ``cmake`` there gets a version inside the pin."""
    return [f"{r.tool}{r.spec}" for r in package.requires if r.tool in VENV_TOOLS]


def dependency_wheels(cfg: Config, name: str) -> dict[str, Path]:
    """Each (transitive) dependency of ``name`` -> its wheel in the wheelhouse."""
    house = Wheelhouse(cfg.build.wheelhouse)
    result = {}
    depends = list(cfg.package(name).depends)
    for dep in cfg.build_order(depends) if depends else []:
        wheel = _published(house, read_json(cfg.build.work_dir / dep / STATE_FILE))
        if wheel is None:
            raise UserError(f"{name} needs {dep}'s wheel, which is not in the wheelhouse; run `nox -s {dep}`")
        result[dep] = wheel
    return result


def _make_venv(cfg, venv: Path, requirements: list[str], wheels: list[Path], house, log, *, label) -> None:
    """The build venv: reused while its Python, requirements and wheels are unchanged."""
    key = json_sha256(
        {"python": _python(cfg), "requirements": requirements, "wheels": [w.name for w in wheels]}
    )
    stamp = venv / ".rocmforge-venv"
    if stamp.is_file() and stamp.read_text() == key:
        return
    _remove(venv)
    uv = uv_binary()
    steps = [("create", [uv, "venv", "--quiet", "--python", _python(cfg), str(venv)])]
    install = [uv, "pip", "install", "--python", str(venv / "bin" / "python")]
    from rocmforge.sources import mirrors

    install += mirrors.offline_index_args()  # air-gapped: the export's wheels are the only index
    if wheels:
        # Our index first: for any project it has, uv takes no version from PyPI.
        install += ["--index", (house.simple).resolve().as_uri(), *map(str, wheels)]
    count = len(requirements) + len(wheels)
    steps.append((f"install {count} requirement{'s' if count != 1 else ''}", [*install, *requirements]))
    for what, argv in steps:
        result = buildlog.run_step(f"{label}: {what}", argv, cwd=venv.parent, env=dict(os.environ), log=log)
        if not result.ok:
            _report_failure(label, result)
            raise UserError(f"{label}: could not install the build requirements; full log: {log}")
    stamp.write_text(key)


def _without(requirements: list[str], wheels) -> list[str]:
    """``requirements`` minus those naming a project we install from our own wheels."""
    ours = {wheel_name(w).project for w in wheels}
    return [r for r in requirements if canonicalize_name(Requirement(r).name) not in ours]


def _python(cfg: Config) -> str:
    """The interpreter the wheels are built for: ``build.python`` or the one running rocmforge."""
    return cfg.build.python or sys.executable


def python_version(cfg: Config) -> str:
    """The version of the interpreter the wheels are built for, e.g. ``3.12.3``."""
    if cfg.build.python is None:
        return platform.python_version()
    from rocmforge import host  # lazily, as elsewhere here: a no-op run should not pay for it

    version = host.interpreter_version(cfg.build.python)
    if version is None:
        raise UserError(f"build.python: {cfg.build.python!r} does not run; give a python executable path")
    return version


def compilers_used(env: Mapping[str, str], facts) -> dict[str, str | None]:
    """Versions of the C and C++ compilers the build uses (``CC``/``CXX``), all known if unset.

    Only these shape the output; a compiler merely installed elsewhere on PATH must not force
    a rebuild. HIP code is compiled by ROCm's clang, which the ROCm version covers; CUDA code
    by nvcc, whose version is added for a CUDA build.
    """
    chosen = [env[k] for k in ("CC", "CXX") if env.get(k)]
    used = {cmd: facts.compilers.get(Path(cmd).name) for cmd in chosen} if chosen else dict(facts.compilers)
    if env.get("USE_CUDA") == "1":  # the device code comes from nvcc, whatever CC/CXX are
        used["nvcc"] = facts.tools.get("nvcc")
    return used


def target_archs(cfg: Config, pkg: Package) -> tuple[str, ...]:
    """The GPU archs ``pkg`` is built for: ``build.cuda_arch`` for CUDA, else its share of ``build.arch``."""
    return cfg.build.cuda_arch if cfg.build.backend == "cuda" else package_archs(cfg, pkg)


def _single_wheel(directory: Path, name: str, log: Path) -> Path:
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise UserError(f"{name}: expected one wheel in {directory}, found {len(wheels)}; full log: {log}")
    return wheels[0]


def _published(house: Wheelhouse, state: dict | None) -> Path | None:
    """The wheel ``state`` records, if the wheelhouse still holds exactly those bytes.

    The wheelhouse's record must name the sha256 this build published (another run may have
    published another build under the same name since), and the file must hash to it.
    """
    if not state:
        return None
    entry = house.entry(state.get("wheel", ""))
    if entry is None or entry.sha256 != state.get("sha256") or not house.verify(entry):
        return None
    return entry.path


def _withdraw_stale(house: Wheelhouse, name: str, current: Path | None) -> None:
    """After a failed rebuild: the old wheel no longer matches the config, so it goes."""
    if current is not None:
        house.withdraw(wheel_name(current).project)
        console.print(f"{name}: removed {current.name} from the wheelhouse (built from other inputs)")


def adopt_wheel(cfg: Config, name: str, wheel: Path) -> Path:
    """Publish an existing ``wheel`` as package ``name``'s current build (its dependants then
    build against exactly these bytes); a later ``nox -s NAME`` still rebuilds it, since no
    fingerprint matches. ``rebuild-check`` seeds a fresh wheelhouse this way."""
    entry = Wheelhouse(cfg.build.wheelhouse).publish(wheel)
    _write_state(cfg.build.work_dir / name, f"adopted {entry.sha256}", {}, entry)
    return entry.path


def _write_state(work: Path, fingerprint: str, inputs: dict, entry) -> None:
    state = {
        "fingerprint": fingerprint,
        "inputs": inputs,
        "wheel": entry.path.name,
        "size": entry.path.stat().st_size,
        "sha256": entry.sha256,
    }
    atomic_write(work / STATE_FILE, json.dumps(state, indent=2, sort_keys=True))


def _sha256_of(house: Wheelhouse, wheel: Path) -> str:
    entry = house.entry(wheel.name)
    if entry is None:  # withdrawn since dependency_wheels found it
        raise UserError(f"{wheel.name} left the wheelhouse during this build; run the build again")
    return entry.sha256


def _changed(old: Mapping, new: Mapping) -> list[str]:
    """Names of the inputs that differ, e.g. ``["arch", "env.CXXFLAGS"]``."""
    changed = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict) and key in ("env", "package", "compilers"):
            changed += [f"{key}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            changed.append(key)
    return changed or ["wheel missing from the wheelhouse"]


def _remove(path: Path) -> None:
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
    except OSError as exc:  # e.g. a process outside rocmforge still writing there
        raise UserError(
            f"{path}: could not remove it ({exc.strerror}); stop whatever still writes there, then run again"
        ) from None


def _say_waiting(name: str):
    def say(holder: str) -> None:
        console.print(f"{name}: another build holds the lock ({holder}); waiting")

    return say


def index_session(session, cfg: Config) -> None:
    """nox entry point of the ``index`` session: regenerate the index, print install commands.

    A configured package without its wheel fails the session: installing the stack without it
    would take PyPI's release of that name (or none), not the one configured here.
    """
    from rocmforge.build.install import REQUIREMENTS, install_commands, resolved_offline

    house = Wheelhouse(cfg.build.wheelhouse)
    entries = house.reindex()
    if not entries:
        first = cfg.build_order()[0]
        raise UserError(f"{house.root}: no wheels to index; build some first, e.g. `nox -s {first}`")
    for e in entries:
        session.log(f"{e.project} {e.version}  {e.path.name}")
    missing = [
        n
        for n in cfg.build_order()
        if _published(house, read_json(cfg.build.work_dir / n / STATE_FILE)) is None
    ]
    if missing:
        raise UserError(
            f"{house.root} lacks {', '.join(missing)} of the configured stack (never built here, or "
            f"withdrawn); build it first (nox -s {' '.join(missing)}): installing without it would take "
            "PyPI's release of that name"
        )
    if not (house.root / REQUIREMENTS).is_file():
        raise UserError(
            f"{house.root / REQUIREMENTS} could not be written (see the line above); install commands need it"
        )
    session.log(f"index: {house.simple}  requirements: {house.root / REQUIREMENTS}")
    for command in install_commands(house.root, offline=resolved_offline(house.root)):
        session.log(command)


# --- python -m rocmforge env: the environment a build of PACKAGE would get, from what is on disk
def add_arguments(parser) -> None:
    """Arguments of ``python -m rocmforge env``."""
    parser.add_argument("package", metavar="PACKAGE", help="a package from build_config.toml")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--shell", action="store_true", help="print export lines (eval them to rebuild by hand)")
    fmt.add_argument("--json", action="store_true", help="print a JSON object")


def main(args) -> int:
    """Print a package's build environment (:func:`rocmforge.build.environment.build_environment`)."""
    from rocmforge import host
    from rocmforge.build import environment as buildenv
    from rocmforge.config import load_config

    cfg = load_config()
    cfg.package(args.package)  # a one-line error for a name that is not configured
    facts = host.gather(build_dir=cfg.build.work_dir)
    ctx = planned_context(cfg, args.package)
    env = buildenv.build_environment(cfg, args.package, facts, base_env=os.environ, ctx=ctx)
    compile_cache.install_wrappers(cfg, {**os.environ, **env})  # so that the variables work by hand
    if args.json:
        print(json.dumps(env, indent=2))
    elif args.shell:
        for note in cfg.overrides:
            print(f"# {note}")
        print("\n".join(buildenv.shell_lines(env)))
    else:
        for note in cfg.overrides:
            print(f"rocmforge env: {note}", file=sys.stderr)
        width = max(map(len, env))
        for key, value in env.items():
            print(f"{key:<{width}}  {value}")
    return 0
