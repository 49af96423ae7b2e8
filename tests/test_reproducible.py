"""Reproducible wheels: the same inputs at another path, air-gapped, give the same sha256;
``rebuild-check`` confirms it and names a changed flag; provenance statements beside the wheels.

Real git repos, real compilers (gcc, Debian's hipcc), real nox, real ssh-keygen.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from test_build import nox, write_config
from test_lock import _offline_nox
from test_wheelhouse import make_wheel

from rocmforge.build import provenance
from rocmforge.build.wheelfile import rewrite_wheel
from rocmforge.build.wheelhouse import Wheelhouse
from rocmforge.fsutil import file_sha256

ROOT = Path(__file__).resolve().parents[1]
CHAIN = ("patchme", "dependent", "hipkernel")
needs_hipcc = pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc (apt install hipcc)")


def rocmforge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m rocmforge ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "rocmforge", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=600,
    )


def signing_key(where: Path) -> Path:
    key = where / "signing-key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nightly", "-f", str(key)], check=True
    )
    return key


def test_rewrite_is_deterministic_whatever_the_clock_umask_and_input_order(tmp_path):
    wheel = make_wheel(tmp_path, "tinydet", "1.0")
    # The same members in another order, with other times and modes: the input a second build makes.
    shuffled = tmp_path / "other" / wheel.name
    shuffled.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(shuffled, "w", zipfile.ZIP_STORED) as dst:
        for info in reversed(src.infolist()):
            info.date_time = (2031, 5, 6, 7, 8, 10)
            info.external_attr = 0o100600 << 16
            dst.writestr(info, src.read(info.filename))
    a = rewrite_wheel(wheel, tmp_path / "a", add_files={"extra.json": b"{}"}, epoch=1767225600)
    old = os.umask(0o077)
    try:
        time.sleep(2.1)  # another zip time, were the clock used
        b = rewrite_wheel(shuffled, tmp_path / "b", add_files={"extra.json": b"{}"}, epoch=1767225600)
    finally:
        os.umask(old)
    assert file_sha256(a) == file_sha256(b)
    with zipfile.ZipFile(a) as zf:
        names = zf.namelist()
        assert {i.date_time for i in zf.infolist()} == {(2026, 1, 1, 0, 0, 0)}
        assert {i.external_attr >> 16 for i in zf.infolist()} == {0o100644}
    assert names[0] == "tinydet/__init__.py" and names[-1].endswith(".dist-info/RECORD")
    # In place (the final writer after a repair tool): same path, same bytes again.
    assert file_sha256(rewrite_wheel(a, a.parent, epoch=1767225600)) == file_sha256(b)


def test_a_signed_statement_verifies_and_a_changed_one_does_not(tmp_path):
    key = signing_key(tmp_path)
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    stmt = provenance.statement(
        wheel.name, file_sha256(wheel), {"package": "demo"}, started=time.time(), finished=time.time()
    )
    provenance.write_statement(wheel, stmt, signing_key=key)
    read, envelope = provenance.read_statement(wheel)
    assert read == stmt and envelope["payloadType"] == "application/vnd.in-toto+json"
    fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", str(key)], capture_output=True, text=True).stdout
    assert envelope["signatures"][0]["keyid"] == fingerprint.split()[1]
    assert provenance.check_signature(envelope).endswith(": valid")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"nightly@rocmforge {Path(str(key) + '.pub').read_text()}")
    assert provenance.check_signature(envelope, allowed).endswith(": valid")
    (tmp_path / "stranger").mkdir()
    stranger = signing_key(tmp_path / "stranger")
    other = tmp_path / "other_signers"
    other.write_text(f"x@y {Path(f'{stranger}.pub').read_text()}")
    assert provenance.check_signature(envelope, other).endswith(f"key not in {other}")
    changed = json.dumps({**stmt, "subject": [{"name": wheel.name, "digest": {"sha256": "0" * 64}}]})
    forged = {**envelope, "payload": base64.b64encode(changed.encode()).decode()}
    assert provenance.check_signature(forged).endswith(": INVALID")


def test_a_missing_signing_key_is_one_line(tmp_path):
    config = tmp_path / "rocmforge.toml"
    config.write_text(
        '[build]\nbackend = "cpu"\nsigning_key = "keys/none"\n'
        '[packages.x.source]\nkind = "path"\npath = "."\n'
    )
    proc = rocmforge("env", "x", env={"ROCMFORGE_CONFIG": str(config)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"rocmforge env: error: build.signing_key: {tmp_path / 'keys' / 'none'} is not a file; "
        "point it at an OpenSSH private key (e.g. made by `ssh-keygen -t ed25519 -N '' -f "
        "rocmforge-signing`) or remove it"
    )


@pytest.mark.slow
@needs_hipcc
def test_two_builders_at_other_paths_one_air_gapped_give_identical_wheels(tmp_path, monkeypatch):
    """The fixture chain built online in one tree, then from its export with the network cut in
    another tree at another path (signed there): the same sha256 for every wheel."""
    repos = tmp_path / "upstream"
    first = write_config(tmp_path / "first", repos=repos)
    online = nox(first, *CHAIN)
    assert online.returncode == 0, online.stderr[-3000:]
    dest = tmp_path / "export"
    exported = nox(first, "export", "--", str(dest))
    assert exported.returncode == 0, exported.stderr[-3000:]
    repos.rename(tmp_path / "upstream-gone")  # the second builder cannot reach the upstream

    second = write_config(tmp_path / "elsewhere" / "a-longer-path", repos=repos)
    monkeypatch.setenv("ROCMFORGE_SIGNING_KEY", str(signing_key(tmp_path)))  # as a nightly sets it
    offline = _offline_nox(second, dest, *CHAIN)
    assert offline.returncode == 0, offline.stderr[-3000:]

    a = Wheelhouse(first.parent / "out" / "wheelhouse")
    b = Wheelhouse(second.parent / "out" / "wheelhouse")
    shas = {e.path.name: e.sha256 for e in a.entries()}
    assert len(shas) == 3
    assert {e.path.name: e.sha256 for e in b.entries()} == shas
    print(f"identical sha256s at two paths, one air-gapped: {json.dumps(shas, indent=1)}")

    # The statements differ (host, times, signature) and sit beside each wheel, listed in the index.
    for entry in b.entries():
        stmt, envelope = provenance.read_statement(entry.path)
        assert stmt["subject"] == [{"name": entry.path.name, "digest": {"sha256": entry.sha256}}]
        assert provenance.check_signature(envelope).endswith(": valid")
        page = (b.simple / entry.project / "index.html").read_text()
        assert f'data-provenance="../../{entry.path.name.replace("+", "%2B")}.intoto.json"' in page
    shown = rocmforge("provenance", str(b.find("patchme")[0].path))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["signature"].endswith(": valid")


@pytest.mark.slow
@needs_hipcc
def test_rebuild_check_passes_then_names_a_changed_flag(tmp_path):
    config = write_config(tmp_path)
    built = nox(config, *CHAIN)
    assert built.returncode == 0, built.stderr[-3000:]
    house = Wheelhouse(tmp_path / "out" / "wheelhouse")
    (patchme,) = house.find("patchme")
    env = {"ROCMFORGE_CONFIG": str(config)}
    lock = (tmp_path / "rocmforge.lock.toml").read_text()
    same = rocmforge("rebuild-check", str(patchme.path), "--json", env=env)
    assert same.returncode == 0, same.stderr[-3000:]
    result = json.loads(same.stdout)
    assert result["identical"] and result["rebuilt_sha256"] == patchme.sha256 == result["sha256"]
    assert not Path(result["work_dir"]).exists()  # a temporary directory, gone when identical
    assert (tmp_path / "rocmforge.lock.toml").read_text() == lock  # the project's lock is left alone

    # A rebuilder whose environment adds a flag: the rebuild differs, and the report says where.
    differs = rocmforge("rebuild-check", str(patchme.path), env={**env, "CPPFLAGS": "-fstack-protector-all"})
    assert differs.returncode == 1, differs.stderr[-3000:]
    out = differs.stdout
    assert f"{patchme.path.name}: DIFFERS" in out
    assert 'env.CPPFLAGS: (absent) -> "-fstack-protector-all"' in out
    so = next(line for line in out.splitlines() if line.strip().startswith("patchme/_native"))
    sections = out.split(so, 1)[1].splitlines()[1]
    assert "ELF sections that differ:" in sections and ".text" in sections
    assert "the original build did not; the rebuild uses them" in out
    if shutil.which("diffoscope") is None:
        assert "note: diffoscope is not installed" in out
    kept = differs.stderr.split("the rebuild is kept in ", 1)[1].split()[0]
    assert Path(kept, "wheelhouse", patchme.path.name).is_file()
    shutil.rmtree(kept)


def test_rebuild_check_refuses_what_it_cannot_rebuild_in_one_line(tmp_path):
    config = tmp_path / "rocmforge.toml"
    config.write_text('[build]\nbackend = "cpu"\n[packages.other.source]\nkind = "path"\npath = "."\n')
    (tmp_path / "tmp").mkdir()
    env = {"ROCMFORGE_CONFIG": str(config), "TMPDIR": str(tmp_path / "tmp")}
    missing = rocmforge("rebuild-check", str(tmp_path / "nope-1.0-py3-none-any.whl"), env=env)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "no such wheel" in missing.stderr
    wheel = make_wheel(tmp_path, "demo", "1.0")
    foreign = rocmforge("rebuild-check", str(wheel), env=env)
    assert (
        foreign.returncode == 2 and "has no rocmforge.json; it was not built by rocmforge" in foreign.stderr
    )
    record = provenance.record_bytes({"package": "demo", "source": {"kind": "git"}, "python": "3"})
    ours = rewrite_wheel(wheel, tmp_path / "ours", add_files={"rocmforge.json": record})
    unknown = rocmforge("rebuild-check", str(ours), env=env)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert (
        f"its package 'demo' is not in {config}; run rebuild-check from the rocmforge project"
        in unknown.stderr
    )
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("")
    assert list((tmp_path / "tmp").iterdir()) == []  # the refused rebuilds left no directory
    taken = rocmforge("rebuild-check", str(ours), "--work-dir", str(busy), env=env)
    assert taken.returncode == 2 and taken.stderr.strip().endswith(
        f"--work-dir {busy}: not an empty directory; a rebuild needs a fresh one"
    )
