"""The lock file, locked mode, and the air-gapped export replayed with no network."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from gitrepos import commit, git, git_package, url_package, write_config

from rocmforge.build.wheelfile import read_member
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.errors import UserError
from rocmforge.sources import cache, lock
from rocmforge.sources import checkout as sources
from rocmforge.sources import export as bundle

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.setattr(cache, "RETRY_DELAYS", (0.1,))
    monkeypatch.delenv("ROCMFORGE_LOCKED", raising=False)
    monkeypatch.delenv("ROCMFORGE_OFFLINE_BUNDLE", raising=False)


def _archive(tmp_path: Path, http) -> str:
    src = tmp_path / "arcsrc" / "arc-1.0"
    src.mkdir(parents=True)
    (src / "setup.py").write_text("pass\n")
    out = tmp_path / "www" / "arc-1.0.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(src, arcname="arc-1.0")
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    return url_package("arc", http.url(out.name), sha)


def _patch(tmp_path: Path, text: str) -> str:
    path = tmp_path / "patches" / "app" / "0001-readme.patch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return f'[[packages.app.patches]]\nfile = "0001-readme.patch"\nsha256 = "{sha}"\nreason = "test"\n'


README_PATCH = (
    "diff --git a/README b/README\n--- a/README\n+++ b/README\n@@ -1 +1 @@\n-app 2\n+app 2 patched\n"
)


def test_lock_records_every_pin_and_reads_as_a_list(tmp_path, upstream, daemon, http):
    pkgs = (
        git_package("app", daemon.url("app"), "v2")
        + _patch(tmp_path, README_PATCH)
        + _archive(tmp_path, http)
    )
    cfg = write_config(tmp_path, pkgs)
    path = sources.write_lock(cfg)
    text = path.read_text()
    data = tomllib.loads(text)
    app, arc = data["packages"]["app"], data["packages"]["arc"]
    assert app["commit"] == upstream.shas["c2"] and app["version"] == "1.0"
    assert app["submodules"] == {"ext/lib": upstream.shas["lib"], "ext/lib/deps/leaf": upstream.shas["leaf"]}
    patch_sha = hashlib.sha256((tmp_path / "patches/app/0001-readme.patch").read_bytes()).hexdigest()
    assert app["patches"] == {"0001-readme.patch": patch_sha}
    assert app["fingerprint"] == sources.prepare(cfg, "app").fingerprint()
    assert arc["sha256"] == hashlib.sha256((tmp_path / "www/arc-1.0.tar.gz").read_bytes()).hexdigest()
    assert data["toolchain"]["python"] == ".".join(map(str, sys.version_info[:3]))
    # One fact per line: every line is a comment, a table header, blank, or `key = "value"`.
    for line in text.splitlines():
        assert line == "" or line.startswith(("#", "[")) or " = " in line
    assert '"ext/lib/deps/leaf" = "' in text
    sources.write_lock(cfg)
    assert path.read_text() == text  # deterministic


def test_locked_mode_replays_the_lock_and_refuses_differences(tmp_path, upstream, daemon, monkeypatch):
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "main"))
    sources.write_lock(cfg)
    moved = commit(upstream.work("app"), {"README": "app 4\n"}, "upstream moved on")
    upstream.publish("app")
    monkeypatch.setenv("ROCMFORGE_LOCKED", "1")
    (tmp_path / "third_party/.app.stamp.json").unlink()
    co = sources.prepare(cfg, "app")
    assert co.commit == upstream.shas["c3"]  # the lock's commit, not the branch's new tip
    sources.write_lock(cfg)  # in locked mode: a check that passes
    monkeypatch.delenv("ROCMFORGE_LOCKED")
    assert sources.prepare(cfg, "app").commit == moved
    monkeypatch.setenv("ROCMFORGE_LOCKED", "1")
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "main", moved))
    with pytest.raises(UserError) as err:
        sources.prepare(cfg, "app")
    assert str(err.value) == (
        f"ROCMFORGE_LOCKED: packages.app.commit is {moved!r} "
        f"but rocmforge.lock.toml has {upstream.shas['c3']!r}; "
        "run `nox -s lock` to accept the change, or restore the config that made the lock"
    )


def _wheel(directory: Path) -> Path:
    """A real (tiny) wheel of the test project's build requirement."""
    directory.mkdir(parents=True)
    path = directory / "rftest_dep-1.0-py3-none-any.whl"
    files = {
        "rftest_dep/__init__.py": "",
        "rftest_dep-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: rftest-dep\nVersion: 1.0\n",
        "rftest_dep-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + "rftest_dep-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in {**files, "rftest_dep-1.0.dist-info/RECORD": record}.items():
            zf.writestr(name, text)
    return path


def test_export_builds_with_no_network(tmp_path, upstream, daemon, http, monkeypatch):
    pkgs = (
        git_package("app", daemon.url("app"), "v2")
        + _patch(tmp_path, README_PATCH)
        + _archive(tmp_path, http)
    )
    cfg = write_config(tmp_path, pkgs)
    wheel = _wheel(tmp_path / "index")
    # The app's build requirement comes from a local index, the generic recipe's `build` from PyPI.
    dest = bundle.export(cfg, tmp_path / "export", index_args=("--find-links", str(wheel.parent)))
    originals = {n: sources.prepare(cfg, n).fingerprint() for n in ("app", "arc")}
    assert len(list((dest / "git").glob("*.bundle"))) == 3  # app, its submodule, the submodule's submodule
    downloaded = {p.name.split("-")[0].lower() for p in (dest / "wheels").glob("*.whl")}
    assert {"rftest_dep", "build", "packaging", "pyproject_hooks"} <= downloaded
    assert (dest / "rocmforge.lock.toml").is_file() and (dest / "patches/app/0001-readme.patch").is_file()
    # The air-gapped machine: no servers, an empty cache and no checkouts.
    daemon.stop()
    http.close()
    elsewhere = tmp_path / "airgapped"
    elsewhere.mkdir()
    (elsewhere / "patches").symlink_to(tmp_path / "patches")
    offline_cfg = write_config(elsewhere, pkgs)
    monkeypatch.setenv("ROCMFORGE_OFFLINE_BUNDLE", str(dest))
    for name, fingerprint in originals.items():
        co = sources.prepare(offline_cfg, name)
        assert co.fingerprint() == fingerprint and co.path.is_relative_to(elsewhere)
    assert (elsewhere / "third_party/app/README").read_text() == "app 2 patched\n"
    assert (elsewhere / "third_party/app/ext/lib/deps/leaf/leaf.txt").read_text() == "leaf 2\n"
    assert git("rev-parse", "HEAD", cwd=elsewhere / "third_party/app/ext/lib") == upstream.shas["lib"]


def test_damaged_lock_files_are_one_line(tmp_path, upstream, daemon):
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "v2"))
    path = lock.lock_path(cfg)
    # An empty lock printed the whole current [packages] table as "the difference".
    path.write_text("")
    with pytest.raises(UserError) as err:
        sources.write_lock(cfg, locked=True)
    assert str(err.value).startswith(
        f"ROCMFORGE_LOCKED: packages.app.commit is {upstream.shas['c2']!r} but rocmforge.lock.toml has None;"
    )
    # Binary bytes and a wrong shape were UnicodeDecodeError / AttributeError tracebacks.
    path.write_bytes(b"\x00\xff")
    with pytest.raises(UserError, match=r"not valid TOML .*; run `nox -s lock` to write it again$"):
        lock.read_lock(cfg)
    path.write_text("packages = 3\n")
    with pytest.raises(UserError, match=r"\[packages\] is not a table of package tables"):
        lock.read_lock(cfg)
    sources.write_lock(cfg)  # the fix the messages name: write it again
    assert lock.read_lock(cfg)["packages"]["app"]["commit"] == upstream.shas["c2"]
    # A directory in its place failed at the final rename, after every checkout.
    path.unlink()
    path.mkdir()
    with pytest.raises(UserError, match=r"cannot read the lock \(Is a directory\); remove it"):
        lock.read_lock(cfg)
    with pytest.raises(UserError, match=r"is not a file; remove it and run `nox -s lock` again$"):
        sources.write_lock(cfg)


def test_export_to_an_unwritable_place_is_one_line_before_any_work(tmp_path, upstream, daemon):
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "v2"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UserError) as err:
        bundle.export(cfg, blocker / "stack")
    assert str(err.value).startswith(f"{blocker / 'stack'}: cannot create the export there (")
    assert str(err.value).endswith("); choose a writable directory")
    assert not lock.lock_path(cfg).exists()  # stopped before writing the lock or checking out
    assert not (tmp_path / "third_party" / "app").exists()


def _network_cut() -> list[str]:
    """A command prefix that runs its command with no network at all (a new, empty network namespace)."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0:
        return [unshare, "-rn"]
    return []  # no user namespaces here: the variables below still forbid every index and cache


def _offline_nox(config: Path, export: Path, *sessions: str) -> subprocess.CompletedProcess:
    """The real nox sessions as on the air-gapped machine: building from ``export`` with empty pip
    and uv caches, every index refused, and (where the kernel lets us) no network at all."""
    empty = config.parent / "empty-caches"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(
        ROCMFORGE_CONFIG=str(config),
        ROCMFORGE_OFFLINE_BUNDLE=str(export),
        PIP_NO_INDEX="1",
        PIP_CONFIG_FILE=os.devnull,
        PIP_CACHE_DIR=str(empty / "pip"),
        UV_OFFLINE="1",
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(empty / "uv"),
    )
    for var in ("PYTORCH_ROCM_ARCH", "MAX_JOBS"):
        env.pop(var, None)
    noxfile = Path(__file__).resolve().parents[1] / "noxfile.py"
    argv = [*_network_cut(), sys.executable, "-m", "nox", "-f", str(noxfile), "-s", *sessions]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


def _record(house: Wheelhouse, project: str) -> tuple[Path, dict]:
    (entry,) = house.find(project)
    return entry.path, json.loads(read_member(entry.path, "rocmforge.json"))


def _wheel_projects(directory: Path) -> set[str]:
    return {p.name.split("-")[0].lower() for p in directory.glob("*.whl")}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc (apt install hipcc)")
def test_the_stack_builds_from_its_export_with_the_network_cut(tmp_path):
    """minitorch's recipe installs requirements-build.txt plus `build`, more than its pyproject's
    [build-system] requires; an export of only the latter left the offline build venv short."""
    from test_build import nox, write_config

    config = write_config(tmp_path, example="stack.toml")
    online = nox(config, "pytorch")
    assert online.returncode == 0, online.stderr[-3000:]
    house = Wheelhouse(tmp_path / "out" / "wheelhouse")
    built, online_record = _record(house, "torch")
    online_wheel = built.read_bytes()
    dest = tmp_path / "export"
    exported = nox(config, "export", "--", str(dest))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert {"build", "setuptools", "wheel", "packaging", "pyproject_hooks"} <= _wheel_projects(
        dest / "wheels"
    )

    # The air-gapped machine: same layout, but no upstream, no cache, no checkout, no wheelhouse.
    (tmp_path / "repos").rename(tmp_path / "repos-gone")
    for made in ("cache", "out"):
        shutil.rmtree(tmp_path / made)
    offline = _offline_nox(config, dest, "pytorch")
    assert offline.returncode == 0, offline.stderr[-3000:]
    rebuilt, record = _record(house, "torch")
    assert rebuilt.name == built.name
    assert record == online_record
    venv = tmp_path / "out" / "pytorch" / "venv"
    assert list(venv.glob("lib/python*/site-packages/build/__init__.py"))  # from the export's wheels
    assert rebuilt.read_bytes() == online_wheel  # reproducible: the same bytes, offline


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc (apt install hipcc)")
def test_the_runtime_requirements_of_a_dependency_wheel_are_exported(tmp_path):
    """A build venv installs its dependencies' wheels, and with them what they require (vLLM's
    gets torch and torch's requirements): those come from the export too."""
    from test_build import nox, pure_wheel, write_config

    vendor = pure_wheel(tmp_path / "tinyvendor", "tinyvendor", "3.1", deps=["six"])
    config = write_config(tmp_path, patched=True)
    text = config.read_text().replace(
        "[packages.patchme]\n", '[packages.patchme]\ndepends = ["tinyvendor"]\n'
    )
    config.write_text(
        text + f'\n[packages.tinyvendor.prebuilt]\nrequirement = "tinyvendor==3.1"\nindex = "{vendor}"\n'
    )
    before = nox(config, "export", "--", str(tmp_path / "early"))  # tinyvendor not in the wheelhouse yet
    assert before.returncode == 0, before.stderr[-3000:]
    assert "patchme: not built yet: tinyvendor; the export lacks the runtime requirements" in before.stderr
    assert "six" not in _wheel_projects(tmp_path / "early" / "wheels")
    online = nox(config, "tinyvendor", "patchme")
    assert online.returncode == 0, online.stderr[-3000:]
    house = Wheelhouse(tmp_path / "out" / "wheelhouse")
    _built, online_record = _record(house, "patchme")
    dest = tmp_path / "export"
    exported = nox(config, "export", "--", str(dest))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "six" in _wheel_projects(dest / "wheels") and "tinyvendor" not in _wheel_projects(dest / "wheels")

    # Air-gapped, with tinyvendor's wheel carried in the wheelhouse (prebuilt wheels are not exported).
    (tmp_path / "repos").rename(tmp_path / "repos-gone")
    for made in ("cache", "out/third_party", "out/patchme"):
        shutil.rmtree(tmp_path / made)
    offline = _offline_nox(config, dest, "patchme")
    assert offline.returncode == 0, offline.stderr[-3000:]
    _rebuilt, record = _record(house, "patchme")
    assert record == online_record
    assert list((tmp_path / "out/patchme/venv").glob("lib/python*/site-packages/six.py"))
