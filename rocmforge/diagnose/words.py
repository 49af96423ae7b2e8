"""A second opinion from the words of a log, for what no rule names: naive Bayes over its tokens.

The rules (``rules.toml``) name a cause from the wording of one phenomenon. A log whose wording
no rule was written for still *talks about* its cause: a device-node refusal mentions
``render``, ``group`` and ``kfd``; an arch problem mentions ``gfx`` names and ``supported``;
a version problem names two versions and a package. This module weighs those words with a
multinomial naive Bayes model, trained on the diagnose corpus (``tests/data/diagnose``, the
blind sets excluded) by ``scripts/train_diagnose_words.py`` and shipped as data
(``words.json``, counts only, so it is read and checked like any other data file).

What it reads of a log: the last ``TAIL_LINES`` lines (a failed build or run ends at its
failure) and the first ``FATAL_LINES`` lines that look like a fatal error (the engine's
``[[fatal]]`` needles). A corpus excerpt is shorter than that, so training reads the same
lines the engine reads at run time.

Tokens: lower-case words of letters, digits and ``_``, each run of digits written ``#`` (so
``gfx1030`` and ``gfx942`` are both ``gfx#``, ``libamdhip64`` is ``libamdhip#``), plus each
pair of neighbouring words on a line; a document counts a token once (binarised naive Bayes
suits short, repetitive logs). Only tokens seen in at least ``min_df`` threads are kept, so no
thread's own file names or hashes become evidence.

The engine asks it only when its rules leave the log ``unknown`` or name a cause from the shape
of the first fatal error alone; the thresholds are chosen by cross-validation
(``tests/diagnose_eval.py --rule-cv``).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_FILE = Path(__file__).with_name("words.json")
FORMAT = 1
TAIL_LINES = 200  # the last lines of a log: where a failed build or run stops
FATAL_LINES = 64  # lines that look like a fatal error, from the start of the log
_MAX_LINE = 400  # characters of a line that are read (command lines are mostly flags)
_TOKEN = re.compile(r"[a-z0-9_]+")
# A user's name in a home directory (/home/NAME, /Users/NAME, C:\\Users\\NAME) says who filed the
# thread, not what failed: the same person's two threads would teach the model their label.
_HOME = re.compile(r"([/\\\\](?:home|users)[/\\\\])[^/\\\\\s]+")
_DIGITS = re.compile(r"[0-9]+")
# Words that say nothing of a cause, however often they appear.
_STOP = frozenset(
    {"the", "a", "an", "of", "to", "in", "is", "it", "on", "at", "by", "for", "and", "or", "be"}
    | {"as", "this", "that", "with", "from", "was", "were", "are"}
)


def tokens(lines: Iterable[str]) -> frozenset[str]:
    """The tokens of a document (each line's words and neighbouring pairs), each once."""
    out: set[str] = set()
    for line in lines:
        words = []
        for raw in _TOKEN.findall(_HOME.sub(r"\1", line[:_MAX_LINE].lower())):
            word = _DIGITS.sub("#", raw)
            if len(word) < 2 or len(word) > 32 or word.count("#") > 2 or word in _STOP:
                continue
            words.append(word)
        out.update(words)
        out.update(f"{a} {b}" for a, b in itertools.pairwise(words))
    return frozenset(out)


@dataclass
class WordModel:
    """Per category: how many training threads, and in how many of them each token appears.

    The log-probabilities are derived from those counts once, when the model is made.
    """

    docs: dict[str, int]
    counts: dict[str, dict[str, int]]
    alpha: float = 0.5
    min_df: int = 2
    _vocab: frozenset[str] = field(init=False, repr=False, compare=False)
    _logp: dict[str, dict[str, float]] = field(init=False, repr=False, compare=False)
    _unseen: dict[str, float] = field(init=False, repr=False, compare=False)  # a token a category never had
    _prior: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._vocab = frozenset(t for c in self.counts.values() for t in c)
        total = sum(self.docs.values())
        self._logp, self._unseen, self._prior = {}, {}, {}
        for cat, n in self.docs.items():
            tokens_in = self.counts.get(cat, {})
            denominator = sum(tokens_in.values()) + self.alpha * len(self._vocab)
            self._logp[cat] = {t: math.log((c + self.alpha) / denominator) for t, c in tokens_in.items()}
            self._unseen[cat] = math.log(self.alpha / denominator)
            self._prior[cat] = math.log(n / total)

    def rank(self, toks: Iterable[str]) -> list[tuple[str, float]]:
        """Every category with its posterior probability, likeliest first."""
        known = [t for t in toks if t in self._vocab]
        if not known:
            return []
        logp, unseen = self._logp, self._unseen
        score = {
            cat: self._prior[cat] + sum(logp[cat].get(t, unseen[cat]) for t in known) for cat in self.docs
        }
        top = max(score.values())
        weights = {cat: math.exp(s - top) for cat, s in score.items()}
        total = sum(weights.values())
        return sorted(((cat, w / total) for cat, w in weights.items()), key=lambda cw: (-cw[1], cw[0]))

    def telling(self, toks: Iterable[str], category: str) -> list[str]:
        """The tokens that speak most for ``category`` against the other categories, best first."""
        logp, unseen = self._logp, self._unseen
        others = [c for c in self.docs if c != category]
        if not others:
            return []

        def lift(t: str) -> float:
            mine = logp[category].get(t, unseen[category])
            rest = max(logp[c].get(t, unseen[c]) for c in others)
            return mine - rest

        known = sorted({t for t in toks if t in logp[category]}, key=lambda t: (-lift(t), t))
        return [t for t in known if lift(t) > 0]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "alpha": self.alpha,
            "min_df": self.min_df,
            "docs": dict(sorted(self.docs.items())),
            "counts": {cat: dict(sorted(c.items())) for cat, c in sorted(self.counts.items())},
        }


def train(
    documents: Sequence[tuple[str, str, frozenset[str]]], *, alpha: float = 0.5, min_df: int = 2
) -> WordModel:
    """A model from ``(thread, category, tokens)`` triples.

    ``unknown`` is a class like the others: a log that reads like the corpus's unexplained
    failures keeps its ``unknown``.

    A token is kept when it appears in at least ``min_df`` distinct threads (any category).
    """
    threads_of: dict[str, set[str]] = {}
    for thread, _, toks in documents:
        for t in toks:
            threads_of.setdefault(t, set()).add(thread)
    vocab = {t for t, ts in threads_of.items() if len(ts) >= min_df}
    docs: dict[str, int] = {}
    counts: dict[str, dict[str, int]] = {}
    for _, category, toks in documents:
        docs[category] = docs.get(category, 0) + 1
        per = counts.setdefault(category, {})
        for t in toks & vocab:
            per[t] = per.get(t, 0) + 1
    return WordModel(docs, counts, alpha, min_df)


class ModelError(ValueError):
    """``words.json`` is not a model this code can use."""


def from_json(data: Any) -> WordModel:
    """Check and build a model from its JSON form; :class:`ModelError` names what is wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(f"not a format-{FORMAT} word model")
    docs, counts = data.get("docs"), data.get("counts")
    if not isinstance(docs, dict) or not all(isinstance(n, int) and n > 0 for n in docs.values()):
        raise ModelError("'docs' must map categories to positive thread counts")
    if not isinstance(counts, dict) or set(counts) - set(docs):
        raise ModelError("'counts' must map the categories of 'docs' to token counts")
    for cat, per in counts.items():
        if not isinstance(per, dict) or not all(
            isinstance(n, int) and 0 < n <= docs[cat] for n in per.values()
        ):
            raise ModelError(f"counts of {cat!r}: each must be a thread count between 1 and {docs[cat]}")
    alpha, min_df = data.get("alpha"), data.get("min_df")
    if not isinstance(alpha, (int, float)) or alpha <= 0 or not isinstance(min_df, int):
        raise ModelError("'alpha' must be a positive number and 'min_df' an integer")
    return WordModel(docs, counts, float(alpha), min_df)


def load(path: Path = MODEL_FILE) -> WordModel:
    """The shipped model, checked (a damaged file is an error naming it, never a silent guess)."""
    try:
        return from_json(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        why = f"not JSON ({exc})"
    except (OSError, ValueError) as exc:  # unreadable, or not a model (ModelError)
        why = str(exc)
    raise ModelError(f"{path}: {why}; reinstall rocmforge or run scripts/train_diagnose_words.py")
