"""Integrity: a run killed at any moment leaves a sound wheelhouse, and a plain re-run finishes it.

Real builds of the fixture chain (``examples/fixtures.toml``: patchme, dependent built against
patchme's wheel, hipkernel compiled by hipcc) through the real ``nox``. Each kill is followed by
:func:`wheelhouse_problems`, which reads the wheelhouse the way pip and uv do (index pages, their
``#sha256=`` fragments, ``constraints.txt``, the flat directory) and checks every claim against
the bytes, then by a plain re-run that must succeed and leave nothing behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest
from test_build import ROOT, nox, write_config
from test_wheelhouse import links

from rocmforge.build.killpoints import VARIABLE
from rocmforge.build.wheelfile import read_member, wheel_name
from rocmforge.fsutil import file_sha256

pytestmark = pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc (apt install hipcc)")

PACKAGES = ("patchme", "dependent", "hipkernel")
BUILD_POINTS = ("source", "venv", "built", "fixed")
PUBLISH_POINTS = ("publish:copied", "publish:staged", "publish:linked", "publish:switched", "published")


def wheelhouse_problems(root: Path) -> list[str]:
    """Everything a reader of the wheelhouse at ``root`` would trip over; [] when it is sound."""
    problems = []
    index = root / "simple" / "index.html"
    dangling = [p.name for p in root.glob("*.whl") if not p.exists()]
    problems += [f"{name}: a name at the root that leads nowhere" for name in dangling]
    if not index.exists():
        if (root / "constraints.txt").exists():
            problems.append("constraints.txt without an index")
        return problems
    indexed: dict[str, str] = {}
    for project in links(index):
        page = root / "simple" / project / "index.html"
        if not page.is_file():
            problems.append(f"{project}: listed, but has no page")
            continue
        for href in links(page):
            path, _, sha = href.partition("#sha256=")
            # Resolved as pip and uv resolve a link: by the URL's text, not through symlinks.
            target = Path(os.path.normpath(root / "simple" / project / unquote(path)))
            if not target.is_file():
                problems.append(f"{project}: the index links {target.name}, which does not exist")
            elif not target.name.endswith(".whl"):
                continue  # a wheel's provenance statement: pip and uv skip it, it claims no sha256
            elif file_sha256(target) != sha:
                problems.append(f"{target.name}: sha256 differs from the index's")
            else:
                indexed[target.name] = sha
    pins = (
        (root / "constraints.txt").read_text().splitlines()[1:] if (root / "constraints.txt").exists() else []
    )
    expected = sorted(f"{wheel_name(n).project}=={wheel_name(n).version}" for n in indexed)
    if sorted(pins) != expected:
        problems.append(f"constraints.txt pins {sorted(pins)}, the index holds {expected}")
    for name in indexed:
        deps = json.loads(read_member(root / name, "rocmforge.json") or b"{}").get("dependencies", {})
        problems += [
            f"{name}: built against {d} {s[:12]}, not in the index"
            for d, s in deps.items()
            if s not in indexed.values()
        ]
    stack = json.loads((root / "stack.json").read_text())
    if {w["filename"]: w["sha256"] for w in stack["wheels"]} != indexed:
        problems.append("stack.json lists other wheels than the index")
    return problems


def leftovers(root: Path) -> list[str]:
    """Temp files and generations a finished run must not leave (wheelhouse and work dirs)."""
    house = root / "out" / "wheelhouse"
    current = os.readlink(house / ".index")
    found = [p.name for p in house.glob(".index-*") if p.name != current]
    found += [str(p.relative_to(root)) for p in (root / "out").glob("**/.*.tmp")]
    return found


def _stale(root: Path, package: str) -> None:
    """Make ``package`` rebuild on the next run (its state names no published wheel)."""
    (root / "out" / package / "state.json").unlink(missing_ok=True)


def _rerun(root: Path, config: Path, tally: Counter) -> None:
    """A plain re-run: it succeeds, and the wheelhouse holds what every package's state records."""
    proc = nox(config, *PACKAGES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    house = root / "out" / "wheelhouse"
    assert wheelhouse_problems(house) == []
    assert leftovers(root) == []
    record = json.loads((house / ".index" / ".record.json").read_text())
    for package in PACKAGES:  # so the next run finds each of them up to date
        state = json.loads((root / "out" / package / "state.json").read_text())
        assert record[state["wheel"]]["sha256"] == state["sha256"], package
    tally["re-runs"] += 1


@pytest.mark.slow
def test_kills_at_every_phase_leave_a_sound_wheelhouse(tmp_path):
    config = write_config(tmp_path)
    first = nox(config, *PACKAGES)
    assert first.returncode == 0, first.stderr[-3000:]
    house = tmp_path / "out" / "wheelhouse"
    tally: Counter = Counter()
    start = time.monotonic()
    # Every point of every package's publication, and every build phase (packages taken in turn).
    targeted = [(point, pkg) for point in PUBLISH_POINTS for pkg in ("patchme", "dependent")]
    targeted += [("publish:switched", "hipkernel")]
    targeted += [(point, PACKAGES[i % 3]) for i, point in enumerate(BUILD_POINTS)]
    # `nox -s index` republishes the same set: a kill in its switch (no package: reindex).
    targeted += [("publish:staged", ""), ("publish:switched", "")]
    for point, package in targeted:
        if package:
            _stale(tmp_path, package)
        sessions = PACKAGES if package else ("index",)
        proc = nox(config, *sessions, env={VARIABLE: f"{point}@{package}" if package else point})
        assert proc.returncode == -signal.SIGKILL, f"{point}@{package} not reached: {proc.stderr[-2000:]}"
        assert wheelhouse_problems(house) == [], f"after a kill at {point}@{package}"
        tally[f"{point} ({package or 'index'})"] += 1
        _rerun(tmp_path, config, tally)

    # The nox process killed while hipcc's build step runs: the step lives on as an orphan that
    # must keep the build lock, so the immediate re-run waits instead of deleting its files.
    for delay in (0.0, 0.5, 1.0):
        _stale(tmp_path, "hipkernel")
        log = tmp_path / "out" / "logs" / "hipkernel.log"
        log.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "hipkernel"],
            env={**os.environ, "ROCMFORGE_CONFIG": str(config)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not (log.exists() and "-m build --wheel" in log.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the build step never started"
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with open(tmp_path / "out" / "hipkernel" / ".lock", "rb") as fh, pytest.raises(BlockingIOError):
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the orphaned build step holds it
        assert wheelhouse_problems(house) == []
        tally["build step (nox killed, step orphaned)"] += 1
        _rerun(tmp_path, config, tally)

    again = nox(config, *PACKAGES)
    assert again.stderr.count(": up to date (") == 3, again.stderr[-3000:]
    kills = sum(n for k, n in tally.items() if k != "re-runs")
    print(f"kills: {kills} {dict(tally)} in {time.monotonic() - start:.0f}s, 0 inconsistent states")
    assert kills >= 20


# -------------------------------------------------------------------------- tampered caches


def test_a_pin_map_naming_another_commit_is_not_used(tmp_path, upstream, capsys):
    from gitrepos import git_package
    from gitrepos import write_config as sources_config

    from rocmforge.sources import checkout as sources
    from rocmforge.sources import mirrors

    url = upstream.file_url("app")
    (tmp_path / "other").mkdir()
    other = sources_config(tmp_path / "other", git_package("app", url, "main", upstream.shas["c3"]))
    sources.prepare(other, "app")  # the shared cache now holds c3 as well
    cfg = sources_config(
        tmp_path, git_package("app", url, "v2", upstream.shas["c2"]), cache=other.build.cache_dir
    )
    assert sources.prepare(cfg, "app").commit == upstream.shas["c2"]
    pins_file = mirrors.mirror_path(other.build.cache_dir, url).with_suffix(".pins.json")
    pins = json.loads(pins_file.read_text())
    record = f"v2@{upstream.shas['c2']}"
    pins[record] = upstream.shas["c3"]  # the tamper: the cache says the pin resolved to c3
    pins_file.write_text(json.dumps(pins))
    shutil.rmtree(tmp_path / "third_party")  # the checkout is made again from the cache
    capsys.readouterr()
    checkout = sources.prepare(cfg, "app")
    assert checkout.commit == upstream.shas["c2"]
    assert (checkout.path / "README").read_text() == "app 2\n"
    assert f"records {upstream.shas['c3']} for {record}, not the pinned commit" in capsys.readouterr().err
    assert json.loads(pins_file.read_text())[record] == upstream.shas["c2"]  # and repaired


def test_edits_in_a_submodule_make_the_tree_dirty_and_undoing_them_clean(tmp_path, upstream):
    from gitrepos import git_package
    from gitrepos import write_config as sources_config

    from rocmforge.sources import checkout as sources

    cfg = sources_config(tmp_path, git_package("app", upstream.file_url("app"), "v2", upstream.shas["c2"]))
    assert sources.prepare(cfg, "app").dirty is None
    lib = tmp_path / "third_party" / "app" / "ext" / "lib" / "lib.txt"
    lib.write_text("my change\n")
    dirty = sources.prepare(cfg, "app").dirty
    assert dirty and sources.prepare(cfg, "app").dirty == dirty  # the same edit, the same hash
    lib.write_text("lib\n")  # undone: content decides
    assert sources.prepare(cfg, "app").dirty is None


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The fixture chain built once; the tests below change it and leave it sound."""
    root = tmp_path_factory.mktemp("tamper")
    config = write_config(root)
    proc = nox(config, *PACKAGES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, config, root / "out" / "wheelhouse"


@pytest.mark.slow
def test_a_swapped_wheel_is_rebuilt_not_trusted(chain):
    _root, config, house = chain
    (wheel,) = house.glob("hipkernel-*.whl")
    data, st = bytearray(wheel.read_bytes()), wheel.stat()
    data[-40] ^= 0xFF  # another wheel of the same size, with the mtime put back
    with open(wheel, "r+b") as fh:  # through the name users see, as `cp` would write it
        fh.write(data)
    os.utime(wheel, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = nox(config, *PACKAGES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{wheel}: sha256 " in proc.stderr and "recorded when it was published" in proc.stderr
    assert "hipkernel: built (" in proc.stderr
    assert wheelhouse_problems(house) == []


@pytest.mark.slow
def test_a_dependent_built_against_a_replaced_wheel_is_withdrawn_or_refused(chain, tmp_path):
    from rocmforge.build.wheelhouse import Wheelhouse
    from rocmforge.errors import UserError

    _root, config, house = chain
    (old_dependent,) = house.glob("dependent-*.whl")
    kept = shutil.copy(old_dependent, tmp_path)  # a run with the old flags, about to publish
    # Another run with other flags replaces patchme: dependent's recorded patchme is gone.
    proc = nox(config, "patchme", env={"CFLAGS": "-O1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dependent: built against patchme" in proc.stderr and "withdrawn from the index" in proc.stderr
    assert wheelhouse_problems(house) == []
    assert not list(house.glob("dependent-*.whl"))
    with pytest.raises(
        UserError, match=r"^dependent: built against patchme \w+, which the wheelhouse no longer"
    ):
        Wheelhouse(house).publish(kept)
    assert wheelhouse_problems(house) == []
    proc = nox(config, *PACKAGES, env={"CFLAGS": "-O1"})  # the same flags throughout: all back
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert wheelhouse_problems(house) == [] and len(list(house.glob("*.whl"))) == 3


@pytest.mark.slow
def test_an_edited_tree_is_marked_dirty_and_refused_by_locked_mode(chain):
    root, config, house = chain
    tree = root / "out" / "third_party" / "patchme"
    (source,) = [p for p in tree.rglob("*.c") if "build" not in p.parts]
    original = source.read_text()
    source.write_text(original + "\n/* a local experiment */\n")
    proc = nox(config, *PACKAGES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = house.glob("patchme-*.whl")
    version = wheel_name(wheel).version
    assert re.fullmatch(r"1\.0\.0\+rf\.dirty\.[0-9a-f]{8}", version), version
    record = json.loads(read_member(wheel, "rocmforge.json"))
    assert record["source"]["dirty"].startswith(version.rsplit(".", 1)[1])
    assert record["source"]["commit"] == "403797eb3c685bf6a560c5aff02adacde3bd35f1"  # still the truth
    locked = nox(config, "lock")
    assert locked.returncode == 0, locked.stderr[-2000:]
    refused = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "lock", "--", "--locked"],
        env={**os.environ, "ROCMFORGE_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode != 0
    assert f"locked mode: {tree} differs from its pin and patches (edits {version[-8:]})" in refused.stderr
    assert "Traceback" not in refused.stderr
    source.write_text(original)  # the edit undone: clean again, the plain label comes back
    proc = nox(config, *PACKAGES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [wheel_name(w).version for w in house.glob("patchme-*.whl")] == ["1.0.0+rf"]
    assert wheelhouse_problems(house) == []


# As setuptools-scm does in vLLM's sdist, every build rewrites a tracked file of its tree, here
# with the time, so that no two builds write the same bytes; and as PyTorch's HIPIFY, it rewrites
# a source file in place.
_WRITES_INTO_ITS_TREE = """\
import time
from pathlib import Path

from setuptools import setup

Path("scribe/_version.py").write_text(f"version = '1.0'  # built at {time.time_ns()}\\n")
kernel = Path("scribe/kernel.py")
kernel.write_text(kernel.read_text().replace("cuda", "hip"))
setup()
"""


def test_what_the_build_writes_into_its_tree_is_no_edit_and_a_users_edit_is(tmp_path, capfd):
    from gitrepos import Upstream, commit, git_package

    from rocmforge.build.package import build_package
    from rocmforge.config import load_config
    from rocmforge.host import gather

    up = Upstream(tmp_path / "up")
    sha = commit(
        up.new("scribe"),
        {
            "setup.py": _WRITES_INTO_ITS_TREE,
            "pyproject.toml": '[project]\nname = "scribe"\nversion = "1.0"\n',
            "scribe/__init__.py": "ANSWER = 42\n",
            "scribe/_version.py": "version = 'unknown'\n",
            "scribe/kernel.py": "DEVICE = 'cuda'\n",
        },
        "scribe 1.0",
    )
    up.publish("scribe")
    config = tmp_path / "rocmforge.toml"
    config.write_text(
        '[build]\nbackend = "cpu"\nwork_dir = "out"\nwheelhouse = "out/wheelhouse"\nlogs_dir = "out/logs"\n'
        'third_party = "out/third_party"\n'
        + git_package("scribe", up.file_url("scribe"), "main", sha, pkg='local_version = "rf"')
    )
    cfg, facts = load_config(config, environ={}), gather()
    tree = tmp_path / "out" / "third_party" / "scribe"

    def build() -> tuple[str, str]:
        result = build_package(cfg, "scribe", facts=facts)
        return result.status, wheel_name(result.wheel).version

    assert build() == ("built", "1.0+rf")
    assert "the build changed tracked files in" in capfd.readouterr().err
    status = subprocess.run(
        ["git", "status", "--porcelain", "-uno"], cwd=tree, capture_output=True, text=True
    )
    assert status.stdout == " M scribe/_version.py\n M scribe/kernel.py\n"  # tracked, written by the build
    assert build() == ("up to date", "1.0+rf")
    # A user's edit is one: marked dirty and built, and its build's own writes are again none.
    (tree / "scribe" / "__init__.py").write_text("ANSWER = 43\n")
    status, version = build()
    assert status == "built" and re.fullmatch(r"1\.0\+rf\.dirty\.[0-9a-f]{8}", version), version
    assert build() == ("up to date", version)
    # Undone, with the build's writes (other bytes than the first build's) still there: clean.
    (tree / "scribe" / "__init__.py").write_text("ANSWER = 42\n")
    assert build() == ("built", "1.0+rf")
    assert build() == ("up to date", "1.0+rf")
    # An edit to a file the build rewrites in place stays an edit after the build rewrote it.
    kernel = tree / "scribe" / "kernel.py"
    kernel.write_text(kernel.read_text() + "FALLBACK = 'cuda'\n")
    status, version = build()
    assert status == "built" and re.fullmatch(r"1\.0\+rf\.dirty\.[0-9a-f]{8}", version), version
    assert kernel.read_text() == "DEVICE = 'hip'\nFALLBACK = 'hip'\n"
    assert build() == ("up to date", version)
