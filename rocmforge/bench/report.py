"""Turn raw bench timings into figures: statistics, rates against the device's peak, A/B ratios.

Everything here is pure: it takes per-call times (ms) as recorded by ``worker`` and the
peak row of ``peaks``, so it is tested with recorded timings on machines without a GPU.
The one exception is ``plot``, which needs matplotlib.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rocmforge.bench.peaks import Peak

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
CROSSCHECK_TOLERANCE = 0.05
# Relative error of a GEMM against float32 arithmetic on the same operands: bf16/fp16/fp8
# outputs round to about 1e-3 (METHOD: bf16 between 1e-3 and 1e-2); a wrong kernel is near 1.
MAX_REL_ERR = 2e-2


def summarize(times_ms: Sequence[float]) -> dict:
    """Median and spread of per-call times: the median resists the odd slow call (a clock dip,
    another process), p10/p90 show how wide the rest is."""
    if not times_ms:
        raise ValueError("no timings to summarize")
    ordered = sorted(times_ms)
    if len(ordered) == 1:
        p10 = p90 = ordered[0]
    else:
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        p10, p90 = deciles[0], deciles[-1]
    return {
        "n": len(ordered),
        "median_ms": statistics.median(ordered),
        "p10_ms": p10,
        "p90_ms": p90,
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
    }


def work(case: dict) -> dict:
    """Floating-point operations and the fewest bytes the case must move through device memory."""
    if case["kind"] == "gemm":
        m, n, k = case["m"], case["n"], case["k"]
        size = DTYPE_BYTES[case["dtype"]]
        out_size = 2  # bf16/fp16 results; fp8 products are written as bf16
        return {"flops": 2 * m * n * k, "bytes": (m * k + n * k) * size + m * n * out_size}
    if case["kind"] == "copy":
        return {"flops": 0, "bytes": 2 * case["bytes"]}  # every byte read once and written once
    raise ValueError(f"unknown case kind {case['kind']!r}")


def figures(case: dict, median_ms: float, peak: Peak | None) -> dict:
    """Rates at the median time and, where the device's peak is known, the share of it.

    ``roofline_pct`` is the time the hardware needs at its peaks (the larger of arithmetic over
    peak FLOP/s and bytes over peak bandwidth) as a share of the measured time: 100 means the
    case runs at the limit that binds it, whether that is arithmetic (prefill) or memory (decode).
    """
    w = work(case)
    seconds = median_ms / 1e3
    out: dict = {"gbps": w["bytes"] / seconds / 1e9}
    if w["flops"]:
        out["tflops"] = w["flops"] / seconds / 1e12
    if peak is None:
        return out
    floor = w["bytes"] / (peak.mem_tbps * 1e12)
    out["pct_peak_bw"] = 100 * out["gbps"] / (peak.mem_tbps * 1e3)
    if w["flops"]:
        peak_tflops = peak.tflops.get(case["dtype"])
        if peak_tflops is None:
            return out
        out["pct_peak_tflops"] = 100 * out["tflops"] / peak_tflops
        floor = max(floor, w["flops"] / (peak_tflops * 1e12))
    out["roofline_pct"] = 100 * floor / seconds
    return out


def clock_summary(samples: list[dict]) -> dict:
    """Minimum, median and maximum of SM clock (MHz), power (W) and temperature (C) over samples."""
    summary = {}
    for field, name in (("clocks.sm", "sm_mhz"), ("power.draw", "power_w"), ("temperature.gpu", "temp_c")):
        values = sorted(s[field] for s in samples if isinstance(s.get(field), (int, float)))
        if values:
            summary[name] = {"min": values[0], "median": statistics.median(values), "max": values[-1]}
    return {"samples": len(samples), **summary}


def ab_ratio(rounds_a: Sequence[Sequence[float]], rounds_b: Sequence[Sequence[float]]) -> dict:
    """How much faster A runs than B (>1: A faster), from interleaved rounds of both.

    ``ratio`` compares the medians of all calls; ``round_min``/``round_max`` are the extremes of
    the same ratio taken round by round, so a ratio whose round range straddles 1 is noise.
    """
    a_all = [t for r in rounds_a for t in r]
    b_all = [t for r in rounds_b for t in r]
    per_round = [statistics.median(b) / statistics.median(a) for a, b in zip(rounds_a, rounds_b, strict=True)]
    return {
        "ratio": statistics.median(b_all) / statistics.median(a_all),
        "round_min": min(per_round),
        "round_max": max(per_round),
        "rounds": len(per_round),
    }


def crosscheck(event_median_ms: float, independent: dict) -> dict:
    """Compare the bench's own median with other timers' medians of the same call (5% allowed)."""
    rows = {}
    for timer, value in independent.items():
        if not isinstance(value, (int, float)):
            rows[timer] = {"skipped": str(value)}
            continue
        deviation = value / event_median_ms - 1
        rows[timer] = {
            "median_ms": value,
            "deviation_pct": 100 * deviation,
            "ok": abs(deviation) <= CROSSCHECK_TOLERANCE,
        }
    return {"event_median_ms": event_median_ms, "tolerance_pct": 100 * CROSSCHECK_TOLERANCE, "timers": rows}


def check_ok(check: dict) -> bool:
    """Whether the worker's correctness check of a case passed (GEMM error, copy equality)."""
    return check.get("rel_err", 0.0) <= MAX_REL_ERR and check.get("equal", True)


def case_result(case: dict, by_env: dict[str, dict | str], peak: Peak | None) -> dict:
    """One case of the report from ``{env: {"rounds": [[ms, ...], ...], "check": {...}} or error}``:
    per environment its rounds, statistics, figures and check, and with two environments that
    both ran, the A/B ratio."""
    envs: dict = {}
    for label, got in by_env.items():
        if isinstance(got, str):
            envs[label] = {"error": got}
            continue
        stats = summarize([t for r in got["rounds"] for t in r])
        envs[label] = {
            "rounds_ms": got["rounds"],
            "stats": stats,
            "figures": figures(case, stats["median_ms"], peak),
            "check": got["check"],
            "check_ok": check_ok(got["check"]),
        }
    result = {"id": case["id"], "label": case["label"], "case": case, "work": work(case), "envs": envs}
    ran = [label for label, env in envs.items() if "error" not in env]
    if len(envs) == 2 and len(ran) == 2:
        result["ab"] = ab_ratio(envs[ran[0]]["rounds_ms"], envs[ran[1]]["rounds_ms"])
    return result


def vllm_result(runs_by_env: dict[str, list[dict] | dict]) -> dict:
    """vLLM offline throughput per environment (wall clock of whole ``generate`` calls), A/B ratio.

    ``runs_by_env`` maps each environment to its runs, or to ``{"skipped": why}`` or
    ``{"error": what}``. No percentage of peak: a tiny model's throughput is bound by
    scheduling and launches, which no datasheet rates.
    """
    envs: dict = {}
    for label, runs in runs_by_env.items():
        if isinstance(runs, dict):
            envs[label] = dict(runs)
            continue
        seconds = [s for run in runs for s in run["seconds"]]
        median_s = statistics.median(seconds)
        tokens = runs[0]["prompt_tokens"] + runs[0]["generated_tokens"]
        envs[label] = {
            "runs": runs,
            "median_s": median_s,
            "tokens_per_s": tokens / median_s,
            "output_tokens_per_s": runs[0]["generated_tokens"] / median_s,
        }
    result: dict = {"envs": envs}
    ran = [label for label, env in envs.items() if "runs" in env]
    if len(envs) == 2 and len(ran) == 2:
        result["ab"] = ab_ratio(*([run["seconds"] for run in envs[label]["runs"]] for label in ran))
    return result


def triton_vs_torch(results: list[dict]) -> list[dict]:
    """Each Triton GEMM against torch's on the same case, per environment (>1: Triton faster)."""
    torch_cases = {_shape(r["case"]): r for r in results if r["case"].get("backend") == "torch"}
    rows = []
    for r in results:
        if r["case"].get("backend") != "triton" or _shape(r["case"]) not in torch_cases:
            continue
        reference = torch_cases[_shape(r["case"])]
        for label, env in r["envs"].items():
            torch_env = reference["envs"].get(label, {})
            if "stats" not in env or "stats" not in torch_env:
                continue
            rows.append(
                {
                    "case": r["label"],
                    "env": label,
                    "triton_tflops": env["figures"]["tflops"],
                    "torch_tflops": torch_env["figures"]["tflops"],
                    "triton_over_torch": torch_env["stats"]["median_ms"] / env["stats"]["median_ms"],
                }
            )
    return rows


def _shape(case: dict) -> tuple:
    return (case["kind"], case.get("dtype"), case.get("m"), case.get("n"), case.get("k"))


def failures(report: dict) -> list[str]:
    """What went wrong: failed cases, failed correctness checks, a missed cross-check, vLLM errors."""
    found = []
    for r in report["results"]:
        for label, env in r["envs"].items():
            if "error" in env:
                found.append(f"{r['label']} in {label}: {env['error']}")
            elif not env["check_ok"]:
                found.append(f"{r['label']} in {label}: wrong result {env['check']}")
    for timer, row in report.get("crosscheck", {}).get("timers", {}).items():
        if row.get("ok") is False:
            found.append(f"cross-check: {timer} is {row['deviation_pct']:+.1f}% off the event median")
    for label, env in report.get("vllm", {}).get("envs", {}).items():
        if "error" in env:
            found.append(f"vllm in {label}: {env['error']}")
    return found


def print_summary(report: dict, console) -> None:
    """The table of all cases, then the Triton comparison, cross-check, vLLM, skips and clocks."""
    from rich.console import Console
    from rich.table import Table

    peak = report.get("peak")
    table = Table(title=f"{report['gpu']['name']} ({report['gpu']['arch']})", title_justify="left")
    for column in ("case", "env", "median ms", "TFLOP/s", "GB/s", "% peak", "% roofline"):
        table.add_column(column, justify="left" if column in ("case", "env") else "right")
    for row in table_rows(report):
        table.add_row(*row)
    # Rows stay one line each in logs and CI, where the console's width falls back to 80.
    Console(file=console.file, width=max(console.width, 150), highlight=False).print(table)
    if peak:
        console.print(f"peaks: {peak['tflops']} TFLOP/s dense, {peak['mem_tbps']} TB/s ({peak['source']})")
    for row in report.get("triton_vs_torch", []):
        console.print(
            f"triton vs torch, {row['case']} in {row['env']}: {row['triton_tflops']:.1f} vs "
            f"{row['torch_tflops']:.1f} TFLOP/s (x{row['triton_over_torch']:.3f})"
        )
    check = report.get("crosscheck")
    if check:
        for timer, row in check["timers"].items():
            verdict = row.get("skipped") or (
                f"{row['median_ms']:.4f} ms, {row['deviation_pct']:+.2f}% ({'ok' if row['ok'] else 'OFF'})"
            )
            console.print(
                f"cross-check {check['case']}: events {check['event_median_ms']:.4f} ms, {timer} {verdict}"
            )
    for label, env in report.get("vllm", {}).get("envs", {}).items():
        if "tokens_per_s" in env:
            console.print(
                f"vllm in {label}: {env['tokens_per_s']:.0f} tokens/s "
                f"({env['output_tokens_per_s']:.0f} generated tokens/s)"
            )
        else:
            console.print(f"vllm in {label}: {env.get('skipped') or env.get('error')}")
    if "ab" in report.get("vllm", {}):
        console.print(
            f"vllm A/B: x{report['vllm']['ab']['ratio']:.3f} ({_round_range(report['vllm']['ab'])})"
        )
    for skip in report.get("skipped", []):
        console.print(f"skipped {skip['what']}: {skip['why']}")
    for snapshot in report.get("clocks", []):
        if "summary" in snapshot:
            console.print(f"clocks {snapshot['when']}: {_describe_summary(snapshot['summary'])}")
            continue
        if "note" in snapshot:
            console.print(f"clocks {snapshot['when']}: {snapshot['note']}")
        for gpu in snapshot.get("gpus", [])[:1] if isinstance(snapshot.get("gpus"), list) else []:
            console.print(
                f"clocks {snapshot['when']}: SM {gpu.get('clocks.sm')} of {gpu.get('clocks.max.sm')} MHz, "
                f"memory {gpu.get('clocks.mem')} MHz, {gpu.get('power.draw')} W, "
                f"{gpu.get('temperature.gpu')} C"
            )


def table_rows(report: dict) -> list[tuple[str, ...]]:
    """The printed summary: one row per case and environment (and one per A/B ratio)."""
    rows = []
    for result in report["results"]:
        for label, env in result["envs"].items():
            if "error" in env:
                rows.append((result["label"], label, "error: " + env["error"], "", "", "", ""))
                continue
            f = env["figures"]
            rows.append(
                (
                    result["label"],
                    label,
                    f"{env['stats']['median_ms']:.4f}",
                    f"{f['tflops']:.1f}" if "tflops" in f else "",
                    f"{f['gbps']:.0f}",
                    _pct(f.get("pct_peak_tflops", f.get("pct_peak_bw"))),
                    _pct(f.get("roofline_pct")),
                )
            )
        if "ab" in result:
            ab = result["ab"]
            rows.append((result["label"], "A/B", f"x{ab['ratio']:.3f}", "", "", "", _round_range(ab)))
    return rows


def _describe_summary(summary: dict) -> str:
    parts = [f"{summary['samples']} samples"]
    for name, unit in (("sm_mhz", "MHz SM"), ("power_w", "W"), ("temp_c", "C")):
        if name in summary:
            r = summary[name]
            parts.append(f"{r['min']:.0f}/{r['median']:.0f}/{r['max']:.0f} {unit}")
    return ", ".join(parts) + " (min/median/max)"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}%"


def _round_range(ab: dict) -> str:
    return f"rounds x{ab['round_min']:.3f}..x{ab['round_max']:.3f}"


def plot(report: dict) -> bytes:
    """A PNG: share of the binding limit per case (bars, per environment), A/B ratios if any."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in report["results"] if any("error" not in e for e in r["envs"].values())]
    labels = [r["label"] for r in results]
    envs = list(report["envs"])
    has_ab = any("ab" in r for r in results)
    fig, axes = plt.subplots(
        1, 2 if has_ab else 1, figsize=(16 if has_ab else 11, 0.32 * len(labels) + 2), squeeze=False
    )
    ax = axes[0][0]
    height = 0.8 / len(envs)
    for i, label in enumerate(envs):
        values = []
        for r in results:
            f = r["envs"].get(label, {}).get("figures", {})
            values.append(f.get("roofline_pct", 0.0))
        ys = [y + i * height for y in range(len(results))]
        env = report["envs"][label]
        settings = " ".join(f"{k}={v}" for k, v in env.get("overrides", {}).items())
        bars = ax.barh(ys, values, height=height, label=f"{label}: torch {env['torch']} {settings}".rstrip())
        for bar, r in zip(bars, results, strict=True):
            f = r["envs"].get(label, {}).get("figures", {})
            text = f"{f['tflops']:.0f} TFLOP/s" if f.get("tflops", 0) >= 1 else f"{f.get('gbps', 0):.0f} GB/s"
            ax.text(bar.get_width() + 1, bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=7)
    ax.set_yticks([y + 0.4 - height / 2 for y in range(len(results))], labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(100, color="black", linewidth=0.8)
    ax.set_xlim(0, 115)
    ax.set_xlabel("% of the binding peak (datasheet FLOP/s or bandwidth, dense)")
    gpu = report["gpu"]
    peak = report.get("peak")
    ax.set_title(f"{gpu['name']} ({gpu['arch']})" + ("" if peak else " - no peak row, see bench/peaks.py"))
    ax.legend(fontsize=7, loc="lower right")
    if has_ab:
        ax = axes[0][1]
        ratios = [r["ab"]["ratio"] if "ab" in r else 1.0 for r in results]
        ax.barh(range(len(results)), [x - 1 for x in ratios], left=1, color="tab:green")
        # The round range is drawn as it is: the ratio of all calls' medians can lie outside it.
        for y, r in enumerate(results):
            if "ab" in r:
                ax.hlines(y, r["ab"]["round_min"], r["ab"]["round_max"], color="black", linewidth=1)
        ax.set_yticks(range(len(results)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.axvline(1, color="black", linewidth=0.8)
        ax.set_xlabel("A/B speed ratio (>1: A faster); whiskers: range over interleaved rounds")
        ax.set_title(
            "A: " + report["envs"][envs[0]]["label"] + "\nB: " + report["envs"][envs[1]]["label"], fontsize=8
        )
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return png.getvalue()
