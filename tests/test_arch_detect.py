"""GPU arch detection on real tool output collected from public issue trackers.

Each file under tests/data/arch/ starts with a ``SOURCE:`` line naming the issue it came from.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import fakehost
import pytest

from rocmforge.arch import arch_from_gfx_target_version, parse_arch_list
from rocmforge.arch_detect import detect_local, parse_text, read_kfd_topology
from rocmforge.errors import UserError

DATA = Path(__file__).parent / "data" / "arch"
ROOT = Path(__file__).resolve().parent.parent

MI300X = "AMD Instinct MI300X"
# file -> (format, [(arch, target_id, name), ...]) in the order the text shows the GPUs.
CASES = {
    "rocminfo_mi300x.txt": ("rocminfo", [("gfx942", None, MI300X)]),
    "rocminfo_mi300x_isa.txt": ("rocminfo", [("gfx942", "gfx942:sramecc+:xnack-", None)]),
    "kfd_properties_grep_mi300x.txt": ("kfd", [("gfx942", None, None)]),
    "rocmsmi_concise_mi300x_multi.txt": ("rocm-smi", [("gfx942", None, None)] * 5),
    "rocminfo_mi250x.txt": ("rocminfo", [("gfx90a", None, "AMD Instinct MI250X/MI250")]),
    "rocminfo_mi210_isa.txt": ("rocminfo", [("gfx90a", "gfx90a:sramecc+:xnack-", None)]),
    "rocminfo_grep_xnack_mi210.txt": ("rocminfo", [("gfx90a", "gfx90a:sramecc+:xnack-", None)]),
    "amdsmi_static_mi210.txt": ("amd-smi", [("gfx90a", None, "AMD Instinct MI210")]),
    "amdsmi_static_mi350x.txt": ("amd-smi", [("gfx950", None, "AMD Instinct MI350X")]),
    "torch_props_mi355x.txt": ("torch", [("gfx950", "gfx950:sramecc+:xnack-", "AMD Instinct MI355X")]),
    "rocminfo_rx7900xtx_agent3.txt": ("rocminfo", [("gfx1100", None, "Radeon RX 7900 XTX")]),
    "rocminfo_rx7900xtx_padded.txt": ("rocminfo", [("gfx1100", None, "Radeon RX 7900 XTX")]),
    "amdsmi_static_rx7800xt.json.txt": ("amd-smi", [("gfx1101", None, "AMD Radeon RX 7800 XT")]),
    "rocmsmi_productname_csv_mi100x2.txt": (
        "rocm-smi",
        [("gfx908", None, "Arcturus GL-XL [AMD Instinct MI100]")] * 2,
    ),
    "rocmsmi_productname_mi100.txt": ("rocm-smi", [("gfx908", None, None)]),
    "rocminfo_cpu_only.txt": ("rocminfo", []),
    # Digit-wise names from gfx_target_version (rocm-smi of ROCm 6.1, amd-smi before 6.3.2).
    "rocmsmi_all_phoenix_gfx11003.txt": ("rocm-smi", [("gfx1103", None, "Phoenix1")]),
    "amdsmi_grep_mi100_gfx9008.txt": ("amd-smi", [("gfx908", None, None)] * 2),
}


def test_every_fixture_has_a_case_and_a_source():
    files = sorted(p.name for p in DATA.glob("*.txt"))
    assert files == sorted(CASES)
    for name in files:
        first = (DATA / name).read_text().splitlines()[0]
        assert re.fullmatch(r"SOURCE: https://github\.com/\S+/((issues|pull)/\d+|blob/\S+)", first), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_outputs(name):
    fmt, expected = CASES[name]
    found_fmt, gpus = parse_text((DATA / name).read_text())
    assert found_fmt == fmt
    assert [(g.arch, g.target_id, g.name) for g in gpus] == expected


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if "csv" not in n])
def test_pastes_with_lost_newlines_read_the_same(name):
    text = (DATA / name).read_text()
    flat = " ".join(text.split())
    assert "\n" not in flat
    assert parse_text(flat)[1] == parse_text(text)[1]


def test_grep_cut_summary_of_several_gpus():
    # What `rocminfo | grep -E 'gfx|Marketing'` leaves of a multi-GPU MI300X paste, built from
    # the real agent block twice: each "Name: gfx942" starts a GPU, its ISA line joins it.
    block = (DATA / "rocminfo_mi300x.txt").read_text() + (DATA / "rocminfo_mi300x_isa.txt").read_text()
    cut = "\n".join(ln for ln in (block * 2).splitlines() if re.search("gfx|Marketing", ln))
    gpus = parse_text(cut)[1]
    assert [(g.arch, g.target_id, g.name) for g in gpus] == [("gfx942", "gfx942:sramecc+:xnack-", MI300X)] * 2


def test_cpu_agent_names_never_become_gpu_names():
    text = (DATA / "rocminfo_cpu_only.txt").read_text() + (DATA / "rocminfo_rx7900xtx_agent3.txt").read_text()
    assert [(g.arch, g.name) for g in parse_text(text)[1]] == [("gfx1100", "Radeon RX 7900 XTX")]


@pytest.mark.parametrize(
    ("value", "arch"),
    [
        (90010, "gfx90a"),
        (90402, "gfx942"),
        (90500, "gfx950"),
        (110000, "gfx1100"),
        (100300, "gfx1030"),
        (0, None),
    ],
)
def test_decimal_gfx_target_version(value, arch):
    assert arch_from_gfx_target_version(value) == arch
    if arch:
        assert parse_text(f"gfx_target_version {value}")[1][0].arch == arch


@pytest.mark.parametrize(
    ("printed", "arch"),
    [
        ("gfx9008", "gfx908"),  # amd-smi < ROCm 6.3.2 on MI100 (its changelog)
        ("gfx11003", "gfx1103"),  # rocm-smi of ROCm 6.1 on a Phoenix APU
        ("gfx90010", "gfx90a"),  # the same scheme on MI210/MI250: stepping 10 in decimal
        ("gfx9010", "gfx90a"),  # the three fields joined in decimal (ollama#3809)
        ("gfx9042", "gfx942"),
        ("gfx9050", "gfx950"),
        ("gfx10030", "gfx1030"),
        ("gfx942", "gfx942"),  # a real name is never remapped
        ("gfx1010", "gfx1010"),
    ],
)
def test_digitwise_gfx_names_from_smi_tools(printed, arch):
    amdsmi = f"GPU: 0\n    ASIC:\n        TARGET_GRAPHICS_VERSION: {printed}\n"
    rocmsmi = f"GPU[0]\t\t: GFX Version: \t\t{printed}\n"
    assert [g.arch for g in parse_text(amdsmi)[1]] == [arch]
    assert [g.arch for g in parse_text(rocmsmi)[1]] == [arch]


def test_kfd_sysfs_with_cpu_first_an_igpu_and_discrete_gpus(tmp_path):
    fakehost.kfd(
        tmp_path,
        [(0, None), (100306, "AMD Radeon Graphics"), (110000, "AMD Radeon RX 7900 XTX"), (110000, None)],
    )
    gpus = read_kfd_topology(tmp_path)
    assert [(g.arch, g.name) for g in gpus] == [
        ("gfx1036", "AMD Radeon Graphics"),
        ("gfx1100", "AMD Radeon RX 7900 XTX"),
        ("gfx1100", None),
    ]
    assert detect_local(root=tmp_path, environ={"PATH": ""}) == (gpus, [])


def test_no_kfd_and_no_tools_says_why(tmp_path):
    gpus, notes = detect_local(root=tmp_path, environ={"PATH": str(tmp_path)})
    assert gpus == []
    assert "no KFD topology" in notes[0]


def run_cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "rocmforge", "arch", *args], capture_output=True, text=True, cwd=ROOT, **kw
    )


def test_cli_json_contract_and_exit_codes(tmp_path):
    proc = run_cli(
        str(DATA / "rocmsmi_productname_csv_mi100x2.txt"), str(DATA / "rocminfo_mi300x.txt"), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["archs"] == ["gfx908", "gfx942"]
    assert [g["arch"] for g in doc["gpus"]] == ["gfx908", "gfx908", "gfx942"]
    assert set(doc["gpus"][2]) == {"arch", "target_id", "name"}

    none = run_cli(str(DATA / "rocminfo_cpu_only.txt"), "--json")
    assert none.returncode == 1
    assert json.loads(none.stdout) == {"gpus": [], "archs": []}
    assert "no GPU found" in none.stderr

    missing = run_cli(str(tmp_path / "nope.txt"))
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x7fELF\0\0\0")
    unreadable = run_cli(str(binary))
    for proc in (missing, unreadable):
        assert proc.returncode == 2
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1

    stdin = run_cli("-", input=(DATA / "amdsmi_static_mi350x.txt").read_text())
    assert stdin.returncode == 0
    assert "export PYTORCH_ROCM_ARCH=gfx950" in stdin.stdout.splitlines()


def test_several_archs_are_printed_quoted_for_a_shell(tmp_path):
    # Unquoted, `PYTORCH_ROCM_ARCH=gfx908;gfx942` pasted into bash sets gfx908 only and runs
    # `gfx942` as a command; the printed line must survive a real shell unchanged.
    proc = run_cli(str(DATA / "rocmsmi_productname_csv_mi100x2.txt"), str(DATA / "rocminfo_mi300x.txt"))
    line = proc.stdout.splitlines()[-1]
    assert line == "export PYTORCH_ROCM_ARCH='gfx908;gfx942'"
    shell = subprocess.run(
        ["bash", "-c", f"{line}\nbash -c 'printf %s \"$PYTORCH_ROCM_ARCH\"'"], capture_output=True, text=True
    )
    assert (shell.returncode, shell.stdout, shell.stderr) == (0, "gfx908;gfx942", "")


def test_user_given_arch_names_are_validated():
    with pytest.raises(UserError, match="did you mean gfx942"):
        parse_arch_list("gfx9420", key="PYTORCH_ROCM_ARCH")
    assert parse_arch_list("gfx90a;gfx942:sramecc+:xnack-", key="k") == ("gfx90a", "gfx942:sramecc+:xnack-")


def test_unknown_arch_in_saved_text_is_flagged_not_recommended():
    # "Name: gfx9420" (a typo, or a GPU newer than our table) was printed as PYTORCH_ROCM_ARCH=gfx9420,
    # a value the config then refuses.
    proc = run_cli("-", input="  Name:                    gfx9420\n  Name:                    gfx942\n")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[-1] == "export PYTORCH_ROCM_ARCH=gfx942"
    assert (
        "rocmforge arch: gfx9420 is not a GPU arch rocmforge knows (a typo in the text, or a GPU newer "
        "than rocmforge/arch.py); left out of PYTORCH_ROCM_ARCH"
    ) in proc.stderr
