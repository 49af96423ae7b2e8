"""A second opinion from the words of a log, for what no rule names: logistic regression on its tokens.

The rules (``rules.toml``) name a cause from the wording of one phenomenon. A log whose wording
no rule was written for still *talks about* its cause: a device-node refusal mentions
``render``, ``group`` and ``kfd``; an arch problem mentions ``gfx`` names and ``supported``;
a version problem names two versions and a package. This module weighs those words with a
multinomial logistic regression, trained on the diagnose corpus (``tests/data/diagnose``, the
blind sets excluded) by ``scripts/train_diagnose_words.py`` and shipped as data
(``words.json``: the classes, a bias and per token one weight per class, in hundredths, so it is
read and checked like any other data file, and the engine needs no numerical library).

Why a regression and not naive Bayes (the first model): replayed on the blind rounds with the
rules frozen as they were (``scripts/replay_diagnose_rounds.py``), it named the right cause of
73 % of the logs alone where naive Bayes named 65 %; in the engine the two are within a point
(about 77 % of 385 never-seen logs), and the regression's next likeliest cause, named second,
makes the right cause first or second for 82 % (docs/diagnose-rounds.md, rounds 8 and 9).

What it reads of a log: the last ``TAIL_LINES`` lines (a failed build or run ends at its
failure) and the first ``FATAL_LINES`` lines that look like a fatal error (the engine's
``[[fatal]]`` needles). A corpus excerpt is shorter than that, so training reads the same
lines the engine reads at run time.

Tokens: lower-case words of letters, digits and ``_``, each run of digits written ``#`` (so
``gfx1030`` and ``gfx942`` are both ``gfx#``, ``libamdhip64`` is ``libamdhip#``), plus each
pair of neighbouring words on a line; a document counts a token once (short, repetitive logs).
Only tokens seen in at least ``min_df`` threads are kept, so no thread's own file names or
hashes become evidence.

The engine asks it when its rules leave the log ``unknown`` or name a cause from the shape of
the first fatal error alone, and for a second cause when the rules name none; the thresholds are
in ``engine.Tuning``.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_FILE = Path(__file__).with_name("words.json")
FORMAT = 2
SCALE = 100  # weights are shipped in hundredths
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
    """Per class a bias and, per token, one weight: a log's score for a class is its bias plus the
    weights of the tokens it has; the probabilities are the softmax of the scores.

    ``docs``: how many training threads each class had (what the model was taught, for reports).
    """

    classes: tuple[str, ...]
    bias: tuple[float, ...]
    weights: dict[str, tuple[float, ...]]
    docs: dict[str, int]

    def rank(self, toks: Iterable[str]) -> list[tuple[str, float]]:
        """Every class with its probability, likeliest first; empty when no token is known."""
        known = [self.weights[t] for t in toks if t in self.weights]
        if not known:
            return []
        score = [b + sum(w[i] for w in known) for i, b in enumerate(self.bias)]
        top = max(score)
        exp = [math.exp(s - top) for s in score]
        total = sum(exp)
        return sorted(
            ((c, e / total) for c, e in zip(self.classes, exp, strict=True)), key=lambda cp: (-cp[1], cp[0])
        )

    def telling(self, toks: Iterable[str], category: str) -> list[str]:
        """The tokens that speak most for ``category`` against every other class, best first."""
        if category not in self.classes or len(self.classes) < 2:
            return []
        i = self.classes.index(category)

        def lift(t: str) -> float:
            w = self.weights[t]
            return w[i] - max(x for j, x in enumerate(w) if j != i)

        known = sorted({t for t in toks if t in self.weights}, key=lambda t: (-lift(t), t))
        return [t for t in known if lift(t) > 0]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "scale": SCALE,
            "classes": list(self.classes),
            "docs": dict(sorted(self.docs.items())),
            "bias": [round(b * SCALE) for b in self.bias],
            "weights": {t: [round(x * SCALE) for x in w] for t, w in sorted(self.weights.items())},
        }

    def to_text(self) -> str:
        """The shipped bytes: JSON with one token a line (readable diffs when it is retrained)."""
        data = self.to_json()
        weights = data.pop("weights")
        head = json.dumps(data, sort_keys=True)[:-1]
        rows = ",\n".join(f"{json.dumps(t)}: {json.dumps(w)}" for t, w in weights.items())
        return f'{head}, "weights": {{\n{rows}\n}}}}\n'


def train(
    documents: Sequence[tuple[str, str, frozenset[str]]],
    *,
    l2: float = 0.3,
    steps: int = 400,
    min_df: int = 2,
) -> WordModel:
    """A model from ``(thread, category, tokens)`` triples (training needs numpy; using it does not).

    ``unknown`` is a class like the others: a log that reads like the corpus's unexplained
    failures keeps its ``unknown``. A token is kept when it appears in at least ``min_df``
    distinct threads (any category). Full-batch Adam from zero for a fixed number of ``steps``
    with an L2 penalty ``l2``, weights rounded to hundredths: the same documents give the same
    model, byte for byte (a test checks that the shipped model is current).
    """
    import numpy as np  # only scripts/ and the tests train; the engine reads the model without it

    threads_of: dict[str, set[str]] = {}
    for thread, _, toks in documents:
        for t in toks:
            threads_of.setdefault(t, set()).add(thread)
    vocab = sorted(t for t, ts in threads_of.items() if len(ts) >= min_df)
    column = {t: j for j, t in enumerate(vocab)}
    classes = sorted({category for _, category, _ in documents})
    x = np.zeros((len(documents), len(vocab)))
    y = np.zeros((len(documents), len(classes)))
    for i, (_, category, toks) in enumerate(documents):
        x[i, [column[t] for t in toks if t in column]] = 1.0
        y[i, classes.index(category)] = 1.0
    n = len(documents)
    w, b = np.zeros((len(vocab), len(classes))), np.zeros(len(classes))
    moments = [[np.zeros_like(w), np.zeros_like(w)], [np.zeros_like(b), np.zeros_like(b)]]
    for step in range(1, steps + 1):
        z = x @ w + b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grads = (x.T @ (p - y) / n + l2 * w / n, (p - y).mean(axis=0))
        for param, grad, m in zip((w, b), grads, moments, strict=True):
            m[0] = 0.9 * m[0] + 0.1 * grad
            m[1] = 0.999 * m[1] + 0.001 * grad * grad
            param -= 0.1 * (m[0] / (1 - 0.9**step)) / (np.sqrt(m[1] / (1 - 0.999**step)) + 1e-8)
    rounded = np.round(w * SCALE) / SCALE
    weights = {t: tuple(float(v) for v in rounded[j]) for t, j in column.items() if rounded[j].any()}
    docs = {c: int(v) for c, v in zip(classes, y.sum(axis=0), strict=True)}
    return WordModel(tuple(classes), tuple(float(v) for v in np.round(b * SCALE) / SCALE), weights, docs)


class ModelError(ValueError):
    """``words.json`` is not a model this code can use."""


def from_json(data: Any) -> WordModel:
    """Check and build a model from its JSON form; :class:`ModelError` names what is wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(f"not a format-{FORMAT} word model")
    classes, docs, bias, weights = (data.get(k) for k in ("classes", "docs", "bias", "weights"))
    if data.get("scale") != SCALE:
        raise ModelError(f"'scale' must be {SCALE}")
    if not isinstance(classes, list) or len(classes) < 2 or not all(isinstance(c, str) for c in classes):
        raise ModelError("'classes' must list at least two categories")
    if (
        not isinstance(docs, dict)
        or set(docs) != set(classes)
        or not all(isinstance(n, int) and n > 0 for n in docs.values())
    ):
        raise ModelError("'docs' must give each class its positive thread count")

    def row(value: Any, what: str) -> tuple[float, ...]:
        if (
            not isinstance(value, list)
            or len(value) != len(classes)
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise ModelError(f"{what} must be {len(classes)} integers, one per class")
        return tuple(v / SCALE for v in value)

    if not isinstance(weights, dict) or not weights:
        raise ModelError("'weights' must map tokens to their weights")
    return WordModel(
        tuple(classes),
        row(bias, "'bias'"),
        {t: row(w, f"the weights of {t!r}") for t, w in weights.items()},
        dict(docs),
    )


def load(path: Path = MODEL_FILE) -> WordModel:
    """The shipped model, checked (a damaged file is an error naming it, never a silent guess)."""
    try:
        return from_json(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        why = f"not JSON ({exc})"
    except (OSError, ValueError) as exc:  # unreadable, or not a model (ModelError)
        why = str(exc)
    raise ModelError(f"{path}: {why}; reinstall rocmforge or run scripts/train_diagnose_words.py")
