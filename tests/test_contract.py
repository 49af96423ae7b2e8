"""The consumer contract on real ELF files: gcc/hipcc-built shared objects, real auditwheel and
patchelf, and the fixture chain built through the real nox sessions.

Symbol versions and dynamic entries are checked against binutils' ``readelf``, an independent
reader, never against numbers written into the test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from rocmforge.build import contract
from rocmforge.build.wheelfile import read_metadata
from rocmforge.verify import inspect

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
HIP_LIB = Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5")  # Debian's, installed with hipcc
NUMA_LIB = Path("/usr/lib/x86_64-linux-gnu/libnuma.so.1")  # a ROCm dependency, not in manylinux

# Uses std::string (GLIBCXX_3.4.21 with the C++11 ABI) and glibc's getrandom (GLIBC_2.25).
CXX_SOURCE = """
#include <string>
#include <sys/random.h>
extern "C" int answer(const char *s) {
    std::string text(s);
    char b;
    getrandom(&b, 1, 0);
    return (int)text.size();
}
"""


def readelf(path: Path) -> tuple[list[str], list[str], str, dict[str, set[str]]]:
    """(NEEDED, RUNPATH/RPATH entries, tag of the path entry, version needs) as binutils reads them."""
    dyn = subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dyn)
    m = re.search(r"\((RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn)
    ver = subprocess.run(["readelf", "-VW", str(path)], capture_output=True, text=True, check=True).stdout
    needs: dict[str, set[str]] = {}
    current = None
    for line in ver.split("Version needs section", 1)[-1].splitlines():
        if f := re.search(r"File: (\S+)", line):
            current = needs.setdefault(f[1], set())
        elif (n := re.search(r"Name: (\S+)", line)) and current is not None:
            current.add(n[1])
    return needed, (m[2].split(":") if m else []), (m[1] if m else ""), needs


def shared_object(tmp: Path, name: str, *, libs=(), rpath: str | None = None, new_dtags=True) -> Path:
    """A C++ shared object compiled here by g++, linked against ``libs`` (paths)."""
    src = tmp / f"{name}.cpp"
    src.write_text(CXX_SOURCE)
    out = tmp / f"{name}.so"
    # --no-as-needed: the library stays NEEDED although the source calls none of it.
    argv = ["g++", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), "-Wl,--no-as-needed", *map(str, libs)]
    if rpath:
        argv.append(f"-Wl,-rpath,{rpath}")
    argv.append("-Wl,--enable-new-dtags" if new_dtags else "-Wl,--disable-new-dtags")
    subprocess.run(argv, check=True)
    return out


def make_wheel(dest: Path, name: str, members: dict[str, Path | bytes]) -> Path:
    """A platform wheel (``linux_x86_64``) holding ``members``, laid out as setuptools lays one."""
    dist = f"{name}-1.0.dist-info"
    wheel = dest / f"{name}-1.0-cp311-cp311-linux_x86_64.whl"
    files = {
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
        b"Tag: cp311-cp311-linux_x86_64\n",
    }
    with zipfile.ZipFile(wheel, "w") as zf:
        for arc, data in members.items():
            info = zipfile.ZipInfo(arc)
            info.external_attr = 0o755 << 16
            zf.writestr(info, data.read_bytes() if isinstance(data, Path) else data)
        for arc, data in files.items():
            zf.writestr(arc, data)
        zf.writestr(f"{dist}/RECORD", "".join(f"{a},,\n" for a in [*members, *files, f"{dist}/RECORD"]))
    return wheel


def test_elf_dynamic_reads_what_readelf_reads(tmp_path):
    built = shared_object(tmp_path, "mod", libs=[HIP_LIB] if HIP_LIB.exists() else [], rpath="/opt/x:$ORIGIN")
    for path in [built, Path("/usr/bin/python3"), *([HIP_LIB] if HIP_LIB.exists() else [])]:
        info = inspect.elf_dynamic(path)
        needed, paths, _tag, needs = readelf(path)
        assert list(info.needed) == needed
        assert [*info.rpath, *info.runpath] == paths
        assert {k: set(v) for k, v in info.version_needs.items()} == needs
    assert inspect.elf_dynamic(tmp_path / "mod.cpp") is None  # not ELF


def test_contract_floors_are_the_newest_versions_referenced(tmp_path):
    so = shared_object(tmp_path, "mod")
    wheel = make_wheel(tmp_path, "floors", {"floors/mod.so": so})
    prepared = contract.prepare(wheel, tmp_path / "work", backend="cpu", rocm_version=None)
    _needed, _paths, _tag, needs = readelf(so)
    want = {
        prefix: max(
            (v.split("_", 1)[1] for vs in needs.values() for v in vs if v.startswith(f"{prefix}_")),
            key=lambda t: tuple(map(int, t.split("."))),
        )
        for prefix in ("GLIBC", "GLIBCXX")
    }
    c = prepared.contract
    assert (c["glibc"], c["glibcxx"]) == (want["GLIBC"], want["GLIBCXX"])
    assert f"GLIBC (>={want['GLIBC']})" in c["requires_external"]
    assert c["rocm"] is None and c["python"] == ["cp311-cp311"]


def test_runpath_keeps_origin_entries_and_the_rpath_kind(tmp_path):
    runpath = shared_object(tmp_path, "run", rpath="/opt/rocm-7.2.0/lib:$ORIGIN/../torch/lib")
    rpath = shared_object(tmp_path, "old", rpath="/opt/rocm/lib:$ORIGIN", new_dtags=False)
    gone = shared_object(tmp_path, "gone", rpath="/root/.pyenv/versions/3.11.7/lib")
    assert contract.strip_runpath(runpath, inspect.elf_dynamic(runpath)) == ["/opt/rocm-7.2.0/lib"]
    assert readelf(runpath)[1:3] == (["$ORIGIN/../torch/lib"], "RUNPATH")
    assert contract.strip_runpath(rpath, inspect.elf_dynamic(rpath)) == ["/opt/rocm/lib"]
    assert readelf(rpath)[1:3] == (["$ORIGIN"], "RPATH")
    contract.strip_runpath(gone, inspect.elf_dynamic(gone))
    assert readelf(gone)[1] == []
    before = runpath.read_bytes()
    assert contract.strip_runpath(runpath, inspect.elf_dynamic(runpath)) == []  # nothing left to do
    assert runpath.read_bytes() == before


@pytest.mark.skipif(not (HIP_LIB.exists() and NUMA_LIB.exists()), reason="needs Debian's hipcc")
def test_repair_excludes_rocm_vendors_the_rest_and_strips_runpath(tmp_path):
    so = shared_object(tmp_path, "mod", libs=[HIP_LIB, NUMA_LIB], rpath="/opt/rocm-7.2.0/lib")
    wheel = make_wheel(tmp_path, "gpumod", {"gpumod/mod.so": so})
    prepared = contract.prepare(wheel, tmp_path / "work", backend="rocm", rocm_version="7.2.1")
    c = prepared.contract
    assert c["auditwheel"]["repaired"] is True
    assert [p for p in c["platform"] if p.startswith("manylinux_")], c["platform"]
    assert "linux_x86_64" not in prepared.wheel.name
    # ROCm stays the node's; libnuma is grafted in under a hashed name.
    assert c["node_libraries"] == [HIP_LIB.name]
    assert [v for v in c["auditwheel"]["vendored"] if v.startswith("libnuma")]
    with zipfile.ZipFile(prepared.wheel) as zf:
        names = zf.namelist()
    assert not [n for n in names if "libamdhip64" in n]
    assert c["rocm"] == ">=7.2,<7.3" and "rocm (>=7.2,<7.3)" in c["requires_external"]
    # auditwheel gave mod.so a $ORIGIN entry for the grafted libnuma and dropped the build
    # host's entry itself (it keeps only entries inside the wheel of files it grafts for).
    out = tmp_path / "final"
    with zipfile.ZipFile(prepared.wheel) as zf:
        zf.extract("gpumod/mod.so", out)
    assert readelf(out / "gpumod/mod.so")[1] == ["$ORIGIN/../gpumod.libs"]
    assert c["runpath_removed"] == {}


def test_a_wheel_auditwheel_cannot_repair_keeps_linux_and_says_why(tmp_path):
    stub_dir = tmp_path / "gone"
    stub_dir.mkdir()
    (stub_dir / "stub.c").write_text("int stub(void) { return 1; }\n")
    stub = stub_dir / "libvanished.so.1"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libvanished.so.1",
            "-o",
            str(stub),
            str(stub_dir / "stub.c"),
        ],
        check=True,
    )
    so = shared_object(tmp_path, "mod", libs=[stub])
    shutil.rmtree(stub_dir)  # built against a library that no machine here has
    wheel = make_wheel(tmp_path, "lost", {"lost/mod.so": so})
    prepared = contract.prepare(wheel, tmp_path / "work", backend="rocm", rocm_version="7.2.0")
    c = prepared.contract
    assert prepared.wheel == wheel and c["platform"] == ["linux_x86_64"]
    assert c["auditwheel"]["repaired"] is False
    assert "libvanished.so.1" in c["auditwheel"]["reason"]
    # auditwheel show's policy: what the symbol versions alone allow, and what it could not find.
    assert c["auditwheel"]["show"]["not_found"] == ["libvanished.so.1"]
    assert c["auditwheel"]["show"]["sym_tag"].startswith("manylinux_")
    assert "libvanished.so.1" in c["system_libraries"] and c["node_libraries"] == []


def test_rocm_range_is_the_release_series():
    assert contract.rocm_range("7.2.1") == ">=7.2,<7.3"
    assert contract.rocm_range("5.2.3-8") == ">=5.2,<5.3"
    assert contract.rocm_range(None) is None and contract.rocm_range("unknown") is None


# --------------------------------------------------------------- the fixture chain via nox


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """``nox -s dependent hipkernel`` on the fixtures (Debian hipcc links libamdhip64)."""
    if shutil.which("hipcc") is None:
        pytest.skip("needs hipcc (apt install hipcc)")
    from test_build import nox, write_config

    root = tmp_path_factory.mktemp("contract-chain")
    proc = nox(write_config(root), "dependent", "hipkernel")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "out" / "wheelhouse"


@pytest.mark.slow
def test_published_wheels_carry_tags_runpath_and_requires_external(chain, tmp_path):
    (hip,) = chain.glob("hipkernel-*.whl")
    (patchme,) = chain.glob("patchme-*.whl")
    for wheel in (hip, patchme):
        assert "manylinux_" in wheel.name and "linux_x86_64" not in wheel.name.replace("manylinux", "")
    meta = read_metadata(hip)
    hip_record = json.loads(zipfile.ZipFile(hip).read("hipkernel-1.0.0+rf.dist-info/rocmforge.json"))
    rocm = contract.rocm_range(hip_record["rocm_version"])
    assert meta.get_all("Requires-External")[:2] == [f"rocm ({rocm})", "libamdhip64.so.5"]
    assert hip_record["contract"]["gpu_archs"] == ["gfx90a"]
    # patchme's extension was linked with the build host's Python lib dir in RUNPATH (a Python
    # built with -rpath, as pyenv's is): removed. Debian's python3 links without one.
    linked_with_runpath = "-rpath" in (sysconfig.get_config_var("LDSHARED") or "")
    out = tmp_path / "x"
    with zipfile.ZipFile(patchme) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        zf.extract(so, out)
        record = json.loads(zf.read("patchme-1.0.0+rf.dist-info/rocmforge.json"))
    assert readelf(out / so)[1] == []
    assert list(record["contract"]["runpath_removed"]) == ([so] if linked_with_runpath else [])
    for entries in record["contract"]["runpath_removed"].values():
        assert all(e.startswith("/") for e in entries)


@pytest.mark.slow
def test_stack_json_and_index_table_state_the_whole_stack(chain):
    doc = json.loads((chain / "stack.json").read_text())
    assert doc["format"] == contract.STACK_FORMAT
    assert [w["project"] for w in doc["wheels"]] == ["dependent", "hipkernel", "patchme"]
    hip = next(w for w in doc["wheels"] if w["project"] == "hipkernel")
    stack = doc["stack"]
    assert stack["rocm"] == hip["contract"]["rocm"] and stack["gpu_archs"] == ["gfx90a"]
    assert stack["node_libraries"] == ["libamdhip64.so.5"] and stack["unknown"] == []
    page = (chain / "simple" / "index.html").read_text()
    assert "What a node needs" in page and f"<td>{hip['version']}</td>" in page
    # pip reads the links of the root page only; the table adds none.
    assert re.findall(r'href="([^"]+)"', page) == ["dependent/", "hipkernel/", "patchme/"]


@pytest.mark.slow
def test_check_node_reads_the_published_stack(chain):
    """The fixture stack on this machine: Debian's ROCm 5.2.3 is in range and its libamdhip64
    resolves through ld.so.conf.d; an MI250X paste stands in for the GPU this box lacks."""
    root = Path(__file__).resolve().parents[1]
    paste = root / "tests" / "data" / "arch" / "rocminfo_mi250x.txt"
    argv = ["check-node", "--stack", str(chain / "stack.json"), "--gpus", str(paste), "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "rocmforge", *argv], capture_output=True, text=True, cwd=root
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["ROCm"]["status"] == "ok" and ">=5.2,<5.3" in checks["ROCm"]["found"]
    assert checks["library libamdhip64.so.5"]["status"] == "ok"
    assert checks["GPUs"]["status"] == "ok" and checks["GPUs"]["found"].startswith("gfx90a")
    failed = {name for name, c in checks.items() if c["status"] == "fail"}
    assert failed <= {"/dev/kfd"} and proc.returncode == (1 if failed else 0)
