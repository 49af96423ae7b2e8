"""Real upstreams for the source tests: git repositories with tags, several commits, a submodule
with its own submodule, served over file://, a real ``git daemon`` and a real HTTP server on
127.0.0.1; plus a TCP proxy that cuts the connection mid-transfer."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rocmforge.config import Config, load_config

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "upstream",
    "GIT_AUTHOR_EMAIL": "up@example.invalid",
    "GIT_COMMITTER_NAME": "upstream",
    "GIT_COMMITTER_EMAIL": "up@example.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=ENV
    ).stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str, *, gitlinks: dict[str, str] | None = None) -> str:
    """Write ``files``, record ``gitlinks`` (submodule path -> commit), commit, return the sha."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    if files:  # only these: the work trees have no submodule checkouts for --all to "delete"
        git("add", "--", *files, cwd=repo)
    for path, sha in (gitlinks or {}).items():
        git("update-index", "--add", "--cacheinfo", f"160000,{sha},{path}", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


def gitmodules(*entries: tuple[str, str]) -> str:
    return "".join(f'[submodule "{p}"]\n\tpath = {p}\n\turl = {u}\n' for p, u in entries)


@dataclass
class Upstream:
    """Working repos under ``work/`` published as bare repos under ``served/``."""

    base: Path
    shas: dict[str, str] = field(default_factory=dict)

    @property
    def served(self) -> Path:
        return self.base / "served"

    def work(self, name: str) -> Path:
        return self.base / "work" / name

    def file_url(self, name: str) -> str:
        return (self.served / f"{name}.git").as_uri()

    def publish(self, name: str) -> None:
        bare = self.served / f"{name}.git"
        if not bare.exists():
            git("init", "-q", "--bare", str(bare), cwd=self.base)
            # Protocol v0 clients may then ask for any reachable commit by id (v2 always may).
            git("config", "uploadpack.allowReachableSHA1InWant", "true", cwd=bare)
        git("push", "-q", "--force", "--tags", str(bare), "HEAD:refs/heads/main", cwd=self.work(name))

    def new(self, name: str) -> Path:
        repo = self.work(name)
        repo.mkdir(parents=True)
        git("init", "-q", "-b", "main", cwd=repo)
        return repo


def make_upstream(base: Path, *, files: int = 3) -> Upstream:
    """app (tags v1 annotated, v2 light; 3 commits) -> ext/lib (submodule) -> deps/leaf (its submodule)."""
    up = Upstream(base)
    leaf = up.new("leaf")
    commit(leaf, {"leaf.txt": "leaf 1\n"}, "leaf 1")
    up.shas["leaf"] = commit(leaf, {"leaf.txt": "leaf 2\n"}, "leaf 2")
    up.publish("leaf")
    lib = up.new("lib")
    up.shas["lib"] = commit(
        lib,
        {"lib.txt": "lib\n", ".gitmodules": gitmodules(("deps/leaf", "../leaf.git"))},
        "lib with leaf",
        gitlinks={"deps/leaf": up.shas["leaf"]},
    )
    up.publish("lib")
    app = up.new("app")
    bulk = {f"src/file{i:04d}.txt": f"line {i}\n" * 20 for i in range(files)}
    up.shas["c1"] = commit(app, {"README": "app 1\n", "pyproject.toml": _PYPROJECT, **bulk}, "app 1")
    git("tag", "-a", "-m", "release 1", "v1", cwd=app)
    up.shas["c2"] = commit(
        app,
        {"README": "app 2\n", ".gitmodules": gitmodules(("ext/lib", "../lib.git"))},
        "app 2 with lib",
        gitlinks={"ext/lib": up.shas["lib"]},
    )
    git("tag", "v2", cwd=app)
    up.shas["c3"] = commit(app, {"README": "app 3\n"}, "app 3")
    up.publish("app")
    return up


_PYPROJECT = '[build-system]\nrequires = ["rftest-dep>=1"]\nbuild-backend = "setuptools.build_meta"\n'


def write_config(base: Path, packages: str, *, cache: Path | None = None) -> Config:
    """A build_config.toml in ``base`` with its cache and third_party inside ``base``."""
    build = (
        f'[build]\narch = ["gfx942"]\nthird_party = "third_party"\ncache_dir = "{cache or base / "cache"}"\n'
    )
    text = f"{build}\n{packages}"
    (base / "build_config.toml").write_text(text)
    return load_config(base / "build_config.toml", environ={})


def git_package(
    name: str, url: str, rev: str, commit: str | None = None, *, version="1.0", pkg: str = "", src: str = ""
) -> str:
    """TOML for one git package; ``pkg`` and ``src`` are extra lines for its two tables."""
    lines = [f"[packages.{name}]", f'version = "{version}"', pkg]
    lines += [f"[packages.{name}.source]", 'kind = "git"', f'url = "{url}"', f'rev = "{rev}"', src]
    if commit:
        lines.append(f'commit = "{commit}"')
    return "\n".join(line for line in lines if line) + "\n"


def url_package(name: str, url: str, sha256: str) -> str:
    """TOML for one package from a URL archive."""
    return (
        f'[packages.{name}]\nversion = "1.0"\n[packages.{name}.source]\nkind = "url"\n'
        f'url = "{url}"\nsha256 = "{sha256}"\n'
    )


def snapshot(*roots: Path, mtimes: bool = False) -> dict[str, tuple]:
    """Every file under ``roots`` with its size and hash (and mtime); lock files are left out."""
    seen = {}
    for root in roots:
        if not root.exists():
            continue
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.name.endswith(".lock"):
                st = p.stat()
                seen[str(p)] = (
                    st.st_size,
                    hashlib.sha256(p.read_bytes()).hexdigest(),
                    *((st.st_mtime_ns,) if mtimes else ()),
                )
            elif p.is_dir():
                seen[str(p)] = ("dir",)
    return seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


class GitDaemon:
    """``git daemon`` serving ``root`` on 127.0.0.1 (a real git:// server)."""

    def __init__(self, root: Path):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--informative-errors",
                f"--base-path={root}",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                str(root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # `git daemon` runs git-daemon as a child: stop the whole group
        )
        wait_port(self.port)

    def url(self, name: str, port: int | None = None) -> str:
        return f"git://127.0.0.1:{port or self.port}/{name}.git"

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class CuttingProxy:
    """Forwards 127.0.0.1:port to ``target_port`` and drops each connection after ``limit`` bytes
    from the server: the network going away in the middle of a fetch."""

    def __init__(self, target_port: int, limit: int):
        self.target_port, self.limit = target_port, limit
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cuts = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        done = threading.Event()

        def pump(src, dst, limit):
            sent = 0
            try:
                while not done.is_set():
                    data = src.recv(4096)
                    if not data:
                        break
                    if limit is not None and sent + len(data) > limit:
                        dst.sendall(data[: limit - sent])
                        self.cuts += 1
                        break
                    dst.sendall(data)
                    sent += len(data)
            except OSError:
                pass
            done.set()
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(client, upstream, None), daemon=True).start()
        pump(upstream, client, self.limit)
        client.close()
        upstream.close()

    def close(self) -> None:
        self.server.close()


class HttpServer:
    """A real HTTP server on 127.0.0.1 serving the files under ``root``; it answers 503 to the
    next ``failures`` requests (a flaky mirror)."""

    def __init__(self, root: Path):
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.failures = 0
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.server.failures > 0:
            self.server.failures -= 1
            self.send_error(503, "busy")
            return
        super().do_GET()

    def log_message(self, *args) -> None:
        pass
