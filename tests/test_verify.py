"""verify: real wheels (hipcc-built code inside) installed into real uv venvs, then checked.

The wheels are tiny but real: METADATA, WHEEL and a RECORD with hashes, installed by uv from a
real wheelhouse index. Each test breaks one thing a user would otherwise find on the GPU
machine: a wheel built for the wrong arch, a missing shared library, torch with a Triton it
does not pin, two Tritons.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from gpu_objects import hipcc, need, pypi_wheel

from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.config import load_config
from rocmforge.fsutil import file_sha256
from rocmforge.verify import checks as verify
from rocmforge.verify import inspect

ROOT = Path(__file__).resolve().parents[1]
TRITON_PIN = "pytorch-triton-rocm==3.8.0+git669b31ac"
TORCH = "2.13.0+rocm7.2"
# Python code that loads the package's shared object the way an extension module would.
LOAD_SO = "import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), {!r}))\n"


def run_verify(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m rocmforge verify ARGS`` from the checkout, output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "rocmforge", "verify", *args], capture_output=True, text=True, cwd=ROOT
    )


def make_wheel(
    out: Path, name: str, version: str, files: dict[str, bytes | str], *, requires=(), provenance=None
) -> Path:
    """A valid platform wheel with ``files``, ``Requires-Dist`` lines and a rocmforge.json."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    members = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    members[f"{info}/METADATA"] = (meta + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    members[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: rocmforge-tests\nRoot-Is-Purelib: false\n"
        b"Tag: py3-none-linux_x86_64\n"
    )
    if provenance is not None:
        members[f"{info}/rocmforge.json"] = json.dumps(provenance).encode()
    record = []
    for path, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    members[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = out / f"{dist}-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in members.items():
            z.writestr(path, data)
    return wheel


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    """hipcc-built shared objects: gfx90a, gfx908, and one that needs libhipblas.so.2."""
    d = tmp_path_factory.mktemp("so")
    stub = d / "stub.c"
    stub.write_text("int hipblasCreate(void **h) { return 0; }\n")
    # A stand-in libhipblas to link against; it is not shipped, as when ROCm's hipblas is absent.
    subprocess.run(
        [
            need("cc"),
            "-shared",
            "-fPIC",
            "-Wl,-soname,libhipblas.so.2",
            str(stub),
            "-o",
            str(d / "libhipblas.so.2"),
        ],
        check=True,
    )
    return {
        "gfx90a": hipcc(d / "k90a.so", ["gfx90a"]),
        "gfx908": hipcc(d / "k908.so", ["gfx908"]),
        "blas": hipcc(d / "blas.so", ["gfx90a"], link=("-L", str(d), "-l:libhipblas.so.2")),
    }


def wheelhouse(
    tmp: Path,
    objects,
    *,
    torch_so="gfx90a",
    triton="3.8.0+git669b31ac",
    vllm_so="gfx90a",
    second_triton=None,
    triton_code="",
    amdsmi=True,
) -> Path:
    """A published wheelhouse of torch, its Triton, vLLM built against that torch, and the
    amdsmi vLLM needs on ROCm."""
    build = tmp / "build"
    build.mkdir()
    house = Wheelhouse(tmp / "wheelhouse")
    torch = make_wheel(
        build,
        "torch",
        TORCH,
        {
            "torch/__init__.py": LOAD_SO.format("lib/libtorch_hip.so"),
            "torch/lib/libtorch_hip.so": objects[torch_so].read_bytes(),
        },
        provenance={"package": "pytorch", "dropped_requirements": [TRITON_PIN]},
    )
    house.publish(torch)
    house.publish(make_wheel(build, "pytorch-triton-rocm", triton, {"triton/__init__.py": triton_code}))
    if second_triton:
        house.publish(make_wheel(build, "triton", second_triton, {"triton/__init__.py": triton_code}))
    if amdsmi:
        house.publish(make_wheel(build, "amdsmi", "7.2.0", {"amdsmi/__init__.py": ""}))
    house.publish(
        make_wheel(
            build,
            "vllm",
            "0.33.0",
            {"vllm/__init__.py": LOAD_SO.format("_C.so"), "vllm/_C.so": objects[vllm_so].read_bytes()},
            requires=[f"torch=={TORCH}"],
            provenance={"package": "vllm", "dependencies": {"pytorch": file_sha256(torch)}},
        )
    )
    return house.root


def verify_house(tmp: Path, root: Path, archs=("gfx90a",)) -> dict[str, verify.Check]:
    python, wheels = verify.fresh_venv(tmp / "venv", root, sys.executable, offline=True)
    checks = verify.run(python, archs=archs, wheels=wheels, gpu=False)
    return {c.name: c for c in checks}


def failed(checks: dict[str, verify.Check]) -> set[str]:
    return {name for name, c in checks.items() if c.status == "fail"}


def test_consistent_wheelhouse_passes(tmp_path, objects):
    checks = verify_house(tmp_path, wheelhouse(tmp_path, objects))
    assert failed(checks) == set(), checks
    assert checks["torch ↔ Triton"].detail.startswith(f"torch {TORCH} pins {TRITON_PIN}")
    assert checks["vllm ↔ pytorch"].status == "ok"
    assert checks["import torch"].status == checks["import vllm"].status == "ok"
    assert "all cover gfx90a" in checks[f"archs: torch-{TORCH}-py3-none-linux_x86_64.whl"].detail


def test_a_rebuild_at_the_same_version_is_verified_not_uvs_cached_copy(tmp_path, objects):
    # A rebuild of torch and vLLM at the same versions puts new files at the same paths; uv had
    # the first vLLM cached for that path and installed it, built against the first torch.
    house = tmp_path / "house"
    house.mkdir()
    verify_house(tmp_path / "v1", wheelhouse(house, objects))
    shutil.rmtree(house)
    house.mkdir()
    root = wheelhouse(house, objects, torch_so="gfx908", vllm_so="gfx908")  # another torch and vLLM
    checks = verify_house(tmp_path / "v2", root, archs=("gfx908",))
    assert failed(checks) == set(), checks
    assert checks["vllm ↔ pytorch"].detail.startswith("built against torch-")


def test_wheel_built_for_the_wrong_arch(tmp_path, objects):
    # hipcc built torch for gfx908 (MI100) while the config asks for gfx90a (MI250)
    cfg = load_config(ROOT / "build_config.toml", environ={"PYTORCH_ROCM_ARCH": "gfx90a"})
    archs = verify.required_archs(cfg)
    assert archs == ("gfx90a",)
    checks = verify_house(tmp_path, wheelhouse(tmp_path, objects, torch_so="gfx908"), archs)
    name = f"archs: torch-{TORCH}-py3-none-linux_x86_64.whl"
    assert failed(checks) == {name}
    assert checks[name].detail == "torch/lib/libtorch_hip.so bundle 0 lacks gfx90a"


def test_missing_shared_library_names_its_provider(tmp_path, objects):
    checks = verify_house(tmp_path, wheelhouse(tmp_path, objects, vllm_so="blas"))
    assert failed(checks) == {"libraries: vllm", "import vllm"}
    assert checks["libraries: vllm"].detail == (
        "libhipblas.so.2 (needed by _C.so) not found; provided by ROCm package hipblas"
    )
    assert "libhipblas.so.2: cannot open shared object file" in checks["import vllm"].detail
    assert checks["import vllm"].detail.endswith("is provided by ROCm package hipblas")


def test_torch_with_a_triton_it_does_not_pin(tmp_path, objects):
    checks = verify_house(tmp_path, wheelhouse(tmp_path, objects, triton="3.7.0"))
    assert failed(checks) == {"torch ↔ Triton"}
    assert checks["torch ↔ Triton"].detail.endswith("installed: pytorch-triton-rocm 3.7.0")


def test_second_triton_and_an_import_crash(tmp_path, objects):
    # Two Tritons share the `triton` package; here its import segfaults, as overwritten files do.
    crash = "import ctypes\nctypes.string_at(0)\n"
    root = wheelhouse(tmp_path, objects, second_triton="3.8.0", triton_code=crash)
    checks = verify_house(tmp_path, root)
    assert "one Triton" in failed(checks)
    assert (
        "pytorch-triton-rocm 3.8.0+git669b31ac and triton 3.8.0 are both installed"
        in checks["one Triton"].detail
    )
    assert checks["import triton"].status == "fail"
    assert checks["import triton"].detail.startswith("crashed with SIGSEGV; likely cause: two Tritons")


def test_vllm_built_against_another_torch_and_cli_json(tmp_path, objects):
    root = wheelhouse(tmp_path, objects)
    house = Wheelhouse(root)
    rebuilt = make_wheel(
        tmp_path,
        "torch",
        TORCH,
        {"torch/__init__.py": "# rebuilt\n"},
        provenance={"package": "pytorch", "dropped_requirements": [TRITON_PIN]},
    )
    # The environment was installed, then torch rebuilt: the installed vLLM's _C.so was built
    # against the old torch (the wheelhouse itself withdraws that vLLM on the rebuild).
    python, _ = verify.fresh_venv(tmp_path / "venv", root, sys.executable, offline=True)
    house.publish(rebuilt)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmforge.verify",
            "--python",
            python,
            "--wheelhouse",
            str(root),
            "--arch",
            "gfx90a",
            "--no-gpu",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is False
    bad = {c["name"]: c["detail"] for c in doc["checks"] if c["status"] == "fail"}
    assert list(bad) == ["vllm ↔ pytorch"]
    assert "no longer in the wheelhouse; rebuild it: nox -s vllm" in bad["vllm ↔ pytorch"]


def test_gpu_part_skips_without_a_device(tmp_path):
    # This machine's own torch (or none): no GPU is reported as a skip or a clear failure, never a crash.
    checks = verify.gpu_checks(sys.executable, ("gfx90a",), None)
    assert checks and checks[0].name == "gpu: device visible"
    assert checks[0].status in {"skip", "fail"}
    assert "torch" in checks[0].detail


def test_probe_imports_the_standard_librarys_inspect_not_ours():
    """Started by path, the probe must not take rocmforge/verify/inspect.py for `import inspect`.

    Python 3.12's importlib.metadata (and torch) import inspect; with rocmforge/ leading
    sys.path that was rocmforge's module, and `nox -s verify` died in a fresh 3.12 venv.
    """
    res = subprocess.run(
        [sys.executable, "-v", str(verify.PROBE), "import", "inspect"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-2000:]
    loaded = [line for line in res.stderr.splitlines() if "inspect" in line and "rocmforge" in line]
    assert loaded == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--python", "/nonexistent/bin/python", "--no-gpu"],
            "--python /nonexistent/bin/python: cannot run it",
        ),
        (["--python", "/tmp", "--no-gpu"], "--python /tmp: cannot run it"),
        (["--wheelhouse", "{empty}", "--no-gpu"], "no wheels there"),
    ],
)
def test_bad_environment_or_empty_wheelhouse_is_one_line(tmp_path, args, message):
    # An empty wheelhouse must not pass vacuously, and a wrong interpreter is no traceback.
    args = [a.replace("{empty}", str(tmp_path)) for a in args]
    res = run_verify(*args, "--json")
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr


def installed(tmp: Path, root: Path) -> tuple[str, verify.Environment]:
    python, _ = verify.fresh_venv(tmp / "venv", root, sys.executable, offline=True)
    return python, verify.probe_environment(python)


def test_vllm_without_amdsmi_fails_statically(tmp_path, objects):
    checks = verify_house(tmp_path, wheelhouse(tmp_path, objects, amdsmi=False))
    assert failed(checks) == {"vLLM on ROCm"}
    assert checks["vLLM on ROCm"].detail.startswith("vllm 0.33.0 is installed without amdsmi")
    # A CUDA stack has no such requirement.
    python = str(tmp_path / "venv/bin/python")
    names = {c.name for c in verify.run(python, archs=("sm_90",), gpu=False)}
    assert "vLLM on ROCm" not in names


def test_libraries_resolve_only_where_the_loader_looks(tmp_path, objects):
    """libhipblas.so.2 under a ROCm tree counts only once LD_LIBRARY_PATH, the ld.so cache or a
    RUNPATH reaches it, as for the real loader."""
    python, env = installed(tmp_path, wheelhouse(tmp_path, objects, vllm_so="blas"))
    lib = tmp_path / "opt/rocm-7.2.0/lib"
    lib.mkdir(parents=True)
    shutil.copy(objects["blas"].parent / "libhipblas.so.2", lib)
    rocm = {"ROCM_PATH": str(tmp_path / "opt/rocm-7.2.0")}
    (check,) = verify.library_checks(env, ["vllm"], rocm)
    assert check.status == "fail"
    assert check.detail == (
        f"libhipblas.so.2 (needed by _C.so) is in {lib} but the loader does not search there (add it to "
        "/etc/ld.so.conf.d/ and run ldconfig, as ROCm's packages do, or to LD_LIBRARY_PATH)"
    )
    (check,) = verify.library_checks(env, ["vllm"], {**rocm, "LD_LIBRARY_PATH": f"/nonexistent:{lib}"})
    assert check.status == "ok", check.detail
    # A real loader cache, made by ldconfig from a conf naming that directory.
    (tmp_path / "ld.so.conf").write_text(f"{lib}\n")
    cache = tmp_path / "ld.so.cache"
    ldconfig = verify.ldconfig_path() or "ldconfig"
    subprocess.run([ldconfig, "-X", "-C", str(cache), "-f", str(tmp_path / "ld.so.conf")], check=True)
    assert verify.ld_cache(cache)["libhipblas.so.2"] == str(lib / "libhipblas.so.2")
    (check,) = verify.library_checks(env, ["vllm"], rocm, cache)
    assert check.status == "ok", check.detail
    # The whole verify, with that cache: the import really loads it only with LD_LIBRARY_PATH, so
    # the static check is what tells.
    assert "libraries: vllm" not in failed(
        {c.name: c for c in verify.run(python, archs=("gfx90a",), gpu=False, environ=rocm, cache=cache)}
    )


def test_runpath_with_origin_is_followed(tmp_path):
    """A library next to the extension, reached through RUNPATH=$ORIGIN/libs (and RPATH)."""
    cc = need("cc")
    build = tmp_path / "build"
    build.mkdir()
    (build / "dep.c").write_text("int dep(void) { return 1; }\n")
    (build / "ext.c").write_text("int dep(void);\nint ext(void) { return dep(); }\n")
    dep = build / "libdep.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-soname,libdep.so.1", str(build / "dep.c"), "-o", str(dep)], check=True
    )
    for tags, version in (("--enable-new-dtags", "1.0"), ("--disable-new-dtags", "2.0")):
        ext = build / f"ext-{version}.so"
        link = [
            cc,
            "-shared",
            "-fPIC",
            str(build / "ext.c"),
            str(dep),
            "-Wl,-rpath,$ORIGIN/libs",
            f"-Wl,{tags}",
        ]
        subprocess.run([*link, "-o", str(ext)], check=True)
        info = inspect.elf_dynamic(ext)
        assert (info.rpath if tags == "--disable-new-dtags" else info.runpath) == ("$ORIGIN/libs",)
        house = Wheelhouse(tmp_path / f"house-{version}")
        files = {"ext/__init__.py": "", "ext/_ext.so": ext.read_bytes()}
        house.publish(make_wheel(build, "ext", version, files, provenance={"package": "ext"}))
        _, env = installed(tmp_path / version, house.root)
        (check,) = verify.library_checks(env, ["ext"], {})
        assert check.status == "fail" and "libdep.so.1 (needed by _ext.so) not found" in check.detail
        libs = Path(env.dists["ext"]["shared_objects"][0]).parent / "libs"
        libs.mkdir()
        shutil.copy(dep, libs)
        (check,) = verify.library_checks(env, ["ext"], {})
        assert check.status == "ok", (tags, check.detail)


def test_installed_packages_archs_checked_without_the_wheelhouse(tmp_path, objects):
    """`verify --python ENV` alone: a gfx908-only torch fails when gfx90a is asked."""
    python, _ = installed(tmp_path, wheelhouse(tmp_path, objects, torch_so="gfx908"))
    checks = {c.name: c for c in verify.run(python, archs=("gfx90a",), gpu=False)}
    assert failed(checks) == {"archs: torch"}
    assert checks["archs: torch"].detail == "libtorch_hip.so bundle 0 lacks gfx90a"
    assert checks["archs: vllm"].status == "ok"
    # Built by rocmforge (provenance): imported; amdsmi only once the wheelhouse says it is ours.
    assert {"import torch", "import vllm"} <= set(checks) and "import amdsmi" not in checks
    wheels = sorted((tmp_path / "wheelhouse").glob("*.whl"))
    with_wheels = {c.name: c for c in verify.run(python, archs=("gfx90a",), wheels=wheels, gpu=False)}
    assert with_wheels["import amdsmi"].status == "ok"


def test_nothing_to_verify_is_a_failure(tmp_path):
    subprocess.run(["uv", "venv", "-q", str(tmp_path / "empty")], check=True)
    python = str(tmp_path / "empty/bin/python")
    res = run_verify("--python", python, "--arch", "gfx90a", "--no-gpu")
    assert res.returncode == 1, res.stderr
    assert res.stderr.rstrip().endswith("- FAILED")
    doc = json.loads(run_verify("--python", python, "--arch", "gfx90a", "--no-gpu", "--json").stdout)
    assert doc["ok"] is False
    (bad,) = [c for c in doc["checks"] if c["status"] == "fail"]
    assert bad["name"] == "anything verified"
    assert "none of torch, triton, vllm or a wheel from the wheelhouse is installed there" in bad["detail"]
    # The GPU part alone with nothing to run it on (no torch there): failed, not OK.
    (last,) = verify.run(python, archs=("gfx90a",), static=False, model=None)[-1:]
    assert (last.name, last.status) == ("anything verified", "fail")


@pytest.mark.network
@pytest.mark.slow
def test_cuda_build_in_a_rocm_environment_is_named_with_its_origin(tmp_path, http):
    """The real torchvision 0.28.0 manylinux wheel from PyPI (NEEDED libcudart.so.13), installed
    from a local file and from a real index on 127.0.0.1: both fail, saying where each came from."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheel = pypi_wheel("torchvision", "0.28.0", f"{tag}-{tag}-manylinux")
    simple = tmp_path / "www/simple/torchvision"
    simple.mkdir(parents=True)
    shutil.copy(wheel, simple)
    (simple / "index.html").write_text(
        f'<a href="{wheel.name}#sha256={file_sha256(wheel)}">{wheel.name}</a>\n'
    )
    sources = {
        "file": [str(wheel)],
        "index": ["--index-url", http.url("simple/"), "torchvision==0.28.0"],
    }
    for how, args in sources.items():
        venv = tmp_path / how
        subprocess.run(["uv", "venv", "-q", str(venv)], check=True)
        python = str(venv / "bin/python")
        subprocess.run(["uv", "pip", "install", "-q", "--no-deps", "--python", python, *args], check=True)
        checks = {c.name: c for c in verify.run(python, archs=("gfx942",), gpu=False)}
        bad = checks["no CUDA: torchvision"]
        assert bad.status == "fail"
        assert bad.detail.startswith("torchvision 0.28.0 is a CUDA build: it needs libc10_cuda.so (by _C.so")
        assert "libcudart.so.13 (by _C.so)" in bad.detail and "libcudart.faf08d9a.so.13 (" in bad.detail
        where = (
            wheel.as_uri()
            if how == "file"
            else "a package index (PyPI unless pip/uv were configured otherwise)"
        )
        assert f"; installed by uv from {where}. Install its ROCm build" in bad.detail


def test_a_package_built_for_fewer_archs_is_held_to_those(tmp_path, objects):
    """aiter is built for gfx942/gfx950 only: its wheel must not fail for lacking gfx90a."""
    aiter = make_wheel(
        tmp_path,
        "aiter",
        "0.1.26",
        {"aiter/__init__.py": "", "aiter/jit/module.so": objects["gfx90a"].read_bytes()},
        provenance={"package": "aiter"},
    )
    both = ("gfx908", "gfx90a")
    (whole,) = verify.coverage_checks([aiter], both)
    assert whole.status == "fail" and whole.detail.endswith("lacks gfx908")
    (narrowed,) = verify.coverage_checks([aiter], both, {"aiter": ("gfx90a",)})
    assert narrowed.status == "ok" and narrowed.detail.endswith("all cover gfx90a")
    cfg = load_config(ROOT / "build_config.toml", environ={})
    assert verify.package_archs(cfg) == {
        "flash_attn": ("gfx90a", "gfx942", "gfx950"),
        "aiter": ("gfx942", "gfx950"),
    }


def test_a_wheel_swapped_under_an_exact_pin_fails(tmp_path, objects):
    root = wheelhouse(tmp_path, objects)
    vision = make_wheel(
        tmp_path / "build",
        "torchvision",
        "0.28.0+rocm7.2",
        {"torchvision/__init__.py": ""},
        requires=[f"torch=={TORCH}"],
        provenance={"package": "torchvision", "exact_pins": {"torch": f"=={TORCH}"}},
    )
    Wheelhouse(root).publish(vision)
    python, wheels = verify.fresh_venv(tmp_path / "venv", root, sys.executable, offline=True)
    checks = {c.name: c for c in verify.run(python, archs=("gfx90a",), wheels=wheels, gpu=False)}
    assert checks["torchvision pins"].status == "ok"
    assert checks["torchvision pins"].detail == f"torch=={TORCH} (installed {TORCH})"
    # A later install replaces torch without a word from the installer (--no-deps, or pip's
    # --force-reinstall of another build): the pin names what torchvision was built against.
    other = make_wheel(tmp_path, "torch", "2.13.0+rocm7.1", {"torch/__init__.py": ""})
    subprocess.run(["uv", "pip", "install", "-q", "--python", python, "--no-deps", str(other)], check=True)
    checks = {c.name: c for c in verify.run(python, archs=("gfx90a",), wheels=wheels, gpu=False)}
    assert checks["torchvision pins"].status == "fail"
    assert checks["torchvision pins"].detail == f"torch=={TORCH} (installed 2.13.0+rocm7.1)"


def test_a_failed_gpu_check_carries_the_root_cause_diagnose_finds():
    # vLLM's engine runs in its own process: the exception the probe catches only says "See root
    # cause above", and the cause is in the run's stderr (the pinned vLLM's own wording). The
    # check's detail keeps the exception and adds diagnose's reading of the whole output.
    wrapper = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    stderr = (
        "(EngineCore_DP0 pid=120) ERROR 01-28 06:36:45 [core.py:946] EngineCore failed to start.\n"
        "(EngineCore_DP0 pid=120) ERROR 01-28 06:36:45 [core.py:946] Traceback (most recent call last):\n"
        "(EngineCore_DP0 pid=120) ERROR 01-28 06:36:45 [core.py:946] ValueError: No available memory "
        "for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n"
    )
    detail = verify._with_diagnosis(wrapper, f"{stderr}\n{wrapper}")
    assert detail.startswith(wrapper)
    assert "--gpu-memory-utilization" in detail and "KV cache" in detail
    # A run-time arch problem gets its cause by name.
    hip = "RuntimeError: HIP error: invalid device function"
    said = verify._with_diagnosis(hip, hip)
    assert said.startswith(f"{hip}; likely cause (arch_mismatch): ")
    # Nothing recognised, or only a guess: the detail stays as it was.
    assert verify._with_diagnosis("AssertionError: generated 7 tokens, expected 8", "") == (
        "AssertionError: generated 7 tokens, expected 8"
    )
