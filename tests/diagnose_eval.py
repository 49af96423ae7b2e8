"""How well ``rocmforge.diagnose.engine`` names the cause of real failures, judged on a split by thread.

Every fixture under ``tests/data/diagnose/`` is an excerpt of one public issue thread (its
``# source:`` URL) with the category a ROCm engineer would give it from the thread's resolution
(``# category:``). The corpus is split by *thread*, never by file: a thread is in the TEST split
when the first byte of ``sha256("owner/repo#number")`` is below ``TEST_BELOW`` (about 30 %),
otherwise in DEV. The rule depends only on the thread, so adding excerpts never moves old ones
and no thread can be in both halves. The split was fixed (commit "diagnose_eval: split the corpus
by thread") before the engine was changed for issue 15.

Round 2 of issue 15 gathered ``fresh5/``; it is split on its own, half and half (``split_of``):
its NEWTEST half is blind and scored once at the end (``--newtest``), its other half joins DEV.

Blind sets: a directory named in ``tests/data/diagnose/BLIND`` (one name a line) is skipped by
every function here, the tests and the cross-validations included, without its files being read;
only ``--blind NAME`` scores it, once, when the engine is frozen. Add a directory's name to BLIND
*before* its excerpts are committed, so no run can look at them by accident; ``--exclude NAME``
skips another directory for one run.

Tune on DEV only: ``python tests/diagnose_eval.py`` prints DEV's accuracy, unknown rate,
per-category precision/recall and the confusion matrix, ``--cv 5`` a k-fold cross-validation by
thread of the engine's weighing. ``--test`` scores the TEST split; it
prints only the aggregate unless ``--report`` is given, so the split can be measured "before"
without reading its errors.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import signal
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script from the checkout: make ``rocmforge`` importable without installing it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FIXTURES = Path(__file__).resolve().parent / "data" / "diagnose"
TEST_BELOW = 77  # of 256: the share of threads in the test split, about 30 %
# Round 2 (issue 15, second round): the excerpts gathered into ROUND2_DIR are split on their own,
# half and half, with a salted hash, so that none of them lands in a split an earlier version of
# the engine was tuned on. NEWTEST is that blind half; its other half joins DEV.
ROUND2_DIR = "fresh5"
ROUND2_SALT = b"round2:"
ROUND2_TEST_BELOW = 128  # of 256: about 50 %
BLIND_FILE = FIXTURES / "BLIND"
_THREAD = re.compile(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull|discussions)/(\d+)")


@dataclass(frozen=True)
class Excerpt:
    """One fixture: where it came from and the category its thread's resolution supports."""

    path: Path
    url: str
    category: str

    @property
    def round2(self) -> bool:
        """Gathered for the second round (``ROUND2_DIR``), split by its own rule."""
        return self.path.parent.name == ROUND2_DIR

    def log(self) -> bytes:
        """The excerpt without its two header lines: the engine must not read the label or the URL."""
        return excerpt_log(self.path)

    @property
    def thread(self) -> str:
        """``owner/repo#number`` (GitHub), else the URL: the unit the split keeps together."""
        m = _THREAD.match(self.url)
        return f"{m.group(1).lower()}#{m.group(2)}" if m else self.url.rstrip("/").lower()


def excerpt_log(path: Path) -> bytes:
    """A fixture's log lines, without the ``# source:`` / ``# category:`` header."""
    return path.read_bytes().split(b"\n", 2)[2]


def in_test_split(thread: str) -> bool:
    """The fixed split: a thread is TEST when the first byte of its sha256 is below TEST_BELOW."""
    return hashlib.sha256(thread.encode()).digest()[0] < TEST_BELOW


def in_newtest_split(thread: str) -> bool:
    """The round-2 split: a round-2 thread is NEWTEST when its salted sha256 starts below 128."""
    return hashlib.sha256(ROUND2_SALT + thread.encode()).digest()[0] < ROUND2_TEST_BELOW


def split_of(e: Excerpt) -> str:
    """``dev``, ``test`` (round 1's test split) or ``newtest`` (round 2's blind half)."""
    if e.round2:
        return "newtest" if in_newtest_split(e.thread) else "dev"
    return "test" if in_test_split(e.thread) else "dev"


def blind_dirs() -> frozenset[str]:
    """The directories under FIXTURES listed in ``BLIND``: held out of everything but ``--blind``."""
    if not BLIND_FILE.is_file():
        return frozenset()
    lines = (line.split("#", 1)[0].strip() for line in BLIND_FILE.read_text().splitlines())
    names = frozenset(line for line in lines if line)
    for name in names:
        # A path ("tests/data/diagnose/fresh13/") names no directory here, and a set it meant to
        # hold out would silently be tuned on: refuse it.
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise SystemExit(f"{BLIND_FILE}: {name!r} is not a directory name; write the name alone: fresh7")
    return names


def corpus(*, exclude: frozenset[str] = frozenset(), only: str = "") -> list[Excerpt]:
    """Every fixture outside the blind directories and ``exclude`` (directory names under FIXTURES).

    The directories record when an excerpt was gathered. ``only`` names one directory to read
    instead, blind or not: the one way a blind set is ever scored (``--blind``).
    """
    skip = blind_dirs() | exclude
    out = []
    for path in sorted(FIXTURES.rglob("*.log")):
        top = path.relative_to(FIXTURES).parts[0]
        if (top != only) if only else (top in skip):
            continue  # decided from the name alone: a blind file is never opened
        head = path.read_text(errors="replace").splitlines()[:2]
        url = head[0].removeprefix("# source:").strip()
        category = head[1].removeprefix("# category:").strip()
        out.append(Excerpt(path, url, category))
    return out


def split(name: str, *, exclude: frozenset[str] = frozenset()) -> list[Excerpt]:
    """``dev``, ``test``, ``newtest`` or ``all`` (always without the blind directories)."""
    items = corpus(exclude=exclude)
    if name == "all":
        return items
    return [e for e in items if split_of(e) == name]


def folds(items: Sequence[Excerpt], k: int) -> list[list[Excerpt]]:
    """k folds by thread (a thread's excerpts share a fold), from a hash, so they never change."""
    out: list[list[Excerpt]] = [[] for _ in range(k)]
    for e in items:
        out[int.from_bytes(hashlib.sha256(b"fold:" + e.thread.encode()).digest()[:4], "big") % k].append(e)
    return out


@dataclass
class Report:
    """Right and wrong answers on a set of excerpts."""

    total: int = 0
    correct: int = 0
    unknown: int = 0
    second: int = 0  # wrong first, right as the secondary cause
    confusion: Counter = field(default_factory=Counter)  # (expected, got) -> count
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # (file, expected, got)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.total, 1)

    @property
    def unknown_rate(self) -> float:
        return self.unknown / max(self.total, 1)

    def __add__(self, other: Report) -> Report:
        """Two reports as one (sets scored apart, counted together)."""
        return Report(
            self.total + other.total,
            self.correct + other.correct,
            self.unknown + other.unknown,
            self.second + other.second,
            self.confusion + other.confusion,
            self.misses + other.misses,
        )

    def precision_recall(self, category: str) -> tuple[float | None, float | None, int]:
        """(precision, recall, support) of one category; None where nothing to divide by."""
        tp = self.confusion[(category, category)]
        predicted = sum(n for (_, got), n in self.confusion.items() if got == category)
        actual = sum(n for (exp, _), n in self.confusion.items() if exp == category)
        return (tp / predicted if predicted else None, tp / actual if actual else None, actual)


def answers(diagnosis: Any) -> tuple[str, str | None]:
    """A diagnosis's first cause and its second (or None), as :func:`score` counts them."""
    second = diagnosis.secondary
    return diagnosis.category, second.category if second is not None else None


def score(
    items: Sequence[Excerpt], classify: Callable[[Path], str | tuple[str, str | None]] | None = None
) -> Report:
    """Run the classifier (the engine on the excerpt's log, by default) on each excerpt.

    ``classify`` gives the category, or the category and the secondary cause (or None).
    """
    if classify is None:
        from rocmforge.diagnose.engine import decide, read_chunks

        def classify(path: Path) -> tuple[str, str | None]:
            return answers(decide(read_chunks([excerpt_log(path)])))

    report = Report()
    for e in items:
        answer = classify(e.path)
        got, second = answer if isinstance(answer, tuple) else (answer, None)
        report.total += 1
        report.correct += got == e.category
        report.second += got != e.category and second == e.category
        report.unknown += got == "unknown"
        report.confusion[(e.category, got)] += 1
        if got != e.category:
            report.misses.append((str(e.path.relative_to(FIXTURES)), e.category, got))
    return report


def cross_validate(items: Sequence[Excerpt], k: int) -> tuple[list[Report], list[object]]:
    """k-fold cross-validation by thread of the engine's weighing (``Tuning``).

    The rules are written by hand; the numbers that weigh them (``rocmforge.diagnose.engine.Tuning``:
    the score below which the answer is ``unknown``, the weight of a line at the first fatal
    error, of the same family) are chosen for each fold from ``TUNING_GRID`` by accuracy on the
    other k-1 folds, then scored on the held fold. Returns each fold's report and its choice.
    """
    from rocmforge.diagnose.engine import TUNING_GRID, decide, read_chunks

    readings = {e.path: read_chunks([e.log()]) for e in items}

    def right(group: Sequence[Excerpt], tuning: object) -> int:
        return sum(decide(readings[e.path], tuning).category == e.category for e in group)

    reports, chosen = [], []
    parts = folds(items, k)
    for i, held in enumerate(parts):
        rest = [e for j, part in enumerate(parts) if j != i for e in part]
        # Ties go to the first in the grid (the plainest weighing).
        best = max(TUNING_GRID, key=lambda t: (right(rest, t), -TUNING_GRID.index(t)))
        chosen.append(best)
        reports.append(score(held, lambda p, best=best: decide(readings[p], best).category))
    return reports, chosen


def word_documents(
    items: Sequence[Excerpt], readings: dict[Path, object] | None = None
) -> list[tuple[str, str, frozenset[str]]]:
    """``(thread, category, tokens)`` of each excerpt, read as the engine reads a log.

    ``readings``: each excerpt's ``read_chunks`` result, when already made.
    """
    from rocmforge.diagnose.engine import read_chunks, word_features

    return [
        (e.thread, e.category, word_features(readings[e.path] if readings else read_chunks([e.log()])))
        for e in items
    ]


def train_words(items: Sequence[Excerpt]) -> object:
    """The word model (``rocmforge/diagnose/words.json``) trained on these excerpts."""
    from rocmforge.diagnose import words

    return words.train(word_documents(items))


def rule_support(items: Sequence[Excerpt], readings: dict[Path, object] | None = None) -> dict[str, set[str]]:
    """For each signal, the threads whose excerpt it fires on and whose label it points to.

    ``readings``: each excerpt's ``read_chunks`` result, when already made.
    """
    from rocmforge.diagnose.engine import read_chunks

    support: dict[str, set[str]] = {}
    for e in items:
        reading = readings[e.path] if readings else read_chunks([e.log()])
        for name, hits in reading.hits.items():
            if hits[0].signal.category == e.category:
                support.setdefault(name, set()).add(e.thread)
    return support


def rule_cross_validate(
    items: Sequence[Excerpt], k: int, tuning: object = None
) -> tuple[list[Report], list[int]]:
    """k-fold cross-validation by thread of the *rules*, not only of the weighing.

    The rules were written looking at DEV, so DEV accuracy is in-sample. Here each fold is scored
    with the signals removed whose only support (an excerpt of the same label they fire on) lies
    in that fold: what the engine would say on those threads had nobody written a rule from
    them. Signals with no support on DEV (written from the docs, or from earlier knowledge) stay.
    The word model is trained on the other folds only. Returns each fold's report and how many
    signals it lost.
    """
    from copy import copy

    from rocmforge.diagnose import words
    from rocmforge.diagnose.engine import TUNING, decide, read_chunks

    # Each excerpt is read once; the folds filter and train on these.
    readings = {e.path: read_chunks([e.log()]) for e in items}
    documents = dict(zip((e.path for e in items), word_documents(items, readings), strict=True))
    support = rule_support(items, readings)
    reports, dropped = [], []
    parts = folds(items, k)
    for i, held in enumerate(parts):
        threads = {e.thread for e in held}
        gone = {name for name, ts in support.items() if ts <= threads}
        dropped.append(len(gone))
        model = words.train([documents[e.path] for j, part in enumerate(parts) if j != i for e in part])

        def classify(path: Path, gone: set[str] = gone, model: object = model) -> tuple[str, str | None]:
            reading = copy(readings[path])
            reading.hits = {n: h for n, h in reading.hits.items() if n not in gone}
            reading.counts = {n: c for n, c in reading.counts.items() if n not in gone}
            return answers(decide(reading, tuning or TUNING, word_model=model))

        reports.append(score(held, classify))
    return reports, dropped


def _pct(x: float | None) -> str:
    return "   - " if x is None else f"{x:5.0%}"


def print_report(name: str, report: Report, *, details: bool) -> None:
    """The aggregate line; with ``details`` per-category precision/recall and the confusion matrix."""
    print(
        f"{name}: {report.correct}/{report.total} = {report.accuracy:.1%} right cause, "
        f"{report.unknown}/{report.total} = {report.unknown_rate:.1%} unknown"
        + (
            f"; right as the second cause: {report.second} more "
            f"({(report.correct + report.second) / max(report.total, 1):.1%} first or second)"
            if report.second
            else ""
        )
    )
    if not details:
        return
    from rocmforge.diagnose.engine import CATEGORIES

    cats = [c for c in CATEGORIES if any(c in pair for pair in report.confusion)]
    print(f"\n{'category':<24} {'prec':>5} {'recall':>6} {'n':>4}")
    for c in cats:
        p, r, n = report.precision_recall(c)
        print(f"{c:<24} {_pct(p)} {_pct(r):>6} {n:>4}")
    print("\nconfusion (rows: expected, columns: got, in the order of the rows)")
    print(" " * 24 + " ".join(f"{i:>3}" for i in range(len(cats))))
    for i, exp in enumerate(cats):
        row = " ".join(f"{report.confusion[(exp, got)] or '.':>3}" for got in cats)
        print(f"{i:>2} {exp:<21}{row}")
    if report.misses:
        print("\nmisses:")
        for name_, exp, got in report.misses:
            print(f"  {name_}: expected {exp}, got {got}")


def _print_folds(kind: str, reports: Sequence[Report], labels: Sequence[str]) -> None:
    for i, (r, label) in enumerate(zip(reports, labels, strict=True)):
        print_report(f"fold {i} ({label})", r, details=False)
    all_ = sum(reports, Report())
    print(
        f"{kind}: {all_.correct}/{all_.total} = {all_.accuracy:.1%} right cause, "
        f"{all_.unknown_rate:.1%} unknown"
    )


def main() -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... | head` ends quietly
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test", action="store_true", help="score the TEST split (aggregate only)")
    parser.add_argument(
        "--newtest", action="store_true", help="score round 2's blind NEWTEST split (aggregate only)"
    )
    parser.add_argument(
        "--blind",
        action="append",
        metavar="DIR",
        help="score the blind directory DIR (named in tests/data/diagnose/BLIND) once (aggregate only); "
        "given several times, each and all of them together",
    )
    parser.add_argument(
        "--report", action="store_true", help="with --test/--newtest/--blind: the full report too"
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="the whole non-blind corpus instead of DEV (also for --cv/--rule-cv)",
    )
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="DIR", help="skip this fixture directory too"
    )
    parser.add_argument("--stats", action="store_true", help="corpus size, sources and split")
    parser.add_argument("--cv", type=int, metavar="K", help="k-fold cross-validation by thread on DEV")
    parser.add_argument(
        "--rule-cv", type=int, metavar="K", help="k-fold cross-validation by thread of the rules on DEV"
    )
    args = parser.parse_args()
    exclude = frozenset(args.exclude)
    if args.blind:
        sets = {}
        for name in args.blind:
            if name not in blind_dirs():
                sys.exit(f"--blind {name}: not listed in {BLIND_FILE}; name a directory listed there")
            sets[name] = corpus(only=name)
            if not sets[name]:
                sys.exit(f"--blind {name}: no excerpts in {FIXTURES / name}")
        reports = {name: score(items) for name, items in sets.items()}
        for name, report in reports.items():
            print_report(f"blind {name}", report, details=False)
        if len(sets) > 1 or args.report:
            print_report(f"blind {' + '.join(sets)}", sum(reports.values(), Report()), details=args.report)
        return
    if args.stats:
        items = corpus(exclude=exclude)
        repos = Counter(e.thread.split("#")[0] for e in items)
        sizes = Counter(split_of(e) for e in items)
        print(
            f"{len(items)} excerpts from {len({e.thread for e in items})} threads in {len(repos)} "
            f"repositories; dev {sizes['dev']}, test {sizes['test']}, newtest {sizes['newtest']} "
            f"(round 2: {sum(e.round2 for e in items)} excerpts; blind directories not read: "
            f"{', '.join(sorted(blind_dirs())) or 'none'})"
        )
        for repo, n in repos.most_common(15):
            print(f"  {n:>3} {repo}")
        return
    tune_on = split("all" if args.all else "dev", exclude=exclude)
    if args.cv:
        reports, chosen = cross_validate(tune_on, args.cv)
        _print_folds("cv", reports, [str(t) for t in chosen])
        return
    if args.rule_cv:
        reports, dropped = rule_cross_validate(tune_on, args.rule_cv)
        _print_folds("rule-cv", reports, [f"without {n} signals supported only by it" for n in dropped])
        return
    name = "test" if args.test else "newtest" if args.newtest else "all" if args.all else "dev"
    blind = args.test or args.newtest
    print_report(name, score(split(name, exclude=exclude)), details=not blind or args.report)


if __name__ == "__main__":
    main()
