"""The wheelhouse: PEP 503 index, constraints, replacement, locking, and PyPI kept out."""

from __future__ import annotations

import html.parser
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from rocmforge.build import install
from rocmforge.build.wheelfile import read_member, wheel_name
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.fsutil import file_sha256

ROOT = Path(__file__).resolve().parents[1]


def make_wheel(tmp: Path, name: str, version: str) -> Path:
    """A real pure-Python wheel built by uv from a two-file project."""
    project = tmp / f"src-{name}-{version}"
    (project / name).mkdir(parents=True)
    (project / name / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n'
    )
    out = tmp / f"dist-{name}-{version}"
    subprocess.run(["uv", "build", "-q", "--wheel", "-o", str(out), str(project)], check=True)
    (wheel,) = out.glob("*.whl")
    return wheel


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs.append(dict(attrs)["href"])


def links(page: Path) -> list[str]:
    parser = _Links()
    parser.feed(page.read_text())
    return parser.hrefs


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheels")
    return {
        "alpha-1": make_wheel(tmp, "alpha_pkg", "1.0"),
        "alpha-2": make_wheel(tmp, "alpha_pkg", "2.0"),
        "beta": make_wheel(tmp, "beta", "0.5"),
    }


def test_publish_writes_a_pep503_index_with_sha256_fragments(tmp_path, wheels):
    house = Wheelhouse(tmp_path / "wh")
    house.publish(wheels["alpha-1"])
    house.publish(wheels["beta"])
    assert links(house.simple / "index.html") == ["alpha-pkg/", "beta/"]
    (href,) = links(house.simple / "alpha-pkg" / "index.html")
    path, _, fragment = href.partition("#sha256=")
    target = (house.simple / "alpha-pkg" / unquote(path)).resolve()
    assert target == (house.root / wheels["alpha-1"].name).resolve()
    assert fragment == file_sha256(target)
    assert house.constraints.read_text().splitlines()[1:] == ["alpha-pkg==1.0", "beta==0.5"]


def test_a_new_build_replaces_the_old_wheel_and_withdraw_removes_the_entry(tmp_path, wheels):
    house = Wheelhouse(tmp_path / "wh")
    house.publish(wheels["alpha-1"])
    house.publish(wheels["beta"])
    house.publish(wheels["alpha-2"])
    assert [e.version for e in house.find("alpha_pkg")] == ["2.0"]
    assert "alpha-pkg==2.0" in house.constraints.read_text()
    assert not (house.root / wheels["alpha-1"].name).exists()
    house.withdraw("alpha-pkg")
    assert not (house.simple / "alpha-pkg").exists()
    assert links(house.simple / "index.html") == ["beta/"]
    assert "alpha" not in house.constraints.read_text()


def _publish(args):
    root, wheel = args
    Wheelhouse(root).publish(wheel)


def test_concurrent_publishes_leave_a_complete_index(tmp_path, wheels):
    root = tmp_path / "wh"
    jobs = [(root, wheels["alpha-2"]), (root, wheels["beta"])] * 3
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_publish, jobs)
    house = Wheelhouse(root)
    assert {e.project for e in house.entries()} == {"alpha-pkg", "beta"}
    assert links(house.simple / "index.html") == ["alpha-pkg/", "beta/"]
    assert not list(root.glob(".*.tmp")) and not list(house.simple.rglob(".*.tmp"))


def _venv(tmp: Path, name: str) -> Path:
    venv = tmp / name
    subprocess.run(["uv", "venv", "-q", "--seed", "--python", sys.executable, str(venv)], check=True)
    return venv / "bin" / "python"


def _pip_install(python: Path, *args: str) -> None:
    """pip install into ``python``'s venv with PyPI as the only index (see ``_PYPI_ENV``)."""
    subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True, env=_PYPI_ENV)


def _installed_version(python: Path, dist: str) -> str:
    code = f"from importlib.metadata import version; print(version({dist!r}))"
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


# PyPI reachable, pip's machine config out of the way: the command line is the whole story.
_PYPI_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))},
    "PIP_CONFIG_FILE": os.devnull,
}
_PYPI = "https://pypi.org/simple"


@pytest.mark.slow
@pytest.mark.network
def test_a_newer_pypi_release_cannot_replace_our_wheel(tmp_path):
    """six 1.16.0 built here from its PyPI sdist; PyPI has 1.17.0. Our install commands keep ours."""
    from rocmforge.build.package import build_package
    from rocmforge.config import load_config

    config = tmp_path / "rocmforge.toml"
    config.write_text(
        '[build]\nbackend = "cpu"\nwork_dir = "out"\nwheelhouse = "out/wheelhouse"\nlogs_dir = "out/logs"\n'
        'third_party = "out/third_party"\n'
        '[packages.six]\nversion = "1.16.0"\nlocal_version = "rf"\n'
        '[packages.six.source]\nkind = "pypi"\nname = "six"\nversion = "1.16.0"\n'
        'sha256 = "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926"\n'
    )
    cfg = load_config(config, environ={})
    wheel = build_package(cfg, "six").wheel
    assert wheel_name(wheel).version == "1.16.0+rf"
    assert read_member(wheel, "rocmforge.json") is not None
    house = Wheelhouse(cfg.build.wheelhouse)

    # The danger, shown for real: pip with --find-links and PyPI takes PyPI's newer release.
    python = _venv(tmp_path, "naive")
    _pip_install(python, "--index-url", _PYPI, "--find-links", str(house.root), "six")
    assert _installed_version(python, "six") == "1.17.0"

    # The documented commands (nox -s index prints them): requirements.txt with its hashes, our
    # index first, PyPI for the rest; uv's and pip's own configuration out of the game.
    for tool in ("uv", "pip"):
        python = _venv(tmp_path, tool)
        argv = install.install_argv(tool, house.root, index=_PYPI, python=str(python))
        subprocess.run(argv, check=True, env=os.environ)
        assert _installed_version(python, "six") == "1.16.0+rf"


def test_stray_files_named_whl_are_left_out_of_the_index(tmp_path, wheels):
    # A bad name or a directory was a traceback in `nox -s index`; a truncated wheel was indexed
    # and pinned in constraints.txt, so installs failed later.
    house = Wheelhouse(tmp_path / "wh")
    house.publish(wheels["beta"])
    data = wheels["alpha-1"].read_bytes()
    (house.root / wheels["alpha-1"].name).write_bytes(data[: len(data) // 2])
    (house.root / "notes.whl").write_text("x")
    (house.root / "gamma-1.0-py3-none-any.whl").mkdir()
    house.reindex()
    assert links(house.simple / "index.html") == ["beta/"]
    assert house.constraints.read_text().splitlines()[1:] == ["beta==0.5"]
    house.publish(wheels["alpha-2"])  # publishing past the strays still works
    assert links(house.simple / "index.html") == ["alpha-pkg/", "beta/"]


def test_no_wheels_leave_no_index_behind(tmp_path, wheels):
    # An empty index with a header-only constraints.txt made `pip install -c constraints.txt vllm`
    # succeed from PyPI; with no wheels there must be no index at all.
    missing = Wheelhouse(tmp_path / "never-built")
    assert missing.reindex() == []
    assert not missing.root.exists()

    house = Wheelhouse(tmp_path / "wh")
    house.publish(wheels["beta"])
    assert house.constraints.is_file()
    house.withdraw("beta")
    assert sorted(p.name for p in house.root.iterdir()) == [".lock"]


def test_index_session_without_wheels_fails_and_writes_nothing(tmp_path):
    config = tmp_path / "rocmforge.toml"
    config.write_text(
        '[build]\nbackend = "cpu"\nwheelhouse = "wheelhouse"\n'
        '[packages.first.source]\nkind = "path"\npath = "src"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "index"],
        env={**os.environ, "ROCMFORGE_CONFIG": str(config)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert (
        f"{tmp_path / 'wheelhouse'}: no wheels to index; build some first, e.g. `nox -s first`" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rocmforge.toml"]


def test_index_writers_publish_their_files_in_the_same_switch(tmp_path, wheels, monkeypatch):
    from rocmforge.build import wheelhouse

    def projects(entries):
        return {"projects.txt": "".join(f"{e.project} {file_sha256(e.path)}\n" for e in entries)}

    monkeypatch.setattr(wheelhouse, "INDEX_WRITERS", [*wheelhouse.INDEX_WRITERS, projects])
    house = Wheelhouse(tmp_path / "wh")
    house.publish(wheels["alpha-1"])
    first = (house.root / ".index").resolve()
    house.publish(wheels["beta"])
    # One generation is visible; the previous one is gone; every root name points into it.
    assert (house.root / ".index").resolve() != first and not first.exists()
    assert (house.root / "projects.txt").read_text() == (
        f"alpha-pkg {file_sha256(wheels['alpha-1'])}\nbeta {file_sha256(wheels['beta'])}\n"
    )
    assert sorted(p.name for p in house.root.iterdir() if not p.name.startswith(".")) == sorted(
        [
            wheels["alpha-1"].name,
            wheels["beta"].name,
            "constraints.txt",
            "projects.txt",
            "requirements.txt",
            "simple",
            "stack.json",
        ]
    )


def test_a_swapped_wheel_with_its_size_and_mtime_is_not_trusted(tmp_path, wheels, capsys):
    house = Wheelhouse(tmp_path / "wh")
    entry = house.publish(wheels["alpha-1"])
    data = bytearray(entry.path.read_bytes())
    st = entry.path.stat()
    data[-30] ^= 0xFF  # same size, other bytes
    entry.path.write_bytes(bytes(data))
    os.utime(entry.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert entry.path.stat().st_size == st.st_size and entry.path.stat().st_mtime_ns == st.st_mtime_ns
    assert not house.verify(house.find("alpha-pkg")[0])
    assert "differs from the" in capsys.readouterr().err
    house.publish(wheels["beta"])  # the damaged wheel is left out of the next generation
    assert [e.project for e in house.entries()] == ["beta"]
    assert links(house.simple / "index.html") == ["beta/"]


def test_a_wheelhouse_of_the_layout_before_generations_is_taken_over(tmp_path, wheels):
    from test_integrity import wheelhouse_problems

    # What earlier rocmforge left: real wheels, a real simple/, constraints.txt, a hash cache.
    root = tmp_path / "wh"
    (root / "simple" / "beta").mkdir(parents=True)
    for wheel in (wheels["alpha-1"], wheels["beta"]):
        shutil.copy(wheel, root)
    (root / "simple" / "index.html").write_text('<a href="beta/">beta</a>')
    (root / "constraints.txt").write_text("# old\nalpha-pkg==1.0\nbeta==0.5\n")
    (root / ".sha256.json").write_text("{}")
    house = Wheelhouse(root)
    house.publish(wheels["alpha-2"])  # replaces a wheel that was a plain file
    assert wheelhouse_problems(root) == []
    # requirements.txt only when uv could resolve it here (it needs an index for the rest)
    names = {p.name for p in root.iterdir() if not p.name.startswith(".")} - {"requirements.txt"}
    assert names == {wheels["alpha-2"].name, wheels["beta"].name, "constraints.txt", "simple", "stack.json"}
    assert all(p.is_symlink() for p in root.iterdir() if not p.name.startswith("."))
    assert not (root / ".sha256.json").exists() and not (root / wheels["alpha-1"].name).exists()
    house.reindex()  # the replaced plain file does not come back
    assert [e.path.name for e in house.entries()] == [wheels["alpha-2"].name, wheels["beta"].name]
