"""bench without a GPU: statistics, figures against peaks, A/B ratios, the report, the worker
protocol and the no-GPU exit, fed with the timings recorded on an H200 (docs/bench/)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from rocmforge.bench import report as bench_report
from rocmforge.bench import runner as bench
from rocmforge.bench.peaks import PEAKS, lookup
from rocmforge.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "docs" / "bench" / "h200.json"
RECORDED_AB = ROOT / "docs" / "bench" / "h200-cublaslt-ab.json"


def _recorded(path: Path = RECORDED) -> dict:
    return json.loads(path.read_text())


# --- peaks -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_name", "model"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI325X", "MI325X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("AMD Instinct MI250X/MI250", "MI250X"),
        ("AMD Instinct MI210", "MI210"),
        ("AMD Instinct MI300A", None),
        ("NVIDIA A100-SXM4-80GB", None),
    ],
)
def test_peak_lookup_by_torch_device_name(device_name, model):
    peak = lookup(device_name)
    assert (peak.model if peak else None) == model


def test_every_peak_row_is_sourced_dense_and_complete():
    required = {"MI210", "MI250X", "MI300X", "MI325X", "MI355X", "H100", "H200"}
    assert required <= {p.model for p in PEAKS}
    for peak in PEAKS:
        vendor_site = {"AMD": "https://www.amd.com/", "NVIDIA": "https://www.nvidia.com/"}[peak.vendor]
        assert peak.source.startswith(vendor_site), peak
        assert {"bf16", "fp16"} <= set(peak.tflops) and peak.mem_tbps > 0
        # fp8 matrix units: every Hopper and gfx942/gfx950 part, none on gfx90a (MI210/MI250X).
        assert ("fp8" in peak.tflops) == (peak.model not in ("MI210", "MI250X")), peak
        if "fp8" in peak.tflops:
            assert peak.tflops["fp8"] == pytest.approx(2 * peak.tflops["bf16"], rel=1e-3)


# --- statistics and figures --------------------------------------------------------------------


def test_summarize_median_resists_an_outlier():
    stats = bench_report.summarize([1.0, 1.1, 0.9, 1.0, 50.0])
    assert stats["median_ms"] == 1.0
    assert stats["min_ms"] == 0.9 and stats["max_ms"] == 50.0 and stats["n"] == 5
    assert stats["min_ms"] <= stats["p10_ms"] <= stats["median_ms"] <= stats["p90_ms"] <= stats["max_ms"]
    assert bench_report.summarize([2.0])["p90_ms"] == 2.0
    with pytest.raises(ValueError):
        bench_report.summarize([])


def test_figures_of_a_compute_bound_gemm_against_the_h200():
    case = bench.gemm_case("bf16", 8192, 8192, 8192, "square")
    peak = lookup("NVIDIA H200")
    f = bench_report.figures(case, 1.5, peak)
    flops = 2 * 8192**3
    assert f["tflops"] == pytest.approx(flops / 1.5e-3 / 1e12)
    assert f["pct_peak_tflops"] == pytest.approx(100 * f["tflops"] / peak.tflops["bf16"])
    # Compute binds: the roofline share is the compute share.
    assert f["roofline_pct"] == pytest.approx(f["pct_peak_tflops"])


def test_figures_of_a_decode_gemm_are_bound_by_bandwidth():
    case = bench.gemm_case("fp8", 16, 8192, 28672, "decode")
    peak = lookup("AMD Instinct MI300X")
    f = bench_report.figures(case, 0.05, peak)
    moved = (16 * 28672 + 8192 * 28672) * 1 + 16 * 8192 * 2  # fp8 operands, bf16 result
    assert f["gbps"] == pytest.approx(moved / 0.05e-3 / 1e9)
    assert f["roofline_pct"] == pytest.approx(f["pct_peak_bw"])
    assert f["pct_peak_tflops"] < f["pct_peak_bw"]


def test_figures_without_a_peak_or_without_that_dtype():
    case = bench.gemm_case("fp8", 4096, 4096, 4096, "x")
    assert set(bench_report.figures(case, 1.0, None)) == {"gbps", "tflops"}
    no_fp8 = bench_report.figures(case, 1.0, lookup("AMD Instinct MI210"))
    assert "pct_peak_tflops" not in no_fp8 and "roofline_pct" not in no_fp8
    copy = bench_report.figures({"kind": "copy", "bytes": 2**30}, 0.5, lookup("NVIDIA H200"))
    assert "tflops" not in copy and copy["roofline_pct"] == pytest.approx(copy["pct_peak_bw"])


def test_ab_ratio_from_interleaved_rounds():
    a = [[1.0, 1.0], [1.1, 1.1], [0.9, 0.9]]
    b = [[2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
    ab = bench_report.ab_ratio(a, b)
    assert ab["ratio"] == pytest.approx(2.0)
    assert ab["round_min"] == pytest.approx(2.0 / 1.1) and ab["round_max"] == pytest.approx(2.0 / 0.9)
    assert ab["rounds"] == 3


def test_crosscheck_allows_five_percent():
    check = bench_report.crosscheck(1.0, {"do_bench": 1.04, "benchmark": 0.94, "other": "skipped: no triton"})
    assert check["timers"]["do_bench"]["ok"] is True
    assert check["timers"]["benchmark"]["ok"] is False
    assert check["timers"]["other"] == {"skipped": "skipped: no triton"}


def test_clock_summary():
    samples = bench.parse_nvidia_smi(
        "2026/11/30 08:27:01.100, 0, NVIDIA H200, 1980, 3201, 1980, 3201, 120.5, 700.00, 40, P0\n"
        "2026/11/30 08:27:01.350, 0, NVIDIA H200, 1740, 3201, 1980, 3201, 690.1, 700.00, 55, P0\n"
        "2026/11/30 08:27:01.600, 0, NVIDIA H200, 1275, 3201, 1980, 3201, 705.6, 700.00, 60, P0\n"
        "2026/11/30 08:27:01.850, 0, NVIDIA H2"  # cut off when the sampling loop was stopped
    )
    assert len(samples) == 3 and samples[0]["name"] == "NVIDIA H200" and samples[2]["pstate"] == "P0"
    summary = bench_report.clock_summary(samples)
    assert summary["samples"] == 3
    assert summary["sm_mhz"] == {"min": 1275.0, "median": 1740.0, "max": 1980.0}
    assert summary["power_w"]["max"] == 705.6


def test_query_clocks_without_vendor_tools_says_so():
    snapshot = bench.query_clocks("start", which=lambda name: None)
    assert "neither nvidia-smi nor rocm-smi" in snapshot["note"]


# --- the report, from timings recorded on an H200 ---------------------------------------------


@pytest.mark.parametrize("path", [RECORDED, RECORDED_AB], ids=["h200", "h200-cublaslt-ab"])
def test_recorded_h200_report_recomputes_from_its_raw_timings(path):
    report = _recorded(path)
    peak = lookup(report["gpu"]["name"])
    assert peak is not None and report["peak"] == peak.to_json()
    for recorded in report["results"]:
        by_env = {
            label: {"rounds": env["rounds_ms"], "check": env["check"]}
            for label, env in recorded["envs"].items()
        }
        assert bench_report.case_result(recorded["case"], by_env, peak) == recorded
    assert bench_report.triton_vs_torch(report["results"]) == report["triton_vs_torch"]
    assert bench_report.failures(report) == []


def test_recorded_crosscheck_and_clock_notes():
    report = _recorded()
    square = next(r for r in report["results"] if r["id"] == report["crosscheck"]["case"])
    median = square["envs"]["A"]["stats"]["median_ms"]
    assert report["crosscheck"]["event_median_ms"] == median
    for row in report["crosscheck"]["timers"].values():
        assert abs(row["median_ms"] / median - 1) <= 0.05
    during = next(c for c in report["clocks"] if c["when"] == "during timing")
    assert during["summary"]["samples"] == len(during["gpus"]) > 0


def test_recorded_ab_run_names_the_setting_that_differs():
    report = _recorded(RECORDED_AB)
    assert report["envs"]["B"]["overrides"] == {"TORCH_BLAS_PREFER_CUBLASLT": "1"}
    assert (report["envs"]["A"]["blas"], report["envs"]["B"]["blas"]) == (
        "_BlasBackend.Cublas",
        "_BlasBackend.Cublaslt",
    )
    assert all(result["ab"]["rounds"] == report["settings"]["rounds"] for result in report["results"])


def test_failures_name_errors_wrong_results_and_a_missed_crosscheck():
    report = _recorded()
    broken = json.loads(json.dumps(report))
    broken["results"][0]["envs"]["B"] = {"error": "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED"}
    broken["results"][1]["envs"]["A"]["check_ok"] = bench_report.check_ok({"rel_err": 0.7})
    broken["crosscheck"]["timers"]["torch.utils.benchmark"].update(ok=False, deviation_pct=9.0)
    broken["vllm"]["envs"]["A"] = {"error": "the vllm run exited with code 1"}
    found = bench_report.failures(broken)
    assert len(found) == 4
    assert "CUBLAS_STATUS_NOT_SUPPORTED" in found[0] and "wrong result" in found[1]
    assert "+9.0%" in found[2] and "vllm in A" in found[3]


def test_summary_prints_one_row_per_case_environment_and_ratio():
    report = _recorded()
    out = io.StringIO()
    bench_report.print_summary(report, Console(file=out, width=80))
    text = out.getvalue()
    cases = len(report["results"])
    assert text.count("│ A/B ") == cases and text.count("│ A   ") == cases
    assert "cross-check gemm-torch-bf16-8192x8192x8192" in text
    assert "vllm in A: vllm is not installed" in text
    assert "during timing" in text


def test_plot_is_a_png():
    pytest.importorskip("matplotlib")
    png = bench_report.plot(_recorded())
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_vllm_result_throughput_and_ratio():
    run = {"prompt_tokens": 1000, "generated_tokens": 1000}
    result = bench_report.vllm_result(
        {"A": [{**run, "seconds": [1.0, 1.2, 1.0]}], "B": [{**run, "seconds": [2.0, 2.0, 2.4]}]}
    )
    assert result["envs"]["A"]["tokens_per_s"] == pytest.approx(2000.0)
    assert result["envs"]["A"]["output_tokens_per_s"] == pytest.approx(1000.0)
    assert result["ab"]["ratio"] == pytest.approx(2.0)
    skipped = bench_report.vllm_result({"A": {"skipped": "vllm is not installed in /usr/bin/python3"}})
    assert "ab" not in skipped and skipped["envs"]["A"]["skipped"].startswith("vllm is not installed")


# --- the plan ---------------------------------------------------------------------------------


def test_full_plan_covers_dtypes_shapes_bandwidth_and_triton():
    cases, skipped = bench.plan(list(bench.SECTIONS), quick=False, fp8_dtype="float8_e4m3fnuz", arch="gfx942")
    assert skipped == []
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids))
    gemms = [c for c in cases if c["kind"] == "gemm" and c["backend"] == "torch"]
    assert len(gemms) == 3 * (1 + 2 * len(bench.PROJECTIONS))
    assert {c["m"] for c in gemms} == {bench.DECODE_M, bench.PREFILL_M, bench.SQUARE}
    assert {c["fp8_dtype"] for c in gemms if c["dtype"] == "fp8"} == {"float8_e4m3fnuz"}
    assert [c["kind"] for c in cases].count("copy") == 1
    triton = [c for c in cases if c.get("backend") == "triton"]
    assert triton and all(bench.gemm_case("bf16", c["m"], c["n"], c["k"], "")["id"] in ids for c in triton)


def test_plan_without_fp8_says_why_and_triton_alone_brings_its_torch_baseline():
    cases, skipped = bench.plan(["gemm"], quick=False, fp8_dtype=None, arch="gfx90a:sramecc+:xnack-")
    assert skipped == [{"what": "gemm fp8", "why": "gfx90a:sramecc+:xnack- has no fp8 matrix instructions"}]
    assert {c["dtype"] for c in cases} == {"bf16", "fp16"}
    cases, _ = bench.plan(["triton"], quick=True, fp8_dtype=None, arch="sm_80")
    assert sorted(c["backend"] for c in cases) == ["torch"] * 3 + ["triton"] * 3


# --- environments, worker and exits -------------------------------------------------------------


def test_gpu_device_nodes(tmp_path):
    assert bench.gpu_device_nodes(tmp_path) == []
    for name in ("kfd", "nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert bench.gpu_device_nodes(tmp_path) == ["kfd", "nvidia0", "nvidia1"]


def test_env_assignments():
    assert bench.parse_env_assignments(["A=1", "B=x=y"], "--env") == (("A", "1"), ("B", "x=y"))
    with pytest.raises(UserError, match="--b-env 'NOVALUE': expected KEY=VALUE"):
        bench.parse_env_assignments(["NOVALUE"], "--b-env")


def test_only_names_known_sections():
    assert bench._sections("gemm, triton") == ["gemm", "triton"]
    with pytest.raises(UserError, match="--only 'gemm,fp4': choose from gemm,bandwidth,triton,vllm"):
        bench._sections("gemm,fp4")


def test_worker_protocol_in_an_environment_without_torch(tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("this interpreter has torch; the probe would find it")
    worker = bench.Worker(bench.Env("A", sys.executable, (("ROCMFORGE_BENCH_TEST", "1"),)), tmp_path)
    try:
        probe = worker.request(op="probe")
        answer = worker.request(op="time", case={"id": "x", "kind": "copy", "bytes": 4}, reps=1)
    finally:
        worker.close()
    assert probe["torch"] is None and probe["python"] == sys.executable
    assert probe["error"].startswith("cannot import torch")
    assert answer == {"error": "ModuleNotFoundError: No module named 'torch'"}
    assert "Traceback" in (tmp_path / "worker-A.log").read_text()  # the detail goes to the log
    with pytest.raises(UserError, match="cannot import torch"):
        bench._require_gpu(worker.env, probe)


def test_worker_with_a_missing_interpreter(tmp_path):
    with pytest.raises(UserError, match="cannot start /nonexistent/python"):
        bench.Worker(bench.Env("B", "/nonexistent/python"), tmp_path)


def test_torch_that_sees_no_gpu_exits_with_the_no_gpu_code():
    probe = {"torch": "2.11.0+cpu", "hip": None, "cuda": None, "gpu": None}
    with pytest.raises(UserError, match=r"no GPU: torch 2\.11\.0\+cpu") as exc:
        bench._require_gpu(bench.Env("A", "/venv/bin/python"), probe)
    assert exc.value.exit_code == bench.NO_GPU == 3


@pytest.mark.skipif(bool(bench.gpu_device_nodes()), reason="this host has a GPU device node")
def test_no_gpu_host_says_so_in_one_line_and_exits_3(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rocmforge.bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [
        "rocmforge bench: error: no GPU: this host has no /dev/kfd and no /dev/nvidia* device"
    ]
    assert proc.stdout == ""


# --- the shipped tiny model ---------------------------------------------------------------------


def test_tiny_model_config_and_tokenizer_agree():
    model = bench.TINY_MODEL
    config = json.loads((model / "config.json").read_text())
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    vocab = tokenizer["model"]["vocab"]
    # Byte-level: one token per byte, id = byte value, each a distinct single character.
    assert sorted(vocab.values()) == list(range(256)) and all(len(t) == 1 for t in vocab)
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert specials["<|begin_of_text|>"] == config["bos_token_id"] == 256
    assert specials["<|end_of_text|>"] == config["eos_token_id"] == 257
    # Dummy weights sample any id: every id below vocab_size must decode to some token.
    assert sorted([*vocab.values(), *specials.values()]) == list(range(config["vocab_size"]))


@pytest.mark.skipif(bool(bench.gpu_device_nodes()), reason="this host has a GPU device node")
def test_nox_bench_session_on_a_host_without_gpu_exits_3(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "nox", "-s", "bench", "--envdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    ours = [line for line in proc.stderr.splitlines() if not line.startswith("nox >")]
    assert ours == [f"rocmforge bench: {bench.NO_GPU_NODE}"]
