"""sources.prepare against real git servers (file://, git daemon), real HTTP and real kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gitrepos import (
    CuttingProxy,
    commit,
    git,
    git_package,
    make_upstream,
    snapshot,
    url_package,
    write_config,
)

from rocmforge.errors import UserError
from rocmforge.fsutil import file_lock
from rocmforge.sources import archives, cache, mirrors
from rocmforge.sources import checkout as sources

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(cache, "RETRY_DELAYS", (0.1, 0.2))
    monkeypatch.delenv("ROCMFORGE_LOCKED", raising=False)
    monkeypatch.delenv("ROCMFORGE_OFFLINE_BUNDLE", raising=False)


def test_git_daemon_shallow_checkout_with_nested_submodules(tmp_path, upstream, daemon):
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "v2"))
    co = sources.prepare(cfg, "app")
    tree = tmp_path / "third_party" / "app"
    assert co.path == tree and co.commit == upstream.shas["c2"]
    assert (tree / "README").read_text() == "app 2\n"
    assert (tree / "ext/lib/lib.txt").read_text() == "lib\n"
    assert (tree / "ext/lib/deps/leaf/leaf.txt").read_text() == "leaf 2\n"
    assert dict(co.submodules) == {
        "ext/lib": upstream.shas["lib"],
        "ext/lib/deps/leaf": upstream.shas["leaf"],
    }
    mirror = mirrors.mirror_path(cfg.build.cache_dir, daemon.url("app"))
    # Fetched by id with --depth 1: the mirror is shallow and lacks the older commit c1.
    assert (mirror / "shallow").read_text().split() == [upstream.shas["c2"]]
    assert git("cat-file", "-t", upstream.shas["c2"], cwd=mirror) == "commit"
    assert subprocess.run(["git", "cat-file", "-e", upstream.shas["c1"]], cwd=mirror).returncode != 0
    # The tree borrows the mirror's objects instead of copying them.
    assert (tree / ".git/objects/info/alternates").read_text().strip() == str(mirror / "objects")
    assert git("status", "--porcelain", cwd=tree) == ""


def test_file_url_annotated_tag_and_abbreviated_commit(tmp_path, upstream):
    cfg = write_config(tmp_path, git_package("app", upstream.file_url("app"), "v1", upstream.shas["c1"][:9]))
    co = sources.prepare(cfg, "app")
    assert co.commit == upstream.shas["c1"]
    assert dict(co.submodules) == {}
    assert (co.path / "README").read_text() == "app 1\n"


def test_unchanged_pin_is_reused_without_network_or_writes(tmp_path, upstream, daemon):
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "v2", upstream.shas["c2"]))
    first = sources.prepare(cfg, "app")
    daemon.stop()  # any network access now fails
    before = snapshot(tmp_path / "third_party", cfg.build.cache_dir, mtimes=True)
    again = sources.prepare(cfg, "app")
    assert again == first and again.fingerprint() == first.fingerprint()
    assert snapshot(tmp_path / "third_party", cfg.build.cache_dir, mtimes=True) == before


def test_pin_bump_fetches_only_new_objects(tmp_path, upstream, daemon):
    url = daemon.url("app")
    cfg = write_config(tmp_path, git_package("app", url, "v2", upstream.shas["c2"]))
    sources.prepare(cfg, "app")
    mirror = mirrors.mirror_path(cfg.build.cache_dir, url)
    objects_before = set(
        git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=mirror).split()
    )
    cfg = write_config(tmp_path, git_package("app", url, "main", upstream.shas["c3"]))
    co = sources.prepare(cfg, "app")
    assert co.commit == upstream.shas["c3"] and (co.path / "README").read_text() == "app 3\n"
    objects_after = set(
        git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=mirror).split()
    )
    new_upstream = set(
        git(
            "rev-list",
            "--objects",
            upstream.shas["c3"],
            "--not",
            upstream.shas["c2"],
            cwd=upstream.work("app"),
        )
        .replace(" ", "\n")
        .split()
    )
    new_objects = {o for o in new_upstream if len(o) == 40}
    assert objects_after - objects_before == new_objects  # commit, root tree, README blob


@pytest.mark.parametrize("digits", [40, 8])
def test_branch_that_moved_on_still_contains_the_pin(tmp_path, upstream, daemon, digits):
    pin = upstream.shas["c2"][:digits]
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "main", pin))
    co = sources.prepare(cfg, "app")
    assert co.commit == upstream.shas["c2"]


def test_commit_not_on_the_branch_is_refused(tmp_path, upstream, daemon):
    side = upstream.work("app")
    git("checkout", "-q", "-b", "side", upstream.shas["c1"], cwd=side)
    stray = commit(side, {"README": "side\n"}, "not on main")
    git("push", "-q", str(upstream.served / "app.git"), "side", cwd=side)
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "main", stray))
    with pytest.raises(UserError, match=f"rev 'main' .* does not contain the pinned commit {stray}"):
        sources.prepare(cfg, "app")


def test_rev_not_resolving_to_commit_leaves_tree_and_cache(tmp_path, upstream, daemon):
    url = daemon.url("app")
    cfg = write_config(tmp_path, git_package("app", url, "v2", upstream.shas["c2"]))
    sources.prepare(cfg, "app")
    before = snapshot(tmp_path / "third_party", cfg.build.cache_dir)
    cfg = write_config(tmp_path, git_package("app", url, "v1", upstream.shas["c2"][:10]))
    with pytest.raises(UserError) as err:
        sources.prepare(cfg, "app")
    message = str(err.value)
    assert "\n" not in message
    assert f"rev 'v1' resolves to {upstream.shas['c1']}" in message and upstream.shas["c2"][:10] in message
    assert snapshot(tmp_path / "third_party", cfg.build.cache_dir) == before


def test_server_refusing_fetch_by_id_gets_a_full_fetch(tmp_path, upstream, daemon, monkeypatch):
    git("config", "--unset", "uploadpack.allowReachableSHA1InWant", cwd=upstream.served / "app.git")
    # Protocol v0 is what old servers speak; there an unadvertised commit may be refused.
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.version")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "0")
    cfg = write_config(tmp_path, git_package("app", daemon.url("app"), "main", upstream.shas["c2"]))
    co = sources.prepare(cfg, "app")
    assert co.commit == upstream.shas["c2"]
    mirror = mirrors.mirror_path(cfg.build.cache_dir, daemon.url("app"))
    assert not (mirror / "shallow").exists()
    assert git("cat-file", "-t", upstream.shas["c1"], cwd=mirror) == "commit"


def test_network_gone_mid_fetch(tmp_path, upstream, daemon):
    # A pin bump whose fetch loses the connection after a few hundred bytes, every time.
    big = {f"big{i}.bin": os.urandom(40000).hex() for i in range(5)}
    new = commit(upstream.work("app"), big, "big")
    upstream.publish("app")
    proxy = CuttingProxy(daemon.port, limit=600)
    url = daemon.url("app", port=proxy.port)
    cfg = write_config(tmp_path, git_package("app", url, "v2", upstream.shas["c2"]))
    proxy.limit = 10**9
    sources.prepare(cfg, "app")
    before = snapshot(tmp_path / "third_party", cfg.build.cache_dir)
    proxy.limit = 600
    cfg = write_config(tmp_path, git_package("app", url, "main", new))
    with pytest.raises(
        UserError, match=r"^app: network error after 3 attempts: .*check the connection"
    ) as err:
        sources.prepare(cfg, "app")
    assert "\n" not in str(err.value) and proxy.cuts >= 3
    assert snapshot(tmp_path / "third_party", cfg.build.cache_dir) == before
    proxy.close()


def test_dead_port_and_offline_leave_no_cache_entry(tmp_path, upstream, daemon):
    dead = daemon.url("app", port=daemon.port)
    daemon.stop()
    cfg = write_config(tmp_path, git_package("app", dead, "v2"))
    with pytest.raises(UserError, match=r"network error after 3 attempts.*Connection refused"):
        sources.prepare(cfg, "app")
    assert list((cfg.build.cache_dir / "git").glob("*.git")) == []
    cfg = write_config(tmp_path, git_package("app", dead, "v2", upstream.shas["c2"]))
    with pytest.raises(
        UserError, match=f"offline, and commit {upstream.shas['c2']} of {dead} is not in the cache"
    ):
        sources.prepare(cfg, "app", offline=True)
    assert not (tmp_path / "third_party" / "app").exists()


def test_missing_local_repository_fails_at_once_without_retries(tmp_path, capfd):
    url = (tmp_path / "no-such-repo").as_uri()
    cfg = write_config(tmp_path, git_package("app", url, "v2"))
    with pytest.raises(UserError, match=f"{url} is not a readable git repository.*fix the source url"):
        sources.prepare(cfg, "app")
    assert "retrying" not in capfd.readouterr().err
    assert not (tmp_path / "third_party" / "app").exists()


@pytest.mark.parametrize("kind", ["git", "url"])
def test_a_host_that_does_not_resolve_fails_at_once_in_one_line(tmp_path, capfd, kind):
    # No DNS (an air-gapped machine): four attempts over 22 s all said the same thing.
    # .invalid never resolves (RFC 2606).
    if kind == "git":
        package = git_package("app", "https://rocmforge-test.invalid/app.git", "v2")
    else:
        package = url_package("app", "https://rocmforge-test.invalid/app-1.0.tar.gz", "0" * 64)
    cfg = write_config(tmp_path, package)
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        sources.prepare(cfg, "app")
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "\n" not in message and "rocmforge-test.invalid" in message
    assert message.endswith("build offline from a filled cache or an export (README: Air-gapped clusters)")
    assert "retrying" not in capfd.readouterr().err


def test_offline_uses_the_filled_cache(tmp_path, upstream, daemon):
    url = daemon.url("app")
    cfg = write_config(tmp_path, git_package("app", url, "v2", upstream.shas["c2"]))
    first = sources.prepare(cfg, "app")
    daemon.stop()
    (tmp_path / "third_party" / ".app.stamp.json").unlink()  # force a rebuild of the tree
    (tmp_path / "third_party" / "app" / "README").write_text("edited\n")
    again = sources.prepare(cfg, "app", offline=True)
    assert again == first and (again.path / "README").read_text() == "app 2\n"


_PREPARE = "\n".join(
    [
        "import sys",
        "from rocmforge import config; from rocmforge.sources import checkout as sources",
        "sources.prepare(config.load_config(sys.argv[1]), 'app')",
    ]
)


def _prepare_process(cfg) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _PREPARE, str(cfg.path)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"},
        start_new_session=True,  # its own process group, like a job a user kills from the shell
    )


def test_second_run_waits_and_names_the_holder(tmp_path, upstream):
    cfg = write_config(tmp_path, git_package("app", upstream.file_url("app"), "v2"))
    lock = tmp_path / "third_party" / ".app.lock"
    with file_lock(lock, what="test holding the checkout"):
        proc = _prepare_process(cfg)
        time.sleep(1.5)
        assert proc.poll() is None  # still waiting
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (
        f"waiting for {tmp_path / 'third_party' / 'app'}: held by pid {os.getpid()} test holding the checkout"
        in err
    )


def test_holder_line_replaces_a_longer_one(tmp_path):
    # The holder is written over the last one (no truncate unless it was longer): no tail left.
    lock = tmp_path / ".app.lock"
    lock.write_text("pid 4000000 a much longer purpose than the next holder has")
    with file_lock(lock, what="short"):
        assert lock.read_text() == f"pid {os.getpid()} short"
    with file_lock(lock, what="short"):
        assert lock.read_text() == f"pid {os.getpid()} short"


@pytest.mark.parametrize("phase", ["fresh", "bump"])
def test_killed_mid_checkout_recovers(tmp_path, phase):
    up = make_upstream(tmp_path / "up", files=4000)
    tip = commit(up.work("app"), {f"src/file{i:04d}.txt": f"changed {i}\n" for i in range(4000)}, "touch all")
    up.publish("app")
    third = tmp_path / "third_party"
    cfg = write_config(tmp_path, git_package("app", up.file_url("app"), "v2", up.shas["c2"]))
    if phase == "bump":
        sources.prepare(cfg, "app")
        cfg = write_config(tmp_path, git_package("app", up.file_url("app"), "main", tip))
    proc = _prepare_process(cfg)
    # Kill it while the tree is being written: a staging dir exists (fresh) or the stamp is gone (bump).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (phase == "fresh" and list(third.glob(".app.tmp-*/src"))) or (
            phase == "bump" and not (third / ".app.stamp.json").exists()
        ):
            break
        time.sleep(0.005)
    assert proc.poll() is None, "prepare finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # prepare and the git it is running, mid-write
    proc.wait()
    co = sources.prepare(cfg, "app")
    assert co.commit == (tip if phase == "bump" else up.shas["c2"])
    assert git("status", "--porcelain", cwd=co.path) == ""
    assert list(third.glob(".app.tmp-*")) == [] and list(third.glob(".app.old-*")) == []
    expected = "changed 7\n" if phase == "bump" else "line 7\n" * 20
    assert (co.path / "src/file0007.txt").read_text() == expected


def test_derived_triton_pin(tmp_path, upstream, capfd):
    triton_commit = upstream.shas["c1"]
    torch = upstream.new("torch")
    commit(
        torch,
        {
            ".ci/docker/ci_commit_pins/triton.txt": f"{triton_commit}\n",
            ".ci/docker/triton_version.txt": "3.8.0\n",
        },
        "torch",
    )
    upstream.publish("torch")
    torch_pkg = git_package("pytorch", upstream.file_url("torch"), "main")
    url = upstream.file_url("app")

    def triton(commit_pin, extra=""):
        return git_package(
            "triton", url, "main", commit_pin, version="3.8.0", pkg=f'pin_from = "pytorch"\n{extra}'
        )

    co = sources.prepare(write_config(tmp_path, torch_pkg + triton(None)), "triton")
    assert co.commit == triton_commit and co.version == "3.8.0"
    assert "pytorch: needed because triton's pin comes from it" in capfd.readouterr().err
    wrong = upstream.shas["c2"]
    with pytest.raises(UserError) as err:
        sources.prepare(write_config(tmp_path, torch_pkg + triton(wrong)), "triton")
    assert f"packages.triton.source.commit = {wrong} but pytorch's" in str(err.value)
    assert triton_commit in str(err.value) and "override_pin = true" in str(err.value)
    co = sources.prepare(write_config(tmp_path, torch_pkg + triton(wrong, "override_pin = true")), "triton")
    assert co.commit == wrong


# --------------------------------------------------------------------------- archives over HTTP


def _tarball(base: Path, name: str, files: dict[str, str]) -> Path:
    import tarfile

    src = base / "tarsrc" / name
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    out = base / "www" / f"{name}.tar.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tf:
        tf.add(src, arcname=name)
    return out


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_url_archive_checkout_and_cached_corruption(tmp_path, http):
    good = _tarball(tmp_path, "arc-1.0", {"setup.py": "print('hi')\n", ".gitignore": "*.py\n"})
    cfg = write_config(tmp_path, url_package("arc", http.url(good.name), _sha(good)))
    co = sources.prepare(cfg, "arc")
    assert co.sha256 == _sha(good) and co.commit is None
    assert (co.path / "setup.py").read_text() == "print('hi')\n"  # ignored by its .gitignore, still there
    cached = archives.archive_path(cfg.build.cache_dir, _sha(good), good.name)
    cached.write_bytes(b"bit rot")
    (tmp_path / "third_party" / ".arc.stamp.json").unlink()
    co = sources.prepare(cfg, "arc")  # the corrupt cached file is deleted and downloaded again
    assert _sha(cached) == _sha(good)


@pytest.mark.parametrize("case", ["corrupted download", "wrong sha256"])
def test_bad_archive_hash_deletes_the_download_and_stops(tmp_path, http, case):
    good = _tarball(tmp_path, "arc-1.0", {"a.txt": "a\n"})
    cfg = write_config(tmp_path, url_package("arc", http.url(good.name), _sha(good)))
    sources.prepare(cfg, "arc")
    newer = _tarball(tmp_path, "arc-2.0", {"a.txt": "b\n"})
    expected = _sha(newer)
    if case == "corrupted download":
        newer.write_bytes(newer.read_bytes()[:-20] + b"\0" * 20)
    else:
        expected = "0" * 64
    before = snapshot(tmp_path / "third_party", cfg.build.cache_dir)
    cfg = write_config(tmp_path, url_package("arc", http.url(newer.name), expected))
    with pytest.raises(
        UserError, match=f"has sha256 {_sha(newer)}, expected {expected}; the download was deleted"
    ):
        sources.prepare(cfg, "arc")
    assert snapshot(tmp_path / "third_party", cfg.build.cache_dir) == before


def test_unreadable_archive_leaves_the_tree(tmp_path, http):
    good = _tarball(tmp_path, "arc-1.0", {"a.txt": "a\n"})
    cfg = write_config(tmp_path, url_package("arc", http.url(good.name), _sha(good)))
    sources.prepare(cfg, "arc")
    before = snapshot(tmp_path / "third_party")
    broken = tmp_path / "www" / "arc-2.0.tar.gz"
    broken.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    cfg = write_config(tmp_path, url_package("arc", http.url(broken.name), _sha(broken)))
    with pytest.raises(UserError, match=r"arc: arc-2\.0\.tar\.gz is not a readable archive"):
        sources.prepare(cfg, "arc")
    assert snapshot(tmp_path / "third_party") == before


def test_pypi_sdist_through_the_configured_index(tmp_path, http, monkeypatch):
    sdist = _tarball(tmp_path, "rf_demo-2.1", {"PKG-INFO": "Name: rf-demo\n"})
    (tmp_path / "www" / "simple" / "rf-demo").mkdir(parents=True)
    (tmp_path / "www" / "simple" / "rf-demo" / "index.html").write_text(
        f'<a href="../../{sdist.name}#sha256={_sha(sdist)}">{sdist.name}</a>\n'
    )
    monkeypatch.setenv("PIP_INDEX_URL", http.url("simple/"))
    pkg = (
        '[packages.demo]\n[packages.demo.source]\nkind = "pypi"\nname = "rf-demo"\nversion = "2.1"\n'
        f'sha256 = "{_sha(sdist)}"\n'
    )
    co = sources.prepare(write_config(tmp_path, pkg), "demo")
    assert co.kind == "pypi" and co.version == "2.1" and (co.path / "PKG-INFO").is_file()
    with pytest.raises(UserError, match=r"the index lists rf_demo-2\.1\.tar\.gz with sha256"):
        sources.prepare(write_config(tmp_path, pkg.replace(_sha(sdist), "1" * 64)), "demo")


def test_http_errors_are_retried_and_offline_names_the_archive(tmp_path, http, capfd):
    good = _tarball(tmp_path, "arc-1.0", {"a.txt": "a\n"})
    cfg = write_config(tmp_path, url_package("arc", http.url(good.name), _sha(good)))
    with pytest.raises(
        UserError, match=f"offline, and its archive \\(sha256 {_sha(good)}\\) is not in the cache"
    ):
        sources.prepare(cfg, "arc", offline=True)
    http.httpd.failures = 2
    co = sources.prepare(cfg, "arc")
    assert (co.path / "a.txt").read_text() == "a\n"
    assert capfd.readouterr().err.count("HTTP 503 busy; retrying") == 2
    http.httpd.failures = 3
    (tmp_path / "third_party/.arc.stamp.json").unlink()
    archives.archive_path(cfg.build.cache_dir, _sha(good), good.name).unlink()
    with pytest.raises(UserError, match=r"^arc: .*: HTTP 503 busy after 3 attempts; try again later$"):
        sources.prepare(cfg, "arc")


def test_archive_download_cut_mid_transfer(tmp_path, http):
    good = _tarball(tmp_path, "arc-1.0", {"a.txt": "a\n"})
    proxy = CuttingProxy(http.port, limit=10**9)
    cfg = write_config(tmp_path, url_package("arc", f"http://127.0.0.1:{proxy.port}/{good.name}", _sha(good)))
    sources.prepare(cfg, "arc")
    before = snapshot(tmp_path / "third_party", cfg.build.cache_dir)
    big = _tarball(tmp_path, "arc-2.0", {"blob.txt": os.urandom(300_000).hex()})
    proxy.limit = 20_000
    cfg = write_config(tmp_path, url_package("arc", f"http://127.0.0.1:{proxy.port}/{big.name}", _sha(big)))
    with pytest.raises(
        UserError, match=r"^arc: network error after 3 attempts at http://.*IncompleteRead"
    ) as err:
        sources.prepare(cfg, "arc")
    assert "\n" not in str(err.value) and proxy.cuts >= 3
    assert snapshot(tmp_path / "third_party", cfg.build.cache_dir) == before
    proxy.close()
