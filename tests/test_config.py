"""Bad configuration: each mistake gives one line naming the key and the fix, no traceback.

Most cases go through the real CLI (and one through nox) in a subprocess, as a user meets them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fakehost import config

from rocmforge.config import load_config, package_archs, require_package_archs
from rocmforge.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
GOOD = (ROOT / "build_config.toml").read_text()


def cli(*args, config_text=None, tmp_path=None, **env):
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ROCM_ARCH", "MAX_JOBS", "ROCM_PATH")}
    if config_text is not None:
        path = tmp_path / "build_config.toml"
        path.write_text(config_text)
        environ["ROCMFORGE_CONFIG"] = str(path)
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env={**environ, **env})


def one_line(proc) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


BAD_CONFIGS = {
    "wrong type": (
        GOOD.replace('jobs = "auto"', "jobs = true"),
        "build.jobs: expected an integer or a string, got a boolean",
    ),
    "unknown key": (
        GOOD.replace('opt_level = "O3"', 'opt_level = "O3"\noptlevel = "O2"'),
        "build.optlevel: unknown key; did you mean 'opt_level'? known keys here:",
    ),
    # The misspelt key left build.arch unset, which was reported as "the arch list is empty".
    "archs typo": (
        GOOD.replace('arch = ["gfx90a", "gfx942", "gfx950"]', 'archs = ["gfx90a", "gfx942"]'),
        "build.archs: unknown key; did you mean 'arch'? known keys here:",
    ),
    "sources typo": (
        GOOD.replace("[packages.vllm.source]", "[packages.vllm.sources]"),
        "packages.vllm.sources: unknown key; did you mean 'source'? known keys here:",
    ),
    "gfx9420": (
        GOOD.replace('arch = ["gfx90a", "gfx942", "gfx950"]', 'arch = ["gfx90a", "gfx9420"]'),
        "build.arch: unknown GPU arch 'gfx9420'; did you mean gfx942",
    ),
    "comma list": (
        GOOD.replace('arch = ["gfx90a", "gfx942", "gfx950"]', 'arch = "gfx90a,gfx942"'),
        "build.arch: 'gfx90a,gfx942' is comma-separated; separate archs with ';' (e.g. 'gfx90a;gfx942')",
    ),
    "empty list": (
        GOOD.replace('arch = ["gfx90a", "gfx942", "gfx950"]', "arch = []"),
        "build.arch: the arch list is empty; name the GPUs to build for",
    ),
    # A package's own list must meet build.arch: aiter built for nothing would be a wheel without code.
    "package arch outside build.arch": (
        GOOD.replace('arch = ["gfx942", "gfx950"]', 'arch = ["gfx1100"]'),
        "packages.aiter.arch: none of gfx1100 is in build.arch (gfx90a;gfx942;gfx950)",
    ),
    "package arch typo": (
        GOOD.replace('arch = ["gfx942", "gfx950"]', 'arch = ["gfx942", "gfx905"]'),
        "packages.aiter.arch: unknown GPU arch 'gfx905'",
    ),
    "unpinned dependency not a dependency": (
        GOOD.replace(
            'depends = ["pytorch", "triton"]\narch',
            'depends = ["pytorch"]\nunpinned_depends = ["triton"]\narch',
        ),
        "packages.aiter.unpinned_depends[0]: 'triton' is not in depends; list only dependencies",
    ),
    "rocm source without a path": (
        GOOD.replace('path = "share/amd_smi"', ""),
        "packages.amdsmi.source.path: required for a rocm source: the tree inside the ROCm install",
    ),
    "rocm source outside the install": (
        GOOD.replace('path = "share/amd_smi"', 'path = "../etc"'),
        "packages.amdsmi.source.path: '../etc' must be a relative path inside the source tree",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_through_the_cli(tmp_path, case):
    text, message = BAD_CONFIGS[case]
    assert text != GOOD, "the replacement did not apply: the shipped config changed"
    line = one_line(
        cli(sys.executable, "-m", "rocmforge", "env", "pytorch", config_text=text, tmp_path=tmp_path)
    )
    assert line.startswith(f"rocmforge env: error: {message}")


def test_an_override_that_leaves_a_package_no_arch_stops_only_that_package(tmp_path):
    cfg = config({"PYTORCH_ROCM_ARCH": "gfx90a"})  # loads: the other packages still build
    assert package_archs(cfg, cfg.package("aiter")) == ()
    assert package_archs(cfg, cfg.package("flash_attn")) == ("gfx90a",)
    with pytest.raises(
        UserError, match=r"^packages\.aiter\.arch: aiter supports only gfx942;gfx950, none of"
    ):
        require_package_archs(cfg, cfg.package("aiter"))
    assert package_archs(cfg, cfg.package("pytorch")) == ("gfx90a",)


def test_bad_environment_overrides_through_the_cli(tmp_path):
    run = ("python", "-m", "rocmforge", "doctor")
    comma = one_line(cli(*run, PYTORCH_ROCM_ARCH="gfx90a,gfx942"))
    assert comma == (
        "rocmforge doctor: error: PYTORCH_ROCM_ARCH: 'gfx90a,gfx942' is comma-separated; "
        "separate archs with ';' (e.g. 'gfx90a;gfx942')"
    )
    assert "did you mean gfx942" in one_line(cli(*run, PYTORCH_ROCM_ARCH="gfx9420"))
    assert "the arch list is empty" in one_line(cli(*run, PYTORCH_ROCM_ARCH=" "))
    missing = tmp_path / "rocm-7.2.0"
    line = one_line(cli("python", "-m", "rocmforge", "env", "vllm", ROCM_PATH=str(missing)))
    assert line == (
        f"rocmforge env: error: ROCM_PATH={missing} does not exist; unset it or point it at a ROCm install "
        "(e.g. /opt/rocm-7.2.0)"
    )
    doctor = cli(*run, "--json", ROCM_PATH=str(missing))
    assert doctor.returncode == 1
    rows = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert (rows["ROCm"]["status"], rows["ROCm"]["found"]) == ("fail", f"ROCM_PATH={missing} does not exist")


def test_bad_config_stops_nox_with_one_line(tmp_path):
    text, message = BAD_CONFIGS["gfx9420"]
    proc = cli(sys.executable, "-m", "nox", "-s", "toolchain", config_text=text, tmp_path=tmp_path)
    assert proc.returncode != 0
    assert f"rocmforge: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_other_bad_inputs_name_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace("gb_per_job = 4.0", 'gb_per_job = "4"'))
    with pytest.raises(UserError, match=r"^packages\.pytorch\.gb_per_job: expected an integer or a number"):
        load_config(path, environ={})
    with pytest.raises(UserError, match=r"^MAX_JOBS: 'many' is not a positive integer"):
        config({"MAX_JOBS": "many"})
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "missing.toml", environ={})


def test_config_path_that_is_a_directory_or_has_a_bom(tmp_path):
    # A directory given as ROCMFORGE_CONFIG was an IsADirectoryError traceback.
    line = one_line(cli(sys.executable, "-m", "rocmforge", "doctor", ROCMFORGE_CONFIG=str(tmp_path)))
    assert line == (
        f"rocmforge doctor: error: {tmp_path}: cannot read the config file (Is a directory); "
        "point ROCMFORGE_CONFIG at a TOML file"
    )
    # A byte-order mark (Windows editors) made valid TOML "not valid TOML" at line 1, column 1.
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert load_config(path, environ={}).build.arch == ("gfx90a", "gfx942", "gfx950")


@pytest.mark.parametrize("value", ["nan", "inf", "-1.5"])
def test_gb_per_job_must_be_a_finite_positive_number(tmp_path, value):
    # nan was a ValueError traceback from the job count; inf silently gave MAX_JOBS=1.
    text = GOOD.replace("gb_per_job = 4.0", f"gb_per_job = {value}")
    line = one_line(
        cli(sys.executable, "-m", "rocmforge", "env", "pytorch", config_text=text, tmp_path=tmp_path)
    )
    assert line == (
        "rocmforge env: error: packages.pytorch.gb_per_job: must be a positive number "
        "(GB of RAM one compile job needs)"
    )


@pytest.mark.parametrize("value", ["²", "0", " 8", "８"])
def test_max_jobs_takes_ascii_digits_only(value):
    # '²' passed str.isdigit() and crashed int(); '８' (fullwidth) is not what make -j reads either.
    with pytest.raises(UserError, match=r"^MAX_JOBS: .* is not a positive integer"):
        config({"MAX_JOBS": value})


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('sha256 = "f4c33c', 'sha256 = "\\nf4c33c', "packages.vllm.source.sha256: "),
        ('74112"', '74112\\n"', "packages.vllm.source.sha256: "),
        ('b77"', 'b77\\n"', "packages.vllm.patches[0].sha256: "),
        ('opt_level = "O3"', 'opt_level = "O3\\n"', "build.opt_level: "),
        ("[packages.triton]", '[packages."triton\\n"]', "packages.triton\n: package names"),
    ],
)
def test_trailing_newline_is_not_a_valid_value(tmp_path, old, new, message):
    # The patterns ended in "$", which also matches before a final newline: "<sha256>\n" passed.
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(UserError, match="^" + re.escape(message)):
        load_config(path, environ={})


def test_rocm_version_must_be_a_version(tmp_path):
    # The doctor built a specifier ">=seven" from it and died with InvalidSpecifier.
    text = GOOD.replace('rocm_version = "7.2"', 'rocm_version = "seven"')
    line = one_line(cli(sys.executable, "-m", "rocmforge", "doctor", config_text=text, tmp_path=tmp_path))
    assert line == "rocmforge doctor: error: toolchain.rocm_version: 'seven' is not a version such as '7.2'"


@pytest.mark.parametrize(
    ("value", "hint"), [("sm_90", "write 9.0"), ("sm_90a", "write 9.0a"), ("hopper", "e.g. 9.0")]
)
def test_cuda_arch_entries_are_torch_cuda_arch_list_entries(tmp_path, value, hint):
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace('cuda_arch = ["9.0"]', f'cuda_arch = ["8.6+PTX", "{value}"]', 1))
    with pytest.raises(
        UserError,
        match=rf"^build\.cuda_arch\[1\]: '{value}' is not a TORCH_CUDA_ARCH_LIST entry; .*{re.escape(hint)}",
    ):
        load_config(path, environ={})


def test_requirement_names_a_tool_the_doctor_can_check(tmp_path):
    # `gccc` used to pass, and the doctor then advised "install gccc".
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace('tool = "gcc"', 'tool = "gccc"', 1))
    with pytest.raises(
        UserError,
        match=r"^packages\.pytorch\.requires\[0\]\.tool: the doctor cannot check 'gccc'; "
        r"did you mean 'gcc'\?$",
    ):
        load_config(path, environ={})


@pytest.mark.parametrize("label", ["rocm 7.2", "rocm7.2!", "", "+rocm7.2"])
def test_local_version_must_be_a_pep440_label(tmp_path, label):
    # It was taken as is and the build died afterwards with InvalidWheelFilename (a traceback).
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace('local_version = "rocm7.2"', f'local_version = "{label}"'))
    with pytest.raises(UserError, match=r"^packages\.pytorch\.local_version: .* is not a PEP 440 local"):
        load_config(path, environ={})


def test_prebuilt_requirement_must_parse(tmp_path):
    # It went to pip unchecked, so the mistake surfaced only when the session ran.
    source = GOOD[GOOD.index("[packages.vllm.source]") : GOOD.index("# Our patches")]
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace(source, '[packages.vllm.prebuilt]\nrequirement = "vllm >>> 0.33"\n\n'))
    with pytest.raises(UserError, match=r"^packages\.vllm\.prebuilt\.requirement: 'vllm >>> 0.33' is not a"):
        load_config(path, environ={})


def test_env_keys_must_be_variable_names(tmp_path):
    # "A B" was accepted and `env --shell` printed `export A B=z`.
    vllm = "gb_per_job = 3.0\n\n[packages.vllm.source]"
    text = GOOD.replace(vllm, vllm.replace("\n\n", '\nenv = {"A B" = "z"}\n\n', 1))
    line = one_line(
        cli(sys.executable, "-m", "rocmforge", "env", "vllm", "--shell", config_text=text, tmp_path=tmp_path)
    )
    assert line == (
        "rocmforge env: error: packages.vllm.env.A B: not an environment variable name (letters, digits, _)"
    )


@pytest.mark.parametrize("key", ["work_dir", "wheelhouse", "logs_dir", "third_party"])
def test_build_directories_must_not_be_empty(key):
    # "" resolved to the checkout root itself: a package named "docs" would have replaced docs/.
    with pytest.raises(UserError, match=rf'^build\.{key}: empty; name a directory such as "'):
        config(**{key: " "})


def test_url_source_needs_a_url_urllib_can_fetch(tmp_path):
    # "notaurl" passed and `checkout` died with urllib's ValueError traceback.
    src = '[packages.extra.source]\nkind = "url"\nurl = "notaurl"\nsha256 = "' + "a" * 64 + '"\n'
    path = tmp_path / "c.toml"
    path.write_text(GOOD + "\n[packages.extra]\n" + src)
    with pytest.raises(
        UserError, match=r"^packages\.extra\.source\.url: 'notaurl' is not an http\(s\):// or file://"
    ):
        load_config(path, environ={})
    path.write_text(
        GOOD + "\n[packages.extra]\n" + src.replace("notaurl", "https://example.org/x-1.0.tar.gz")
    )
    assert load_config(path, environ={}).package("extra").source.url == "https://example.org/x-1.0.tar.gz"


@pytest.mark.parametrize("value", ["../..", "/etc", "python/../../x"])
def test_subdir_and_patch_workdir_stay_inside_the_tree(tmp_path, value):
    # Accepted before: the build (subdir) or `git apply` (workdir) then ran outside the checkout.
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace("submodules = false", f'submodules = false\nsubdir = "{value}"'))
    with pytest.raises(
        UserError, match=r"^packages\.triton\.source\.subdir: .* must be a relative path inside"
    ):
        load_config(path, environ={})
    path.write_text(GOOD.replace('versions = "==0.33.*"', f'versions = "==0.33.*"\nworkdir = "{value}"'))
    if value.startswith("/"):  # patches.py strips a workdir's slashes: "/etc" is the submodule etc/
        assert load_config(path, environ={}).package("vllm").patches[0].workdir == value
        return
    with pytest.raises(
        UserError, match=r"^packages\.vllm\.patches\[0\]\.workdir: .* must be a relative path"
    ):
        load_config(path, environ={})


def test_a_file_where_a_build_directory_goes(tmp_path):
    # `checkout` died with NotADirectoryError from mkdir under ROCMFORGE_CACHE=/etc/passwd.
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(UserError, match=rf"^ROCMFORGE_CACHE: {blocker} is a file, not a directory; point it"):
        config({"ROCMFORGE_CACHE": str(blocker)})
    with pytest.raises(UserError, match=rf"^build\.wheelhouse: {blocker} is a file, not a directory"):
        config(wheelhouse=str(blocker))
