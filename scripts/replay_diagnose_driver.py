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
    train = [excerpt(p) for p in sorted(fixtures.rglob("*.log")) if p.parent.name not in held]
    test = [excerpt(p) for s in sets for p in sorted(Path(blind_root, s).glob("*.log"))]

    def features(log: bytes) -> frozenset[str]:
        return engine.word_features(engine.read_chunks([log]))

    model = words.train([(thread, category, features(log)) for thread, category, log in train])
    off = dataclasses.replace(engine.TUNING, words_min=2.0, words_override=2.0)
    new = dataclasses.replace(
        engine.TUNING, words_min=tuning["words_min"], words_override=tuning["words_override"]
    )
    out = {"rules": 0, "shipped": 0, "new": 0, "new_unknown": 0, "first_or_second": 0, "n": len(test)}
    for _, category, log in test:
        out["rules"] += engine.decide(engine.read_chunks([log]), off).category == category
        out["shipped"] += engine.decide(engine.read_chunks([log])).category == category
        reading = engine.read_chunks([log])
        d = engine.decide(reading, new, word_model=model)
        second = d.secondary.category if d.secondary else None
        if second is None and getattr(reading, "outside", None) is None:
            # As engine.Tuning.words_second: the model's next likeliest cause, named second.
            ranked = [(c, p) for c, p in model.rank(features(log)) if c not in (d.category, "unknown")]
            second = ranked[0][0] if ranked and ranked[0][1] >= tuning["words_second"] else None
        out["new"] += d.category == category
        out["new_unknown"] += d.category == "unknown"
        out["first_or_second"] += category in (d.category, second)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
