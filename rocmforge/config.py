"""``build_config.toml``: loaded once into a validated, frozen model.

Every error names the dotted key that is wrong (``packages.vllm.source.sha256: ...``) and
what to write instead. Environment variables users already know override the file, and each
override is recorded in ``Config.overrides`` so sessions can say so:

- ``ROCMFORGE_CONFIG``: path of the config file to load instead of ``build_config.toml``;
- ``PYTORCH_ROCM_ARCH``: ``build.arch`` (semicolon-separated);
- ``MAX_JOBS``: ``build.jobs``;
- ``ROCMFORGE_CACHE``: ``build.cache_dir``;
- ``ROCMFORGE_SIGNING_KEY``: ``build.signing_key``;
- ``ROCMFORGE_COMPILE_CACHE`` / ``ROCMFORGE_COMPILE_CACHE_BACKEND``: ``build.compile_cache``
  (tool) and ``build.compile_cache.backend``; sccache's and ccache's own endpoint variables
  (``SCCACHE_REDIS_ENDPOINT``, ``SCCACHE_BUCKET``, ...) override the store's url and bucket.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmforge.arch import parse_arch_list
from rocmforge.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

BACKENDS = ("rocm", "cuda", "cpu")
RECIPES = ("pytorch", "triton", "torchvision", "torchaudio", "vllm", "generic")
SOURCE_KINDS = ("git", "pypi", "url", "path", "rocm")
# Tools a ``[[packages.X.requires]]`` entry may name: the ones the doctor knows how to measure.
REQUIREMENT_TOOLS = ("gcc", "g++", "clang", "cmake", "ninja", "git", "python", "rocm", "nvcc")
# Those among them a build venv installs from PyPI under the requirement's spec, so the build runs
# that one (the venv's bin comes first on PATH), not the host's: requirements-build.txt's bare
# `cmake` can then never bring CMake 4.
VENV_TOOLS = ("cmake", "ninja")
COMPILE_CACHES = ("none", "ccache", "sccache")
CACHE_BACKENDS = ("local", "redis", "s3", "gcs")
# The variables sccache and ccache read themselves; set in the environment they win over the
# file, like PYTORCH_ROCM_ARCH does. (tool, backend, variable, CacheStore field)
_NATIVE_CACHE_VARS = (
    ("sccache", "redis", "SCCACHE_REDIS_ENDPOINT", "url"),
    ("sccache", "s3", "SCCACHE_ENDPOINT", "url"),
    ("sccache", "s3", "SCCACHE_BUCKET", "bucket"),
    ("sccache", "s3", "SCCACHE_REGION", "region"),
    ("sccache", "gcs", "SCCACHE_GCS_BUCKET", "bucket"),
    ("ccache", "redis", "CCACHE_REMOTE_STORAGE", "url"),
)
_REDIS_URL_RE = re.compile(r"^(redis|rediss|redis\+unix|unix)://")
# Used with fullmatch: "$" alone also matches before a trailing newline ("<sha>\n" passed).
_SIZE_RE = re.compile(r"[0-9]+(\.[0-9]+)?[KMGT]?")
DEFAULT_CONFIG = "build_config.toml"
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_OPT_RE = re.compile(r"O[0-3sz]")
_LOCAL_VERSION_RE = re.compile(r"[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)*")  # PEP 440 local version label


@dataclass(frozen=True)
class Source:
    """Where a package's source comes from. Which fields apply depends on ``kind``."""

    kind: str
    url: str | None = None  # git, url
    rev: str | None = None  # git: tag, branch or commit (what a human reads)
    commit: str | None = None  # git: the commit ``rev`` must resolve to (what a machine trusts)
    submodules: bool = True  # git
    name: str | None = None  # pypi: project name
    version: str | None = None  # pypi
    sha256: str | None = None  # pypi, url
    path: Path | None = None  # path: a local tree, for people developing the upstream
    rocm_path: str | None = None  # rocm: a tree inside the ROCm install, e.g. "share/amd_smi"
    subdir: str | None = None  # where the buildable project lives inside the tree


@dataclass(frozen=True)
class Patch:
    """One patch file applied on top of a package's source."""

    file: str  # relative to patches/<package>/
    sha256: str
    reason: str
    upstream: str | None = None  # link to the upstream issue/PR the patch comes from
    versions: str | None = None  # PEP 440 specifier of package versions it applies to
    workdir: str | None = None  # directory inside the tree (a submodule) to apply it in


@dataclass(frozen=True)
class Requirement:
    """A toolchain requirement tied to a pin: ``tool`` must satisfy ``spec`` because ``why``."""

    tool: str  # gcc, g++, clang, cmake, ninja, git, python, rocm
    spec: str  # PEP 440 specifier, e.g. ">=13" or ">=3.26.1,<4"
    why: str


@dataclass(frozen=True)
class Prebuilt:
    """Take a ready-made wheel instead of building: ``requirement`` from ``index``."""

    requirement: str
    index: str | None = None


@dataclass(frozen=True)
class Package:
    """One buildable (or prebuilt) package and everything that shapes its build."""

    name: str
    recipe: str
    version: str | None
    depends: tuple[str, ...]
    source: Source | None
    prebuilt: Prebuilt | None
    patches: tuple[Patch, ...]
    requires: tuple[Requirement, ...]
    env: Mapping[str, str]
    gb_per_job: float
    local_version: str | None
    pin_from: str | None  # take the pin from this package's tree (Triton from PyTorch)
    override_pin: bool  # on purpose: keep our pin even if ``pin_from`` disagrees
    options: Mapping[str, Any]  # recipe-specific knobs, documented per recipe
    # GPU archs this package supports; it is built for build.arch narrowed to these
    # (aiter: gfx942, gfx950). None: all of build.arch. See :func:`package_archs`.
    arch: tuple[str, ...] | None = None
    # Dependencies whose Requires-Dist stays as the build wrote it instead of ``==`` our wheel.
    unpinned_depends: tuple[str, ...] = ()


@dataclass(frozen=True)
class CacheStore:
    """Where ``build.compile_cache`` keeps objects (its table form; see docs/scaling.md).

    ``local`` is a directory on this machine; ``redis``, ``s3`` and ``gcs`` are shared by every
    builder pointed at them (s3 and gcs need sccache; ccache stores locally or in redis).
    """

    backend: str = "local"
    dir: Path | None = None  # local: default <build.cache_dir>/<tool>
    size: str = "50G"  # local: size limit
    url: str | None = None  # redis: redis://host:6379/0; s3: endpoint of an S3-compatible store
    bucket: str | None = None  # s3, gcs
    region: str | None = None  # s3
    prefix: str = "rocmforge"  # key prefix, so several projects can share one store
    hip: bool = True  # also cache HIP compiles (hipcc's clang via HIP_CLANG_PATH, CMake's HIP)


@dataclass(frozen=True)
class Build:
    """The ``[build]`` table: what every package is built for and with."""

    backend: str
    arch: tuple[str, ...]
    cuda_arch: tuple[str, ...]
    jobs: int | None  # None = derive from cores and memory
    opt_level: str
    compile_cache: str
    python: str | None
    work_dir: Path
    wheelhouse: Path
    logs_dir: Path
    third_party: Path
    cache_dir: Path
    cache_store: CacheStore = CacheStore()  # where compile_cache keeps objects
    retry: tuple[str, ...] = ()  # diagnosis categories retried once with their remedy
    signing_key: Path | None = None  # OpenSSH private key that signs provenance statements


@dataclass(frozen=True)
class Config:
    """The whole validated configuration. Build it with :func:`load_config`."""

    path: Path
    root: Path  # directory relative paths are resolved against
    rocm_version: str | None
    build: Build
    packages: Mapping[str, Package]
    overrides: tuple[str, ...] = field(default=())  # human-readable notes, one per override

    def package(self, name: str) -> Package:
        """The package called ``name``, or a one-line error listing the configured ones."""
        try:
            return self.packages[name]
        except KeyError:
            raise UserError(
                f"no package {name!r} in {self.path.name}; configured: {', '.join(self.packages)}"
            ) from None

    def build_order(self, names: list[str] | None = None) -> list[str]:
        """``names`` (default: all) plus their dependencies, dependencies first."""
        order: list[str] = []

        def visit(n: str, stack: tuple[str, ...]) -> None:
            if n in order:
                return
            for dep in self.package(n).depends:
                visit(dep, (*stack, n))
            order.append(n)

        for n in names or list(self.packages):
            visit(n, ())
        return order


class _Table:
    """A TOML table being read: typed getters that name the dotted key, and unknown-key checks."""

    def __init__(self, data: Any, path: str):
        if not isinstance(data, dict):
            raise UserError(f"{path}: expected a table, got {_type(data)}")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, types: type | tuple[type, ...], default: Any = None, *, required=False):
        self.used.add(name)
        if name not in self.data:
            if required:
                raise UserError(f"{self.key(name)}: missing; add it to the config")
            return default
        value = self.data[name]
        # bool is an int in Python; a TOML `true` must not pass for a number.
        if isinstance(value, bool) and bool not in _as_tuple(types):
            raise UserError(f"{self.key(name)}: expected {_names(types)}, got a boolean")
        if not isinstance(value, types):
            raise UserError(f"{self.key(name)}: expected {_names(types)}, got {_type(value)}")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str | None = None, **kw) -> str:
        value = self.get(name, str, default, **kw)
        if value is not None and value not in choices:
            raise UserError(f"{self.key(name)}: {value!r} is not one of {', '.join(choices)}")
        return value

    def strings(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.get(name, list, None)
        if value is None:
            return default
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise UserError(f"{self.key(name)}[{i}]: expected a string, got {_type(item)}")
        return tuple(value)

    def table(self, name: str) -> _Table | None:
        value = self.get(name, dict, None)
        return None if value is None else _Table(value, self.key(name))

    def tables(self, name: str) -> list[_Table]:
        value = self.get(name, list, [])
        return [_Table(item, f"{self.key(name)}[{i}]") for i, item in enumerate(value)]

    def done(self) -> None:
        """Refuse keys we did not read: a typo must not be silently ignored."""
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            close = difflib.get_close_matches(unknown[0], self.used, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            known = ", ".join(sorted(self.used))
            raise UserError(f"{self.key(unknown[0])}: unknown key; {hint}known keys here: {known}")


def _as_tuple(types):
    return types if isinstance(types, tuple) else (types,)


def _names(types) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true/false",
        list: "an array",
        dict: "a table",
    }
    return " or ".join(names.get(t, t.__name__) for t in _as_tuple(types))


def _type(value: Any) -> str:
    return {
        bool: "a boolean",
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _path(base: Path, text: str) -> Path:
    return (base / os.path.expanduser(text)).resolve()


def _source(t: _Table, root: Path) -> Source:
    kind = t.choice("kind", SOURCE_KINDS, required=True)
    src = Source(
        kind=kind,
        url=t.get("url", str),
        rev=t.get("rev", str),
        commit=t.get("commit", str),
        submodules=t.get("submodules", bool, True),
        name=t.get("name", str),
        version=t.get("version", str),
        sha256=t.get("sha256", str),
        subdir=t.get("subdir", str),
    )
    p = t.get("path", str)
    if p is not None and kind == "rocm":
        _check_inside(p, t.key("path"))  # relative to the ROCm install, never outside it
        src = replace(src, rocm_path=p)
    elif p:
        src = replace(src, path=_path(root, p))
    t.done()
    needed = {
        "git": ("url", "rev"),
        "pypi": ("name", "version", "sha256"),
        "url": ("url", "sha256"),
        "path": ("path",),
        "rocm": (),
    }[kind]
    if kind == "rocm" and not src.rocm_path:
        raise UserError(
            f"{t.key('path')}: required for a rocm source: the tree inside the ROCm install, "
            'e.g. "share/amd_smi"'
        )
    for name in needed:
        if getattr(src, name) in (None, ""):
            raise UserError(f"{t.key(name)}: required for a {kind} source")
    if src.sha256 is not None and not _SHA256_RE.fullmatch(src.sha256):
        raise UserError(f"{t.key('sha256')}: {src.sha256!r} is not 64 lowercase hex digits")
    if src.commit is not None and not re.fullmatch(r"[0-9a-f]{7,40}", src.commit):
        raise UserError(f"{t.key('commit')}: {src.commit!r} is not a hex commit id (7-40 digits)")
    if src.subdir is not None:
        _check_inside(src.subdir, t.key("subdir"))
    # urllib downloads these; anything else was a ValueError traceback at checkout time.
    if kind == "url" and urlsplit(src.url).scheme not in ("http", "https", "file"):
        raise UserError(f"{t.key('url')}: {src.url!r} is not an http(s):// or file:// URL of the archive")
    return src


def _patch(t: _Table) -> Patch:
    p = Patch(
        file=t.get("file", str, required=True),
        sha256=t.get("sha256", str, required=True),
        reason=t.get("reason", str, required=True),
        upstream=t.get("upstream", str),
        versions=t.get("versions", str),
        workdir=t.get("workdir", str),
    )
    t.done()
    if not _SHA256_RE.fullmatch(p.sha256):
        raise UserError(f"{t.key('sha256')}: {p.sha256!r} is not 64 lowercase hex digits")
    if p.versions is not None:
        _check_specifier(p.versions, t.key("versions"))
    if p.workdir is not None:  # patches.py strips the slashes: "/ext/lib" means ext/lib
        _check_inside(p.workdir.strip("/"), t.key("workdir"))
    return p


def _check_inside(text: str, key: str) -> None:
    """A path inside the source tree: "../x" or "/x" would build or patch outside the checkout."""
    parts = Path(text).parts
    if Path(text).is_absolute() or ".." in parts:
        raise UserError(f"{key}: {text!r} must be a relative path inside the source tree, without '..'")


def _check_specifier(spec: str, key: str) -> None:
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        raise UserError(
            f"{key}: {spec!r} is not a version specifier such as '>=13' or '>=3.26.1,<4'"
        ) from None


def _check_version(text: str, key: str, *, example: str) -> None:
    try:
        Version(text)
    except InvalidVersion:
        raise UserError(f"{key}: {text!r} is not a version such as {example!r}") from None


def _check_requirement(text: str, key: str) -> None:
    """``text`` must be a PEP 508 requirement: pip gets it as is, and would fail only mid-session."""
    try:
        Pep508(text)
    except InvalidRequirement:
        raise UserError(f"{key}: {text!r} is not a requirement such as 'torch==2.13.0+rocm7.2'") from None


def _requirement(t: _Table) -> Requirement:
    r = Requirement(
        tool=t.get("tool", str, required=True),
        spec=t.get("spec", str, required=True),
        why=t.get("why", str, required=True),
    )
    t.done()
    if r.tool not in REQUIREMENT_TOOLS:
        close = difflib.get_close_matches(r.tool, REQUIREMENT_TOOLS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(REQUIREMENT_TOOLS)}"
        raise UserError(f"{t.key('tool')}: the doctor cannot check {r.tool!r}; {hint}")
    _check_specifier(r.spec, t.key("spec"))
    return r


def _package(name: str, t: _Table, root: Path) -> Package:
    if not _NAME_RE.fullmatch(name):
        raise UserError(f"{t.path}: package names are letters, digits and _ (it becomes a nox session)")
    recipe = t.choice("recipe", RECIPES, "generic")
    src_t = t.table("source")
    pre_t = t.table("prebuilt")
    source = _source(src_t, root) if src_t else None
    prebuilt = None
    if pre_t:
        prebuilt = Prebuilt(
            requirement=pre_t.get("requirement", str, required=True), index=pre_t.get("index", str)
        )
        pre_t.done()
        _check_requirement(prebuilt.requirement, pre_t.key("requirement"))
    env = t.get("env", dict, {})
    for k, v in env.items():
        # `env --shell` prints `export K=V`: a name like "A B" would be a broken shell line.
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise UserError(f"{t.key('env')}.{k}: not an environment variable name (letters, digits, _)")
        if not isinstance(v, str):
            raise UserError(f"{t.key('env')}.{k}: expected a string, got {_type(v)}")
    gb = t.get("gb_per_job", (int, float), 2.0)
    # TOML has nan and inf; neither divides memory into a job count (nan was a traceback).
    if not math.isfinite(gb) or gb <= 0:
        raise UserError(f"{t.key('gb_per_job')}: must be a positive number (GB of RAM one compile job needs)")
    local_version = t.get("local_version", str)
    # Checked here: a bad label otherwise fails only after the build, naming the wheel file.
    if local_version is not None and not _LOCAL_VERSION_RE.fullmatch(local_version):
        raise UserError(
            f"{t.key('local_version')}: {local_version!r} is not a PEP 440 local version label; "
            "use letters, digits and '.', e.g. 'rocm7.2'"
        )
    pkg = Package(
        name=name,
        recipe=recipe,
        version=t.get("version", str),
        depends=t.strings("depends"),
        source=source,
        prebuilt=prebuilt,
        patches=tuple(_patch(p) for p in t.tables("patches")),
        requires=tuple(_requirement(r) for r in t.tables("requires")),
        env=MappingProxyType(dict(env)),
        gb_per_job=float(gb),
        local_version=local_version,
        pin_from=t.get("pin_from", str),
        override_pin=t.get("override_pin", bool, False),
        options=MappingProxyType(dict(t.get("options", dict, {}))),
        arch=_package_arch(t),
        unpinned_depends=t.strings("unpinned_depends"),
    )
    t.done()  # first: a typo such as `sources = {...}` is an unknown key, not a missing [source]
    if source is None and prebuilt is None:
        raise UserError(f"{t.path}: needs a [source] table (or [prebuilt] to take a ready wheel)")
    if source is not None and prebuilt is not None:
        raise UserError(f"{t.path}: has both [source] and [prebuilt]; keep one")
    for i, dep in enumerate(pkg.unpinned_depends):
        if dep not in pkg.depends:
            raise UserError(
                f"{t.key('unpinned_depends')}[{i}]: {dep!r} is not in depends; list only dependencies"
            )
    return pkg


def _package_arch(t: _Table) -> tuple[str, ...] | None:
    """``packages.X.arch``: the archs the package supports (a list, or "gfx942;gfx950")."""
    value = t.get("arch", (list, str), None)
    return None if value is None else parse_arch_list(value, key=t.key("arch"))


def package_archs(cfg: Config, pkg: Package) -> tuple[str, ...]:
    """The ROCm archs ``pkg`` is built for: ``build.arch`` narrowed to ``packages.X.arch``.

    In build.arch's order. Empty when the two share nothing, which only an environment
    override can cause (a file that does so is refused at load); the package's build then
    stops with :func:`require_package_archs`'s one line.
    """
    if pkg.arch is None:
        return tuple(cfg.build.arch)
    wanted = {a.split(":")[0] for a in pkg.arch}
    return tuple(a for a in cfg.build.arch if a.split(":")[0] in wanted)


def require_package_archs(cfg: Config, pkg: Package) -> tuple[str, ...]:
    """:func:`package_archs`, or a one-line error when the package has none to build for."""
    archs = package_archs(cfg, pkg)
    if not archs and cfg.build.backend == "rocm":
        raise UserError(
            f"packages.{pkg.name}.arch: {pkg.name} supports only {';'.join(pkg.arch)}, none of which is in "
            f"build.arch ({';'.join(cfg.build.arch)}); add one to build.arch / PYTORCH_ROCM_ARCH "
            f"or skip {pkg.name}"
        )
    return archs


def _env_choice(
    environ: Mapping[str, str], var: str, choices: tuple[str, ...], value: str, key: str, notes: list[str]
) -> str:
    """``value``, or the environment's ``var`` in its place (checked against ``choices``, noted)."""
    if var not in environ:
        return value
    if environ[var] not in choices:
        raise UserError(f"{var}: {environ[var]!r} is not one of {', '.join(choices)}")
    notes.append(f"{var}={environ[var]!r} overrides {key}")
    return environ[var]


def _compile_cache(t: _Table, root: Path, environ: Mapping[str, str], notes: list[str]):
    """``build.compile_cache``: a tool name, or a table with ``tool`` and where it stores."""
    raw = t.get("compile_cache", (str, dict), "none")
    ct = _Table(raw if isinstance(raw, dict) else {}, t.key("compile_cache"))
    if isinstance(raw, str):
        tool = t.choice("compile_cache", COMPILE_CACHES, "none")
    else:
        tool = ct.choice("tool", COMPILE_CACHES, required=True)
    backend = ct.choice("backend", CACHE_BACKENDS, "local")
    tool = _env_choice(environ, "ROCMFORGE_COMPILE_CACHE", COMPILE_CACHES, tool, ct.path, notes)
    backend = _env_choice(
        environ, "ROCMFORGE_COMPILE_CACHE_BACKEND", CACHE_BACKENDS, backend, ct.key("backend"), notes
    )
    store = CacheStore(
        backend=backend,
        dir=_path(root, d) if (d := ct.get("dir", str)) else None,
        size=ct.get("size", str, "50G"),
        url=ct.get("url", str),
        bucket=ct.get("bucket", str),
        region=ct.get("region", str),
        prefix=ct.get("prefix", str, "rocmforge"),
        hip=ct.get("hip", bool, True),
    )
    ct.done()
    for var_tool, var_backend, var, name in _NATIVE_CACHE_VARS:
        if (tool, backend) == (var_tool, var_backend) and environ.get(var):
            # The value is not shown: endpoints often carry a password.
            notes.append(f"{var} (set in the environment) overrides {ct.key(name)}")
            store = replace(store, **{name: environ[var]})
    if tool == "ccache" and backend in ("s3", "gcs"):
        raise UserError(
            f'{ct.key("backend")}: {backend!r} needs tool = "sccache"; ccache stores locally or in redis'
        )
    if backend == "redis" and not (store.url and _REDIS_URL_RE.match(store.url)):
        var = "SCCACHE_REDIS_ENDPOINT" if tool == "sccache" else "CCACHE_REMOTE_STORAGE"
        raise UserError(  # the value is not shown: it may hold a password
            f'{ct.key("url")}: the redis backend needs a redis:// URL such as "redis://cache.lan:6379/0",'
            f" here or in {var}"
        )
    if backend in ("s3", "gcs") and not store.bucket:
        raise UserError(f"{ct.key('bucket')}: required for the {backend} backend")
    if not _SIZE_RE.fullmatch(store.size):
        raise UserError(f'{ct.key("size")}: {store.size!r} is not a size such as "50G" or "500M"')
    return tool, store


_CUDA_ARCH_RE = re.compile(r"[0-9]+\.[0-9]+[af]?(\+PTX)?")


def _cuda_archs(t: _Table) -> tuple[str, ...]:
    """``build.cuda_arch``: TORCH_CUDA_ARCH_LIST entries such as 9.0, 9.0a or 8.6+PTX."""
    archs = t.strings("cuda_arch")
    for i, arch in enumerate(archs):
        if not _CUDA_ARCH_RE.fullmatch(arch):
            m = re.fullmatch(r"(?:sm|compute)_([0-9]+)([0-9])([af]?)", arch)
            hint = f"write {m.group(1)}.{m.group(2)}{m.group(3)!s}" if m else "write e.g. 9.0 or 8.6+PTX"
            raise UserError(
                f"{t.key('cuda_arch')}[{i}]: {arch!r} is not a TORCH_CUDA_ARCH_LIST entry; {hint}"
            )
    return archs


def _build(t: _Table, root: Path, environ: Mapping[str, str], notes: list[str]) -> Build:
    backend = t.choice("backend", BACKENDS, "rocm")
    arch_value = t.get("arch", (list, str), [])
    arch_key = t.key("arch")
    if "PYTORCH_ROCM_ARCH" in environ:
        notes.append(f"PYTORCH_ROCM_ARCH={environ['PYTORCH_ROCM_ARCH']!r} overrides {arch_key}")
        arch_value, arch_key = environ["PYTORCH_ROCM_ARCH"], "PYTORCH_ROCM_ARCH"
    jobs = t.get("jobs", (int, str), "auto")
    if "MAX_JOBS" in environ:
        notes.append(f"MAX_JOBS={environ['MAX_JOBS']!r} overrides {t.key('jobs')}")
        jobs = environ["MAX_JOBS"]
        # Not str.isdigit: it accepts '²', which int() then refuses with a traceback.
        if not re.fullmatch(r"[0-9]+", jobs) or int(jobs) < 1:
            raise UserError(f"MAX_JOBS: {jobs!r} is not a positive integer; unset it or use e.g. MAX_JOBS=8")
        jobs = int(jobs)
    if jobs == "auto":
        jobs = None
    elif not isinstance(jobs, int) or jobs < 1:
        raise UserError(f'{t.key("jobs")}: {jobs!r} must be a positive integer or "auto"')
    opt = t.get("opt_level", str, "O3")
    if not _OPT_RE.fullmatch(opt):
        raise UserError(f"{t.key('opt_level')}: {opt!r} must be one of O0, O1, O2, O3, Os, Oz")
    cache_default = default_cache_dir(environ)
    if environ.get("ROCMFORGE_CACHE"):
        notes.append(f"ROCMFORGE_CACHE={environ['ROCMFORGE_CACHE']!r} overrides {t.key('cache_dir')}")
        t.used.add("cache_dir")
        cache_dir = cache_default
    else:
        cache_dir = t.get("cache_dir", str, cache_default)
    compile_cache, cache_store = _compile_cache(t, root, environ, notes)
    signing_key = t.get("signing_key", str)
    signing_key_via = t.key("signing_key")
    if environ.get("ROCMFORGE_SIGNING_KEY"):
        notes.append(
            f"ROCMFORGE_SIGNING_KEY={environ['ROCMFORGE_SIGNING_KEY']!r} overrides {signing_key_via}"
        )
        signing_key, signing_key_via = environ["ROCMFORGE_SIGNING_KEY"], "ROCMFORGE_SIGNING_KEY"
    if signing_key is not None:
        signing_key = _path(root, signing_key)
        if not signing_key.is_file():
            raise UserError(
                f"{signing_key_via}: {signing_key} is not a file; point it at an OpenSSH private key "
                "(e.g. made by `ssh-keygen -t ed25519 -N '' -f rocmforge-signing`) or remove it"
            )
    fields = dict(
        backend=backend,
        cuda_arch=_cuda_archs(t),
        jobs=jobs,
        opt_level=opt,
        compile_cache=compile_cache,
        python=t.get("python", str),
        work_dir=_directory(t, root, "work_dir", "build"),
        wheelhouse=_directory(t, root, "wheelhouse", "wheelhouse"),
        logs_dir=_directory(t, root, "logs_dir", "logs"),
        third_party=_directory(t, root, "third_party", "third_party"),
        cache_dir=_path(root, cache_dir),
        cache_store=cache_store,
        retry=_retry(t),
        signing_key=signing_key,
    )
    t.done()
    # The arch list is checked after the table's keys: a typo such as `archs = [...]` must get
    # the unknown-key error, not "the arch list is empty".
    arch = (
        parse_arch_list(arch_value, key=arch_key)
        if backend == "rocm"
        else tuple(parse_arch_list(arch_value, key=arch_key) if arch_value else ())
    )
    b = Build(arch=arch, **fields)
    # A file where a directory goes was a NotADirectoryError traceback from the first mkdir.
    for name in ("work_dir", "wheelhouse", "logs_dir", "third_party", "cache_dir"):
        where = getattr(b, name)
        if where.exists() and not where.is_dir():
            via = "ROCMFORGE_CACHE" if name == "cache_dir" and environ.get("ROCMFORGE_CACHE") else t.key(name)
            raise UserError(f"{via}: {where} is a file, not a directory; point it at a directory")
    return b


def default_cache_dir(environ: Mapping[str, str]) -> str:
    """``build.cache_dir`` when the file does not set it: ``$ROCMFORGE_CACHE``, else
    ``$XDG_CACHE_HOME/rocmforge`` (``~/.cache/rocmforge``)."""
    return environ.get("ROCMFORGE_CACHE") or os.path.join(
        environ.get("XDG_CACHE_HOME") or "~/.cache", "rocmforge"
    )


def _directory(t: _Table, root: Path, name: str, default: str) -> Path:
    """A directory key of ``[build]``; "" would be the config's own directory, where checkouts
    named like a top-level folder (docs, tests) would replace it."""
    text = t.get(name, str, default)
    if not text.strip():
        raise UserError(
            f'{t.key(name)}: empty; name a directory such as "{default}" (relative to the config file)'
        )
    return _path(root, text)


# The diagnosis categories live with the diagnose rules; config reads only their names, so it
# needs no import of the engine (which itself reads Config).
DIAGNOSE_RULES = Path(__file__).parent / "diagnose" / "rules.toml"


def diagnosis_categories() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every diagnosis category, the retryable ones), from ``diagnose/rules.toml``."""
    with open(DIAGNOSE_RULES, "rb") as f:
        categories = tomllib.load(f)["categories"]
    return (*categories, "unknown"), tuple(c for c, spec in categories.items() if spec.get("retryable"))


def _retry(t: _Table) -> tuple[str, ...]:
    """``build.retry``: failure categories that have a mechanical remedy (see docs/diagnose.md)."""
    names = t.strings("retry")
    if not names:
        return ()
    categories, retryable = diagnosis_categories()
    for name in names:
        if name not in categories:
            close = difflib.get_close_matches(name, categories, n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            raise UserError(
                f"{t.key('retry')}: {name!r} is not a diagnosis category; {guess}"
                f"retryable: {', '.join(retryable)}"
            )
        if name not in retryable:
            raise UserError(
                f"{t.key('retry')}: {name!r} has no automatic remedy; retryable: {', '.join(retryable)}"
            )
    return tuple(names)


def parse_config(data: Mapping[str, Any], *, path: Path, environ: Mapping[str, str] | None = None) -> Config:
    """Validate already-parsed TOML ``data`` into a :class:`Config` (pure; used by tests)."""
    environ = os.environ if environ is None else environ
    root = path.parent.resolve()
    top = _Table(dict(data), "")
    notes: list[str] = []
    tool_t = top.table("toolchain")
    rocm_version = None
    if tool_t:
        rocm_version = tool_t.get("rocm_version", str)
        tool_t.done()
        if rocm_version is not None:  # the doctor compares it as a version (was a traceback there)
            _check_version(rocm_version, tool_t.key("rocm_version"), example="7.2")
    build_t = top.table("build") or _Table({}, "build")
    build = _build(build_t, root, environ, notes)
    pk_t = top.table("packages")
    if pk_t is None or not pk_t.data:
        raise UserError("packages: no packages configured; add a [packages.NAME] table")
    packages: dict[str, Package] = {}
    for name in pk_t.data:
        packages[name] = _package(name, pk_t.table(name), root)
    pk_t.done()
    top.done()
    for pkg in packages.values():
        for dep in (*pkg.depends, *([pkg.pin_from] if pkg.pin_from else [])):
            if dep not in packages:
                raise UserError(f"packages.{pkg.name}: depends on {dep!r}, which is not configured")
    cfg = Config(
        path=path,
        root=root,
        rocm_version=rocm_version,
        build=build,
        packages=MappingProxyType(packages),
        overrides=tuple(notes),
    )
    _check_cycles(cfg)
    _check_package_archs(cfg, arch_overridden="PYTORCH_ROCM_ARCH" in environ)
    return cfg


def _check_package_archs(cfg: Config, *, arch_overridden: bool) -> None:
    """A package's arch list must meet build.arch; an override narrowing it away is noted instead."""
    if cfg.build.backend != "rocm":
        return
    for pkg in cfg.packages.values():
        if pkg.arch is None or package_archs(cfg, pkg):
            continue
        if not arch_overridden:
            raise UserError(
                f"packages.{pkg.name}.arch: none of {';'.join(pkg.arch)} is in build.arch "
                f"({';'.join(cfg.build.arch)}); add one to build.arch or fix the package's list"
            )


def _check_cycles(cfg: Config) -> None:
    state: dict[str, int] = {}

    def visit(n: str, chain: list[str]) -> None:
        if state.get(n) == 1:
            raise UserError(f"packages.{n}.depends: dependency cycle {' -> '.join([*chain, n])}")
        if state.get(n) == 2:
            return
        state[n] = 1
        for d in cfg.packages[n].depends:
            visit(d, [*chain, n])
        state[n] = 2

    for n in cfg.packages:
        visit(n, [])


def config_path(environ: Mapping[str, str] | None = None, start: Path | None = None) -> Path:
    """The config file to load: ``$ROCMFORGE_CONFIG`` or ``build_config.toml`` in ``start``."""
    environ = os.environ if environ is None else environ
    if environ.get("ROCMFORGE_CONFIG"):
        return Path(environ["ROCMFORGE_CONFIG"]).expanduser().resolve()
    return (start or Path.cwd()) / DEFAULT_CONFIG


def load_config(path: Path | str | None = None, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate the config file (see :func:`config_path` for which one)."""
    environ = os.environ if environ is None else environ
    p = Path(path) if path is not None else config_path(environ)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise UserError(
            f"{p}: config file not found; run from the rocmforge checkout or set ROCMFORGE_CONFIG"
        ) from None
    except OSError as exc:  # a directory, no permission: still the user's path, not a bug
        raise UserError(
            f"{p}: cannot read the config file ({exc.strerror or exc}); point ROCMFORGE_CONFIG at a TOML file"
        ) from None
    try:
        # utf-8-sig: editors on Windows save a byte-order mark, which TOML parsers refuse.
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(data, path=p.resolve(), environ=environ)
