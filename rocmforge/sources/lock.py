"""``rocmforge.lock.toml``: exactly which sources and toolchain a build used, to replay or check it.

Per package: the resolved commit and every submodule's commit, the archive sha256, the
patch files with their sha256 and a fingerprint of it all; plus the toolchain facts that
shape the binaries (ROCm version, compiler versions). The file is TOML with one fact per line,
sorted, so ``git diff`` of two locks reads as a list of what changed.

Locked mode (``ROCMFORGE_LOCKED=1``, or ``nox -s lock -- --locked``) replays the lock: a
package pinned only by a branch gets the lock's commit, and any difference between what would
be checked out and the lock stops the run with the first difference named.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from rocmforge.config import Config
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_lock

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

LOCK_FILE = "rocmforge.lock.toml"
LOCKED_ENV = "ROCMFORGE_LOCKED"
_HEADER = """\
# rocmforge.lock.toml: the exact sources and toolchain of a build.
# Written by `nox -s lock`; replay or check it with ROCMFORGE_LOCKED=1.
# Do not edit by hand: change build_config.toml and run `nox -s lock` again.
"""


def lock_path(cfg: Config) -> Path:
    """The lock file next to the config."""
    return cfg.root / LOCK_FILE


def locked_mode(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``ROCMFORGE_LOCKED`` asks for a replay of the lock."""
    environ = os.environ if environ is None else environ
    return environ.get(LOCKED_ENV, "").lower() in ("1", "true", "yes", "on")


def read_lock(cfg: Config) -> dict | None:
    """The parsed lock file, or None when there is none."""
    path = lock_path(cfg)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid TOML ({exc}); run `nox -s lock` to write it again") from None
    except OSError as exc:  # a directory in its place, no permission
        raise UserError(
            f"{path}: cannot read the lock ({exc.strerror or exc}); remove it and run `nox -s lock`"
        ) from None
    # Callers index packages.<name>.<key>: a hand-edited shape must not become an AttributeError.
    packages = data.get("packages", {})
    if not isinstance(packages, dict) or not all(isinstance(e, dict) for e in packages.values()):
        raise UserError(
            f"{path}: [packages] is not a table of package tables; run `nox -s lock` to write it again"
        )
    return data


def locked_entry(cfg: Config, name: str) -> dict | None:
    """In locked mode, the lock's entry for package ``name``; otherwise None."""
    if not locked_mode():
        return None
    data = read_lock(cfg)
    if data is None:
        raise UserError(f"{LOCKED_ENV}=1 but {lock_path(cfg)} does not exist; run `nox -s lock` first")
    entry = data.get("packages", {}).get(name)
    if entry is None:
        raise UserError(f"{LOCKED_ENV}=1 but {LOCK_FILE} has no package {name!r}; run `nox -s lock` again")
    return entry


def package_entry(checkout) -> dict:
    """What the lock records about one prepared checkout (a :class:`rocmforge.sources.checkout.Checkout`)."""
    entry = {"kind": checkout.kind, "fingerprint": checkout.fingerprint()}
    for key in ("url", "version", "commit", "sha256"):
        value = getattr(checkout, key)
        if value is not None:
            entry[key] = value
    if checkout.submodules:
        entry["submodules"] = dict(sorted(checkout.submodules.items()))
    if checkout.patches:
        entry["patches"] = {file: sha for file, sha in checkout.patches}
    if checkout.dirty:  # the lock tells the truth about the tree; locked mode refuses it
        entry["dirty"] = checkout.dirty
    return entry


def check_checkout(cfg: Config, checkout) -> None:
    """In locked mode, stop when ``checkout`` differs from the lock's entry for its package."""
    entry = locked_entry(cfg, checkout.package)
    if entry is not None:
        refuse_dirty(checkout.package, checkout.path, checkout.dirty)
        require_same(entry, package_entry(checkout), f"packages.{checkout.package}")


def refuse_dirty(package: str, tree, dirty: str | None) -> None:
    """Locked mode reproduces pins and patches; a tree edited on top of them is not that."""
    if dirty:
        raise UserError(
            f"locked mode: {tree} differs from its pin and patches (edits {dirty[:8]}); "
            f"turn them into a patch (python -m rocmforge patch {package} NAME --reason ...) "
            f"or undo them (git -C {tree} checkout .)"
        )


def require_same(locked: Mapping, current: Mapping, prefix: str) -> None:
    """Stop at the first difference between a lock entry and what would be used now."""
    first = next(iter(_differences(locked, current, prefix)), None)
    if first is not None:
        key, was, now = first
        raise UserError(
            f"{LOCKED_ENV}: {key} is {now!r} but {LOCK_FILE} has {was!r}; "
            "run `nox -s lock` to accept the change, or restore the config that made the lock"
        )


def _differences(a: Mapping, b: Mapping, prefix: str):
    # The fingerprint sums up the other keys: name what differs before it.
    for key in sorted({*a, *b}, key=lambda k: (k == "fingerprint", k)):
        if key == "url":
            continue  # where it came from is informational (an sdist has no URL offline); hashes decide
        x, y = a.get(key), b.get(key)
        # A table on one side only (an empty lock, a new package) is compared key by key, so
        # the message names one value instead of printing the whole table.
        if all(isinstance(v, Mapping) for v in (x, y) if v is not None):
            yield from _differences(x or {}, y or {}, f"{prefix}.{key}" if prefix else key)
        elif x != y:
            yield (f"{prefix}.{key}" if prefix else key), x, y


def toolchain_facts(facts=None) -> dict[str, str]:
    """ROCm and compiler versions from host facts (gathered now when not given)."""
    from rocmforge import host

    facts = host.facts() if facts is None else facts
    found = {name: str(version) for name, version in facts.compilers.items() if version}
    if facts.rocm_version:
        found["rocm"] = facts.rocm_version
    found["python"] = ".".join(map(str, sys.version_info[:3]))
    return dict(sorted(found.items()))


def record_build(cfg: Config, checkout, facts) -> None:
    """After a package build: update its entry (and the toolchain) in the lock, keeping the others.

    Every build thus leaves a lock describing what it used; locked mode only reads the lock
    (``sources.prepare`` has already checked the checkout against it).
    """
    if locked_mode():
        return
    path = lock_path(cfg)
    with file_lock(cfg.build.third_party / f".{LOCK_FILE}.lock", what="writing the lock"):
        data = read_lock(cfg) or {}
        packages = dict(data.get("packages", {}))
        packages[checkout.package] = package_entry(checkout)
        text = render({"toolchain": toolchain_facts(facts), "packages": packages})
        if not (path.is_file() and path.read_text() == text):
            atomic_write(path, text)


def render(data: Mapping) -> str:
    """Deterministic TOML: scalar keys first, then sub-tables, all sorted; one fact per line."""
    lines = [_HEADER.rstrip("\n")]

    def table(name: str, t: Mapping) -> None:
        scalars = {k: v for k, v in t.items() if not isinstance(v, Mapping)}
        if scalars:
            lines.append("")
            lines.append(f"[{name}]")
            lines.extend(f"{_key(k)} = {_value(v)}" for k, v in sorted(scalars.items()))
        for k, v in sorted(t.items()):
            if isinstance(v, Mapping):
                table(f"{name}.{_key(k)}", v)

    for k, v in sorted(data.items()):
        table(_key(k), v)
    return "\n".join(lines) + "\n"


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _value(k)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
