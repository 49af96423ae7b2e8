"""Package sessions end to end: real git repos, real compilers (gcc, Debian's hipcc), real nox.

The fixture projects live in ``examples/fixtures`` (the README's "builds something real here"
path); each test turns them into git repositories under its own temporary directory and
drives the real ``nox`` sessions against a config that points there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from rocmforge.build.wheelfile import read_member, read_metadata, wheel_name
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.config import tomllib
from rocmforge.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
pytestmark = pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc (apt install hipcc)")


def _make_repos(dest: Path) -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("make_repos", EXAMPLES / "fixtures" / "make_repos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_repos(dest)


def write_config(
    root: Path,
    *,
    arch: str = "gfx90a",
    patched: bool = True,
    example: str = "fixtures.toml",
    repos: Path | None = None,
) -> Path:
    """A copy of ``examples/<example>`` whose caches and outputs all live under ``root``, and its
    repos too unless ``repos`` names where they are (two builders of the same upstream)."""
    repos = repos or root / "repos"
    if not repos.is_dir():
        _make_repos(repos)
    shutil.copytree(EXAMPLES / "patches", root / "patches", dirs_exist_ok=True)
    text = (EXAMPLES / example).read_text()
    text = text.replace("file:///tmp/rocmforge-fixtures/", repos.as_uri() + "/")
    text = text.replace('arch = ["gfx90a"]', f'arch = ["{arch}"]')
    text = re.sub(r"\.\./build/examples[\w-]*", "out", text)
    text = text.replace(
        'third_party = "out/third_party"', 'third_party = "out/third_party"\ncache_dir = "cache"'
    )
    if not patched:
        start = text.index("[[packages.patchme.patches]]")
        text = text[:start] + text[text.index("[packages.dependent]") :]
    path = root / "rocmforge.toml"
    path.write_text(text)
    return path


def nox(
    config: Path, *sessions: str, env: dict[str, str] | None = None, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Run the real noxfile's sessions against ``config`` (``unset``: variables to leave out)."""
    drop = ("PYTORCH_ROCM_ARCH", "MAX_JOBS", *unset)
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ.update(ROCMFORGE_CONFIG=str(config), COLUMNS="200", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", *sessions],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


def venv_with(tmp: Path, *install_args: str, installer: str = "uv") -> Path:
    """A fresh venv with ``install_args`` installed by uv (``--index``) or pip; its python."""
    venv = tmp / f"venv-{installer}"
    subprocess.run(["uv", "venv", "-q", "--seed", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    if installer == "uv":
        argv = ["uv", "pip", "install", "--python", str(python), *install_args]
    else:
        argv = [str(python), "-m", "pip", "install", "-q", *install_args]
    # PIP_CONFIG_FILE=/dev/null: this machine's pip config adds extra indexes; the user's
    # command line must be the whole story.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    subprocess.run(argv, check=True, env={**env, "PIP_CONFIG_FILE": os.devnull})
    return python


def code_object_targets(so_bytes: bytes) -> set[str]:
    """The GPU targets named by the clang offload bundle entries in a shared object."""
    marker = b"hipv4-amdgcn-amd-amdhsa--"
    found, start = set(), 0
    while (i := so_bytes.find(marker, start)) >= 0:
        end = i + len(marker)
        while end < len(so_bytes) and (chr(so_bytes[end]).isalnum() or so_bytes[end] in b":+-"):
            end += 1
        found.add(so_bytes[i + len(marker) : end].decode().split(":")[0])
        start = end
    return found


def so_targets(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return code_object_targets(zf.read("hipkernel/libhipkernel.so"))


def pure_wheel(
    project: Path, name: str, version: str, *, package: str | None = None, init: str = "", deps=()
) -> Path:
    """A one-package pure-Python project at ``project``, built by uv into ``project``'s sibling
    ``vendor/`` (a real wheel); returns that directory."""
    package = package or name
    (project / package).mkdir(parents=True)
    (project / package / "__init__.py").write_text(init)
    dependencies = "dependencies = [{}]\n".format(", ".join(f'"{d}"' for d in deps))
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n{dependencies}'
    )
    vendor = project.parent / "vendor"
    subprocess.run(["uv", "build", "-q", "--wheel", "-o", str(vendor), str(project)], check=True)
    return vendor


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture chain built once through `nox -s dependent hipkernel`."""
    root = tmp_path_factory.mktemp("chain")
    config = write_config(root)
    start = time.monotonic()
    proc = nox(config, "dependent", "hipkernel")
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"fresh build of the fixture chain: {seconds:.1f}s")
    return root, config, Wheelhouse(root / "out" / "wheelhouse"), proc


@pytest.mark.slow
def test_chain_builds_in_dependency_order(built):
    _root, _config, house, proc = built
    # `nox -s dependent` ran patchme first (requires=), then dependent, then hipkernel.
    order = [
        line.split("Running session ")[1] for line in proc.stderr.splitlines() if "Running session " in line
    ]
    assert order == ["patchme", "dependent", "hipkernel"]
    assert {e.project for e in house.entries()} == {"patchme", "dependent", "hipkernel"}
    assert (house.constraints.read_text().splitlines()[1:]) == [
        "dependent==1.0.0+rf",
        "hipkernel==1.0.0+rf",
        "patchme==1.0.0+rf",
    ]


@pytest.mark.slow
def test_fresh_venv_installs_from_the_index_and_imports(built, tmp_path):
    _root, _config, house, _proc = built
    start = time.monotonic()
    python = venv_with(tmp_path, "--index", house.simple.as_uri(), "dependent", "hipkernel")
    print(f"fresh install with uv: {time.monotonic() - start:.1f}s")
    out = subprocess.run(
        [str(python), "-c", "import dependent, hipkernel; print(dependent.value(), hipkernel.answer())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["43", "42"]
    subprocess.run([str(python), "-m", "pip", "check"], check=True)


@pytest.mark.slow
def test_pip_with_constraints_installs_the_same_wheels(built, tmp_path):
    _root, _config, house, _proc = built
    python = venv_with(
        tmp_path,
        "--no-index",
        "--find-links",
        str(house.root),
        "-c",
        str(house.constraints),
        "dependent",
        installer="pip",
    )
    subprocess.run([str(python), "-m", "pip", "check"], check=True)
    out = subprocess.run(
        [str(python), "-m", "rocmforge", "provenance", "patchme"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    record = json.loads(out.stdout)["record"]
    assert record["patches"][0]["file"] == "0001-define-the-answer.patch"


@pytest.mark.slow
def test_hip_library_holds_gfx90a_code(built):
    _root, _config, house, _proc = built
    (entry,) = house.find("hipkernel")
    assert so_targets(entry.path) == {"gfx90a"}


@pytest.mark.slow
def test_provenance_records_source_patches_and_toolchain(built):
    root, _config, house, _proc = built
    (entry,) = house.find("patchme")
    out = subprocess.run(
        [sys.executable, "-m", "rocmforge", "provenance", str(entry.path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    shown = json.loads(out.stdout)
    record = shown["record"]
    commit = subprocess.run(
        ["git", "rev-parse", "v1.0.0"], cwd=root / "repos" / "patchme", capture_output=True, text=True
    ).stdout.strip()
    assert record["source"]["commit"] == commit
    assert record["source"]["url"] == (root / "repos" / "patchme").as_uri()
    patch = root / "patches" / "patchme" / "0001-define-the-answer.patch"
    from rocmforge.fsutil import file_sha256

    assert record["patches"] == [{"file": patch.name, "sha256": file_sha256(patch)}]
    assert record["arch"] == ["gfx90a"] and record["backend"] == "rocm"
    assert record["env"]["PYTORCH_ROCM_ARCH"] == "gfx90a"
    assert record["rocm_version"] and record["compilers"]
    assert record["version"] == "1.0.0+rf"
    # The source's commit time dates the build and every member of the wheel.
    commit_time = subprocess.run(
        ["git", "show", "-s", "--format=%ct", commit],
        cwd=root / "repos" / "patchme",
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert record["env"]["SOURCE_DATE_EPOCH"] == commit_time == str(record["source_date_epoch"])
    with zipfile.ZipFile(entry.path) as zf:
        assert {i.date_time for i in zf.infolist()} == {time.gmtime(int(commit_time))[:6]}
    # Where and when it was built is not in the wheel but in the statement beside it.
    assert not {"built_at", "host", "retries"} & set(record)
    stmt = shown["statement"]
    assert stmt["subject"] == [{"name": entry.path.name, "digest": {"sha256": entry.sha256}}]
    assert stmt["predicate"]["buildDefinition"]["externalParameters"] == record
    assert stmt["predicate"]["runDetails"]["metadata"]["startedOn"].endswith("Z")
    assert stmt["predicate"]["buildDefinition"]["internalParameters"]["env"]["MAX_JOBS"] == "2"
    assert shown["signature"] == "unsigned"


@pytest.mark.slow
def test_every_build_records_its_sources_in_the_lock(built):
    root, _config, house, _proc = built
    lock = tomllib.loads((root / "rocmforge.lock.toml").read_text())
    assert set(lock["packages"]) == {"patchme", "dependent", "hipkernel"}
    (entry,) = house.find("patchme")
    record = json.loads(read_member(entry.path, "rocmforge.json"))
    locked = lock["packages"]["patchme"]
    assert locked["commit"] == record["source"]["commit"]
    assert locked["patches"] == {p["file"]: p["sha256"] for p in record["patches"]}
    assert lock["toolchain"]["rocm"] == record["rocm_version"]


@pytest.mark.slow
def test_immediate_rerun_is_a_no_op(built):
    _root, config, house, _proc = built
    before = {e.path.name: e.path.stat().st_mtime_ns for e in house.entries()}
    start = time.monotonic()
    proc = nox(config, "patchme", "dependent", "hipkernel")
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"no-op re-run of 3 sessions: {seconds:.1f}s")
    assert proc.stderr.count(": up to date (") == 3
    assert {e.path.name: e.path.stat().st_mtime_ns for e in house.entries()} == before
    assert seconds < 10


@pytest.mark.slow
def test_changing_the_arch_list_rebuilds_cleanly(tmp_path):
    config = write_config(tmp_path)
    assert nox(config, "hipkernel").returncode == 0
    house = Wheelhouse(tmp_path / "out" / "wheelhouse")
    # Something a stale build would carry over: it must be gone after the rebuild.
    stale = tmp_path / "out" / "third_party" / "hipkernel" / "build" / "stale-object.o"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("from the old arch")
    proc = nox(config, "hipkernel", env={"PYTORCH_ROCM_ARCH": "gfx908"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hipkernel: rebuilding, changed: arch" in proc.stderr
    assert not stale.exists()
    (entry,) = house.find("hipkernel")
    assert so_targets(entry.path) == {"gfx908"}


@pytest.mark.slow
def test_failing_build_leaves_no_wheel_and_no_index_entry(tmp_path):
    assert nox(write_config(tmp_path), "patchme").returncode == 0
    house = Wheelhouse(tmp_path / "out" / "wheelhouse")
    assert house.find("patchme")
    # The patch dropped from the config: the build fails, and the wheel built with it goes too.
    config = write_config(tmp_path, patched=False)
    proc = nox(config, "patchme")
    assert proc.returncode != 0
    assert "patchme: rebuilding, changed: patches, source" in proc.stderr
    log = tmp_path / "out" / "logs" / "patchme.log"
    assert "full log:" in proc.stderr and log.is_file()
    assert "PATCHME_ANSWER" in proc.stderr  # the compiler's error line is shown
    assert "PATCHME_ANSWER" in log.read_text()
    assert house.find("patchme") == []
    assert not (house.simple / "patchme").exists()


@pytest.mark.slow
def test_a_dependency_without_a_wheel_is_named(tmp_path):
    from rocmforge.build.package import dependency_wheels
    from rocmforge.config import load_config
    from rocmforge.errors import UserError

    cfg = load_config(write_config(tmp_path))
    with pytest.raises(UserError, match=r"needs patchme's wheel.*nox -s patchme"):
        dependency_wheels(cfg, "dependent")


def test_prebuilt_wheel_is_published_byte_identical(tmp_path):
    from rocmforge.build.package import build_package
    from rocmforge.config import load_config
    from rocmforge.fsutil import file_sha256
    from rocmforge.host import gather

    vendor = pure_wheel(tmp_path / "proj", "tinyvendor", "3.1", init="VALUE = 7\n")
    (original,) = vendor.glob("*.whl")
    config = tmp_path / "rocmforge.toml"
    config.write_text(
        '[build]\nbackend = "cpu"\nwork_dir = "out"\nwheelhouse = "out/wheelhouse"\nlogs_dir = "out/logs"\n'
        f'[packages.tinyvendor.prebuilt]\nrequirement = "tinyvendor==3.1"\nindex = "{vendor}"\n'
    )
    cfg = load_config(config, environ={})
    facts = gather()
    result = build_package(cfg, "tinyvendor", facts=facts)
    assert result.status == "downloaded"
    assert file_sha256(result.wheel) == file_sha256(original)
    assert build_package(cfg, "tinyvendor", facts=facts).status == "up to date"
    assert wheel_name(result.wheel).version == "3.1"


@pytest.mark.slow
@pytest.mark.network
def test_real_vllm_sdist_through_the_vllm_session(tmp_path):
    """vLLM 0.33.0 from its real sdist, VLLM_TARGET_DEVICE=empty, through `nox -s vllm`.

    With pip's configuration off (no local wheel directory, no extra index): as on a fresh
    machine, everything comes from PyPI, and the torch is the example's stand-in.
    """
    config = tmp_path / "examples" / "vllm-empty.toml"
    config.parent.mkdir()
    shutil.copy(EXAMPLES / "vllm-empty.toml", config)
    shutil.copytree(EXAMPLES / "torch-standin", config.parent / "torch-standin")
    shutil.copytree(EXAMPLES / "patches" / "vllm", config.parent / "patches" / "vllm")  # the link's target
    clean_pip = {"env": {"PIP_CONFIG_FILE": os.devnull}, "unset": ("PIP_FIND_LINKS", "PIP_INDEX_URL")}
    proc = nox(config, "vllm", **clean_pip)
    assert proc.returncode == 0, proc.stderr[-3000:]
    house = Wheelhouse(tmp_path / "build" / "vllm-empty" / "wheelhouse")
    (vllm,) = house.find("vllm")
    assert vllm.version == "0.33.0+empty"
    record = json.loads(read_member(vllm.path, "rocmforge.json"))
    assert record["env"]["VLLM_TARGET_DEVICE"] == "empty"
    assert record["source"]["sha256"] == "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
    assert set(record["dependencies"]) == {"torch"}
    # Its contract: no shared object (the empty target), so no ROCm need; stack.json lists it.
    assert record["contract"]["node_libraries"] == [] and record["contract"]["rocm"] is None
    assert "no shared object" in record["contract"]["auditwheel"]["reason"]
    stack = json.loads((house.root / "stack.json").read_text())
    assert [w["contract"] for w in stack["wheels"] if w["project"] == "vllm"] == [record["contract"]]
    # Built against our torch, vLLM names exactly it (VLLM_TARGET_DEVICE=empty lists no torch itself).
    assert "torch==0.0.0+standin" in read_metadata(vllm.path).get_all("Requires-Dist")
    assert record["exact_pins"] == {"torch": "==0.0.0+standin"} and record["pins_added"] == [
        "torch==0.0.0+standin"
    ]
    # The README says "our patch applied": the wheel's provenance says which, by sha256.
    assert record["patches"] == [
        {
            "file": "0001-rocm-arch-list-errors.patch",
            "sha256": "c75ac0c62643253bd2ca1d9e1ac0252dd07ee04b07693e0f5f12487de9db3b77",
        }
    ]
    # No build isolation: the build venv holds the wheelhouse's torch, not the one vLLM pins.
    (torch,) = house.find("torch")
    log = (tmp_path / "build" / "vllm-empty" / "logs" / "vllm.log").read_text()
    assert torch.path.name == "torch-0.0.0+standin-py3-none-any.whl"
    assert torch.path.name in log and "torch==2.14.0" not in log
    start = time.monotonic()
    again = nox(config, "vllm", **clean_pip)
    print(f"no-op re-run of torch+vllm: {time.monotonic() - start:.1f}s")
    assert again.returncode == 0 and again.stderr.count(": up to date (") == 2
    # Reproducible: built again from what the wheel records, in another directory at another
    # path (its own checkout, venv and work dir), the wheel has the same sha256.
    environ = {k: v for k, v in os.environ.items() if k not in clean_pip["unset"]}
    environ.update(clean_pip["env"], ROCMFORGE_CONFIG=str(config), PYTHONPATH=str(ROOT))
    elsewhere = tmp_path / "a" / "second" / "builder"
    start = time.monotonic()
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmforge",
            "rebuild-check",
            str(vllm.path),
            "--json",
            "--work-dir",
            str(elsewhere),
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(f"rebuild-check of vllm: {time.monotonic() - start:.1f}s")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    result = json.loads(check.stdout)
    assert result["identical"] and result["rebuilt_sha256"] == vllm.sha256
    assert Path(result["rebuilt"]).is_relative_to(elsewhere)


LOCAL_TORCH = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.skipif(not LOCAL_TORCH, reason="needs the local torch 2.13.0+cpu wheel in /opt/wheels")
def test_real_vllm_pins_our_torch_and_an_install_resolves_to_our_wheels(tmp_path):
    """The real vLLM 0.33.0 sdist (empty target) built against a real torch 2.13.0+cpu taken
    prebuilt: its METADATA requires that torch exactly, and uv, with our index first and PyPI
    behind it, resolves vLLM's whole dependency tree to our vllm and our torch."""
    config = tmp_path / "examples" / "vllm-empty.toml"
    config.parent.mkdir()
    text = (EXAMPLES / "vllm-empty.toml").read_text()
    standin = text[text.index("\n[packages.torch]\n") + 1 : text.index("\n[packages.vllm]\n") + 1]
    prebuilt = (
        f'[packages.torch.prebuilt]\nrequirement = "torch==2.13.0+cpu"\nindex = "{LOCAL_TORCH[0].parent}"\n\n'
    )
    config.write_text(text.replace(standin, prebuilt))
    shutil.copytree(EXAMPLES / "patches" / "vllm", config.parent / "patches" / "vllm")
    proc = nox(config, "vllm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    house = Wheelhouse(tmp_path / "build" / "vllm-empty" / "wheelhouse")
    (vllm,) = house.find("vllm")
    assert "torch==2.13.0+cpu" in read_metadata(vllm.path).get_all("Requires-Dist")
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    dry_run = ["uv", "pip", "install", "--dry-run", "--python", str(venv / "bin" / "python")]
    plan = subprocess.run(
        [*dry_run, "--index", house.simple.as_uri(), "vllm"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert plan.returncode == 0, plan.stderr[-2000:]
    chosen = dict(ln.split()[1].split("==", 1) for ln in plan.stderr.splitlines() if ln.startswith(" + "))
    assert (chosen["vllm"], chosen["torch"]) == ("0.33.0+empty", "2.13.0+cpu")
    print(f"resolved {len(chosen)} distributions; ours: vllm {chosen['vllm']}, torch {chosen['torch']}")


# A build that runs out of memory while compiling with more than one job, the way GCC reports
# it (from the OOM killer); with one job fewer it fits.
_OOM_SETUP = """
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_checking_memory(build_py):
    def run(self):
        if int(os.environ["MAX_JOBS"]) > 2:
            print("g++: fatal error: Killed signal terminated program cc1plus", flush=True)
            print("compilation terminated.", flush=True)
            sys.exit(1)
        super().run()


setup(cmdclass={"build_py": build_py_checking_memory})
"""


def test_a_diagnosed_failure_is_retried_once_and_recorded(tmp_path):
    from rocmforge.build.package import build_package
    from rocmforge.config import load_config

    project = tmp_path / "hungry"
    (project / "hungry").mkdir(parents=True)
    (project / "hungry" / "__init__.py").write_text("")
    (project / "setup.py").write_text(_OOM_SETUP)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "hungry"\nversion = "0.1"\n'
    )
    config = tmp_path / "rocmforge.toml"
    config.write_text(
        '[build]\nbackend = "cpu"\njobs = 4\nretry = ["oom_compiler"]\nwork_dir = "out"\n'
        'wheelhouse = "out/wheelhouse"\nlogs_dir = "out/logs"\n'
        f'[packages.hungry.source]\nkind = "path"\npath = "{project}"\n'
    )
    result = build_package(load_config(config, environ={}), "hungry")
    from rocmforge.build.provenance import read_statement

    stmt, _envelope = read_statement(result.wheel)
    (retry,) = [b for b in stmt["predicate"]["runDetails"]["byproducts"] if b["name"] == "retry"]
    assert "MAX_JOBS 4 -> 2" in retry["annotations"]["note"]
    # Fewer jobs do not change the bytes: the wheel's own record does not mention them.
    assert "MAX_JOBS" not in json.loads(read_member(result.wheel, "rocmforge.json"))["env"]
    log = (tmp_path / "out" / "logs" / "hungry.log").read_text()
    assert log.count("Killed signal terminated program cc1plus") == 1


def _record_is_honest(wheel: Path) -> None:
    """Every member's RECORD hash and size match its bytes, and every member is listed."""
    import base64
    import csv
    import hashlib
    import io

    with zipfile.ZipFile(wheel) as zf:
        (record_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        rows = {r[0]: r for r in csv.reader(io.StringIO(zf.read(record_name).decode()))}
        assert set(rows) == set(zf.namelist())
        for name in zf.namelist():
            if name == record_name:
                continue
            data = zf.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert rows[name][1:] == [f"sha256={digest}", str(len(data))], name


def test_own_triton_drops_torchs_triton_requirement(tmp_path):
    """A vendor torch wheel taken prebuilt while we build Triton: its PyPI Triton pin must go."""
    from rocmforge.build.package import build_package
    from rocmforge.build.wheelfile import read_metadata
    from rocmforge.config import load_config

    project = tmp_path / "torchlike"
    vendor = pure_wheel(project, "torch", "2.13.0+rocm7.2", deps=["pytorch-triton-rocm==3.8.0", "filelock"])
    config = tmp_path / "rocmforge.toml"
    config.write_text(
        '[build]\nbackend = "cpu"\nwork_dir = "out"\nwheelhouse = "out/wheelhouse"\nlogs_dir = "out/logs"\n'
        '[packages.pytorch]\nrecipe = "pytorch"\n'
        f'[packages.pytorch.prebuilt]\nrequirement = "torch"\nindex = "{vendor}"\n'
        f'[packages.triton]\nrecipe = "triton"\n[packages.triton.source]\nkind = "path"\npath = "{project}"\n'
    )
    wheel = build_package(load_config(config, environ={}), "pytorch").wheel
    assert read_metadata(wheel).get_all("Requires-Dist") == ["filelock"]
    record = json.loads(read_member(wheel, "rocmforge.json"))
    assert record["dropped_requirements"] == ["pytorch-triton-rocm==3.8.0"]
    assert record["source"]["kind"] == "prebuilt"
    _record_is_honest(wheel)
    python = venv_with(tmp_path, str(wheel), installer="pip")
    subprocess.run([str(python), "-m", "pip", "check"], check=True)
    python = venv_with(tmp_path / "uv", str(wheel))
    subprocess.run([str(python), "-m", "pip", "check"], check=True)


def test_local_label_is_added_and_record_rewritten(built):
    _root, _config, house, _proc = built
    for entry in house.entries():
        assert entry.version.endswith("+rf")
        _record_is_honest(entry.path)


@pytest.mark.parametrize("example", ["fixtures.toml", "cuda.toml"])
def test_example_config_pins_the_commits_make_repos_creates(tmp_path, example):
    """Editing a fixture changes its commit: the example configs must follow, or the README path breaks."""
    from rocmforge.config import load_config

    cfg = load_config(EXAMPLES / example, environ={})
    commits = _make_repos(tmp_path)
    pinned = {name: package.source.commit for name, package in cfg.packages.items()}
    assert pinned == {name: commits[name] for name in pinned}


def test_a_package_requires_its_dependencies_exactly(tmp_path):
    """Built against our torch, a package names exactly that torch; unpinned_depends opts out."""
    from rocmforge.build.package import build_package
    from rocmforge.build.wheelfile import read_metadata
    from rocmforge.config import load_config
    from rocmforge.host import gather

    vendor = pure_wheel(tmp_path / "torchlike", "torch", "2.13.0+rocm7.2")
    consumer = tmp_path / "consumer"
    pure_wheel(consumer, "consumer", "1.0", deps=["torch>=2"])
    config = tmp_path / "rocmforge.toml"
    text = (
        '[build]\nbackend = "cpu"\nwork_dir = "out"\nwheelhouse = "out/wheelhouse"\nlogs_dir = "out/logs"\n'
        '[packages.pytorch]\nrecipe = "pytorch"\n'
        f'[packages.pytorch.prebuilt]\nrequirement = "torch==2.13.0+rocm7.2"\nindex = "{vendor}"\n'
        f'[packages.consumer]\ndepends = ["pytorch"]\n'
        f'[packages.consumer.source]\nkind = "path"\npath = "{consumer}"\n'
    )
    config.write_text(text)
    facts = gather()
    cfg = load_config(config, environ={})
    build_package(cfg, "pytorch", facts=facts)
    wheel = build_package(cfg, "consumer", facts=facts).wheel
    assert read_metadata(wheel).get_all("Requires-Dist") == ["torch==2.13.0+rocm7.2"]
    record = json.loads(read_member(wheel, "rocmforge.json"))
    assert record["exact_pins"] == {"torch": "==2.13.0+rocm7.2"}
    assert record["pins_added"] == ["torch==2.13.0+rocm7.2"]  # the build wrote torch>=2
    _record_is_honest(wheel)
    # From the index, the pin leaves the resolver one choice: our torch, even with PyPI behind it.
    house = Wheelhouse(tmp_path / "out" / "wheelhouse")
    python = venv_with(tmp_path, "--index", house.simple.as_uri(), "consumer")
    shown = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "2.13.0+rocm7.2"

    config.write_text(
        text.replace('depends = ["pytorch"]\n', 'depends = ["pytorch"]\nunpinned_depends = ["pytorch"]\n')
    )
    wheel = build_package(load_config(config, environ={}), "consumer", facts=facts).wheel
    assert read_metadata(wheel).get_all("Requires-Dist") == ["torch>=2"]


def test_a_rocm_source_is_copied_out_of_the_rocm_install_and_built(tmp_path, monkeypatch):
    """amdsmi's way: the project under <ROCm>/share/amd_smi, built without writing into ROCm."""
    from rocmforge.build.package import build_package
    from rocmforge.config import load_config
    from rocmforge.host import gather
    from rocmforge.sources.archives import tree_sha256

    rocm = tmp_path / "rocm"
    share = rocm / "share" / "amd_smi"
    pure_wheel(share, "amdsmi", "26.2.1", init="def amdsmi_init():\n    return 0\n")
    (rocm / ".info").mkdir()
    (rocm / ".info" / "version").write_text("7.2.3-1\n")
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    before = sorted(p.relative_to(rocm) for p in rocm.rglob("*"))
    config = tmp_path / "rocmforge.toml"
    config.write_text(
        '[build]\nbackend = "cpu"\nwork_dir = "out"\nwheelhouse = "out/wheelhouse"\nlogs_dir = "out/logs"\n'
        'third_party = "out/third_party"\n'
        '[packages.amdsmi.source]\nkind = "rocm"\npath = "share/amd_smi"\n'
    )
    cfg = load_config(config, environ={})
    result = build_package(cfg, "amdsmi", facts=gather())
    assert wheel_name(result.wheel).version == "26.2.1"
    source = json.loads(read_member(result.wheel, "rocmforge.json"))["source"]
    assert source["kind"] == "rocm" and source["url"] == str(share)
    assert source["sha256"] == tree_sha256(share)
    assert sorted(p.relative_to(rocm) for p in rocm.rglob("*")) == before  # nothing written there
    # Another ROCm's tree is another source: the wheel is rebuilt from it.
    (share / "amdsmi" / "__init__.py").write_text("def amdsmi_init():\n    return 1\n")
    assert build_package(cfg, "amdsmi", facts=gather()).status == "built"
    # Missing (a ROCm without amd-smi-lib): one line naming the place and both ways out.
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    with pytest.raises(UserError, match=r"share/amd_smi does not exist .*amd-smi-lib.*prebuilt"):
        build_package(cfg, "amdsmi", facts=gather())


def test_exact_pins_keep_markers_and_leave_extras_alone():
    """pin_requirements on a METADATA like vLLM's: the marker of a pinned line stays, an optional
    extra's line is not ours to change, and a project named nowhere gets its own line."""
    from email.parser import Parser

    from rocmforge.build.wheelfile import pin_requirements

    metadata = Parser().parsestr(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n"
        'Requires-Dist: torch==2.13.0; platform_system == "Linux"\n'
        "Requires-Dist: triton==3.8.0+git669b31ac\n"
        'Requires-Dist: torchaudio; extra == "audio"\n'
        "Requires-Dist: regex\n"
    )
    pins = {"torch": "2.13.0+rocm7.2", "triton": "3.8.0+git669b31ac", "torchaudio": "2.11.0+rocm7.2"}
    written = pin_requirements(metadata, pins)
    assert metadata.get_all("Requires-Dist") == [
        'torch==2.13.0+rocm7.2; platform_system == "Linux"',
        "triton==3.8.0+git669b31ac",
        'torchaudio; extra == "audio"',
        "regex",
        "torchaudio==2.11.0+rocm7.2",
    ]
    assert written == ['torch==2.13.0+rocm7.2; platform_system == "Linux"', "torchaudio==2.11.0+rocm7.2"]
    assert pin_requirements(metadata, pins) == []  # already exact: nothing more to write
