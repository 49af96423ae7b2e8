"""Accuracy of ``rocmforge.diagnose`` on the real fixtures, per split (train or held-out).

The split is a fixed function of the file name (see ``tests/data/diagnose/README.md``), decided
before the classifier was tuned: tune on ``--train``, report ``--held-out``. ``--fresh`` is a
third set, ``tests/data/diagnose/fresh/``, gathered only after the classifier was frozen
(commit ac32f62); ``--fresh2``, ``fresh2/``, only after the second freeze (d441963), which
had learnt from the first fresh set's misses; ``--fresh3``, ``fresh3/``, gathered before the
third round of tuning, which learnt from the fresh2 and fresh3 misses.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import Counter
from pathlib import Path

# Run as a script from the checkout: make ``rocmforge`` importable without installing it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FIXTURES = Path(__file__).resolve().parent / "data" / "diagnose"
# The blind sets, each gathered after the classifier was frozen, never tuned on before scoring.
BLIND_SETS = ("fresh", "fresh2", "fresh3")


def is_held_out(path: Path) -> bool:
    """The fixed split: about one third of the fixtures, chosen by a hash of the file name."""
    return hashlib.sha256(path.name.encode()).digest()[0] < 86


def fixtures(split: str) -> list[tuple[Path, str]]:
    """(path, expected category) of every fixture in one split: train, held-out or a blind set."""
    out = []
    directory = FIXTURES / split if split in BLIND_SETS else FIXTURES
    for path in sorted(directory.glob("*.log")):
        if directory is FIXTURES and is_held_out(path) != (split == "held-out"):
            continue
        for line in path.read_text().splitlines():
            if line.startswith("# category:"):
                out.append((path, line.split(":", 1)[1].strip()))
                break
    return out


def evaluate(split: str) -> tuple[int, int, Counter]:
    """(correct, total, confusions {(expected, got): count}) for one split."""
    from rocmforge.diagnose import diagnose_file

    correct, confusions = 0, Counter()
    items = fixtures(split)
    for path, expected in items:
        got = diagnose_file(path).category
        if got == expected:
            correct += 1
        else:
            confusions[(expected, got)] += 1
    return correct, len(items), confusions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--train", action="store_true")
    group.add_argument("--held-out", action="store_true")
    for name in BLIND_SETS:
        group.add_argument(f"--{name}", action="store_true")
    parser.add_argument("-v", action="store_true", help="name each misclassified fixture")
    args = parser.parse_args()
    chosen = [name for name in BLIND_SETS if getattr(args, name)]
    name = "held-out" if args.held_out else chosen[0] if chosen else "train"
    correct, total, confusions = evaluate(name)
    print(f"{name}: {correct}/{total} = {correct / max(total, 1):.1%}")
    for (expected, got), n in confusions.most_common():
        print(f"  {expected} -> {got}: {n}")
    if args.v:
        from rocmforge.diagnose import diagnose_file

        for path, expected in fixtures(name):
            got = diagnose_file(path).category
            if got != expected:
                print(f"  {path.name}: expected {expected}, got {got}")


if __name__ == "__main__":
    main()
