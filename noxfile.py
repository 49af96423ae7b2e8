"""rocmforge sessions: `nox -l` is the table of contents, the logic lives in `rocmforge/`.

nox -s toolchain              check the host before anything long starts
nox -s pytorch triton vllm    build the configured packages into the wheelhouse
nox -s verify bench           prove the wheels run, measure them
nox -s lint tests             what CI runs
"""

from __future__ import annotations

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


@nox.session(venv_backend="none")
def toolchain(session: nox.Session) -> None:
    """Check compilers, ROCm, GPUs, permissions and memory against the pinned versions."""
    from rocmforge import doctor

    _announce(session)
    doctor.toolchain_session(session, CONFIG)


@nox.session
def bench(session: nox.Session) -> None:
    """Measure the wheelhouse on this GPU against its peak (-- --quick; A/B: -- --b-python PATH)."""
    from rocmforge import bench

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
