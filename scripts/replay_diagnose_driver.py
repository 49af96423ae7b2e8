"""The half of scripts/replay_diagnose_rounds.py that runs inside an old checkout.

    python scripts/replay_diagnose_driver.py OLD_TREE NEW_WORDS_PY BLIND_ROOT SET,SET TUNING_JSON

Imports the old checkout's engine (``OLD_TREE`` first on ``sys.path``) and this tree's word model
module by its path, under another name, so the two never mix; prints one JSON object of counts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path


def excerpt(path: Path) -> tuple[str, str, bytes]:
    """(thread, category, log) of a fixture file."""
    source, category, body = path.read_bytes().split(b"\n", 2)
    return source.decode().split(":", 1)[1].strip().lower(), category.decode().split(":", 1)[1].strip(), body


def decide(
    rules: object, outside: bool, failed: bool, ranked: list[tuple[str, float]], tuning: dict[str, float]
) -> tuple[str, str | None]:
    """This tree's ``engine.decide`` policy for the word model, on an old engine's rules-only answer.

    The rules name nothing in a log that shows a failure (``failed``: a fatal error, a
    consequence line or a fatal-looking line): the model's likeliest cause other than
    ``unknown``, unless its own ``unknown`` reaches ``words_unknown``. The rules guess from a
    shape (confidence ``low``): ``unknown`` (the guess second) when the model's likeliest class
    is ``unknown`` from ``words_unknown_shape``, else the model's likeliest cause replaces it
    from ``words_override``. Second: the rules' own second cause, else the model's likeliest other
    cause from ``words_second``. Kept in step with ``rocmforge.diagnose.engine.decide`` by hand:
    a test runs both on the whole corpus.
    """
    answer = rules.category
    probability = dict(ranked)
    if not outside and ranked:
        others = [(c, p) for c, p in ranked if c != "unknown"]
        if (
            answer == "unknown"
            and failed
            and others
            and probability.get("unknown", 0.0) < tuning["words_unknown"]
        ):
            answer = others[0][0]
        elif rules.confidence == "low" and ranked[0][0] == "unknown":
            if ranked[0][1] >= tuning["words_unknown_shape"]:
                return "unknown", answer  # the shape's guess, named second
        elif rules.confidence == "low" and ranked[0][0] != answer:
            answer = ranked[0][0] if ranked[0][1] >= tuning["words_override"] else answer
    second = rules.secondary.category if rules.secondary is not None and answer == rules.category else None
    if second is None and not outside:
        others = [(c, p) for c, p in ranked if c not in ("unknown", answer)]
        second = others[0][0] if others and others[0][1] >= tuning["words_second"] else None
    return answer, second


def main() -> None:
    old, new_words, blind_root, sets_arg, tuning_arg = sys.argv[1:6]
    sets, tuning = sets_arg.split(","), json.loads(tuning_arg)
    sys.path[:0] = [old]
    from rocmforge.diagnose import engine

    spec = importlib.util.spec_from_file_location("new_words", new_words)
    assert spec is not None and spec.loader is not None
    words = sys.modules["new_words"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(words)

    fixtures = Path(old, "tests/data/diagnose")
    # Old BLIND files name a directory per line, with a comment after '#'.
    lines = (line.split("#")[0].strip() for line in (fixtures / "BLIND").read_text().splitlines())
    held = {line.rstrip("/").rsplit("/", 1)[-1] for line in lines if line} | set(sets)
    # Labels in the old engine's terms: a category added since (disk_full, round 12) was
    # `unknown` then, so the old engine's score on its round is what it was at the time.
    known = set(engine.CATEGORIES)

    def labelled(path: Path) -> tuple[str, str, bytes]:
        thread, category, log = excerpt(path)
        return thread, category if category in known else "unknown", log

    train = [labelled(p) for p in sorted(fixtures.rglob("*.log")) if p.parent.name not in held]
    test = [labelled(p) for s in sets for p in sorted(Path(blind_root, s).glob("*.log"))]

    def features(log: bytes) -> frozenset[str]:
        return engine.word_features(engine.read_chunks([log]))

    model = words.train([(thread, category, features(log)) for thread, category, log in train])
    # The word model off, in each engine's own terms (its Tuning fields changed over the rounds).
    fields = {f.name for f in dataclasses.fields(engine.TUNING)}
    never = {
        "words_min": 2.0,
        "words_unknown": 0.0,
        "words_override": 2.0,
        "words_second": 2.0,
        "words_unknown_shape": 2.0,
    }
    off = dataclasses.replace(engine.TUNING, **{k: v for k, v in never.items() if k in fields})
    out = {"rules": 0, "shipped": 0, "new": 0, "new_unknown": 0, "first_or_second": 0, "n": len(test)}
    # The shipped answers by the confidence they were given with ("unknown" for no cause): how
    # far a user can trust each level on logs the engine never saw.
    calibration: dict[str, list[int]] = {}
    for _, category, log in test:
        reading = engine.read_chunks([log])  # read once: decide does not change a reading
        shipped = engine.decide(reading)
        out["shipped"] += shipped.category == category
        level = "unknown" if shipped.category == "unknown" else str(getattr(shipped, "confidence", "high"))
        tally = calibration.setdefault(level, [0, 0])
        tally[0] += 1
        tally[1] += shipped.category == category
        rules = engine.decide(reading, off)  # the old rules, no word model
        out["rules"] += rules.category == category
        outside = getattr(reading, "outside", None) is not None
        failed = bool(
            reading.first_error
            or getattr(reading, "first_follow_up", None)
            or getattr(reading, "fatal_lines", None)
        )
        ranked = model.rank(engine.word_features(reading))
        answer, second = decide(rules, outside, failed, ranked, tuning)
        out["new"] += answer == category
        out["new_unknown"] += answer == "unknown"
        out["first_or_second"] += category in (answer, second)
    print(json.dumps({**out, "calibration": calibration}))


if __name__ == "__main__":
    main()
