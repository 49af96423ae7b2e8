"""diagnose's word model (``rocmforge/diagnose/words.py``): what it reads, that the shipped model
is the one the corpus trains, that a damaged model is refused, and how the engine uses it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocmforge.diagnose import words
from rocmforge.diagnose.engine import Tuning, decide, diagnose_text, read_chunks, word_lines

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "tests")]


def test_tokens_fold_digits_keep_neighbours_and_drop_filler():
    toks = words.tokens(["error: gfx1030 is not in the supported list of the build: gfx90a;gfx942"])
    assert {"gfx#", "gfx#a", "supported list", "not supported"} <= toks
    assert "gfx1030" not in toks and "the" not in toks
    # A line counts its words once, however often a parallel build repeats it.
    assert words.tokens(["Killed"] * 3) == words.tokens(["Killed"]) == frozenset({"killed"})


def test_tokens_leave_out_the_user_name_of_a_home_directory():
    # Who filed a thread is no evidence of its cause (one user's two threads would teach the model
    # their label): /home/NAME, /Users/NAME and C:\\Users\\NAME lose the name, keep the rest.
    toks = words.tokens(["/home/loong/xformers/csrc/a.hip C:\\Users\\Afraa\\sd\\venv /Users/bob/lib"])
    assert not {"loong", "afraa", "bob"} & toks
    assert {"home", "xformers", "csrc", "hip", "users", "venv", "lib"} <= toks


def test_shipped_model_is_what_the_corpus_trains():
    # The model is data derived from tests/data/diagnose (blind sets excluded): a rule or fixture
    # change that moves it must come with a retrained words.json.
    from train_diagnose_words import model_text

    assert words.MODEL_FILE.read_text() == model_text(), "run scripts/train_diagnose_words.py"
    model = words.load()
    assert "unknown" in model.docs and sum(model.docs.values()) >= 400


def test_train_script_check_says_current(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_diagnose_words.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "current" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", "not JSON"),  # truncated to nothing
        ('{"format": 1, "docs": {"oom_c', "not JSON"),  # cut off while written by hand
        ('{"format": 2}', "not a format-1 word model"),
        ('{"format": 1, "docs": {"oom_compiler": 0}, "counts": {}}', "positive thread counts"),
        (
            '{"format": 1, "docs": {"oom_compiler": 2}, "counts": {"oom_compiler": {"killed": 3}}}',
            "between 1 and 2",
        ),
        ('{"format": 1, "docs": {"oom_compiler": 2}, "counts": {"nvidia": {}}}', "'counts' must map"),
    ],
)
def test_a_damaged_model_is_refused_naming_the_file(tmp_path, text, names):
    path = tmp_path / "words.json"
    path.write_text(text)
    with pytest.raises(words.ModelError) as err:
        words.load(path)
    assert str(path) in str(err.value) and names in str(err.value)
    assert "train_diagnose_words.py" in str(err.value) and "\n" not in str(err.value)


def test_a_log_no_rule_names_gets_the_words_opinion_with_its_lines():
    # No rule knows this wording of a too-new target; the words (a gfx name, "target",
    # "supports") do. The answer says it is a guess, names the words and keeps the next step.
    log = (
        "[ 45%] Building HIP object foo.hip.o\n"
        "error: requested offload target gfx1201 is newer than this toolchain supports\n"
        "make: *** [Makefile:12: all] Error 2\n"
    )
    plain = decide(read_chunks([log.encode()]), Tuning(words_min=2.0, words_override=2.0))
    assert plain.category == "unknown"  # the rules alone
    d = diagnose_text(log)
    assert d.category == "arch_unsupported" and d.confidence == "low"
    assert d.hint.startswith("most likely arch_unsupported, from the words of the log alone (gfx#")
    assert "If not: " in d.hint
    assert d.evidence[0].line == 2 and "gfx1201" in d.evidence[0].text
    assert json.loads(json.dumps(d.to_json()))["confidence"] == "low"


def test_word_lines_are_the_first_fatal_lines_and_the_tail_of_a_long_log():
    # A long log: the model reads what failed at its end and the first fatal-looking lines, with
    # the file's own line numbers, not the 100,000 lines of progress between them.
    lines = ["error: early trouble"] + [f"[{i}/100000] Building CXX object o{i}.o" for i in range(100_000)]
    lines.append("c++: fatal error: Killed signal terminated program cc1plus")
    reading = read_chunks([("\n".join(lines) + "\n").encode()])
    got = word_lines(reading)
    assert got[0] == (1, "error: early trouble")
    assert got[-1] == (100_002, lines[-1])
    assert len(got) == 1 + words.TAIL_LINES
    assert [n for n, _ in got[1:]] == list(range(100_002 - words.TAIL_LINES + 1, 100_003))
