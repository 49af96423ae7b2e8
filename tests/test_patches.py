"""Patch series on real git checkouts and on the real vLLM 0.33.0 sdist."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gitrepos import commit, git, git_package, make_upstream, snapshot, write_config

from rocmforge.config import load_config
from rocmforge.errors import UserError
from rocmforge.sources import checkout as sources

ROOT = Path(__file__).resolve().parent.parent
LINES = "".join(f"line {i}\n" for i in range(1, 61))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("ROCMFORGE_LOCKED", raising=False)
    monkeypatch.delenv("ROCMFORGE_OFFLINE_BUNDLE", raising=False)


@pytest.fixture
def up(tmp_path):
    up = make_upstream(tmp_path / "up")
    up.shas["c4"] = commit(up.work("app"), {"long.txt": LINES}, "long file")
    up.publish("app")
    return up


def _diff(repo: Path, files: dict[str, str]) -> str:
    """The diff that turns ``repo``'s HEAD into ``files`` (working tree restored afterwards)."""
    for name, text in files.items():
        (repo / name).write_text(text)
    out = git("diff", "--", *files, cwd=repo) + "\n"
    git("checkout", "--", ".", cwd=repo)
    return out


def _format_patch(repo: Path, files: dict[str, str], message: str) -> str:
    commit(repo, files, message)
    out = git("format-patch", "-1", "--stdout", cwd=repo) + "\n"
    git("reset", "-q", "--hard", "HEAD~1", cwd=repo)
    return out


def _config(tmp_path: Path, url: str, rev: str, pin: str, patches: list[tuple[str, str, str]]):
    """Write patches/app/<file> for each (file, text, extra TOML) and a config listing them."""
    entries = ""
    for file, text, extra in patches:
        path = tmp_path / "patches" / "app" / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        entries += f'[[packages.app.patches]]\nfile = "{file}"\nsha256 = "{sha}"\nreason = "test"\n{extra}\n'
    return write_config(tmp_path, git_package("app", url, rev, pin) + entries)


def test_series_of_plain_and_format_patches(tmp_path, up):
    work = up.work("app")
    edited = LINES.replace("line 5\n", "line five\n")
    plain = _diff(work, {"long.txt": edited})
    fp = _format_patch(work, {"long.txt": edited.replace("line 50\n", "line fifty\n")}, "fifty")
    cfg = _config(
        tmp_path,
        up.file_url("app"),
        "main",
        up.shas["c4"],
        [("0001-five.patch", plain, ""), ("0002-fifty.patch", fp, "")],
    )
    co = sources.prepare(cfg, "app")
    text = (co.path / "long.txt").read_text()
    assert "line five\n" in text and "line fifty\n" in text
    assert [f for f, _ in co.patches] == ["0001-five.patch", "0002-fifty.patch"]
    log = git("log", "--format=%s", cwd=co.path).splitlines()
    assert log[:2] == ["fifty", "rocmforge patch 0001-five.patch"]  # one commit per patch
    assert git("status", "--porcelain", cwd=co.path) == ""


def test_patch_already_in_upstream_is_skipped(tmp_path, up):
    readme_fix = _diff(up.work("app"), {"README": "app 3 fixed\n"})
    commit(up.work("app"), {"README": "app 3 fixed\n"}, "upstream took our fix")
    up.publish("app")
    tip = git("rev-parse", "HEAD", cwd=up.work("app"))
    cfg = _config(tmp_path, up.file_url("app"), "main", tip, [("0001-readme.patch", readme_fix, "")])
    co = sources.prepare(cfg, "app")
    assert co.patches[0][0] == "0001-readme.patch"
    assert git("log", "-1", "--format=%s", cwd=co.path) == "upstream took our fix"  # nothing applied


def test_patch_that_no_longer_applies_names_file_and_hunk(tmp_path, up):
    work = up.work("app")
    patch = _diff(
        work, {"long.txt": LINES.replace("line 5\n", "line five\n").replace("line 50\n", "line fifty\n")}
    )
    cfg = _config(tmp_path, up.file_url("app"), "main", up.shas["c4"], [("0001-two-hunks.patch", patch, "")])
    sources.prepare(cfg, "app")
    newer = commit(work, {"long.txt": LINES.replace("line 51\n", "line 51 upstream\n")}, "upstream edit")
    up.publish("app")
    tree = tmp_path / "third_party"
    before = snapshot(tree)
    cfg = _config(tmp_path, up.file_url("app"), "main", newer, [("0001-two-hunks.patch", patch, "")])
    with pytest.raises(UserError) as err:
        sources.prepare(cfg, "app")
    assert str(err.value) == (
        "0001-two-hunks.patch no longer applies: long.txt, hunk #2 (@@ -47,7 +47,7 @@) "
        "does not match the source; "
        "refresh the patch or drop it (packages.app.patches[0])"
    )
    assert snapshot(tree) == before


@pytest.mark.parametrize("problem", ["missing file", "sha256 mismatch"])
def test_bad_patch_entry_stops_before_anything_changes(tmp_path, up, problem):
    patch = _diff(up.work("app"), {"README": "patched\n"})
    cfg = _config(tmp_path, up.file_url("app"), "main", up.shas["c4"], [("0001-readme.patch", patch, "")])
    sources.prepare(cfg, "app")
    before = snapshot(tmp_path / "third_party", cfg.build.cache_dir)
    patch_file = tmp_path / "patches/app/0001-readme.patch"
    if problem == "missing file":
        patch_file.unlink()
        expected = (
            f"packages.app.patches[0].file: {patch_file} does not exist; restore the file or remove the entry"
        )
    else:
        patch_file.write_text(patch.replace("patched", "patched again"))
        actual = hashlib.sha256(patch_file.read_bytes()).hexdigest()
        expected = f"0001-readme.patch: sha256 is {actual} but packages.app.patches[0].sha256 says"
    (tmp_path / "third_party/.app.stamp.json").unlink()  # even a rebuild must stop first
    before.pop(str(tmp_path / "third_party/.app.stamp.json"))
    with pytest.raises(
        UserError, match="^" + expected.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")
    ):
        sources.prepare(cfg, "app")
    assert snapshot(tmp_path / "third_party", cfg.build.cache_dir) == before


def test_changed_patch_set_rebuilds_a_clean_tree(tmp_path, up):
    url = up.file_url("app")
    cfg = _config(tmp_path, url, "main", up.shas["c4"], [])
    co = sources.prepare(cfg, "app")
    (co.path / "README").write_text("stray edit\n")
    (co.path / "build").mkdir()
    (co.path / "build" / "junk.o").write_text("old object\n")
    patch = _diff(up.work("app"), {"long.txt": LINES.replace("line 9\n", "line nine\n")})
    co = sources.prepare(
        _config(tmp_path, url, "main", up.shas["c4"], [("0001-nine.patch", patch, "")]), "app"
    )
    assert (co.path / "README").read_text() == "app 3\n"
    assert not (co.path / "build").exists()
    assert "line nine\n" in (co.path / "long.txt").read_text()


def test_patch_in_a_submodule(tmp_path, up):
    patch = _diff(up.work("lib"), {"lib.txt": "lib patched\n"})
    cfg = _config(
        tmp_path,
        up.file_url("app"),
        "main",
        up.shas["c4"],
        [("0001-lib.patch", patch, 'workdir = "ext/lib"')],
    )
    co = sources.prepare(cfg, "app")
    assert (co.path / "ext/lib/lib.txt").read_text() == "lib patched\n"
    bad = _config(
        tmp_path,
        up.file_url("app"),
        "main",
        up.shas["c4"],
        [("0001-lib.patch", patch, 'workdir = "ext/nope"')],
    )
    with pytest.raises(
        UserError, match=r"packages\.app\.patches\[0\]\.workdir: 'ext/nope' is not a submodule"
    ):
        sources.prepare(bad, "app")


def test_edits_become_a_patch_with_its_config_entry(tmp_path, up):
    cfg = _config(tmp_path, up.file_url("app"), "main", up.shas["c4"], [])
    co = sources.prepare(cfg, "app")
    (co.path / "README").write_text("my fix\n")
    (co.path / "NEW.txt").write_text("added\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rocmforge", "patch", "app", "My fix!", "--reason", "fix the readme"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "ROCMFORGE_CONFIG": str(cfg.path), "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "patches/app/0001-my-fix.patch"
    assert proc.stdout.startswith('[[packages.app.patches]]\nfile = "0001-my-fix.patch"\n')
    sha = hashlib.sha256(written.read_bytes()).hexdigest()
    assert f'sha256 = "{sha}"' in proc.stdout
    # Adding the printed entry reproduces the edits on a clean tree.
    cfg.path.write_text(cfg.path.read_text() + proc.stdout)
    (co.path / "README").write_text("unrelated edit\n")
    co = sources.prepare(load_config(cfg.path, environ={}), "app")
    assert (co.path / "README").read_text() == "my fix\n" and (co.path / "NEW.txt").read_text() == "added\n"
    assert co.patches == (("0001-my-fix.patch", sha),)


# --------------------------------------------------------------------------- the real vLLM sdist

CACHE = Path(os.environ.get("ROCMFORGE_TEST_CACHE", Path.home() / ".cache" / "rocmforge-tests"))
_ARCH_PROBE = """cmake_minimum_required(VERSION 3.20)
include(${SRC}/cmake/utils.cmake)
override_gpu_arches(OUT "HIP" "gfx90a;gfx942;gfx950")
message(STATUS "kept: ${OUT}")
"""


@pytest.mark.slow
@pytest.mark.network
def test_our_vllm_patch_applies_to_the_real_sdist(tmp_path):
    real = load_config(ROOT / "build_config.toml", environ={})
    build = dataclasses.replace(real.build, third_party=tmp_path / "third_party", cache_dir=CACHE / "cache")
    co = sources.prepare(dataclasses.replace(real, build=build), "vllm")
    assert co.sha256 == "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
    assert [f for f, _ in co.patches] == ["0001-rocm-arch-list-errors.patch"]
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed: the patch applied, its effect is not exercised")
    probe = tmp_path / "probe.cmake"
    probe.write_text(_ARCH_PROBE)

    def configure(arch: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["cmake", f"-DSRC={co.project_dir}", "-P", str(probe)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTORCH_ROCM_ARCH": arch},
        )

    dropped = configure("gfx90a;gfx1010;gfx942")
    assert dropped.returncode == 0 and "kept: gfx90a;gfx942" in dropped.stdout
    assert "ROCm architecture gfx1010 is not supported by vLLM and is skipped" in " ".join(
        dropped.stderr.split()
    )
    comma = configure("gfx90a,gfx942")
    assert comma.returncode != 0
    assert 'e.g. PYTORCH_ROCM_ARCH="gfx90a;gfx942"' in " ".join(comma.stderr.split())


def test_patch_entry_with_a_multiline_reason_loads(tmp_path, up):
    # The reason was quoted without escaping newlines, so pasting the printed entry broke the config.
    cfg = _config(tmp_path, up.file_url("app"), "main", up.shas["c4"], [])
    co = sources.prepare(cfg, "app")
    (co.path / "README").write_text("my fix\n")
    reason = 'two lines:\nsee "ticket 7"\tC:\\path ü \x7f'
    proc = subprocess.run(
        [sys.executable, "-m", "rocmforge", "patch", "app", "fix", "--reason", reason, "--upstream", "u\nrl"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "ROCMFORGE_CONFIG": str(cfg.path), "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    cfg.path.write_text(cfg.path.read_text() + proc.stdout)
    patch = load_config(cfg.path, environ={}).package("app").patches[0]
    assert (patch.reason, patch.upstream) == (reason, "u\nrl")
