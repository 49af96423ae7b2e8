"""Installs that cannot go wrong: requirements.txt with hashes, and the two documented commands
under twelve settings that add an attacker's sources.

Everything is real: wheels built by uv, a wheelhouse published by rocmforge, a stand-in for PyPI
and an attacker's PEP 503 index served over HTTP on 127.0.0.1, a find-links directory, uv.toml,
pyproject.toml and pip.conf files, and uv and pip installing. The attacker serves higher
versions of our project and of its third-party dependency, and a same-version copy of our wheel
with other contents.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gitrepos import HttpServer
from test_verify import make_wheel

from rocmforge.build import install
from rocmforge.build import package as build
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.errors import UserError

OURS = "# built here\n"
EVIL = "# the attacker's\n"


def _index(www: Path, wheels: list[Path]) -> None:
    """A PEP 503 index of ``wheels`` under ``www`` (one page per project, sha256 in each link)."""
    for wheel in wheels:
        project = wheel.name.split("-")[0].replace("_", "-")
        page = www / project
        page.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, page)
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        with open(page / "index.html", "a") as fh:
            fh.write(f'<a href="{wheel.name}#sha256={sha}">{wheel.name}</a><br>\n')


def _wheel(tmp: Path, name: str, version: str, *, init: str = OURS, deps=()) -> Path:
    """A real wheel (METADATA, WHEEL, RECORD with hashes) of one package, written directly: uv
    building a dozen of them took half a minute."""
    out = tmp / f"wheels-{'evil' if init == EVIL else 'ours'}"
    out.mkdir(exist_ok=True)
    return make_wheel(out, name, version, {f"{name}/__init__.py": init}, requires=deps)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Our wheelhouse (stackpkg 1.0 needing helperdep), a public index, an attacker's, links."""
    tmp = tmp_path_factory.mktemp("install")
    ours = _wheel(tmp, "stackpkg", "1.0", deps=["helperdep"])
    evil = _wheel(tmp, "stackpkg", "1.0", init=EVIL, deps=["helperdep"])
    _index(tmp / "public", [_wheel(tmp, "helperdep", "1.0"), _wheel(tmp, "stackpkg", "1.5")])
    higher = [_wheel(tmp, "stackpkg", "9.0", init=EVIL), _wheel(tmp, "helperdep", "9.0", init=EVIL)]
    _index(tmp / "attacker", [*higher, evil])
    links = tmp / "links"
    links.mkdir()
    for wheel in (_wheel(tmp, "stackpkg", "8.0", init=EVIL), evil):
        shutil.copy(wheel, links)
    public, attacker = HttpServer(tmp / "public"), HttpServer(tmp / "attacker")
    house = Wheelhouse(tmp / "wheelhouse")
    with pytest.MonkeyPatch.context() as mp:  # requirements.txt resolves the rest from "PyPI"
        mp.setenv("UV_DEFAULT_INDEX", public.url(""))
        house.publish(ours)
    pip_venv = tmp / "pip-venv"
    subprocess.run(["uv", "venv", "-q", "--seed", "--python", sys.executable, str(pip_venv)], check=True)
    yield {
        "tmp": tmp,
        "house": house,
        "public": public.url(""),
        "attacker": attacker.url(""),
        "links": links,
        "pip": str(pip_venv / "bin" / "python"),
    }
    public.close()
    attacker.close()


def _settings(s: dict) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """Twelve ways a machine's uv or pip may be set up to look elsewhere: name -> (environment
    variables, files {path relative to the working directory or the config home: content})."""
    links, attacker = str(s["links"]), s["attacker"]
    unsafe_extra = f'index-strategy = "unsafe-best-match"\nextra-index-url = ["{attacker}"]\n'
    return {
        "UV_FIND_LINKS": ({"UV_FIND_LINKS": links}, {}),
        "UV_INDEX_STRATEGY=unsafe-best-match + UV_EXTRA_INDEX_URL": (
            {"UV_INDEX_STRATEGY": "unsafe-best-match", "UV_EXTRA_INDEX_URL": attacker},
            {},
        ),
        "uv.toml in cwd: find-links": ({}, {"uv.toml": f'find-links = ["{links}"]\n'}),
        "uv.toml in cwd: index-strategy + extra-index-url": ({}, {"uv.toml": unsafe_extra}),
        "UV_INDEX": ({"UV_INDEX": attacker}, {}),
        "UV_DEFAULT_INDEX": ({"UV_DEFAULT_INDEX": attacker}, {}),
        "user uv.toml (XDG_CONFIG_HOME)": (
            {},
            {"xdg/uv/uv.toml": f'find-links = ["{links}"]\n' + unsafe_extra},
        ),
        "pyproject.toml in cwd: [tool.uv]": (
            {},
            {"pyproject.toml": f'[project]\nname = "app"\nversion = "0"\n[tool.uv]\n{unsafe_extra}'},
        ),
        "PIP_EXTRA_INDEX_URL": ({"PIP_EXTRA_INDEX_URL": attacker}, {}),
        "PIP_FIND_LINKS": ({"PIP_FIND_LINKS": links}, {}),
        "PIP_INDEX_URL": ({"PIP_INDEX_URL": attacker}, {}),
        "pip.conf (PIP_CONFIG_FILE)": (
            {"PIP_CONFIG_FILE": "{cwd}/pip.conf"},
            {"pip.conf": f"[global]\nextra-index-url = {attacker}\nfind-links = {links}\n"},
        ),
    }


def _install(s: dict, setting: str, tool: str, argv: list[str]) -> dict[str, str]:
    """Run ``argv`` (``{target}`` = a fresh directory) under ``setting``; what got installed:
    project -> version, with ``!`` appended when the files are the attacker's."""
    env_vars, files = _settings(s)[setting]
    work = s["tmp"] / "runs" / f"{setting}-{tool}".replace(" ", "_").replace("/", "_")
    shutil.rmtree(work, ignore_errors=True)
    cwd, xdg, target = work / "cwd", work / "xdg", work / "target"
    cwd.mkdir(parents=True)
    for rel, text in files.items():
        path = work / rel if rel.startswith("xdg/") else cwd / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update({k: v.replace("{cwd}", str(cwd)) for k, v in env_vars.items()})
    env.update(XDG_CONFIG_HOME=str(xdg), UV_CACHE_DIR=str(s["tmp"] / "uv-cache"), PIP_NO_CACHE_DIR="1")
    argv = [a.replace("{target}", str(target)) for a in argv]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{setting}, {tool}: {proc.stderr[-1500:]}"
    got = {}
    for info in target.glob("*.dist-info"):
        name, version = info.name[: -len(".dist-info")].split("-")
        init = target / name / "__init__.py"
        got[name] = version + ("!" if init.is_file() and init.read_text() == EVIL else "")
    return got


def _documented(s: dict, tool: str) -> list[str]:
    """The documented command (install.install_argv), into ``{target}``, "PyPI" = the stand-in."""
    argv = install.install_argv(
        tool, s["house"].root, index=s["public"], python=s["pip"] if tool == "pip" else None
    )
    return [*argv[:-1], "--target", "{target}", argv[-1]] if tool == "uv" else [*argv, "--target", "{target}"]


def test_commands_name_the_wheelhouse_not_its_current_generation(stack):
    """simple/ is a symlink into a generation a later publish deletes: the commands must not
    name the generation."""
    root = stack["house"].root
    for command in install.install_commands(root, index=stack["public"]):
        assert f"file://{root}/simple " in command and ".index" not in command


def test_requirements_txt_pins_the_stack_and_its_dependencies_with_hashes(stack):
    text = (stack["house"].root / install.REQUIREMENTS).read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    pins = [line.split(" ")[0] for line in lines if not line.startswith("--hash")]
    assert pins == ["helperdep==1.0", "stackpkg==1.0"]
    (entry,) = stack["house"].entries()
    assert f"--hash=sha256:{entry.sha256}" in lines
    assert sum(line.startswith("--hash=sha256:") for line in lines) == 2
    assert f"resolved for Python {sys.version_info.major}.{sys.version_info.minor}" in text


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_documented_commands_keep_our_wheels_under_twelve_settings(stack, tool):
    """Each setting alone; every install must give our stackpkg 1.0 and the public helperdep 1.0."""
    argv = _documented(stack, tool)
    with ThreadPoolExecutor(max_workers=4) as pool:  # the installs wait on processes, not on us
        futures = {setting: pool.submit(_install, stack, setting, tool, argv) for setting in _settings(stack)}
        results = {setting: future.result() for setting, future in futures.items()}
    assert len(results) == 12
    wrong = {
        setting: got for setting, got in results.items() if got != {"stackpkg": "1.0", "helperdep": "1.0"}
    }
    assert wrong == {}


@pytest.mark.slow
def test_the_attack_is_real_for_the_old_commands(stack):
    """The commands the README showed before: uv with --index, pip with --find-links and -c."""
    root, public = stack["house"].root, stack["public"]
    uv_old = ["uv", "pip", "install", "--target", "{target}", "--index", (root / "simple").as_uri()]
    uv_old += ["--default-index", public, "stackpkg"]
    pip_old = [stack["pip"], "-m", "pip", "install", "-q", "--target", "{target}", "--find-links", str(root)]
    pip_old += ["-c", str(root / "constraints.txt"), "--index-url", public, "stackpkg"]
    assert _install(stack, "UV_FIND_LINKS", "uv", uv_old) == {"stackpkg": "8.0!"}
    assert _install(stack, "uv.toml in cwd: index-strategy + extra-index-url", "uv", uv_old) == {
        "stackpkg": "9.0!"
    }
    # pip's exact pin admits the attacker's file of the same version, and its dependency too.
    assert _install(stack, "PIP_EXTRA_INDEX_URL", "pip", pip_old) == {"stackpkg": "1.0!", "helperdep": "9.0!"}


def test_index_session_refuses_a_stack_member_the_wheelhouse_lacks(stack, tmp_path):
    """`nox -s index` with pytorch built but vllm not: one line naming what to build, no commands."""
    from fakehost import config

    house_root = stack["house"].root
    cfg = config(work_dir=str(tmp_path / "work"), wheelhouse=str(house_root))

    class Session:  # what index_session uses of nox's Session
        def __init__(self):
            self.lines = []

        def log(self, line: str) -> None:
            self.lines.append(line)

    session = Session()
    with pytest.raises(UserError) as err:
        build.index_session(session, cfg)
    assert str(err.value).startswith(
        f"{house_root} lacks {', '.join(cfg.build_order())} of the configured stack"
    )
    assert "installing without it would take PyPI's release of that name" in str(err.value)
    assert not any("pip install" in line or "uv pip" in line for line in session.lines)


def _no_network(tmp: Path, bundle: Path) -> tuple[list[str], dict[str, str]]:
    """A command prefix and environment with no network at all (a new, empty network namespace,
    where the kernel lets us), PyPI unreachable even so, an empty uv cache, and the offline
    export at ``bundle``: the air-gapped cluster."""
    unshare = shutil.which("unshare")
    cut = [unshare, "-rn"] if unshare and subprocess.run([unshare, "-rn", "true"]).returncode == 0 else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(
        UV_DEFAULT_INDEX="http://127.0.0.1:9/simple",  # nothing listens on port 9: refused at once
        UV_CACHE_DIR=str(tmp / "empty-uv-cache"),
        PIP_CONFIG_FILE=os.devnull,
        ROCMFORGE_OFFLINE_BUNDLE=str(bundle),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    return cut, env


_PUBLISH_AND_VERIFY_INSTALL = """
import sys
from pathlib import Path

from rocmforge.verify import checks as verify
from rocmforge.build.wheelhouse import Wheelhouse

house, venv, wheel = Wheelhouse(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
house.publish(Path(wheel[0])) if wheel else house.reindex()
verify.fresh_venv(venv, house.root, sys.executable)
"""


def test_offline_the_index_is_published_and_verify_installs_what_there_is(tmp_path, monkeypatch):
    """No network: requirements.txt comes from the wheelhouse and the export's wheels/, names what
    neither has, and verify's install of it still runs; complete once the export has it all."""
    bundle = tmp_path / "export"
    (bundle / "wheels").mkdir(parents=True)
    make_wheel(bundle / "wheels", "bundledep", "1.0", {"bundledep/__init__.py": ""})
    ours = _wheel(tmp_path, "stackpkg", "1.0", deps=["bundledep>=1", "helperdep"])
    cut, env = _no_network(tmp_path, bundle)
    root, venv = tmp_path / "wheelhouse", tmp_path / "venv"

    def offline(*wheel: Path) -> subprocess.CompletedProcess:
        argv = [
            *cut,
            sys.executable,
            "-c",
            _PUBLISH_AND_VERIFY_INSTALL,
            str(root),
            str(venv),
            *map(str, wheel),
        ]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    def installed() -> list[str]:
        return sorted(p.name.split("-")[0] for p in venv.glob("lib/python*/site-packages/*.dist-info"))

    proc = offline(ours)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (warning,) = [line for line in proc.stderr.splitlines() if line.startswith("warning: requirements.txt")]
    assert warning.startswith("warning: requirements.txt lacks helperdep (stackpkg): not resolvable here (")
    text = (root / install.REQUIREMENTS).read_text()
    assert "# INCOMPLETE: not resolvable here, install from your own mirror: helperdep (stackpkg)" in text
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert [line.split(" ")[0] for line in lines if not line.startswith("--hash")] == [
        "bundledep==1.0",
        "stackpkg==1.0",
    ]
    (entry,) = Wheelhouse(root).entries()
    assert f"--hash=sha256:{entry.sha256}" in lines
    assert install.resolved_offline(root)
    assert installed() == ["bundledep", "stackpkg"]  # what there is; verify's checks name the rest
    # The export brings the missing one: complete, no warning, still without the network.
    make_wheel(bundle / "wheels", "helperdep", "1.0", {"helperdep/__init__.py": ""})
    proc = offline()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning" not in proc.stderr
    text = (root / install.REQUIREMENTS).read_text()
    assert "INCOMPLETE" not in text and "uv's cache (offline) for the rest" in text
    assert installed() == ["bundledep", "helperdep", "stackpkg"]
    # The commands `nox -s index` prints for it work without the network too; pip's here.
    monkeypatch.setenv("ROCMFORGE_OFFLINE_BUNDLE", str(bundle))
    uv_command, _ = install.install_commands(root, offline=True)
    assert f"--offline --find-links {bundle / 'wheels'}" in uv_command
    pip = install.install_argv("pip", root, python=sys.executable, offline=True)
    target = tmp_path / "pip-target"
    proc = subprocess.run([*cut, *pip, "--target", str(target)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name.split("-")[0] for p in target.glob("*.dist-info")) == [
        "bundledep",
        "helperdep",
        "stackpkg",
    ]
    # No export at all: our wheel alone, both dependencies named, and verify's install still runs.
    del env["ROCMFORGE_OFFLINE_BUNDLE"]
    root, venv = tmp_path / "wheelhouse-alone", tmp_path / "venv-alone"
    proc = offline(ours)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: requirements.txt lacks bundledep (stackpkg), helperdep (stackpkg)" in proc.stderr
    assert "Network is unreachable" in proc.stderr or "Connection refused" in proc.stderr  # the reason
    assert installed() == ["stackpkg"]
