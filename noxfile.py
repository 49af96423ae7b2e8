"""rocmforge sessions (nox -l lists them; the logic lives in the rocmforge package).

nox -s toolchain              check the host before anything long starts
nox -s pytorch triton vllm    build the configured packages into the wheelhouse
nox -s verify bench           prove the wheels run, measure them
nox -s lint tests             what CI runs
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from rocmforge.config import load_config  # noqa: E402
from rocmforge.errors import UserError  # noqa: E402

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["toolchain"]
nox.options.error_on_missing_interpreters = False

try:
    CONFIG = load_config()
except UserError as exc:  # a bad config is a one-line error, not a traceback from nox
    sys.exit(f"rocmforge: {exc}")


def _announce(session: nox.Session) -> None:
    for note in CONFIG.overrides:
        session.log(note)


def rocmforge_session(**options):
    """``nox.session`` whose body may raise ``UserError``: it fails the session with that one line.

    Bugs keep their traceback; every session announces the environment overrides in force.
    """

    def decorate(func):
        @functools.wraps(func)
        def run(session: nox.Session) -> None:
            _announce(session)
            try:
                func(session)
            except UserError as exc:
                session.error(str(exc))

        return nox.session(**options)(run)

    return decorate


@rocmforge_session(venv_backend="none")
def toolchain(session: nox.Session) -> None:
    """Check compilers, ROCm, GPUs, permissions and memory against the pinned versions."""
    from rocmforge.build import doctor

    doctor.toolchain_session(session, CONFIG)


def _package_session(name: str):
    def package_session(session: nox.Session) -> None:
        from rocmforge.build import package as build

        build.run_session(session, CONFIG, name)

    pkg = CONFIG.packages[name]
    what = (
        f"Take {pkg.prebuilt.requirement} prebuilt" if pkg.prebuilt else f"Build {name} {pkg.version or ''}"
    )
    package_session.__doc__ = f"{what.strip()} into the wheelhouse ({pkg.recipe} recipe)."
    return package_session


# One session per configured package; `requires` runs its dependencies first.
for _name, _pkg in CONFIG.packages.items():
    rocmforge_session(name=_name, venv_backend="none", requires=list(_pkg.depends))(_package_session(_name))


@rocmforge_session(venv_backend="none")
def lock(session: nox.Session) -> None:
    """Check out every pin and write rocmforge.lock.toml (-- --locked: fail on any difference; --offline)."""
    from rocmforge.sources import checkout as sources

    sources.lock_session(session, CONFIG)


@rocmforge_session(venv_backend="none")
def export(session: nox.Session) -> None:
    """Export sources, patches, lock and build-requirement wheels for an offline build (-- DEST [--tar])."""
    from rocmforge.sources import export as bundle

    bundle.export_session(session, CONFIG)


@rocmforge_session(venv_backend="none")
def index(session: nox.Session) -> None:
    """Regenerate the wheelhouse's index, constraints.txt and requirements.txt; print the install commands."""
    from rocmforge.build import package as build

    build.index_session(session, CONFIG)


@rocmforge_session(venv_backend="none")
def verify(session: nox.Session) -> None:
    """Install the wheelhouse into a fresh venv and prove it runs (-- --no-gpu, --gpu-only, --json)."""
    from rocmforge.verify import checks as verify

    verify.nox_session(session, CONFIG)


@rocmforge_session()
def bench(session: nox.Session) -> None:
    """Measure the wheelhouse on this GPU against its peak (-- --quick; A/B: -- --b-python PATH)."""
    from rocmforge.bench import runner as bench

    bench.nox_session(session, CONFIG)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (pass pytest arguments after --)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check; the CI workflows against GitHub's schema and zizmor."""
    session.install("ruff>=0.6", "zizmor>=1.0", "check-jsonschema>=0.29")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    workflows = sorted(str(p) for p in ROOT.glob(".github/workflows/*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("zizmor", "--offline", "--no-progress", *workflows)  # CI has no GitHub API
