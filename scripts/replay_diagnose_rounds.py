#!/usr/bin/env python3
"""Replay diagnose's blind rounds with a word model the rounds never had.

A blind round scores, once, the engine frozen before its excerpts were gathered. To judge a new
*word model* the same way, each round is replayed: the engine's rules and code are checked out
as they were frozen (a temporary git worktree of that commit), the word model is trained with
*this* tree's ``rocmforge/diagnose/words.py`` on that commit's corpus (its blind sets excluded),
and the round's blind excerpts (read from this tree) are diagnosed by the old engine with the
new model. Per round: the rules alone, the engine as it was shipped, the engine with the new
model, and how often the right cause is first or second (the new model's next likeliest cause
named second where the rules name none, as ``engine.Tuning.words_second`` does). At the end, the
shipped answers of all rounds by their confidence: how often each level was right on logs the
engine had never seen.

The thresholds are this tree's ``engine.Tuning``. Needs git, the repository's history and numpy.

    python scripts/replay_diagnose_rounds.py            # the rounds in ROUNDS
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "diagnose"
# engine.Tuning's thresholds of the word model, which the replay applies (each may be given).
NAMES = ("words_unknown", "words_override", "words_second", "words_unknown_shape")
# (round, the commit its blind sets were scored on, the sets) — docs/diagnose-rounds.md gives each.
ROUNDS = (
    ("4", "55b9348", ("fresh7", "fresh8")),
    ("5", "5c1a180", ("fresh9", "fresh10")),
    ("7", "4964385", ("fresh11", "fresh12")),
    ("8", "db302cb", ("fresh13", "fresh14")),
    ("9", "c12bc15", ("fresh15", "fresh16")),
    ("10", "e873089", ("fresh17", "fresh18")),
    ("11", "50f8148", ("fresh19", "fresh20")),
    ("12", "f7b8e4a", ("fresh21", "fresh22", "fresh23")),
    ("13", "725916b", ("fresh24", "fresh25")),
    ("14", "819fe30", ("fresh26", "fresh27", "fresh28", "fresh29")),
    ("15", "567d3d0", ("fresh30", "fresh31", "fresh32", "fresh33")),
    ("16", "6b9ce70", ("fresh34", "fresh35", "fresh36", "fresh37")),
    ("17", "bf89060", ("fresh38", "fresh39", "fresh40", "fresh41")),
    ("18", "38f5a7e", ("fresh42", "fresh43", "fresh44", "fresh45")),
    ("19", "357a4d4", ("fresh47", "fresh48")),
    ("20", "2045464", ("fresh49", "fresh50", "fresh51")),
    ("21", "8320a84", ("fresh52", "fresh53", "fresh54")),
    ("22", "1b04722", ("fresh55", "fresh56", "fresh57")),
    ("23", "55e2845", ("fresh58", "fresh59")),
    ("25", "b801899", ("fresh63", "fresh64", "fresh65")),
    ("26", "d808e4a", ("fresh66", "fresh67")),
)


def replay(commit: str, sets: tuple[str, ...], tuning: dict[str, float]) -> dict[str, int]:
    """The counts of one round, from the engine of ``commit`` (checked out in a temporary worktree)."""
    git = ["git", "-C", str(ROOT), "worktree"]
    with tempfile.TemporaryDirectory(prefix="replay-") as tmp:
        tree = Path(tmp, "tree")
        subprocess.run([*git, "add", "--detach", "-q", str(tree), commit], check=True)
        try:
            out = subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "scripts" / "replay_diagnose_driver.py"),
                    str(tree),
                    str(ROOT / "rocmforge" / "diagnose" / "words.py"),
                    str(FIXTURES),
                    ",".join(sets),
                    json.dumps(tuning),
                ],
                capture_output=True,
                text=True,
            )
            if out.returncode:
                sys.exit(f"replaying {commit}: {out.stderr.strip().splitlines()[-1]}")
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=True)
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round", action="append", help="replay only this round (repeatable)")
    for name in NAMES:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=float, metavar="P", help=f"instead of engine.Tuning.{name}")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT)]
    from rocmforge.diagnose.engine import TUNING

    tuning = {k: getattr(TUNING, k) if getattr(args, k) is None else getattr(args, k) for k in NAMES}
    total: dict[str, int] = {}
    calibration: dict[str, list[int]] = {}  # per confidence level: answers, right
    print(f"thresholds: {tuning}")
    for name, commit, sets in ROUNDS:
        if args.round and name not in args.round:
            continue
        got = replay(commit, sets, tuning)
        n = got["n"]
        print(
            f"round {name} ({' + '.join(sets)}, {n}, rules of {commit}): rules alone {got['rules']}, "
            f"as shipped {got['shipped']}, with this word model {got['new']} "
            f"({got['new_unknown']} unknown), right first or second {got['first_or_second']}"
        )
        for level, (count, right) in got.pop("calibration").items():
            tally = calibration.setdefault(level, [0, 0])
            tally[0] += count
            tally[1] += right
        for k, v in got.items():
            total[k] = total.get(k, 0) + v
    n = total.get("n", 0)
    if n:
        pct = {k: f"{v}/{n} = {v / n:.1%}" for k, v in total.items() if k != "n"}
        print(
            f"all: rules alone {pct['rules']}, as shipped {pct['shipped']}, with this word model "
            f"{pct['new']} ({pct['new_unknown']} unknown), right first or second {pct['first_or_second']}"
        )
        print("as shipped, by the confidence of the answer (how far each level can be trusted):")
        for level in ("high", "medium", "low", "unknown"):
            count, right = calibration.get(level, [0, 0])
            if count:
                print(f"  {level:8} {count:5} answers, {right:5} right = {right / count:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
