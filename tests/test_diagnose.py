"""``rocmforge.diagnose.engine`` on real failures: public tracker excerpts, and failures produced here
with real tools (g++ under a memory limit, the linker, Debian's hipcc, pip's build isolation).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from rocmforge.config import parse_config
from rocmforge.diagnose import words
from rocmforge.diagnose.engine import (
    CATEGORIES,
    RETRYABLE,
    RULES,
    RULES_ONLY,
    SIGNALS,
    Diagnosis,
    Tuning,
    body,
    decide,
    diagnose_file,
    diagnose_text,
    read_chunks,
    retry_plan,
    word_features,
)
from rocmforge.errors import UserError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diagnose_eval import FIXTURES, blind_dirs, corpus, score, split

ROOT = Path(__file__).resolve().parent.parent
FRESH = FIXTURES / "fresh"
# Every real excerpt, whichever round gathered it and whichever half of the split it is in.
ALL_FIXTURES = [e.path for e in corpus()]


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a failing tool and return what a build log would hold: the command, then its output."""
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, f"{argv[0]} was expected to fail:\n{proc.stdout}{proc.stderr}"
    return " ".join(argv) + "\n" + proc.stdout + proc.stderr


def _config(tmp_path: Path, retry: list[str]):
    data = {
        "build": {"arch": ["gfx942"], "retry": retry},
        "packages": {"x": {"source": {"kind": "path", "path": "."}}},
    }
    return parse_config(data, path=tmp_path / "build_config.toml", environ={})


# --- the real fixtures ------------------------------------------------------------------------


def test_fixtures_name_their_source_and_a_known_category():
    seen = set()
    for path in ALL_FIXTURES:
        head = path.read_text().splitlines()[:2]
        assert head[0].startswith(("# source: https://", "# source: http://")), path.name  # old trackers
        category = head[1].removeprefix("# category: ")
        assert category in CATEGORIES, path.name
        assert path.name.startswith(category + "-"), path.name
        seen.add(category)
    assert seen == set(CATEGORIES), f"categories without a real excerpt: {set(CATEGORIES) - seen}"


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_rule_matches_its_example(sig):
    """Every rule in diagnose/rules.toml carries a line it must recognise, needles included."""
    assert sig.example and sig.examples[0] == sig.example, f"{sig.name}: no example"
    for example in sig.examples:  # a family signal lists the wordings of its family
        line = body(example)
        assert sig.pattern.search(line), f"{sig.name}: pattern misses {example!r}"
        # Tools word the same phenomenon in other casings ("Invalid device function").
        assert sig.pattern.search(line.swapcase()), f"{sig.name}: pattern depends on the case of {example!r}"
        assert not (sig.unless and sig.unless.search(line)), f"{sig.name}: 'unless' rejects {example!r}"
        assert any(n in example.lower() for n in sig.needles), f"{sig.name}: no needle in {example!r}"
    assert sig.family in RULES.family_names


@pytest.mark.parametrize("sig", [s for s in SIGNALS if s.name.startswith("family-")], ids=lambda s: s.name)
def test_family_signal_names_its_category_from_each_wording_alone(sig):
    # A family signal exists for wordings no specific rule knows: each of its examples, alone in
    # a log, must come out as its category.
    for example in sig.examples:
        assert diagnose_text(example + "\n").category == sig.category, example


# What the packages rocmforge builds raise themselves, as their sources word it (vLLM's
# CMakeLists.txt and platforms/rocm.py, torch's cpp_extension.py and LoadHIP.cmake, Triton's driver,
# aiter's JIT, TheRock's CMake, the HIP runtime and rocminfo, ROCm's libraries, bitsandbytes, ggml):
# the first line a user of a failed build sees, so each must name its cause alone, not by shape.
UPSTREAM_LINES = [
    (
        "RuntimeError: The current installed version of g++ (14.2.0) is greater than the maximum required"
        " version by CUDA 12.4. Please make sure to use an adequate version of g++ (>=6.0.0, <14.0).",
        "compiler_version",
    ),
    ("  GCC >= 11.3 is required to build vLLM (found 10.2.1).  PyTorch's C++20", "compiler_version"),
    ("  X86 backend requires gcc/g++ >= 12.3", "compiler_version"),
    ("ValueError: Unknown CUDA arch (12.0) or GPU not supported", "arch_unsupported"),
    ("  No supported CUDA architectures; the build would produce a binary with no", "arch_unsupported"),
    ("RuntimeError: Unsupported gfx", "arch_unsupported"),
    ("RuntimeError: amdsmi did not return valid GCN arch", "no_gpu_visible"),
    ("RuntimeError: 0 active drivers ([]). There should only be one.", "no_gpu_visible"),
    ("RuntimeError: Found no NVIDIA driver on your system.", "no_gpu_visible"),
    ("RuntimeError: No gfx arch found in rocminfo output.", "arch_not_specified"),
    (
        "RuntimeError: Get GPU arch from rocminfo failed: Command '['/opt/rocm/bin/rocminfo']' returned"
        " non-zero exit status 1.",
        "arch_not_specified",
    ),
    ("No ROCm runtime is found, using ROCM_HOME='None'", "cmake_hip_not_found"),
    ("No ROCm runtime is found, using ROCM_HOME='/opt/rocm'", "build_isolation_torch"),
    ("RuntimeError: Ninja is required to load C++ extensions (pip install ninja to get it)", "unknown"),
    # TheRock's CMake (ROCm built from source)
    ("  THEROCK_AMDGPU_FAMILIES value 'gfx1152' unknown.  Available:", "arch_unsupported"),
    ("  No AMDGPU target selected: make a selection via THEROCK_AMDGPU_FAMILIES or", "arch_not_specified"),
    ("  Detected MSVC_VERSION is too old and may encounter OpenMP linker errors.", "compiler_version"),
    # the HIP runtime's own error strings (ROCm/clr's hip_error.cpp), rocminfo, torch's LoadHIP.cmake
    ("RuntimeError: HIP error: invalid device function", "arch_mismatch"),
    ("RuntimeError: HIP error: no kernel image is available for execution on the device", "arch_mismatch"),
    ("hipErrorNoBinaryForGpu: Unable to find code object for all current devices!", "arch_mismatch"),
    ("RuntimeError: HIP error: no ROCm-capable device is detected", "no_gpu_visible"),
    ("RuntimeError: HIP error: out of memory", "unknown"),
    ("RuntimeError: HIP error: driver version is insufficient for runtime version", "version_mismatch"),
    ("ROCk module is NOT live, possibly no GPU devices", "no_gpu_visible"),
    ("Unable to open /dev/kfd read-write: Permission denied", "device_permission"),
    ("  ROCM_PATH environment variable is set to /opt/rocm-6.4.0 but does not exist.", "cmake_hip_not_found"),
    ("  ********************* rocm_version.h could not be found ******************", "cmake_hip_not_found"),
    ("  No GPU arch specified for ROCm build.  Please use PYTORCH_ROCM_ARCH", "arch_not_specified"),
    # ROCm's libraries (rocBLAS, MIOpen, RCCL, amdsmi), bitsandbytes and ggml (llama.cpp) in their own words
    (
        "rocBLAS warning: No paths matched /opt/rocm/lib/rocblas/library/*gfx1031*co. Make sure that",
        "arch_mismatch",
    ),
    ("  ERROR: HCC compiler is no longer supported!", "compiler_version"),
    ("  Require at least gcc-5.4.0", "compiler_version"),
    ("MIOpen Error: /src/MIOpen/src/hip/handlehip.cpp:150: No device", "no_gpu_visible"),
    ("ERROR: Driver not loaded (amdgpu not found in modules)", "no_gpu_visible"),
    (
        "NCCL WARN Failed to find ROCm runtime library in (null) (RCCL_ROCR_PATH=(null))",
        "missing_library_runtime",
    ),
    (
        "No compatible ROCm library found (tried: libbitsandbytes_rocm63.so). You may need to compile",
        "missing_library_runtime",
    ),
    ("ROCm error: out of memory", "unknown"),
    ("ggml_gallocr_reserve_n_impl: failed to allocate ROCm0 buffer of size 2147483648", "unknown"),
    ("rocBLAS internal error: hipMallocAsync() failed to allocate memory of size : 34359738368", "unknown"),
    ("ROCm error: an illegal memory access was encountered", "unknown"),
]


@pytest.mark.parametrize(("line", "category"), UPSTREAM_LINES)
def test_upstream_messages_name_their_cause(line, category):
    d = diagnose_text(line + "\n")
    assert d.category == category, line
    assert d.confidence in (("none",) if category == "unknown" else ("high", "medium")), d.confidence


@pytest.mark.parametrize("line", RULES.follow_up_examples)
def test_follow_up_rule_matches_its_examples(line):
    assert RULES.follow_up.search(body(line))
    assert any(n in line.lower() for n in RULES.follow_up_needles)


def test_config_reads_the_categories_without_importing_the_engine():
    """config validates build.retry from the rules file: no config -> diagnose import cycle."""
    code = (
        "import sys; from pathlib import Path\n"
        "from rocmforge.config import parse_config, diagnosis_categories\n"
        "data = {'build': {'arch': ['gfx942'], 'retry': ['oom_compiler']},"
        " 'packages': {'x': {'source': {'kind': 'path', 'path': '.'}}}}\n"
        "parse_config(data, path=Path('/tmp/c.toml'), environ={})\n"
        "assert 'rocmforge.diagnose.engine' not in sys.modules\n"
        "print(diagnosis_categories())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == repr((CATEGORIES, RETRYABLE))


# Every rule that reads a line: causes, fatal-error shapes, facts. Each has needles, a pattern
# and an example; the needles are the literal prefilter that decides which lines are read at all.
LINE_RULES = [*SIGNALS, *RULES.fatal, *RULES.facts]


@pytest.mark.parametrize("rule", [*RULES.fatal, *RULES.facts], ids=lambda r: r.name)
def test_line_rule_matches_its_example(rule):
    for example in rule.examples:
        line = body(example)
        assert rule.pattern.search(line) and not (rule.unless and rule.unless.search(line)), example
        assert any(n in example.lower() for n in rule.needles), example


def test_needles_are_in_every_line_a_rule_matches():
    """The literal prefilter must never hide a line from a rule (checked on all real text)."""
    from rocmforge.diagnose.engine import iter_lines

    for path in ALL_FIXTURES:
        with open(path, "rb") as f:
            for number, text in iter_lines(f):
                for rule in LINE_RULES:
                    if rule.pattern.search(body(text)):
                        assert any(n in text.lower() for n in rule.needles), (path.name, number, rule.name)
                if RULES.follow_up.search(body(text)):
                    assert any(n in text.lower() for n in RULES.follow_up_needles), (path.name, number)


def test_reading_in_blocks_of_any_size_reads_the_same_lines():
    """Block boundaries (a line cut in two, a colour code cut in two) change nothing."""
    from rocmforge.diagnose.engine import decide, read_chunks

    data = b"".join(p.read_bytes() for p in sorted(FIXTURES.glob("*.log"))[:40])
    data = data.replace(b"error", b"\x1b[1;31merror\x1b[0m")  # colour codes inside lines
    whole = decide(read_chunks([data])).to_json()
    for size in (1, 7, 4096):
        blocks = [data[i : i + size] for i in range(0, len(data), size)]
        assert decide(read_chunks(blocks)).to_json() == whole, size


def test_dev_split_accuracy_stays_at_the_reported_level():
    # A floor just under what docs/diagnose.md reports for the DEV split, so a change that loses
    # ground fails here. The TEST split is deliberately not asserted: it is scored once, by hand.
    # Round 7's blind sets joined DEV untuned (93.9 % of 458), which moved the floor from 95 %.
    # The engine's own `unknown`s are counted where the thread names a category: round 25 brought
    # DEV's share of threads whose cause lies outside every category to 10.7 %, so the plain
    # unknown rate (10.2 %) now measures the labels more than the engine.
    report = score(split("dev"))
    assert report.total >= 450
    assert report.accuracy >= 0.93, report.misses
    missed_as_unknown = sum(n for (want, got), n in report.confusion.items() if got == "unknown" != want)
    assert missed_as_unknown <= 0.02 * report.total


def test_blind_directories_stay_out_of_every_split(monkeypatch, tmp_path):
    # A set is declared blind (in BLIND) before it lands: no test, tuning or cross-validation
    # reads it, and its files are not even opened. Declared here for an existing directory, a
    # file of which is made unreadable to prove it is skipped by name alone.
    import diagnose_eval

    tops = {e.path.relative_to(FIXTURES).parts[0] for e in corpus()}
    assert not tops & blind_dirs()
    blind = tmp_path / "BLIND"
    blind.write_text("# one name a line\nfresh6  # a comment\n")
    monkeypatch.setattr(diagnose_eval, "BLIND_FILE", blind)
    assert blind_dirs() == {"fresh6"}
    opened = []
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        opened.append(self)
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    items = corpus()
    assert items and not any(e.path.parent.name == "fresh6" for e in items)
    assert not any("fresh6" in p.parts for p in opened)
    assert len(corpus(only="fresh6")) == 80  # only --blind reads it
    # A path instead of a name would hold nothing out (round 8 was first declared so): refused.
    blind.write_text("tests/data/diagnose/fresh6/\n")
    with pytest.raises(SystemExit) as err:
        corpus()
    assert "'tests/data/diagnose/fresh6/' is not a directory name" in str(err.value)


def test_no_thread_is_in_two_splits():
    dev = {e.thread for e in split("dev")}
    test = {e.thread for e in split("test")}
    newtest = {e.thread for e in split("newtest")}
    assert dev and test and newtest
    assert not dev & test and not dev & newtest and not test & newtest
    assert 0.2 < len(test) / (len(dev) + len(test)) < 0.4
    # Round 2 is split about half and half; its NEWTEST half never mixes with round 1.
    round2 = [e for e in corpus() if e.round2]
    assert all(e.round2 for e in split("newtest"))
    assert 0.35 < len(newtest) / len(round2) < 0.65


def test_json_shape_and_evidence_point_at_the_decisive_line():
    path = FIXTURES / "oom_compiler-fc-planner-1.log"
    d = diagnose_file(path).to_json()
    # The shape only grows: the first three keys are the original contract.
    assert list(d) == ["category", "hint", "evidence", "first_error", "secondary", "confidence"]
    assert d["category"] == "oom_compiler"
    first = d["evidence"][0]
    assert set(first) == {"line", "text"}
    # The first kill, not "compilation terminated." or make's "Error 1" after it.
    lines = path.read_text().splitlines()
    assert (
        lines[first["line"] - 1]
        == first["text"]
        == "c++: fatal error: Killed signal terminated program cc1plus"
    )


def test_a_log_of_only_follow_up_lines_is_unknown_not_a_guess():
    d = diagnose_file(FRESH / "unknown-pytorch-rocm-64.log")
    assert d.category == "unknown"
    assert d.evidence[0].text == "ninja: build stopped: subcommand failed."


def test_the_same_cuda_check_reads_differently_inside_pip_isolation():
    """CUDA_HOME on a ROCm torch is the project's CUDA check; in pip's isolated env it is the isolation."""
    rocm = diagnose_file(FIXTURES / "cuda_check_on_rocm-deepep-1.log")
    assert rocm.category == "cuda_check_on_rocm"
    isolated = diagnose_file(FIXTURES / "build_isolation_torch-vllm-17445.log")
    assert isolated.category == "build_isolation_torch"
    assert "--no-build-isolation" in isolated.hint


def test_a_compiler_killed_for_memory_is_not_called_a_compiler_crash():
    d = diagnose_file(FIXTURES / "oom_compiler-therock-997.log")
    assert d.category == "oom_compiler"
    assert "MAX_JOBS" in d.hint


def test_a_signal_death_reads_as_memory_only_without_a_crash_report_and_with_memory_running_out():
    died = "clang++: error: clang frontend command failed due to signal (use -v to see invocation)\n"
    memory = "ld.lld: error: failed to open libtorch_hip.so: Cannot allocate memory\n"
    report = "PLEASE submit a bug report to https://github.com/llvm/llvm-project/issues/\nStack dump:\n"
    assert diagnose_text(died).category == "compiler_crash"  # nothing says why it died
    assert diagnose_text(died + memory).category == "oom_compiler"
    assert diagnose_text(report + died + memory).category == "compiler_crash"  # it crashed by itself


def test_a_math_library_without_kernels_for_the_gpu_names_the_arch():
    d = diagnose_file(FIXTURES / "fresh2" / "arch_mismatch-llamacpp-rocm-10.log")
    assert d.category == "arch_mismatch"  # at run time: the run-time side of the arch boundary
    assert "gfx1151" in d.hint and "rocBLAS" in d.hint


# --- reading big, messy logs ----------------------------------------------------------------


def test_50k_line_interleaved_log_with_colours_and_progress_redraws(tmp_path):
    real = (FIXTURES / "missing_library_link-hipfort-13.log").read_text().splitlines()[2:]
    log = tmp_path / "build.log"
    lines = []
    for i in range(60_000):
        if i == 41_233:
            lines.append(f"\x1b[1m\x1b[31m{real[1]}\x1b[0m")  # the real ld error, coloured
            lines.extend(real[2:])
        elif i % 997 == 0:
            # pip/rich progress bars redraw one line with \r; only the last state is text.
            lines.append("Downloading 10%\rDownloading 55%\rDownloading 100%")
        elif i % 3:
            lines.append(f"[{i}/60000] Building HIPCC object caffe2/CMakeFiles/torch_hip.dir/k{i}.hip.o")
        else:
            lines.append(f"[rank{i % 8}]: warning: loop not unrolled [-Wpass-failed=transform-warning]")
    lines += ["FAILED: lib/libtorch_hip.so", "ninja: build stopped: subcommand failed."]
    log.write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    d = diagnose_file(log)
    seconds = time.perf_counter() - start
    assert d.category == "missing_library_link"
    assert d.evidence[0].line == 41_234
    assert d.evidence[0].text == "/usr/bin/ld: cannot find -lamdhip64"  # colours gone
    assert "libamdhip64" in d.hint and "line 41234" in d.hint
    assert seconds < 10, f"{seconds:.1f} s for 60k lines"


def test_carriage_return_progress_keeps_the_last_state_and_the_line_number():
    failure = (
        "fatal: unable to access 'https://github.com/ROCm/triton.git/': Could not resolve host: github.com"
    )
    text = f"step 1\nfetching 3%\rfetching 40%\r{failure}\nstep 3\n"
    d = diagnose_text(text)
    assert d.category == "network_fetch"
    assert d.evidence[0].line == 2
    assert d.evidence[0].text.startswith("fatal: unable to access")


# --- failures produced here with real tools -------------------------------------------------

_HEAVY = """\
// A wide (not deep) instantiation: tens of thousands of distinct class templates at once.
#include <utility>
template <int N> struct S { long pad[N % 7 + 1]; static long f() { return N; } };
template <int... I> long sum(std::integer_sequence<int, I...>) { return (S<I>::f() + ...); }
long value() { return sum(std::make_integer_sequence<int, 40000>{}); }
"""
_LIGHT = "#include <utility>\nlong value() { return 1; }\n"


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("g++") and shutil.which("prlimit")), reason="needs g++ and prlimit")
def test_compile_out_of_memory_under_a_limit(tmp_path):
    (tmp_path / "heavy.cpp").write_text(_HEAVY)
    (tmp_path / "light.cpp").write_text(_LIGHT)
    limit = ["prlimit", f"--as={70 * 1024 * 1024}", "--"]
    # The same limit is enough for an ordinary file: what fails is the heavy one's memory.
    subprocess.run([*limit, "g++", "-c", "light.cpp", "-o", "light.o"], cwd=tmp_path, check=True)
    out = _run([*limit, "g++", "-c", "heavy.cpp", "-o", "heavy.o"], cwd=tmp_path)
    d = diagnose_text("MAX_JOBS=8\n" + out)
    assert d.category == "oom_compiler", out
    assert "memory" in d.evidence[0].text
    assert d.first_error.family == "oom"
    assert "MAX_JOBS=4" in d.hint
    env, note = retry_plan(
        d, {"MAX_JOBS": "8", "CMAKE_BUILD_PARALLEL_LEVEL": "8"}, _config(tmp_path, ["oom_compiler"])
    )
    assert env["MAX_JOBS"] == env["CMAKE_BUILD_PARALLEL_LEVEL"] == "4"
    assert note.startswith("retry after oom_compiler at line ") and "MAX_JOBS 8 -> 4" in note


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_missing_library_at_link_time(tmp_path):
    (tmp_path / "main.c").write_text("int main(void) { return 0; }\n")
    out = _run(["gcc", "main.c", "-lrocmforge_no_such_lib", "-o", "main"], cwd=tmp_path)
    d = diagnose_text(out)
    assert d.category == "missing_library_link", out
    assert "cannot find -lrocmforge_no_such_lib" in d.evidence[0].text  # not collect2's line
    assert d.first_error.family == "linker" and d.first_error.line == d.evidence[0].line
    assert "librocmforge_no_such_lib" in d.hint


@pytest.mark.skipif(not shutil.which("hipcc"), reason="needs Debian's hipcc")
def test_hipcc_with_a_bad_arch(tmp_path):
    (tmp_path / "k.hip").write_text(
        "#include <hip/hip_runtime.h>\n__global__ void k(float* x) { x[0] = 1; }\n"
    )
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    out = _run(["hipcc", "--offload-arch=gfx9420", "-c", "k.hip", "-o", "k.o"], cwd=tmp_path, env=env)
    d = diagnose_text(out)
    assert d.category == "arch_unsupported", out
    assert d.first_error.family == "compiler"
    assert "gfx9420" in d.hint and "gfx942" in d.hint.replace("gfx9420", "")  # did-you-mean


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
def test_a_compile_error_no_rule_knows_is_named_from_its_first_fatal_error(tmp_path):
    # No rule knows this wording: the shape of the first fatal error (a source line the
    # compiler rejects) names the likeliest cause, with low confidence, and keeps the next step.
    (tmp_path / "bad.cpp").write_text("int main() { return undeclared_name; }\n")
    out = _run(["g++", "-c", "bad.cpp", "-o", "bad.o"], cwd=tmp_path)
    log = "[1/2] Building CXX object bad.o\n" + out + "ninja: build stopped: subcommand failed.\n"
    # The rules and the shapes alone (the word model may make it unknown, the guess second:
    # tests/test_diagnose_words.py); the shipped engine names the guess first or second.
    shipped = diagnose_text(log)
    named = [shipped.category, shipped.secondary.category if shipped.secondary else None]
    assert "compiler_version" in named and shipped.category in ("compiler_version", "unknown")
    d = decide(read_chunks([log.encode()]), RULES_ONLY)
    assert (d.category, d.confidence) == ("compiler_version", "low"), log
    first = d.first_error
    assert first.family == "compiler" and "undeclared_name" in first.text
    assert log.splitlines()[first.line - 1] == first.text  # the line number is the log's
    assert d.evidence[0].line == first.line
    assert d.hint.startswith("most likely compiler_version, from the first fatal error alone (compiler)")
    assert f"If not: the compiler stopped at line {first.line}" in d.hint
    # Without any fatal error the shapes have nothing to guess from (the word model may still
    # guess from the words of a log that failed: tests/test_diagnose_words.py).
    quiet = "bad.cpp:1:5: warning: unused variable 'x'\nninja: build stopped\n"
    rules_only = decide(read_chunks([quiet.encode()]), RULES_ONLY)
    assert (rules_only.category, rules_only.confidence) == ("unknown", "none")


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_a_link_error_no_rule_knows_is_named_from_its_shape(tmp_path):
    # The real linker's undefined reference: no rule names its cause, the shape of the first fatal
    # error does (a link error is most often the link line's flags), with low confidence and the
    # linker's next step.
    (tmp_path / "main.c").write_text("int helper(void);\nint main(void) { return helper(); }\n")
    out = _run(["gcc", "main.c", "-o", "main"], cwd=tmp_path)
    log = "[2/2] Linking C executable main\n" + out + "ninja: build stopped: subcommand failed.\n"
    d = decide(read_chunks([log.encode()]), RULES_ONLY)
    assert (d.category, d.confidence) == ("link_flags", "low"), log
    assert d.first_error.family == "linker" and "helper" in d.first_error.text
    assert d.hint.startswith("most likely link_flags, from the first fatal error alone (linker)")


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
def test_a_host_compiler_given_hip_options_is_the_wrong_compiler(tmp_path):
    # A build that hands HIP sources to g++: the real g++ refuses --offload-arch, and the answer
    # names the wrong compiler (compiler_version) and says which one to use instead.
    (tmp_path / "k.cpp").write_text("int main() { return 0; }\n")
    out = _run(["g++", "--offload-arch=gfx942", "-c", "k.cpp", "-o", "k.o"], cwd=tmp_path)
    d = diagnose_text("[ 10%] Building CXX object k.o\n" + out + "make[2]: *** [k.o] Error 1\n")
    assert (d.category, d.confidence) == ("compiler_version", "high"), out
    assert d.first_error.family == "compiler" and "--offload-arch=gfx942" in d.first_error.text
    assert "g++ was given HIP options" in d.hint and "hipcc" in d.hint


def test_a_library_missing_from_a_link_names_the_library_or_the_symbol_it_must_provide():
    # MSVC's linker names a .lib (no -l, no lib prefix); lld names the symbol a shared library
    # needs from a library missing on the line: the hint says what to add, never "libthe library".
    msvc = diagnose_text("LINK : fatal error LNK1181: cannot open input file 'amdhip64.lib'\n")
    assert (msvc.category, msvc.first_error.family) == ("missing_library_link", "linker")
    assert "cannot find amdhip64.lib" in msvc.hint and "LIBPATH" in msvc.hint
    lld = diagnose_text(
        "ld.lld: error: undefined reference due to --no-allow-shlib-undefined: rocblas_initialize\n"
        ">>> referenced by ../src/.libs/libstarpu-1.4.so\n"
    )
    assert lld.category == "missing_library_link"
    assert "needs rocblas_initialize" in lld.hint and "-lrocblas" in lld.hint
    assert "libthe" not in lld.hint


def test_a_gpu_not_supported_under_hsa_override_is_a_runtime_arch_mismatch_not_a_build_one():
    # docs/diagnose.md's boundary: at run time (override workarounds included) a GPU the binaries
    # lack is arch_mismatch; at build time a target the compiler refuses is arch_unsupported.
    run = (
        'level=INFO msg="skipping rocm gfx compatibility check" HSA_OVERRIDE_GFX_VERSION=11.0.0\n'
        'level=WARN msg="amdgpu is not supported" gpu=0 gpu_type=gfx1031 supported_types=[gfx1100]\n'
        'level=INFO msg="no compatible GPUs were discovered"\n'
    )
    d = diagnose_text(run)
    assert d.category == "arch_mismatch" and "HSA_OVERRIDE_GFX_VERSION" in d.hint
    assert d.evidence and "amdgpu is not supported" in d.evidence[0].text
    build = (
        "export HSA_OVERRIDE_GFX_VERSION=11.0.0\n"
        "/src/k.hip:3:1: error: instruction not supported on this GPU\n"
    )
    assert diagnose_text(build).category == "arch_unsupported"
    assert diagnose_text(run.replace("HSA_OVERRIDE_GFX_VERSION=11.0.0", "")).category == "arch_unsupported"


def test_a_first_fatal_error_whose_shape_names_the_cause_is_used_when_no_signal_fires():
    # git's words for a clone whose repository went away: no signal knows them, the network
    # shape of the first fatal error does; a compiler error's shape names no cause by itself.
    gone = (
        "Cloning into 'third_party/fbjni'...\nfatal: repository 'https://example.org/fbjni.git/' not found\n"
    )
    d = diagnose_text(gone)
    assert (d.category, d.first_error.family, d.evidence[0].line) == ("network_fetch", "network", 2)
    # A first fatal error that says nothing of its cause ("error: ...") leaves the guess to the
    # first later one whose shape does; the first fatal error is still the first.
    d = diagnose_text("error: step 3 of 5 failed\nplugin library load error: no build for this runtime\n")
    assert (d.category, d.confidence, d.first_error.line) == ("missing_library_runtime", "low", 1)
    assert d.evidence[0].line == 2 and "from the fatal error at line 2 alone (loader)" in d.hint
    # The compiler driver refusing before any source is compiled has many causes: no shape guess.
    driver = read_chunks([b"clang-14: error: unable to execute command: ld.lld\n"])
    assert decide(driver, Tuning(words_unknown=0.0)).category == "unknown"


@pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")
@pytest.mark.parametrize(("package", "category"), [("rfnopkg", "unknown"), ("hip", "cmake_hip_not_found")])
def test_cmake_missing_a_package_is_a_rocm_cause_only_for_a_rocm_package(tmp_path, package, category):
    # The real CMake's words under its "CMake Error at": a ROCm package not found is
    # cmake_hip_not_found; any other package lies outside every category, so neither the CMake
    # shape's fallback nor the word model may name a ROCm cause for it.
    (tmp_path / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.16)\nproject(x NONE)\nfind_package({package} CONFIG REQUIRED)\n"
    )
    out = _run(["cmake", "-S", ".", "-B", "build"], cwd=tmp_path)
    d = diagnose_text(out)
    assert d.category == category, out
    assert d.first_error.family == "cmake" and d.first_error.text.startswith("CMake Error at")
    if category == "unknown":
        assert d.hint.startswith("a failure outside the known build causes: CMake could not use a package")
        assert [e.line for e in d.evidence] == [d.first_error.line, d.first_error.line + 1]


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
def test_a_full_disk_is_the_cause_whatever_fails_after_it(tmp_path):
    # /dev/full answers every write with ENOSPC: the real g++ and its assembler fail the way they
    # do on a full /tmp. A CMake error that follows is its consequence, not a second cause.
    (tmp_path / "k.cpp").write_text("int main() { return 0; }\n")
    out = _run(["g++", "-c", "k.cpp", "-o", "/dev/full"], cwd=tmp_path)
    log = (
        out
        + "CMake Error at THC_generated_THCTensorTopK.cu.o.cmake:267 (message):\n  Error generating file\n"
    )
    d = diagnose_text(log)
    assert (d.category, d.confidence) == ("disk_full", "high"), log
    assert "No space left on device" in d.evidence[0].text and d.first_error.family == "other"
    assert "df -h" in d.hint
    assert d.secondary is None or d.secondary.category != "cmake_hip_not_found"
    assert (
        diagnose_text(_run(["g++", "-S", "k.cpp", "-o", "/dev/full"], cwd=tmp_path)).category == "disk_full"
    )


def test_a_vllm_serve_that_fails_to_start_gets_its_root_causes_next_step(tmp_path):
    # The last mile: the wheels install and import, and `vllm serve` stops on what the request
    # asks of this GPU. The lines are the pinned vLLM's own (v1/core/kv_cache_planning.py,
    # platforms/rocm.py), under the engine core's log prefix; the answer is unknown (no build
    # cause), with the knob that fixes it, and the exit status says "not a known cause" (1).
    prefix = "(EngineCore_DP0 pid=120) ERROR 01-28 06:36:45 [core.py:946] "
    cases = [
        (
            "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB "
            "KV cache is needed, which is larger than the available KV cache memory (9.5 GiB). Based on "
            "the available memory, the estimated maximum model length is 77824. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            "--max-model-len",
        ),
        (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
            "--gpu-memory-utilization",
        ),
        (
            "ValueError: Model architecture 'Gemma3nForConditionalGeneration' is not supported by ROCm "
            "for now.",
            "supported-models list",
        ),
        (
            "ValueError: No valid attention backend found for rocm with AttentionSelectorConfig("
            "head_size=80, dtype=torch.bfloat16). Reasons: {ROCM_ATTN: [kv_cache_dtype not supported]}.",
            "--attention-backend",
        ),
        (
            "ValueError: Inconsistent GPU visibility env vars: HIP_VISIBLE_DEVICES='0' vs "
            "CUDA_VISIBLE_DEVICES='1'. Please set only one, or ensure they match.",
            "unset CUDA_VISIBLE_DEVICES",
        ),
        # Below vLLM: a Triton kernel tuned for a GPU with more LDS (the pinned Triton's wording),
        # a torch that lost its ROCm build, RCCL without the container's shared memory.
        (
            "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, "
            "Hardware limit: 65536. Reducing block sizes or `num_stages` may help.",
            "num_stages",
        ),
        ("AssertionError: Torch not compiled with CUDA enabled", "requirements.txt"),
        (
            "RuntimeError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
            "--ipc=host",
        ),
    ]
    for line, step in cases:
        log = tmp_path / "serve.log"
        log.write_text(
            f"{prefix}EngineCore failed to start.\n{prefix}Traceback (most recent call last):\n"
            f'{prefix}  File "/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 937\n'
            f"{prefix}{line}\n"
        )
        d = diagnose_text(log.read_text())
        assert (d.category, d.first_error.line) == ("unknown", 4), line
        assert step in d.hint and "outside the known build causes" in d.hint, d.hint
        argv = [sys.executable, "-m", "rocmforge", "diagnose", str(log)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        said = " ".join((out.stdout + out.stderr).split())
        assert out.returncode == 1 and step in said, said


def test_a_first_fatal_error_outside_every_category_is_unknown_whatever_comes_after():
    # A GPU memory fault in a running program lies outside every category; what fails after it
    # (here a CMake error, whose shape alone would guess cmake_hip_not_found) is its consequence:
    # the answer is unknown, with the fault's next step, and the words of the log are not asked.
    log = (
        "Memory access fault by GPU node-1 (Agent handle: 0x55f8) on address 0x7f2a.\n"
        "CMake Error at THC_generated_THCTensorTopK.cu.o.cmake:267 (message):\n"
        "  Error generating file\n"
    )
    d = diagnose_text(log)
    assert (d.category, d.confidence, d.first_error.line) == ("unknown", "none", 1)
    assert "AMD_SERIALIZE_KERNEL=3" in d.hint
    features = word_features(read_chunks([log.encode()]))
    killed = word_features(read_chunks([b"c++: fatal error: Killed signal terminated program cc1plus\n"]))
    model = words.train(
        [(f"t#{i}", "cmake_hip_not_found", features) for i in (1, 2)]
        + [(f"t#{i}", "oom_compiler", killed) for i in (3, 4)]
    )
    best, p = model.rank(features)[0]
    assert best == "cmake_hip_not_found" and p > 0.9  # the words alone would say so
    d = decide(read_chunks([log.encode()]), word_model=model)
    assert d.category == "unknown" and d.secondary is None  # not even as a second guess
    # A rule for the very phenomenon still names its cause (a later run without a code object).
    later = "Memory access fault by GPU node-1 (Agent handle: 0x1)\nHIP error: invalid device function\n"
    assert diagnose_text(later).category == "arch_mismatch"
    # Only the first fatal error decides: a GPU fault after a failed import changes nothing.
    after = "ImportError: libf.so: cannot open shared object file\nMemory access fault by GPU node-1\n"
    assert diagnose_text(after).category == "missing_library_runtime"
    # A warning made an error by -Werror is outside too, and so is a fault on its own.
    werror = diagnose_text("/src/a.cc:30:41: error: unused variable 'c' [-Werror=unused-variable]\n")
    assert (werror.category, werror.first_error.family) == ("unknown", "compiler")
    assert "-Wno-error" in werror.hint
    fault = diagnose_text("Memory access fault by GPU node-1 (Agent handle: 0x1) on address (nil).\n")
    assert fault.category == "unknown" and "AMD_SERIALIZE_KERNEL=3" in fault.hint


def test_runtime_wordings_are_read_whatever_their_case_and_name_the_likely_second_cause():
    d = diagnose_text(
        "Traceback (most recent call last):\nRuntimeError: HIP error: Invalid device function\n"
    )
    assert (d.category, d.first_error.family) == ("arch_mismatch", "hip_runtime")
    # No GPU listed: most often none is there for the runtime, as often one this user may not
    # open; the second is named on the same line.
    d = diagnose_text("RuntimeError: No HIP GPUs are available\n")
    assert (d.category, d.confidence, d.secondary.category) == ("no_gpu_visible", "high", "device_permission")
    assert d.secondary.evidence == d.evidence and "usermod" in d.secondary.hint
    # With a line saying the device nodes are refused, the refusal is the cause of "no GPU".
    d = diagnose_text(
        "Unable to open /dev/kfd read-write: Permission denied\nRuntimeError: No HIP GPUs are available\n"
    )
    assert d.category == "device_permission" and d.evidence[0].line == 1
    # A HIP runtime failure no signal knows still names the most likely cause of its shape.
    d = diagnose_text("hipErrorNoDevice returned from hipGetDeviceCount\n")
    assert (d.category, d.secondary.category) == ("no_gpu_visible", "device_permission")


def test_two_causes_in_one_log_are_both_reported_with_their_lines():
    net = (FIXTURES / "network_fetch-vllm-7813.log").read_text()
    link = (FIXTURES / "missing_library_link-hipfort-13.log").read_text()
    d = diagnose_text(net + link)
    assert {d.category, d.secondary.category} == {"network_fetch", "missing_library_link"}
    assert not {e.line for e in d.evidence} & {e.line for e in d.secondary.evidence}
    assert d.to_json()["secondary"]["category"] == d.secondary.category


# pip's build isolation, for real: an sdist whose build imports torch. The in-tree backend does
# what vLLM's and flash-attention's setup.py do (import torch, decide CUDA vs ROCm from
# torch.version.hip); pip's behaviour around it is pip's own.
_BACKEND = """\
import os


def get_requires_for_build_wheel(config_settings=None):
    import torch  # like flash-attention's setup.py: the build needs torch to configure

    print("torch.__version__ =", torch.__version__)
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    import torch

    print("torch.__version__ =", torch.__version__)
    if torch.version.hip is None and not os.environ.get("CUDA_HOME"):
        raise AssertionError("CUDA_HOME is not set")
    raise SystemExit("not reached in this test")
"""


def _sdist_project(root: Path, requires: list[str]) -> Path:
    proj = root / "kernels"
    proj.mkdir()
    (proj / "backend.py").write_text(_BACKEND)
    reqs = ", ".join(f'"{r}"' for r in requires)
    (proj / "pyproject.toml").write_text(
        f'[build-system]\nrequires = [{reqs}]\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "kernels"\nversion = "0.1"\n'
    )
    return proj


def _cpu_torch_wheel(directory: Path) -> Path:
    """A real (tiny) wheel named torch 2.13.0+cpu: what PyPI's torch is to a ROCm build."""
    name = directory / "torch-2.13.0+cpu-py3-none-any.whl"
    info = "torch-2.13.0+cpu.dist-info"
    files = {
        "torch/__init__.py": "from torch import version\n__version__ = '2.13.0+cpu'\n",
        "torch/version.py": "hip = None\ncuda = None\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: rocmforge-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    with zipfile.ZipFile(name, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{info}/RECORD", "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n")
    return name


def _pip_wheel(proj: Path, *index_args: str) -> str:
    pytest.importorskip("pip", reason="pip's build isolation is what these tests exercise")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-cache-dir",
        "-w",
        str(proj / "dist"),
        *index_args,
        str(proj),
    ]
    # Only the index the test names: no pip.conf (find-links, extra indexes) of this machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "CUDA_HOME"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return _run(argv, cwd=proj, env=env)


@pytest.mark.slow
def test_pip_isolation_without_torch(tmp_path):
    out = _pip_wheel(_sdist_project(tmp_path, []), "--no-index")
    d = diagnose_text(out)
    assert d.category == "build_isolation_torch", out
    assert "No module named 'torch'" in " ".join(e.text for e in d.evidence)
    assert d.first_error.family == "python_import"  # the build backend's import of torch
    assert "--no-build-isolation" in d.hint


@pytest.mark.slow
def test_pip_isolation_pulls_a_cpu_torch_from_an_index(tmp_path):
    simple = tmp_path / "index" / "simple" / "torch"
    simple.mkdir(parents=True)
    wheel = _cpu_torch_wheel(simple)
    (simple / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    fetched: list[str] = []

    class Index(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args):
            fetched.append(self.path)

    handler = functools.partial(Index, directory=str(tmp_path / "index"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
        out = _pip_wheel(_sdist_project(tmp_path, ["torch"]), "--index-url", url)
    finally:
        server.shutdown()
    assert any("torch-2.13.0%2Bcpu" in path for path in fetched)  # pip fetched it for the build env
    d = diagnose_text(out)
    # The message is "CUDA_HOME is not set", but the cause is the isolated env's torch.
    assert d.category == "build_isolation_torch", out
    assert "2.13.0+cpu" in d.hint


# --- remedies -------------------------------------------------------------------------------


def test_compiler_crash_retries_once_at_O2(tmp_path):
    d = diagnose_file(FIXTURES / "compiler_crash-hip-3889.log")
    assert d.category == "compiler_crash"
    cfg = _config(tmp_path, ["compiler_crash"])
    env = {"CFLAGS": "-O3", "CXXFLAGS": "-g -O3", "MAX_JOBS": "8"}
    new, note = retry_plan(d, env, cfg)
    assert new["CFLAGS"] == "-O2" and new["CXXFLAGS"] == "-g -O2"
    assert new["CMAKE_CXX_FLAGS_RELEASE"] == "-O2 -DNDEBUG"
    assert new["MAX_JOBS"] == "8" and env["CFLAGS"] == "-O3"  # the caller's env is not touched
    assert "CFLAGS/CXXFLAGS -O3 -> -O2" in note
    assert retry_plan(d, new, cfg) is None  # nothing left to lower: no second retry


def test_no_retry_unless_the_user_enabled_it(tmp_path):
    d = diagnose_file(FIXTURES / "oom_compiler-stellar-5308.log")
    assert retry_plan(d, {"MAX_JOBS": "8"}, _config(tmp_path, ["compiler_crash"])) is None
    assert retry_plan(d, {"MAX_JOBS": "1"}, _config(tmp_path, ["oom_compiler"])) is None
    other = Diagnosis("hipify", "x")
    assert retry_plan(other, {"MAX_JOBS": "8"}, _config(tmp_path, ["oom_compiler"])) is None


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["oom"], "build.retry: 'oom' is not a diagnosis category"),
        (
            ["hipify"],
            "build.retry: 'hipify' has no automatic remedy; retryable: compiler_crash, oom_compiler",
        ),
    ],
)
def test_build_retry_is_validated(tmp_path, names, message):
    with pytest.raises(UserError, match=message):
        _config(tmp_path, names)


# --- the command ----------------------------------------------------------------------------


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rocmforge", "diagnose", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_json_and_exit_codes(tmp_path):
    proc = _cli(str(FIXTURES / "arch_not_specified-kernel-builder-142.log"), "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["category"] == "arch_not_specified" and "PYTORCH_ROCM_ARCH" in d["hint"]
    assert d["evidence"][0]["line"] == 6

    proc = _cli(str(FIXTURES / "arch_not_specified-kernel-builder-142.log"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(  # the console
        "first fatal error (cmake) at line 5\narch_not_specified (high confidence): "
    )

    proc = _cli("-", "--json", stdin="all good\nbuild finished\n")
    assert proc.returncode == 1 and json.loads(proc.stdout)["category"] == "unknown"

    proc = _cli(str(tmp_path / "missing.log"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"rocmforge diagnose: error: {tmp_path / 'missing.log'}: no such log file"


def test_empty_or_binary_log_and_unreadable_file(tmp_path):
    # An empty or binary file answered "unknown" (exit 1), as if a text log had no known cause.
    log = tmp_path / "x.log"
    for data, why in ((b"", "empty"), (b"\x00\xff\xfe binary \x00", "not a text log (binary data)")):
        log.write_bytes(data)
        proc = _cli(str(log), "--json")
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.startswith(f"rocmforge diagnose: error: {log}: {why}; give the log of")
    # Any other read error (EIO here) was an OSError traceback.
    if Path("/proc/self/mem").exists():
        proc = _cli("/proc/self/mem")
        assert proc.returncode == 2
        assert (
            proc.stderr.strip()
            == "rocmforge diagnose: error: /proc/self/mem: cannot read the log (Input/output error)"
        )


# --- a failure of one's own as a fixture (--excerpt) ------------------------------------------


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_excerpt_of_a_real_link_failure_is_a_fixture_diagnosed_the_same(tmp_path):
    (tmp_path / "main.c").write_text("int main(void) { return 0; }\n")
    failure = _run(["gcc", "main.c", "-lrocmforge_no_such_lib", "-o", "main"], cwd=tmp_path)
    # The failure inside a long build log: progress redraws, colours, a home directory.
    progress = "".join(
        f"\x1b[32m[{i}/900]\x1b[0m Building C object /home/alice/x/obj{i}.o\r\n" for i in range(600)
    )
    log = tmp_path / "build.log"
    log.write_text(progress + failure + "ninja: build stopped: subcommand failed.\n" + "cleanup\n" * 300)
    url = "https://github.com/rocmforge/rocmforge/issues/42"

    proc = _cli(str(log), "--excerpt", str(tmp_path), "--source", url)
    assert proc.returncode == 0, proc.stderr
    fixture = tmp_path / "missing_library_link-rocmforge-42.log"
    assert f"excerpt written to {fixture}" in proc.stderr
    *head, body = fixture.read_text().split("\n", 2)
    assert head == [f"# source: {url}", "# category: missing_library_link"]
    lines = body.splitlines()
    assert 5 <= len(lines) <= 30  # the error and its context, not the 900 lines around it
    assert any("cannot find -lrocmforge_no_such_lib" in line for line in lines)
    assert not any("\x1b" in line or "\r" in line or "alice" in line for line in lines)
    # What the engine reads of the fixture (its body) names the same cause, at the same kind of line.
    full, cut = diagnose_text(log.read_text()), diagnose_text(body)
    assert (
        (cut.category, cut.first_error.family)
        == (full.category, full.first_error.family)
        == (
            "missing_library_link",
            "linker",
        )
    )
    assert cut.first_error.text == full.first_error.text


def test_excerpt_of_a_log_without_an_error_line_is_its_end(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("".join(f"step {i} done\n" for i in range(100)) + "and then it stopped\n")
    proc = _cli(str(log), "--excerpt", str(tmp_path / "mine.log"), "--source", "https://example.org/t/1")
    assert proc.returncode == 1, proc.stderr  # unknown, but the excerpt is still written
    body = (tmp_path / "mine.log").read_text().splitlines()
    assert body[:2] == ["# source: https://example.org/t/1", "# category: unknown"]
    assert body[2:] == [f"step {i} done" for i in range(61, 100)] + ["and then it stopped"]


def test_excerpt_refuses_what_it_cannot_do_and_writes_nothing(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("/usr/bin/ld: cannot find -lamdhip64\ncollect2: error: ld returned 1 exit status\n")
    out = tmp_path / "out.log"
    cases = [
        ((str(log), "--excerpt", str(out)), "--excerpt needs --source URL: the http(s) address of"),
        ((str(log), "--excerpt", str(out), "--source", "issue 12"), "--excerpt needs --source URL"),
        (
            ("-", "--excerpt", str(out), "--source", "https://x.org/1"),
            "--excerpt reads the log a second time",
        ),
        ((str(log), "--source", "https://x.org/1"), "--source is for --excerpt"),
        (
            (str(log), "--excerpt", f"{tmp_path}/new/", "--source", "https://x.org/1"),
            f"{tmp_path}/new/: no such",
        ),
    ]
    for args, message in cases:
        proc = _cli(*args, stdin="")
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith(f"rocmforge diagnose: error: {message}"), proc.stderr
        assert not out.exists()
    out.write_text("mine\n")
    proc = _cli(str(log), "--excerpt", str(out), "--source", "https://x.org/1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (  # one line, before any diagnosis
        f"rocmforge diagnose: error: {out}: already exists; give another --excerpt path (nothing was written)"
    )
    assert out.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build.log", "out.log"]  # no temp file left


def test_excerpt_lines_as_a_terminal_showed_them():
    from rocmforge.diagnose.excerpt import LINE_CHARS, clean

    assert clean(b"\x1b[1;31merror:\x1b[0m 50%\r100% /home/alice/x.cpp\r\n") == "100% /home/user/x.cpp"
    assert clean(b"C:\\Users\\bob\\src /Users/carol/lib") == "C:\\Users\\user\\src /Users/user/lib"
    assert clean(b"\xff\xfe ok") == "\ufffd\ufffd ok"
    long = clean(b"x" * (LINE_CHARS + 500))
    assert len(long) == LINE_CHARS + len(" [...]") and long.endswith(" [...]")


def test_a_failure_report_says_a_cause_as_surely_as_the_blind_rounds_allow():
    # engine.summary: the one line a failed build's (or verify's) report adds. A rule for the
    # phenomenon is a likely cause; a shape's guess is a possible one, with what such guesses are
    # worth; a failure outside every category gives its own next step; nothing recognised, None.
    from rocmforge.diagnose.engine import LOW_TRUST, summary

    sure = diagnose_text("c++: fatal error: Killed signal terminated program cc1plus\n")
    assert sure.confidence == "high" and summary(sure).startswith("likely cause (oom_compiler): ")
    guess = decide(read_chunks([b"/src/a.cc:3:5: error: 'foo' was not declared in this scope\n"]), RULES_ONLY)
    assert guess.confidence == "low"
    assert summary(guess) == f"possible cause ({guess.category}{LOW_TRUST}): {guess.hint}"
    full = diagnose_text("/usr/bin/ld: final link failed: No space left on device\n")
    assert full.category == "disk_full" and summary(full).startswith("likely cause (disk_full): ")
    gpu = diagnose_text("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB\n")
    assert gpu.category == "unknown" and summary(gpu).startswith("a failure outside the known build causes: ")
    assert summary(diagnose_text("all went well\n")) is None


def test_a_source_written_for_another_release_is_told_to_match_the_release():
    # A version mismatch found while compiling (hipBLAS's API, two HIP releases' headers) is not
    # fixed by rebuilding against the installed versions: the hint names the release to match.
    from rocmforge.diagnose.engine import SIGNALS, decide, read_chunks

    assert {s.category for s in SIGNALS if s.fix} == {"version_mismatch"}
    api = b"ggml-cuda.cu:1269:13: error: no matching function for call to 'hipblasGemmEx'\n"
    bf16 = b"ld.lld: error: duplicate symbol: __float2bfloat16(float)\n"
    for log, says in (
        (api, "source release"),
        (b"[ 42%] Linking HIP shared library\n" + bf16, "libamdhip64-dev"),
    ):
        diagnosis = decide(read_chunks([log]))
        assert diagnosis.category == "version_mismatch", log
        assert says in diagnosis.hint and "Rebuild the extension" not in diagnosis.hint, diagnosis.hint
