"""check-node on a ROCm-shaped tree: /opt/rocm-7.2.0 with ld.so.conf.d, this machine's real libc
and libstdc++, KFD and /dev nodes, and saved rocminfo pastes (tests/data/arch) for the GPUs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fakehost
import pytest

from rocmforge import arch_detect, host
from rocmforge.build import contract
from rocmforge.build.doctor import FAIL, OK, WARN
from rocmforge.verify import checks as verify
from rocmforge.verify import node

ROOT = Path(__file__).resolve().parent.parent
ARCH_DATA = ROOT / "tests" / "data" / "arch"
LIBDIR = "lib/x86_64-linux-gnu"
REAL_LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
REAL_LIBSTDCXX = Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
LDCONFIG = verify.ldconfig_path()
pytestmark = pytest.mark.skipif(
    not (REAL_LIBC.exists() and REAL_LIBSTDCXX.exists() and LDCONFIG and os.geteuid() == 0),
    reason="needs a Debian/Ubuntu x86-64 libc, gcc, and root for `ldconfig -r` (chroot)",
)


def shared_library(path: Path, soname: str) -> None:
    """A real shared object with ``soname`` (ldconfig reads the SONAME, not the file name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / f".{soname}.c"
    src.write_text("int rocm_stand_in(void) { return 7; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(src)], check=True
    )


def ldconfig(root: Path) -> None:
    """The node's loader cache, built by the real ldconfig from the tree's ld.so.conf."""
    subprocess.run([LDCONFIG, "-r", str(root)], check=True)


def node_tree(tmp: Path, *, ld_conf: bool = True) -> Path:
    """A node: ROCm 7.2.0 under /opt (HIP and hipBLASLt, real shared objects), ld.so.conf.d/rocm.conf
    when ``ld_conf`` and the loader cache from it, the real libc/libstdc++, /dev/kfd and a render
    node, alice in video and render."""
    rocm = fakehost.rocm(tmp, "opt/rocm-7.2.0", "7.2.0-43")
    for soname in ("libamdhip64.so.7", "libhipblaslt.so.1"):
        shared_library(rocm / "lib" / soname, soname)
    fakehost.write(tmp / "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    fakehost.write(tmp / "etc/ld.so.conf.d/x86_64-linux-gnu.conf", "# multiarch\n/usr/local/lib\n")
    if ld_conf:
        fakehost.write(tmp / "etc/ld.so.conf.d/rocm.conf", "/opt/rocm-7.2.0/lib\n")
    (tmp / LIBDIR).mkdir(parents=True, exist_ok=True)
    shutil.copy(REAL_LIBC, tmp / LIBDIR / "libc.so.6")
    shutil.copy(REAL_LIBSTDCXX, tmp / LIBDIR / "libstdc++.so.6")
    ldconfig(tmp)
    fakehost.write(tmp / "etc/group", "video:x:44:alice\nrender:x:110:alice\n")
    # Owned by video and render, as udev leaves them (the tests run as root, who may chown).
    os.chown(fakehost.write(tmp / "dev/kfd", ""), -1, 44)
    os.chown(fakehost.write(tmp / "dev/dri/renderD128", ""), -1, 110)
    return tmp


def stack_doc(wheel_archs=(("torch", ["gfx90a", "gfx942"]),), **overrides) -> dict:
    """A stack.json as the index writes it: ROCm 7.2, two sonames, gfx90a+gfx942, cp311."""
    stack = {
        "rocm": ">=7.2,<7.3",
        "rocm_conflict": [],
        "node_libraries": ["libamdhip64.so.7", "libhipblaslt.so.1"],
        "glibc": "2.17",
        "glibcxx": "3.4.21",
        "cxxabi": "1.3.9",
        "python": ["cp311-cp311"],
        "gpu_archs": ["gfx90a", "gfx942"],
        "unknown": [],
        **overrides,
    }
    wheels = [
        {"project": project, "version": "1.0", "filename": f"{project}.whl", "sha256": "0" * 64}
        | {"contract": {"python": stack["python"], "gpu_archs": archs}}
        for project, archs in wheel_archs
    ]
    return {"format": contract.STACK_FORMAT, "stack": stack, "wheels": wheels}


def saved_gpus(name: str) -> list[arch_detect.Gpu]:
    return arch_detect.parse_text((ARCH_DATA / name).read_text(), name)[1]


def run(tmp, doc, *, gpus="rocminfo_mi300x.txt", python="3.11.7", **environ):
    checks = node.check_node(
        doc,
        root=tmp,
        environ={"USER": "alice", **environ},
        gpus=saved_gpus(gpus) if gpus else None,
        python=python,
    )
    return {c.name: c for c in checks}


def test_a_node_that_fits_passes_every_check(tmp_path):
    checks = run(node_tree(tmp_path), stack_doc())
    assert {c.status for c in checks.values()} == {OK}, [c for c in checks.values() if c.status != OK]
    assert checks["ROCm"].found.startswith("ROCm 7.2.0 at /opt/rocm-7.2.0")
    lib = checks["library libamdhip64.so.7"].found
    assert lib == "/opt/rocm-7.2.0/lib/libamdhip64.so.7 (ld.so cache, /etc/ld.so.conf.d/rocm.conf)"
    assert checks["GPUs"].found.startswith("gfx942 (AMD Instinct MI300X)")
    glibc = host.newest_symbol_version(REAL_LIBC, "GLIBC")
    assert checks["GLIBC >= 2.17"].found == f"GLIBC {glibc} in /{LIBDIR}/libc.so.6"


def test_rocm_outside_the_range_fails(tmp_path):
    checks = run(node_tree(tmp_path), stack_doc(rocm=">=7.3,<7.4"))
    assert checks["ROCm"].status == FAIL and "the stack needs >=7.3,<7.4" in checks["ROCm"].found


def test_rocm_libraries_must_be_where_the_loader_looks(tmp_path):
    tree = node_tree(tmp_path, ld_conf=False)
    checks = run(tree, stack_doc())
    row = checks["library libamdhip64.so.7"]
    assert row.status == FAIL and row.found == "not found by the loader; present in /opt/rocm-7.2.0/lib"
    assert "ld.so.conf.d/rocm.conf" in row.fix and "ldconfig" in row.fix
    # rocm.conf written but ldconfig not run: the cache is what the loader reads.
    fakehost.write(tree / "etc/ld.so.conf.d/rocm.conf", "/opt/rocm-7.2.0/lib\n")
    row = run(tree, stack_doc())["library libamdhip64.so.7"]
    assert row.status == FAIL and "sudo ldconfig" in row.fix and "/etc/ld.so.conf.d/rocm.conf" in row.found
    ldconfig(tree)
    assert run(tree, stack_doc())["library libamdhip64.so.7"].status == OK
    (tree / "etc/ld.so.conf.d/rocm.conf").unlink()
    ldconfig(tree)
    # LD_LIBRARY_PATH is the other documented way.
    checks = run(tree, stack_doc(), LD_LIBRARY_PATH="/opt/rocm-7.2.0/lib")
    assert checks["library libamdhip64.so.7"].found.endswith("(LD_LIBRARY_PATH)")
    assert checks["library libamdhip64.so.7"].status == OK


def test_a_library_from_another_rocm_is_a_warning(tmp_path):
    tree = node_tree(tmp_path)
    fakehost.write(tree / "opt/rocm-7.2.1/lib/libamdhip64.so.7", b"\x7fELF")
    checks = run(
        tree, stack_doc(), ROCM_PATH=str(tree / "opt/rocm-7.2.0"), LD_LIBRARY_PATH="/opt/rocm-7.2.1/lib"
    )
    row = checks["library libamdhip64.so.7"]
    assert row.status == WARN and "two ROCm installs mixed" in row.fix


def test_a_missing_library_says_what_to_install(tmp_path):
    checks = run(node_tree(tmp_path), stack_doc(node_libraries=["librccl.so.1"]))
    assert checks["library librccl.so.1"].status == FAIL
    assert "install the ROCm >=7.2,<7.3 libraries" in checks["library librccl.so.1"].fix


@pytest.mark.parametrize(
    ("paste", "status", "arch"),
    [
        ("rocminfo_mi300x.txt", OK, "gfx942"),
        ("rocminfo_mi250x.txt", OK, "gfx90a"),
        ("rocminfo_rx7900xtx_padded.txt", FAIL, "gfx1100"),
        ("rocminfo_cpu_only.txt", FAIL, None),
    ],
)
def test_gpus_from_saved_rocminfo_against_the_stack_archs(tmp_path, paste, status, arch):
    row = run(node_tree(tmp_path), stack_doc(), gpus=paste)["GPUs"]
    assert row.status == status
    if arch:
        assert row.found.startswith(arch)
    if status == FAIL and arch:
        assert "hipErrorNoBinaryForGpu" in row.fix and arch in row.fix


def test_each_wheel_is_checked_and_generic_targets_count(tmp_path):
    # vllm built for gfx9-4-generic runs on the MI300X (gfx942) although the archs all wheels
    # name in common are only gfx90a; on an RX 7900 (gfx1100) the fix names both wheels.
    wheels = (("torch", ["gfx90a", "gfx942"]), ("vllm", ["gfx90a", "gfx9-4-generic"]))
    doc = stack_doc(wheels, gpu_archs=["gfx90a"])
    assert run(node_tree(tmp_path), doc)["GPUs"].status == OK
    row = run(tmp_path, doc, gpus="rocminfo_rx7900xtx_padded.txt")["GPUs"]
    assert row.status == FAIL and "gfx1100: torch, vllm" in row.fix
    wheels = (("torch", ["gfx942"]), ("vllm", ["gfx90a"]))
    row = run(tmp_path, stack_doc(wheels, gpu_archs=[]), gpus="rocminfo_mi250x.txt")["GPUs"]
    assert row.status == FAIL and "gfx90a: torch" in row.fix


def test_wheels_built_against_two_rocm_series_fail(tmp_path):
    doc = stack_doc(rocm=None, rocm_conflict=[">=7.1,<7.2", ">=7.2,<7.3"])
    row = run(node_tree(tmp_path), doc)["ROCm"]
    assert row.status == FAIL and ">=7.1,<7.2 and >=7.2,<7.3" in row.found


def test_no_gpu_detected_on_a_tree_without_kfd(tmp_path):
    row = run(node_tree(tmp_path), stack_doc(), gpus=None, PATH=str(tmp_path / "nothing"))["GPUs"]
    assert row.status == FAIL and "no KFD topology" in row.found


def test_glibc_and_libstdcxx_floors(tmp_path):
    have = host.newest_symbol_version(REAL_LIBSTDCXX, "GLIBCXX")
    major, minor, patch = have.split(".")
    newer = f"{major}.{minor}.{int(patch) + 1}"
    checks = run(node_tree(tmp_path), stack_doc(glibc="2.99", glibcxx=newer))
    assert checks["GLIBC >= 2.99"].status == FAIL and "newer distribution" in checks["GLIBC >= 2.99"].fix
    assert checks[f"GLIBCXX >= {newer}"].status == FAIL
    assert checks[f"GLIBCXX >= {newer}"].found == f"GLIBCXX {have} in /{LIBDIR}/libstdc++.so.6"
    assert checks["CXXABI >= 1.3.9"].status == OK


def test_python_tags():
    assert node.python_fits(["cp311-cp311"], "3.11.7")
    assert not node.python_fits(["cp311-cp311"], "3.12.1")
    assert node.python_fits(["cp38-abi3"], "3.12.1") and not node.python_fits(["cp38-abi3"], "3.7.9")
    assert node.python_fits(["py3-none"], "3.10.0")


def test_wrong_python_and_kfd_absent_fail(tmp_path):
    tree = node_tree(tmp_path)
    (tree / "dev/kfd").unlink()
    checks = run(tree, stack_doc(), python="3.12.3")
    assert checks["Python"].status == FAIL and "torch (cp311-cp311)" in checks["Python"].found
    assert checks["/dev/kfd"].status == FAIL and "--device=/dev/kfd" in checks["/dev/kfd"].fix


def cli(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rocmforge", "check-node", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )


def test_bad_stack_files_are_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**stack_doc(), "format": 99}))
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    for path, words in [
        (tmp_path / "missing.json", "cannot read"),
        (bad, "not JSON"),
        (newer, "format 99"),
        (other, "not a rocmforge stack.json"),
    ]:
        proc = cli("--stack", str(path))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and words in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stdout == ""


def test_cli_json_on_this_machine_with_a_saved_paste(tmp_path):
    """This machine has no GPU: the paste stands in; what fails here is /dev/kfd, nothing else."""
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(stack_doc(rocm=None, node_libraries=[], python=[])))
    proc = cli("--stack", str(path), "--gpus", str(ARCH_DATA / "rocminfo_mi250x.txt"), "--json")
    doc = json.loads(proc.stdout)
    failed = {c["name"] for c in doc["checks"] if c["status"] == FAIL}
    expected = set() if os.access("/dev/kfd", os.R_OK | os.W_OK) else {"/dev/kfd"}
    assert failed == expected and doc["ok"] == (not expected)
    assert proc.returncode == (1 if expected else 0)
    assert next(c for c in doc["checks"] if c["name"] == "GPUs")["found"].startswith("gfx90a")
    if expected:  # the table's verdict names the command to run again after the fixes
        text = cli("--stack", str(path), "--gpus", str(ARCH_DATA / "rocminfo_mi250x.txt"))
        assert text.stderr.splitlines()[-1].endswith(
            f"then check again with `python -m rocmforge check-node --stack {path}`"
        )


def test_stack_from_an_index_server_by_url(http, tmp_path):
    """A node reads the stack.json its index server serves; a wrong URL is the one-line error."""
    (tmp_path / "www" / "stack.json").write_text(json.dumps(stack_doc()))
    assert node.load_stack(http.url("stack.json")) == stack_doc()
    proc = cli("--stack", http.url("missing/stack.json"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr and proc.stderr.count("\n") == 1
