"""``python -m rocmforge diagnose LOG``: the cause of a failed build or run, and the fix.

A failed PyTorch build log runs to tens of thousands of lines (hundreds of MB with verbose
compile commands): parallel jobs interleave, tools colour their output, progress bars redraw one
line with ``\\r``, and the first real error is followed by a cascade of consequences (``ninja:
build stopped``, ``make: *** Error 1``, ``Failed building wheel``). This module reads the log
once, in blocks, and:

1. finds the lines worth reading: every rule declares literal *needles*, and all of them are
   searched for at once (Aho-Corasick) in each lower-cased block; only those lines are decoded
   and cleaned (ANSI colours removed, ``\\r`` redraws reduced to what the terminal showed),
   keeping the file's own line numbers, so ``sed -n 1234p LOG`` shows the evidence;
2. finds the *first fatal error* and its family (compiler, linker, loader, CMake, Python
   import, Python, HIP runtime, out of memory, network), independently of any cause;
3. matches *signals*: patterns for one phenomenon each (a compiler killed by the kernel, a
   linker that cannot find ``-lX``, a CMake package that is not found), each voting for one
   category with a weight and capturing what it names (the library, the arch, the program);
4. collects *facts* about the whole log (compilers and versions, ROCm version, the torch
   version, whether pip built in an isolated environment, ``MAX_JOBS``);
5. weighs the votes (with the first fatal error's line and family), then lets the facts change
   the reading where a ROCm engineer would (``CUDA_HOME is not set`` inside pip's isolated
   environment with a non-ROCm torch means the isolation pulled the wrong torch, not that the
   project needs CUDA), and names a second cause when the log shows one on other lines;
6. writes a hint from what the log names, pointing at the lines; for an ``unknown`` log, the
   first fatal error and the next step for its family.

The rules (signals, fatal-error shapes, facts, follow-ups, categories and families) are data, in
``diagnose/rules.toml`` next to this file; the categories and what each means are defined in
``docs/diagnose.md``. ``retry_plan`` turns the two mechanical categories into a changed build
environment when the user enabled that in ``build.retry``.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, BinaryIO

import ahocorasick_rs

from rocmforge.diagnose import words
from rocmforge.diagnose.text import terminal_text
from rocmforge.errors import UserError
from rocmforge.fsutil import looks_binary, refuse_special

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from rocmforge.config import Config


RULES_FILE = Path(__file__).with_name("rules.toml")
# Below this score nothing in the log is a known failure: the category is ``unknown``.
MIN_SCORE = 5.0
# From this score on, the category rests on a rule for the very phenomenon (specific signals
# weigh 6 to 10, family signals 5): its confidence is "high".
HIGH_SCORE = 8.0
MAX_EVIDENCE = 5
# What a low-confidence answer is worth, said where it is printed: on the blind rounds, each with
# its engine as frozen, 108 of 301 such answers named the thread's cause, against 832 of 864 high
# ones (scripts/replay_diagnose_rounds.py; docs/diagnose.md, "How far each confidence can be
# trusted").
LOW_TRUST = ": a guess, right about one time in three on logs never seen before; check its lines"
# How an unknown whose first fatal error lies outside every category (a full disk, a GPU out of
# memory, vLLM refusing a model) begins its hint, before that failure's own next step.
OUTSIDE = "a failure outside the known build causes: "
_MAX_LINE = 4000  # characters of one line looked at; minified blobs are not evidence
_MAX_HITS_PER_SIGNAL = 3


@dataclass(frozen=True)
class Evidence:
    """One line of the log (1-based, as ``sed -n Np`` counts) that supports the diagnosis."""

    line: int
    text: str


@dataclass(frozen=True)
class FirstError:
    """The first line of the log that reports a fatal error, and the kind of tool it came from."""

    line: int
    text: str
    family: str  # one of RULES.family_names: compiler, linker, loader, cmake, ...
    fallback: str = ""  # the cause this shape of line alone shows, if any (see diagnose/rules.toml)
    also: str = ""  # the cause that often shows the same way, named second with the fallback


@dataclass(frozen=True)
class Cause:
    """A cause other than the main one, with its own lines.

    ``basis``: ``lines`` when the log shows this cause too (or its lines are as often this cause's),
    ``words`` when it is only the word model's next likeliest cause, to check if the first is wrong,
    ``shape`` when it is only what the first fatal error's shape most often means, given second
    to an ``unknown`` whose words read like a failure outside every category.
    """

    category: str
    hint: str
    evidence: tuple[Evidence, ...] = ()
    basis: str = "lines"


@dataclass(frozen=True)
class Diagnosis:
    """What failed (one of ``CATEGORIES``), what to do about it, and the lines that show it.

    ``first_error`` is the log's first fatal error and its family, found independently of the
    cause (it is there for ``unknown`` too); ``secondary`` is a second cause the log shows as
    well, or the one that most often shows the same way, or else the word model's next likeliest
    cause (``basis`` says which), when there is one. ``confidence`` says
    what the category rests on: ``high`` a rule for this very phenomenon, ``medium`` only
    wordings of its family (or weaker rules together), ``low`` only the shape and family of the
    first fatal error (the most likely cause of such a line), ``none`` for ``unknown``.
    """

    category: str
    hint: str
    evidence: tuple[Evidence, ...] = ()
    first_error: FirstError | None = None
    secondary: Cause | None = None
    confidence: str = "none"

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (fields are only ever added)::

        {"category", "hint", "evidence": [{"line", "text"}],
         "first_error": {"line", "text", "family"} or null,
         "secondary": {"category", "hint", "evidence", "basis": "lines" | "words" | "shape"} or null,
         "confidence": "high" | "medium" | "low" | "none"}
        """
        first = self.first_error
        second = self.secondary
        return {
            "category": self.category,
            "hint": self.hint,
            "evidence": _evidence_json(self.evidence),
            "first_error": None
            if first is None
            else {"line": first.line, "text": first.text, "family": first.family},
            "secondary": None
            if second is None
            else {
                "category": second.category,
                "hint": second.hint,
                "evidence": _evidence_json(second.evidence),
                "basis": second.basis,
            },
            "confidence": self.confidence,
        }


def _evidence_json(evidence: tuple[Evidence, ...]) -> list[dict[str, Any]]:
    return [{"line": e.line, "text": e.text} for e in evidence]


# --- reading --------------------------------------------------------------------------------

# What parallel builds, CI systems and containers put in front of a tool's own output:
# timestamps, docker build step timers, nix/bazel package prefixes, sub-project labels.
_PREFIX = re.compile(
    r"^(?:\s*(?:\d{4}-\d\d-\d\dT[\d:.,]+Z?|\d\d:\d\d:\d\d(?:[.,]\d+)?|#\d+ \d+\.\d+|\d+\.\d+(?= )"
    r"|[\w.+-]+> |\[[\w .:+/-]{1,40}\](?::)?(?= ))\s*)+"
)


def iter_lines(stream: Iterable[bytes | str]) -> Iterator[tuple[int, str]]:
    """``(line number, cleaned text)`` for each line of a log (see :func:`clean`).

    Numbers count ``\\n`` lines of the file, so they match ``sed``/editors even when the file
    has progress redraws.
    """
    for number, raw in enumerate(stream, 1):
        yield number, clean(raw)


def body(line: str) -> str:
    """The tool's own text of a log line, without timestamps and job/package prefixes."""
    return _PREFIX.sub("", line, count=1).strip()


# --- signals --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signal:
    """One phenomenon a log line can show, the category it points to, and how strongly.

    Named groups in ``pattern`` (``lib``, ``arch``, ``prog``, ``pkg``, ``header``, ``symbol``,
    ``url``, ``var``, ``version``) are captured as details for the hint. ``unless`` is a
    pattern that, on the same line, means something else is going on. ``example`` is a line
    the pattern must match (checked by a test for every rule).
    """

    name: str
    needles: tuple[str, ...]  # lower-case text every match contains (one of): a cheap first test
    category: str
    weight: float
    pattern: re.Pattern[str]
    unless: re.Pattern[str] | None = None
    family: str = ""
    example: str = ""
    also: str = ""  # a second cause that often shows the same way (named when no other shows)
    examples: tuple[str, ...] = ()  # every line it must match: ``example`` and the other wordings
    # The next step this phenomenon calls for where its category's usual one is wrong (a version
    # mismatch found while compiling: match the source's release, do not rebuild).
    fix: str = ""


@dataclass(frozen=True)
class LineRule:
    """A shape of line that is not a cause by itself: a fatal error of some family, or a fact."""

    name: str
    needles: tuple[str, ...]
    pattern: re.Pattern[str]
    unless: re.Pattern[str] | None
    family: str  # for a fact: ""
    example: str
    fallback: str = ""  # fatal rules only: the cause this shape alone shows, if any
    also: str = ""  # fatal rules only: the cause that often shows the same way as the fallback
    examples: tuple[str, ...] = ()  # every line it must match: ``example`` and other wordings
    # fatal rules only: the failure this shape shows lies outside every category (a full disk);
    # as the first fatal error (or the message under it) it leaves the log ``unknown`` with this
    # next step ({line} filled in), whatever a later error's shape or the words would guess.
    outside: str = ""
    # fatal rules only: a line that is not fatal by itself, read only under a first fatal error of
    # this family (CMake's message under its "CMake Error at ...:" line).
    under: str = ""


@dataclass(frozen=True)
class Rules:
    """The contents of ``diagnose/rules.toml``, validated and compiled."""

    categories: tuple[str, ...]  # the causes, then "unknown"
    family_names: tuple[str, ...]
    next_steps: Mapping[str, str]  # family -> the generic next step ({line} is filled in)
    retryable: tuple[str, ...]
    families: Mapping[str, str]  # category -> the kind of tool whose failure usually shows it
    signals: tuple[Signal, ...]
    follow_up_needles: tuple[str, ...]
    follow_up: re.Pattern[str]
    follow_up_examples: tuple[str, ...]
    fatal: tuple[LineRule, ...]
    facts: tuple[LineRule, ...]


_MACRO = re.compile(r"<<(\w+)>>")
_SIGNAL_KEYS = {"name", "category", "weight", "needles", "pattern", "unless", "family", "example", "also"} | {
    "fix"
}
_FATAL_ONLY = {"family", "fallback", "also", "outside", "under"}
_LINE_RULE_KEYS = {"name", "needles", "pattern", "unless", "example"} | _FATAL_ONLY


def load_rules(path: Path = RULES_FILE) -> Rules:
    """Read and check the rules file; a mistake in it is a bug, reported with the rule's name."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    categories = data["categories"]
    family_names = tuple(data["families"])
    next_steps = {f: spec["next_step"] for f, spec in data["families"].items()}
    macros = data.get("macros", {})
    for c, spec in categories.items():
        if spec.get("family") not in family_names:
            raise ValueError(f"{path}: category {c}: family {spec.get('family')!r} not in {family_names}")

    def compile_(text: str, where: str, flags: int = 0) -> re.Pattern[str]:
        def expand(m: re.Match[str]) -> str:
            if m.group(1) not in macros:
                raise ValueError(f"{path}: {where}: unknown macro <<{m.group(1)}>>")
            return macros[m.group(1)]

        return re.compile(_MACRO.sub(expand, text), flags)

    def examples(spec: dict[str, Any]) -> tuple[str, ...]:
        # `example` is one line, or a list of the wordings of a family (the first is shown).
        value = spec.get("example", "")
        return (value,) if isinstance(value, str) else tuple(value)

    signals = []
    for spec in data["signal"]:
        name = spec.get("name", "?")
        if set(spec) - _SIGNAL_KEYS or not {"name", "category", "weight", "needles", "pattern"} <= set(spec):
            raise ValueError(f"{path}: signal {name}: keys {sorted(spec)}; allowed {sorted(_SIGNAL_KEYS)}")
        if spec["category"] not in categories or spec.get("also", spec["category"]) not in categories:
            raise ValueError(f"{path}: signal {name}: unknown category in {spec['category']!r}/also")
        if spec.get("family", family_names[0]) not in family_names:
            raise ValueError(f"{path}: signal {name}: family {spec['family']!r} not in {family_names}")
        if any(n != n.lower() for n in spec["needles"]) or not spec["needles"]:
            raise ValueError(f"{path}: signal {name}: needles must be lower-case, at least one")
        signals.append(
            Signal(
                name,
                tuple(spec["needles"]),
                spec["category"],
                float(spec["weight"]),
                # A phenomenon's words come in every casing ("Invalid device function", "No HIP
                # GPUs", "no hip gpus"); its needles are lower-case already.
                compile_(spec["pattern"], f"signal {name}", re.IGNORECASE),
                compile_(spec["unless"], f"signal {name}", re.IGNORECASE) if "unless" in spec else None,
                spec.get("family", categories[spec["category"]]["family"]),
                examples(spec)[0],
                spec.get("also", ""),
                examples(spec),
                spec.get("fix", ""),
            )
        )
    if len({s.name for s in signals}) != len(signals):
        raise ValueError(f"{path}: two signals share a name")

    def line_rules(kind: str, with_family: bool) -> tuple[LineRule, ...]:
        out = []
        for spec in data[kind]:
            name = spec.get("name", "?")
            required = {"name", "needles", "pattern", "example"} | ({"family"} if with_family else set())
            allowed = _LINE_RULE_KEYS if with_family else _LINE_RULE_KEYS - _FATAL_ONLY
            if set(spec) - allowed or not required <= set(spec):
                raise ValueError(f"{path}: {kind} {name}: keys {sorted(spec)}; allowed {sorted(allowed)}")
            if with_family and spec["family"] not in family_names:
                raise ValueError(f"{path}: {kind} {name}: family {spec['family']!r} not in {family_names}")
            if any(n != n.lower() for n in spec["needles"]) or not spec["needles"]:
                raise ValueError(f"{path}: {kind} {name}: needles must be lower-case, at least one")
            for key in ("fallback", "also"):
                if spec.get(key, "") not in ("", *categories):
                    raise ValueError(f"{path}: {kind} {name}: unknown {key} {spec[key]!r}")
            if "outside" in spec and (spec.get("fallback") or not isinstance(spec["outside"], str)):
                raise ValueError(f"{path}: {kind} {name}: `outside` is a next step, and excludes a fallback")
            if "under" in spec and (spec["under"] not in family_names or "outside" not in spec):
                raise ValueError(f"{path}: {kind} {name}: `under` names a family, with `outside`")
            out.append(
                LineRule(
                    name,
                    tuple(spec["needles"]),
                    compile_(spec["pattern"], f"{kind} {name}"),
                    compile_(spec["unless"], f"{kind} {name}") if "unless" in spec else None,
                    spec.get("family", ""),
                    examples(spec)[0],
                    spec.get("fallback", ""),
                    spec.get("also", ""),
                    examples(spec),
                    spec.get("outside", ""),
                    spec.get("under", ""),
                )
            )
        return tuple(out)

    follow = data["follow_up"]
    return Rules(
        categories=(*categories, "unknown"),
        family_names=family_names,
        next_steps=MappingProxyType(next_steps),
        retryable=tuple(c for c, spec in categories.items() if spec.get("retryable")),
        families=MappingProxyType({c: spec["family"] for c, spec in categories.items()}),
        signals=tuple(signals),
        follow_up_needles=tuple(follow["needles"]),
        follow_up=compile_("|".join(follow["patterns"]), "follow_up"),
        follow_up_examples=tuple(follow.get("examples", ())),
        fatal=line_rules("fatal", True),
        facts=line_rules("fact", False),
    )


RULES = load_rules()
CATEGORIES = RULES.categories
# Categories whose fix is mechanical and safe enough to retry automatically (``build.retry``).
RETRYABLE = RULES.retryable
SIGNALS = RULES.signals
_FOLLOW_UP_NEEDLES = RULES.follow_up_needles
_FOLLOW_UP = RULES.follow_up


def _is_follow_up(text: str, low: str | None = None) -> bool:
    """A consequence line (``ninja: build stopped``, ``make: *** ... Error 1``): never evidence.

    ``low``: the line in lower case, when already made (the needles come first: most lines
    hold none of them, and only those that do are stripped of their prefix and matched).
    """
    low = text.lower() if low is None else low
    return any(n in low for n in _FOLLOW_UP_NEEDLES) and _FOLLOW_UP.search(body(text)) is not None


# What the facts and hints read off the log besides signals: the compilers and their versions,
# the ROCm and torch versions, MAX_JOBS, the gfx targets. Each is looked for until it is found
# (the archs: until 16 are found or 64 lines named some), so after the first few lines of a
# log none of them costs anything.
_COMPILER_ID = re.compile(
    r"The (?:C|CXX|HIP) compiler identification is (?P<name>GNU|Clang|AppleClang) (?P<version>[\d.]+)|"
    r"^(?P<name2>gcc|g\+\+|cc|c\+\+)(?:-\d+)? \([^)]*\) (?P<version2>\d+\.\d+\.\d+)|"
    r"(?P<name3>AMD clang|clang) version (?P<version3>\d+[\d.]*)|"
    r"GCC version: \([^)]*\) (?P<version4>[\d.]+)|C\+\+ compiler version\s*:\s*(?P<version5>[\d.]+)"
)
_COMPILER_NEEDLES = (
    "compiler identification", "gcc (", "g++ (", "cc (", "c++ (", "gcc-", "g++-", "clang version",
    "gcc version:", "c++ compiler version",
)  # fmt: skip
_ROCM_VERSION = re.compile(
    r"/opt/rocm-(?P<v>\d+\.\d+(?:\.\d+)?)|\+rocm(?P<v2>\d+\.\d+(?:\.\d+)?)|HIP VERSION: (?P<v3>\d+\.\d+)|"
    r"ROCM_VERSION_DEV: (?P<v4>[\d.]+)|ROCm (?:Version )?(?P<v5>\d+\.\d+(?:\.\d+)?)"
)
_ROCM_NEEDLES = ("/opt/rocm-", "+rocm", "hip version:", "rocm_version_dev:", "rocm ")
_TORCH_VERSION = re.compile(
    r"torch(?:==|\.__version__\s*=\s*|-)(?P<v>\d+\.\d+(?:\.\d+)?(?:[\w.]*\+[\w.]+|\.dev\w+|a0\+\w+)?)"
)
_TORCH_NEEDLES = ("torch==", "torch.__version__", "torch-")
_JOBS = re.compile(
    r"MAX_JOBS=(?P<n>\d+)|cmake --build .* (?:-j|--parallel)\s*(?P<n2>\d+)|\bninja .*-j\s*(?P<n3>\d+)"
)
_JOBS_NEEDLES = ("max_jobs=", "cmake --build", "ninja ")
_ARCH = re.compile(r"\bgfx(?:\d{3,4}|9[0-4][0-9a-c]|90[ac])[a-z0-9]*\b")
_ARCH_LINES = 64  # lines naming a gfx target that are read for the list of targets
_SEEN_LINES = 4096  # distinct candidate lines remembered, so that repeats only count again
# Lines after the first fatal error that are read for a shape outside every category: CMake prints
# its message under "CMake Error at ...:" (the package that was not found, the missing compiler).
_UNDER_FIRST = 8


def _search(text: str, low: str, needles: tuple[str, ...], pattern: re.Pattern[str]) -> re.Match[str] | None:
    """``pattern.search(text)`` when one of ``needles`` is in the lower-cased line, else None."""
    return pattern.search(text) if any(n in low for n in needles) else None


@dataclass
class _Hit:
    signal: Signal
    line: int
    text: str
    details: dict[str, str]


@dataclass
class _Reading:
    """What one pass over a log found: signal hits, the first fatal error and whole-log facts."""

    hits: dict[str, list[_Hit]] = field(default_factory=dict)  # signal name -> first hits
    counts: dict[str, int] = field(default_factory=dict)  # signal name -> all hits
    facts: set[str] = field(default_factory=set)
    compilers: dict[str, str] = field(default_factory=dict)  # "gcc"/"clang" -> version
    rocm_version: str | None = None
    torch_version: str | None = None
    jobs: str | None = None
    archs: list[str] = field(default_factory=list)
    arch_lines: int = 0
    first_error: FirstError | None = None
    # The first fatal error whose shape has a likely cause (a fallback): the first fatal error
    # itself, or a later one when the first is a generic "error:" (pip's "ERROR: Exception:").
    first_shaped: FirstError | None = None
    # The first fatal error, or a line of the message under it, when its shape shows a failure
    # outside every category (a full disk), and that shape's next step.
    outside: FirstError | None = None
    outside_step: str = ""
    first_follow_up: tuple[int, str] | None = None
    lines: int = 0
    # For the word model (diagnose/words.py): the first lines shaped like a fatal error, and the
    # log's last bytes (where a failed build or run stops), read only if the rules need a
    # second opinion.
    fatal_lines: list[tuple[int, str]] = field(default_factory=list, repr=False)
    tail: bytes = field(default=b"", repr=False)
    seen: dict[str, list[tuple[Signal, dict[str, str]]]] = field(default_factory=dict, repr=False)

    def add_hit(self, sig: Signal, number: int, text: str, details: dict[str, str]) -> None:
        self.counts[sig.name] = self.counts.get(sig.name, 0) + 1
        hits = self.hits.setdefault(sig.name, [])
        if len(hits) < _MAX_HITS_PER_SIGNAL:
            hits.append(_Hit(sig, number, text, details))

    def wanted(self) -> frozenset[str]:
        """The needles of what is still being looked for (facts and details not yet found)."""
        out = {n for fact in RULES.facts if fact.name not in self.facts for n in fact.needles}
        if len(self.compilers) < 2:
            out.update(_COMPILER_NEEDLES)
        if self.rocm_version is None:
            out.update(_ROCM_NEEDLES)
        if self.torch_version is None:
            out.update(_TORCH_NEEDLES)
        if self.jobs is None:
            out.update(_JOBS_NEEDLES)
        if len(self.archs) < 16 and self.arch_lines < _ARCH_LINES:
            out.add("gfx")
        return frozenset(out)

    def note_facts(self, text: str, low: str) -> None:
        """Record what this line says about the whole log; each check runs until it succeeds."""
        for fact in RULES.facts:
            if (
                fact.name not in self.facts
                and any(n in low for n in fact.needles)
                and fact.pattern.search(text)
            ):
                self.facts.add(fact.name)
        if len(self.compilers) < 2 and (m := _search(text, low, _COMPILER_NEEDLES, _COMPILER_ID)):
            name = m.group("name") or m.group("name2") or m.group("name3") or "GNU"
            version = next(v for k, v in m.groupdict().items() if k.startswith("version") and v)
            self.compilers.setdefault("clang" if "lang" in name else "gcc", version)
        if self.rocm_version is None and (m := _search(text, low, _ROCM_NEEDLES, _ROCM_VERSION)):
            self.rocm_version = next(v for v in m.groups() if v)
        if self.torch_version is None and (m := _search(text, low, _TORCH_NEEDLES, _TORCH_VERSION)):
            self.torch_version = m.group("v")
        if self.jobs is None and (m := _search(text, low, _JOBS_NEEDLES, _JOBS)):
            self.jobs = next(v for v in m.groups() if v)
        if "gfx" in low and len(self.archs) < 16 and self.arch_lines < _ARCH_LINES:
            self.arch_lines += 1
            for arch in _ARCH.findall(text):
                if arch not in self.archs:
                    self.archs.append(arch)

    def read_line(self, number: int, text: str) -> None:
        """Everything one (cleaned) line says: facts, follow-up, first fatal error, signals."""
        # Parallel jobs repeat the same lines; what a text says does not change, so a line seen
        # before only counts again.
        seen = self.seen.get(text)
        if seen is not None:
            for sig, details in seen:
                self.add_hit(sig, number, text, details)
            return
        if len(self.seen) >= _SEEN_LINES:
            self.seen.clear()
        self.seen[text] = found = []
        low = text.lower()
        self.note_facts(text, low)
        if _is_follow_up(text, low):
            if self.first_follow_up is None:
                self.first_follow_up = (number, text)
            return
        core = None
        if len(self.fatal_lines) < words.FATAL_LINES and _FATAL_AC.find_matches_as_indexes(low.encode()):
            self.fatal_lines.append((number, text))
        first = self.first_error
        under_first = first is not None and self.outside is None and number - first.line <= _UNDER_FIRST
        if self.first_shaped is None or under_first:
            for rule in RULES.fatal:
                if rule.under and not (under_first and first.family == rule.under):
                    continue  # a message line, read only under its family's first fatal error
                if any(n in low for n in rule.needles):
                    core = body(text) if core is None else core
                    if rule.pattern.search(core) and not (rule.unless and rule.unless.search(core)):
                        found_error = FirstError(number, text, rule.family, rule.fallback, rule.also)
                        if first is None:
                            self.first_error = found_error
                        if rule.outside and (first is None or rule.under):
                            self.outside, self.outside_step = found_error, rule.outside
                        if rule.fallback and self.first_shaped is None:
                            self.first_shaped = found_error
                        break
        tried: set[str] = set()
        present = {i for i, _, _ in _SIGNAL_NEEDLES.find_matches_as_indexes(low.encode(), overlapping=True)}
        for needle in (_NEEDLES[i] for i in sorted(present)):
            core = body(text) if core is None else core
            for sig in _BY_NEEDLE[needle]:
                if sig.name in tried:
                    continue
                tried.add(sig.name)
                m = sig.pattern.search(core)
                if m is not None and not (sig.unless and sig.unless.search(core)):
                    # "lib2", "version3": the same detail named in another alternative.
                    details = {k.rstrip("0123456789"): v for k, v in m.groupdict().items() if v}
                    found.append((sig, details))
                    self.add_hit(sig, number, text, details)


# needle -> the signals it lets through.
_BY_NEEDLE: dict[str, list[Signal]] = {}
for _s in SIGNALS:
    for _n in _s.needles:
        _BY_NEEDLE.setdefault(_n, []).append(_s)
_NEEDLES = tuple(_BY_NEEDLE)
# The signals' needles alone: which of them a candidate line holds, found in one search.
_SIGNAL_NEEDLES = ahocorasick_rs.BytesAhoCorasick([n.encode() for n in _NEEDLES])
# Needles that make a line worth reading whatever has been found so far.
_FATAL_NEEDLES = tuple(dict.fromkeys(n for rule in RULES.fatal for n in rule.needles))
_FATAL_AC = ahocorasick_rs.BytesAhoCorasick([n.encode() for n in _FATAL_NEEDLES])
_ALWAYS = frozenset((*_NEEDLES, *_FOLLOW_UP_NEEDLES, *_FATAL_NEEDLES))


@functools.lru_cache(maxsize=64)
def _automaton(wanted: frozenset[str]) -> ahocorasick_rs.BytesAhoCorasick:
    """One automaton for every needle still of use: candidate lines are found in one pass."""
    needles = sorted(_ALWAYS | wanted)
    return ahocorasick_rs.BytesAhoCorasick(
        [n.encode() for n in needles], implementation=ahocorasick_rs.Implementation.DFA
    )


_CHUNK = 1 << 23  # bytes read at once: memory stays flat whatever the log's size
_TAIL_BYTES = words.TAIL_LINES * 512  # enough for the word model's last lines
_ANSI_BYTES = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def clean(raw: bytes | str) -> str:
    """:func:`terminal_text`, cut to the characters the rules read."""
    return terminal_text(raw)[:_MAX_LINE]


def read_chunks(chunks: Iterable[bytes]) -> _Reading:
    """One pass over a log given as byte blocks (any sizes): every signal hit and the facts.

    Each block is lower-cased once and searched for every needle at once (Aho-Corasick); only
    the lines that contain one are decoded and read by :meth:`_Reading.read_line`. Lines are
    numbered by their ``\\n``, as ``sed -n Np`` counts them.
    """
    reading = _Reading()
    number = 0  # lines before the current block
    tail = b""
    for block in chunks:
        if not block:
            continue
        data = tail + block
        if b"\x1b" in data:  # colour codes could split a needle; newlines are kept, so are numbers
            data = _ANSI_BYTES.sub(b"", data)
        end = data.rfind(b"\n") + 1
        if end == 0:  # no line ends in this block yet; keep at most one long line's head
            tail = data[: _MAX_LINE * 8]
            continue
        tail = data[end:]
        number = _read_block(reading, data, end, number)
        reading.tail = (reading.tail + data[max(0, end - _TAIL_BYTES) : end])[-_TAIL_BYTES:]
    if tail:
        number = _read_block(reading, tail + b"\n", len(tail) + 1, number)
        reading.tail = (reading.tail + tail + b"\n")[-_TAIL_BYTES:]
    reading.lines = number
    return reading


def _read_block(reading: _Reading, data: bytes, end: int, number: int) -> int:
    """Read the candidate lines of ``data[:end]`` (whole lines); return the line count after it."""
    low = data.lower()
    wanted = reading.wanted()
    done = 0  # where the next line to read starts
    counted, at = 0, number  # newlines are counted up to `counted`, which is line `at` + 1
    while done < end:
        base = done
        rescan = False
        for _, start, _ in _automaton(wanted).find_matches_as_indexes(low[base:end] if base else low):
            start += base
            if start >= end:  # in the unfinished line after the block: read with the next one
                break
            if start < done:
                continue
            first = low.rfind(b"\n", 0, start) + 1
            last = low.find(b"\n", start)
            at += low.count(b"\n", counted, first)
            counted = first
            reading.read_line(at + 1, clean(data[first:last]))
            done = last + 1
            if reading.wanted() != wanted:  # something was found: search the rest without its needles
                wanted = reading.wanted()
                rescan = True
                break
        if not rescan:
            break
    return at + low.count(b"\n", counted, end)


# --- weighing -------------------------------------------------------------------------------


def _scores(reading: _Reading) -> dict[str, float]:
    """Each category's weight of evidence: its strongest signal, plus half of the others.

    A signal counts once however often it repeats (parallel jobs repeat the same error), with
    a small bonus for repetition so that a failure seen in many jobs outweighs a stray line.
    """
    by_category: dict[str, list[float]] = {}
    for name, hits in reading.hits.items():
        sig = hits[0].signal
        weight = sig.weight + min(1.0, math.log10(reading.counts[name]))
        by_category.setdefault(sig.category, []).append(weight)
    return {cat: max(ws) + 0.5 * (sum(ws) - max(ws)) for cat, ws in by_category.items()}


def _reconsider(scores: dict[str, float], reading: _Reading) -> dict[str, str]:
    """Change the reading where the whole log says what a line alone cannot.

    Returns ``{category: why}`` for categories that gained weight from the facts, so the hint
    can say why.
    """
    facts = reading.facts
    has = reading.hits.__contains__
    why: dict[str, str] = {}

    def move(src: str, dst: str, bonus: float, reason: str) -> None:
        scores[dst] = scores.get(dst, 0.0) + scores.pop(src, 0.0) + bonus
        why[dst] = reason

    if has("hipcc-clang-missing"):
        # hipcc looks for nvcc before it settles on AMD: its "nvcc: not found" is that probe, not
        # a build asking for CUDA; the ROCm clang it then cannot run is the failure.
        scores.pop("cuda_check_on_rocm", None)

    oom_kill = any(
        has(n)
        for n in (
            "killed-signal",
            "ice-killed",
            "signal-9",
            "vm-exhausted",
            "out-of-memory-allocating",
            "llvm-oom",
            "oom-killer",
        )
    ) or (reading.first_error is not None and reading.first_error.family == "oom")
    if oom_kill and "compiler_crash" in scores:
        # A compiler killed for memory prints a crash banner too; the kill is the cause (and so
        # is memory running out when that is the log's first fatal error).
        move("compiler_crash", "oom_compiler", 0.0, "the compiler was killed for lack of memory")
    elif "compiler_crash" in scores and "oom_compiler" in scores and _signal_death_only(reading):
        # A compiler that crashes on its own prints a report (stack dump, backtrace, "PLEASE
        # submit"); one that only "failed due to signal" was stopped from outside, and with the
        # log showing memory running out, that was the memory.
        move(
            "compiler_crash",
            "oom_compiler",
            0.0,
            "the compiler died of a signal without a crash report while memory ran out",
        )

    # In pip's isolated build env the only torch is the one pip put there (PyPI's CUDA or CPU
    # build) or none, so a missing torch or a CUDA check there is a symptom of the isolation,
    # unless the log shows the build really saw a ROCm torch.
    rocm_torch = "rocm" in (reading.torch_version or "")
    isolated_torch = "isolated" in facts and (
        has("isolated-no-torch")
        or has("isolation-collects-torch")
        or has("isolated-no-rocm")
        or has("isolated-module-missing")
        or has("build-requires-hook-failed")
        or "cuda_torch" in facts
        or ("cuda_check_on_rocm" in scores and not rocm_torch)
    )
    if isolated_torch:
        scores["build_isolation_torch"] = scores.get("build_isolation_torch", 0.0) + 6.0
        if "cuda_check_on_rocm" in scores:
            move(
                "cuda_check_on_rocm",
                "build_isolation_torch",
                0.0,
                "pip's isolated build env has no ROCm torch",
            )
        why.setdefault("build_isolation_torch", "pip built in an isolated environment")
    elif "cuda_check_on_rocm" in scores and "rocm" in facts:
        scores["cuda_check_on_rocm"] += 4.0
        why["cuda_check_on_rocm"] = "the log shows a ROCm build"

    if "hipify" in scores and "rocm" in facts:
        scores["hipify"] += 3.0
        why["hipify"] = "the failing compile is a HIP compile"

    if "network_fetch" in scores and has("downloading") and len(reading.hits) > 1:
        # "downloading X" right before an error makes that error the download's.
        scores["network_fetch"] += 2.0

    first = reading.first_error
    compiling = first is not None and first.family in ("compiler", "cmake", "linker")
    if (
        "gfx_override" in facts
        and "arch_unsupported" in scores
        and scores["arch_unsupported"] < HIGH_SCORE
        and not compiling
    ):
        # A GPU "not supported" in a log that overrides the gfx version is a program running on
        # a GPU its binaries were not built for (docs: at run time that is arch_mismatch); a rule
        # for a compiler or library refusing a target (score 8 and more) still wins, and so does
        # a build that failed compiling (build time: arch_unsupported).
        move(
            "arch_unsupported",
            "arch_mismatch",
            0.0,
            "the program runs on a GPU its binaries lack (HSA_OVERRIDE_GFX_VERSION is in play)",
        )

    if "device_permission" in scores and "no_gpu_visible" in scores:
        # "No GPU" is what a runtime that may not open /dev/kfd reports: with a line saying the
        # device nodes are refused, that refusal is the cause.
        move("no_gpu_visible", "device_permission", 0.0, "the GPU is there but its device nodes are refused")
    if "runtime" in facts and "no_gpu_visible" in scores and "arch_not_specified" in scores:
        # "Failed to get device count" while running means no GPU, not a build without archs.
        move("arch_not_specified", "no_gpu_visible", 0.0, "the error comes from a running program")
    return why


# What a compiler prints when it crashes by itself, as opposed to being killed from outside.
_CRASH_REPORT = (
    "ice",
    "exec-aborted",
    "submit-bug-report",
    "stack-dump",
    "compiler-backtrace",
    "llvm-signal-handler",
    "llvm-error",
    "compiler-segfault",
)


def _signal_death_only(reading: _Reading) -> bool:
    """The compiler died of a signal ("failed due to signal") and printed no crash report."""
    died = any(
        "due to signal" in h.text
        for n in ("frontend-crash", "command-failed-signal")
        for h in reading.hits.get(n, ())
    )
    return died and not any(n in reading.hits for n in _CRASH_REPORT)


def _first_line(reading: _Reading, category: str) -> int:
    return min(h.line for hits in reading.hits.values() for h in hits if h.signal.category == category)


@dataclass(frozen=True)
class Tuning:
    """How the evidence is weighed: the numbers cross-validation chooses (tests/diagnose_eval.py).

    ``min_score``: below it a category is not named (``unknown``). ``at_first_error``: added to
    a category with a line at the log's first fatal error or within ``window`` lines after it
    (CMake and pip print the message under the line that says "error"). ``same_family``:
    added to a category whose family is the first fatal error's.
    """

    min_score: float = 5.0
    at_first_error: float = 0.0
    same_family: float = 0.0
    window: int = 3
    # The word model (diagnose/words.py) names the cause of a log the rules leave unknown (its
    # likeliest cause other than unknown) unless its own probability of ``unknown`` reaches
    # ``words_unknown`` (0: never), and replaces a guess from the first fatal error's shape
    # alone when it names another cause with ``words_override`` (above 1: never). Its likeliest
    # other cause is named second (when the rules name no second cause) from ``words_second``.
    # Chosen by replaying the blind rounds with the rules frozen as they were
    # (scripts/replay_diagnose_rounds.py; docs/diagnose-rounds.md, rounds 8 to 10).
    words_unknown: float = 0.7
    words_override: float = 0.9
    words_second: float = 0.1
    # A guess from the first fatal error's shape alone gives way to ``unknown`` (the guess named
    # second) when the word model's likeliest class is ``unknown`` with at least this probability
    # (above 1: never): the words read like the corpus's failures outside every category (a
    # project's own CMake or source bug under a CMake or compile error, where the shape guesses
    # cmake_hip_not_found or compiler_version). Replayed on rounds 4 to 16 (1,026 excerpts, each
    # round's rules as frozen, the model trained without the round): 829 right against 819, 7.0 %
    # unknown against 5.4 %; chosen in leave-one-round-out, 0.3 scores 833 but passes 10 %
    # unknown on rounds 8, 14 and 16 (docs/diagnose-rounds.md, round 16).
    words_unknown_shape: float = 0.5


TUNING = Tuning()
# The word model silent: the rules and the first fatal error's shape alone (the evaluation's and
# the replay's "rules alone", and tests that must not move with the shipped model).
RULES_ONLY = Tuning(words_unknown=0.0, words_override=2.0, words_second=2.0, words_unknown_shape=2.0)
_NOTHING = re.compile(r"(?!)")  # the pattern of a cause named from the first fatal error alone
# The values cross-validation chooses among (tests/diagnose_eval.py --cv); the default first,
# so that a tie keeps it.
TUNING_GRID = tuple(
    Tuning(min_score=m, at_first_error=a, same_family=f)
    for m in (5.0, 4.0, 6.0)
    for a in (0.0, 2.0, 4.0)
    for f in (0.0, 1.0, 2.0)
)


@functools.lru_cache(maxsize=1)
def shipped_words() -> words.WordModel:
    """The word model shipped next to the rules (checked when loaded)."""
    return words.load()


def word_lines(reading: _Reading) -> list[tuple[int, str]]:
    """What the word model reads: the first fatal-looking lines and the log's last lines."""
    raw = reading.tail.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    if len(reading.tail) >= _TAIL_BYTES:
        raw = raw[1:]  # the first line may be cut
    raw = raw[-words.TAIL_LINES :]
    first = reading.lines - len(raw) + 1
    tail = [(first + i, clean(line)) for i, line in enumerate(raw)]
    numbers = {n for n, _ in tail}
    return [(n, t) for n, t in reading.fatal_lines if n not in numbers] + tail


def word_features(reading: _Reading, lines: list[tuple[int, str]] | None = None) -> frozenset[str]:
    """What the word model weighs: the words of :func:`word_lines`, and what the rules saw.

    Besides the words, the names of the signals that fired (``sig:...``) and the categories they
    point to (``cat:...``), and the first fatal error's family and shape (``fam:...``,
    ``shape:...``): the model learns from the corpus how far each goes, including signals too weak
    to name a cause alone. ``lines``: :func:`word_lines` of this reading, when already made.
    """
    out = set(words.tokens(t for _, t in (word_lines(reading) if lines is None else lines)))
    for name, hits in reading.hits.items():
        out.update((f"sig:{name}", f"cat:{hits[0].signal.category}"))
    if reading.first_error is not None:
        out.add(f"fam:{reading.first_error.family}")
    if reading.first_shaped is not None:
        out.add(f"shape:{reading.first_shaped.fallback}")
    return frozenset(out)


@dataclass(frozen=True)
class _Opinion:
    """A cause the word model names, its probability, its words and the lines holding them."""

    category: str
    p: float
    telling: list[str]  # the log's words that speak most for the category, best first
    hits: list[_Hit]


class _Words:
    """What the word model says of one log: every cause with its probability, likeliest first."""

    def __init__(self, reading: _Reading, model: words.WordModel) -> None:
        self.reading, self.model = reading, model
        self.lines = word_lines(reading)
        self.features = word_features(reading, self.lines)
        self.ranked = model.rank(self.features)
        # The lines that may be evidence (not consequences such as "make: *** [all] Error 2"),
        # each with its words: the words the hint names must be on one of them.
        self.shown = [(n, t, words.tokens([t])) for n, t in self.lines if not _is_follow_up(t)]
        self.shown_tokens = frozenset().union(*(toks for _, _, toks in self.shown))

    def opinion(self, category: str, p: float) -> _Opinion:
        """``category`` as the model's answer: the words that speak for it and their lines."""
        telling = [t for t in self.model.telling(self.features, category) if t in self.shown_tokens][:8]
        sig = Signal("words", (), category, 0.0, _NOTHING)
        scored = []
        for number, text, toks in self.shown:
            n = sum(t in toks for t in telling)
            if n:
                scored.append((-n, number, text))
        hits = [_Hit(sig, number, text, {}) for _, number, text in sorted(scored)[:MAX_EVIDENCE]]
        if not hits:  # no single line holds a telling word: point at where the log failed
            where = self.reading.first_error
            number, text = (where.line, where.text) if where is not None else self.lines[-1]
            hits = [_Hit(sig, number, text, {})]
        hits.sort(key=lambda h: h.line)
        return _Opinion(category, p, telling, hits)

    def best(self) -> _Opinion | None:
        """The likeliest cause (None when the model knows none of the log's words)."""
        if not self.ranked or self.ranked[0][0] not in CATEGORIES:
            return None
        return self.opinion(*self.ranked[0])

    def probability(self, category: str) -> float:
        """The model's probability of ``category`` for this log (0 when it knows none of its words)."""
        return next((p for c, p in self.ranked if c == category), 0.0)

    def runner_up(self, named: str, minimum: float) -> _Opinion | None:
        """The likeliest cause besides ``named`` and ``unknown``, if its probability reaches ``minimum``."""
        for category, p in self.ranked:
            if category not in (named, "unknown") and category in CATEGORIES:
                return self.opinion(category, p) if p >= minimum else None
        return None


def _said_by_words(opinion: _Opinion, hint: str) -> str:
    # The words that spoke for it, not the model's probability: fitted on the corpus, it reads
    # 90 % and more where such guesses were right about one time in three on never-seen logs.
    told = ", ".join(opinion.telling[:4])
    return f"from the words of the log alone{f' ({told})' if told else ''}: {hint}"


def _words_cause(said: _Words, named: str, tuning: Tuning, reading: _Reading) -> Cause | None:
    """The word model's likeliest cause besides ``named``, as a second cause to check (or None).

    Replayed on the blind rounds 4 to 9 with the rules as they were then, naming it (at
    ``tuning.words_second``) put the right cause first or second for 82 % of the logs, against
    78 % first (scripts/replay_diagnose_rounds.py; docs/diagnose-rounds.md, round 9).
    """
    other = said.runner_up(named, tuning.words_second)
    if other is None:
        return None
    hint = _said_by_words(other, _hint(other.category, other.hits, reading, None))
    return Cause(other.category, hint, _evidence(other.hits), basis="words")


def decide(
    reading: _Reading, tuning: Tuning = TUNING, *, word_model: words.WordModel | None = None
) -> Diagnosis:
    """The cause (and a second one, if the log shows two) from what :func:`read_chunks` found.

    ``word_model`` replaces the shipped word model (cross-validation trains its own).
    """
    scores = _scores(reading)
    why = _reconsider(scores, reading)
    first = reading.first_error
    if first is not None:
        for cat in scores:
            lines = [h.line for hits in reading.hits.values() for h in hits if h.signal.category == cat]
            if any(first.line <= n <= first.line + tuning.window for n in lines):
                scores[cat] += tuning.at_first_error
            if RULES.families.get(cat) == first.family:
                scores[cat] += tuning.same_family
    ranked = sorted(
        (cat for cat, s in scores.items() if s >= tuning.min_score and cat in CATEGORIES),
        key=lambda cat: (-scores[cat], _first_line(reading, cat) if _has_hits(reading, cat) else 0),
    )
    fallback: list[_Hit] = []
    confidence = "high" if ranked and scores[ranked[0]] >= HIGH_SCORE else "medium"
    # The first fatal error whose shape has a likely cause: the first one, or a later one when
    # the first says nothing of its cause (a generic "error:").
    shaped = reading.first_shaped
    # A first fatal error outside every category (a full disk) is the answer unless a rule
    # names a cause: no later error's shape and no word model guesses over it.
    outside = reading.outside is not None
    if not ranked and shaped is not None and not outside:
        # No signal is strong enough, but the fatal error's shape and family name the most
        # likely cause (diagnose/rules.toml gives, per shape, how often it was right).
        ranked = [shaped.fallback]
        sig = Signal(
            "first-fatal-error", (), shaped.fallback, 0.0, _NOTHING, family=shaped.family, also=shaped.also
        )
        fallback = [_Hit(sig, shaped.line, shaped.text, {})]
        confidence = "low"
    said_by_words: _Opinion | None = None
    said = _Words(reading, word_model or shipped_words())
    failed = first is not None or reading.first_follow_up is not None or bool(reading.fatal_lines)
    if not ranked and not outside and failed:
        # The rules name nothing in a log that shows a failure: the words' likeliest cause,
        # unless the words too read like the corpus's unexplained failures.
        opinion = said.runner_up("unknown", 0.0)
        if opinion is not None and said.probability("unknown") < tuning.words_unknown:
            ranked, fallback, confidence = [opinion.category], opinion.hits, "low"
            said_by_words = opinion
    elif confidence == "low" and not outside:
        # A guess from a fatal error's shape alone: the words replace it only when they name
        # another cause, and surely; when they read like a failure outside every category, the
        # guess is only named second.
        opinion = said.best()
        if opinion is not None and opinion.category == "unknown" and opinion.p >= tuning.words_unknown_shape:
            assert shaped is not None  # a low confidence rests on the shape
            hint = f"a guess from the fatal error at line {shaped.line} alone ({shaped.family}): "
            hint += _hint(ranked[0], fallback, reading, None)
            return _unknown(reading, Cause(ranked[0], hint, _evidence(fallback), basis="shape"))
        surely = opinion is not None and opinion.p >= tuning.words_override
        if surely and opinion.category not in ("unknown", *ranked):
            ranked, fallback, confidence = [opinion.category], opinion.hits, "low"
            said_by_words = opinion
    if not ranked:
        guess = None if outside else _words_cause(said, "unknown", tuning, reading)
        return _unknown(reading, guess)
    category = ranked[0]
    hits = (
        _category_hits(reading, category)
        or _category_hits(reading, _source_of(category, reading))
        or fallback
    )
    secondary = None
    if len(ranked) > 1:
        other = ranked[1]
        other_hits = _category_hits(reading, other)
        # A second cause only where it shows on lines of its own (not a reading of the same lines).
        if other_hits and not {h.line for h in other_hits} & {h.line for h in hits}:
            secondary = Cause(other, _hint(other, other_hits, reading, why.get(other)), _evidence(other_hits))
    also = hits[0].signal.also if hits else ""
    if secondary is None and also and also != category:
        # The same lines are as often the sign of another cause (no GPU listed: missing device
        # or no permission to open it): name it second, on the same evidence.
        secondary = Cause(also, _hint(also, hits, reading, None), _evidence(hits))
    if secondary is None:
        # The rules see one cause; the words of the log may make another one likely enough to
        # check when the first is wrong.
        secondary = _words_cause(said, category, tuning, reading)
    hint = _hint(category, hits, reading, why.get(category))
    if said_by_words:
        # Named from the words of the log alone: say so, with the words, and keep the next step
        # of the first fatal error's family for when the guess is wrong.
        step = (
            RULES.next_steps[first.family].format(line=first.line)
            if first is not None
            else "read the lines above the evidence"
        )
        hint = f"most likely {category}, {_said_by_words(said_by_words, hint)}. If not: {step}"
    elif confidence == "low" and shaped is not None:
        # Named from the shape of a fatal error alone: say so, and keep the family's next step
        # for when the guess is wrong.
        step = RULES.next_steps[shaped.family].format(line=shaped.line)
        which = "the first fatal error" if shaped is first else f"the fatal error at line {shaped.line}"
        hint = f"most likely {category}, from {which} alone ({shaped.family}): {hint}. If not: {step}"
    return Diagnosis(
        category,
        hint,
        _evidence(hits),
        first,
        secondary,
        confidence,
    )


def _evidence(hits: list[_Hit]) -> tuple[Evidence, ...]:
    return tuple(Evidence(h.line, h.text.strip()[:300]) for h in hits[:MAX_EVIDENCE])


def _has_hits(reading: _Reading, category: str) -> bool:
    return any(hits[0].signal.category == category for hits in reading.hits.values())


def _source_of(category: str, reading: _Reading) -> str:
    """For a category that won only by a moved score, the category whose lines show it."""
    for src in ("cuda_check_on_rocm", "compiler_crash", "arch_not_specified", "arch_unsupported"):
        if _has_hits(reading, src):
            return src
    return category


def _category_hits(reading: _Reading, category: str) -> list[_Hit]:
    """The category's lines, strongest signal first, then in log order; one line once."""
    hits = [h for hs in reading.hits.values() for h in hs if h.signal.category == category]
    hits.sort(key=lambda h: (-h.signal.weight, h.line))
    seen: set[int] = set()
    out = []
    for h in hits:
        if h.line not in seen:
            seen.add(h.line)
            out.append(h)
    # The decisive line first, the rest in the order they appear in the log.
    return out[:1] + sorted(out[1:], key=lambda h: h.line)


def _unknown(reading: _Reading, guess: Cause | None = None) -> Diagnosis:
    """No cause named; ``guess``: the word model's likeliest cause, too unsure to be the answer."""
    first = reading.first_error
    if first is None and reading.first_follow_up is not None:
        # Only consequences ("ninja: build stopped") are left: point at the first of them.
        first = FirstError(*reading.first_follow_up, "other")
    if first is None:  # an empty, binary or successful log: there is no "first error" to point at
        return Diagnosis(
            "unknown",
            "no known build or run failure recognised and no error line in the log; "
            "give the full log of the step that failed",
            secondary=guess,
        )
    outside = reading.outside
    if outside is not None:
        # The failure is one no category covers (a full disk, a GPU memory fault): say so, with
        # the next step for that failure and its line (the message under the first fatal error).
        hint = f"{OUTSIDE}{reading.outside_step.format(line=outside.line)}"
        lines = dict.fromkeys((first.line, outside.line))
        text = {first.line: first.text, outside.line: outside.text}
        evidence = tuple(Evidence(n, text[n].strip()[:300]) for n in lines)
        return Diagnosis("unknown", hint, evidence, reading.first_error)
    step = RULES.next_steps[first.family].format(line=first.line)
    hint = f"no known cause recognised; {step}"
    evidence = (Evidence(first.line, first.text.strip()[:300]),)
    return Diagnosis("unknown", hint, evidence, reading.first_error, guess)


def summary(diagnosis: Diagnosis) -> str | None:
    """One line for a failure report (a failed build's, verify's): the cause and its fix, said as
    surely as the blind rounds allow, or a failure outside every category with its own next
    step; None when nothing is recognised (the report's own lines are all there is to say)."""
    if diagnosis.category == "unknown":
        return diagnosis.hint if diagnosis.hint.startswith(OUTSIDE) else None
    if diagnosis.confidence == "low":
        return f"possible cause ({diagnosis.category}{LOW_TRUST}): {diagnosis.hint}"
    return f"likely cause ({diagnosis.category}): {diagnosis.hint}"


def diagnose_text(text: str, *, tuning: Tuning = TUNING) -> Diagnosis:
    """Diagnose a whole log given as one string."""
    return decide(read_chunks([text.encode("utf-8", "surrogateescape")]), tuning)


def diagnose_stream(stream: BinaryIO, *, tuning: Tuning = TUNING) -> Diagnosis:
    """Diagnose a log read from a binary stream, in blocks (memory stays flat)."""
    return decide(read_chunks(iter(functools.partial(stream.read, _CHUNK), b"")), tuning)


def diagnose_file(path: str | os.PathLike[str], *, tuning: Tuning = TUNING) -> Diagnosis:
    """Diagnose a log file, streaming it (logs of millions of lines are fine)."""
    try:
        with open(path, "rb") as f:
            return diagnose_stream(f, tuning=tuning)
    except FileNotFoundError:
        raise UserError(f"{path}: no such log file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; give the log file (builds keep theirs in logs/)") from None
    except OSError as exc:  # no permission, a device that cannot be read
        raise UserError(f"{path}: cannot read the log ({exc.strerror or exc})") from None


# --- hints ----------------------------------------------------------------------------------


def _detail(hits: list[_Hit], key: str) -> str | None:
    return next((h.details[key] for h in hits if key in h.details), None)


def _lines(hits: list[_Hit], n: int = 3) -> str:
    numbers = sorted({h.line for h in hits})[:n]
    return ("line " if len(numbers) == 1 else "lines ") + ", ".join(map(str, numbers))


def _arch_advice(arch: str) -> str:
    from rocmforge.arch import GENERIC_TARGETS, KNOWN_PROCESSORS, known_arch_names

    name = arch.split(":")[0].lower()
    if name.startswith("sm_") or name.startswith("compute_"):
        return f"{arch!r} is a CUDA arch; ROCm needs gfx names such as gfx942 (`python -m rocmforge arch`)"
    if name in KNOWN_PROCESSORS or name in GENERIC_TARGETS:
        return (
            f"{arch} is a real target that this compiler does not know: use a newer ROCm/clang, "
            f"or drop {arch} from PYTORCH_ROCM_ARCH"
        )
    close = difflib.get_close_matches(name, known_arch_names(), n=2, cutoff=0.6)
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    return f"{arch!r} is not an AMD GPU target; {guess}set PYTORCH_ROCM_ARCH to real ones, e.g. gfx942"


def _compiler(reading: _Reading) -> str:
    if not reading.compilers:
        return "the compiler"
    return " and ".join(f"{k} {v}" for k, v in reading.compilers.items())


def _half(jobs: str | None) -> str:
    return str(max(1, int(jobs) // 2)) if jobs and jobs.isdigit() else "half the cores"


def _hint(category: str, hits: list[_Hit], reading: _Reading, why: str | None) -> str:
    """A fix that names what this log shows: the library, arch, compiler, variable; the lines."""
    at = _lines(hits)
    prog = _detail(hits, "prog")
    lib = _detail(hits, "lib")
    arch = _detail(hits, "arch")
    pkg = _detail(hits, "pkg")
    symbol = _detail(hits, "symbol")
    var = _detail(hits, "var")
    version = _detail(hits, "version")
    rocm = f"ROCm {reading.rocm_version}" if reading.rocm_version else "ROCm"
    because = f" ({why})" if why else ""
    if category == "arch_not_specified":
        what = var or "PYTORCH_ROCM_ARCH"
        return (
            f"the build never got a GPU target ({at}): with no GPU visible, auto-detection "
            f"(rocm_agent_enumerator/amdgpu-arch) found nothing. Set PYTORCH_ROCM_ARCH (and "
            f"{what} for plain CMake projects) explicitly, e.g. PYTORCH_ROCM_ARCH='gfx90a;gfx942', "
            "or build.arch in build_config.toml"
        )
    if category == "arch_unsupported":
        names = {h.signal.name for h in hits}
        if "offload-arch-combination" in names:
            return (
                f"{at}: clang refuses this mix of targets ({arch or 'the same processor'} with and "
                "without a feature such as xnack/sramecc); list each processor once, all with or "
                "all without the feature, and make sure no stale ROCm component adds its own"
            )
        if arch:
            return f"{at}: {_arch_advice(arch)}"
        return (
            f"{at}: a requested GPU target is not supported by this compiler or library; check "
            f"PYTORCH_ROCM_ARCH against what {rocm} supports (`python -m rocmforge arch`)"
        )
    if category == "arch_mismatch":
        if "no-kernels-for-arch" in {h.signal.name for h in hits}:
            gpu = arch or "this GPU's arch"
            return (
                f"{at}: the installed rocBLAS/hipBLASLt has no kernels for {gpu}: use a {rocm} (or a "
                f"torch wheel) whose math libraries were built for {gpu}, or build them with {gpu} "
                "in GPU_TARGETS; HSA_OVERRIDE_GFX_VERSION to a supported sibling is only a workaround"
            )
        built = f" (this log mentions {', '.join(reading.archs[:4])})" if reading.archs else ""
        return (
            f"{at}: the binaries have no code object for the GPU that is running{built}{because}. Check the "
            "GPU with `python -m rocmforge arch`, rebuild with that gfx in PYTORCH_ROCM_ARCH "
            "after `rm -rf build/` (stale objects keep the old arch), and check the wheels with "
            "`python -m rocmforge inspect`; HSA_OVERRIDE_GFX_VERSION only papers over it"
        )
    if category == "compiler_version":
        have = _compiler(reading)
        names = {h.signal.name for h in hits}
        if "unsupported-gnu" in names:
            return (
                f"{at}: {have} is newer than these CUDA/HIP headers accept (GCC up to {version}); "
                f"point CC/CXX (or nvcc -ccbin) at a GCC <= {version}, or use a newer toolkit"
            )
        if "host-compiler-hip-option" in names:
            return (
                f"{at}: {prog or 'a host C/C++ compiler'} was given HIP options it does not know: the "
                "HIP sources went to the wrong compiler. Compile them with ROCm's clang++ or hipcc "
                "(CMAKE_HIP_COMPILER / CMAKE_CXX_COMPILER, or CXX=/opt/rocm/bin/hipcc for a plain "
                "Makefile), and clear the build directory so CMake forgets the compiler it chose"
            )
        header = _detail(hits, "header")
        if "std-header-missing" in names and header:
            return (
                f"{at}: the C++ standard library of {have} has no <{header}> (C++17/20); use a newer "
                "GCC/libstdc++ (>= 9 for <filesystem>, >= 13 for <format>) via CC/CXX, and pin it in "
                "[[packages.X.requires]]"
            )
        if "truncsfbf2" in names:
            need = " (__truncsfbf2 comes from the libgcc of GCC >= 13)"
        elif "static-assert-false" in names:
            need = " (a template's static_assert(false, ...) needs GCC >= 13 or Clang >= 17)"
        elif "needs-cxx17" in names or "unknown-std" in names:
            need = f" (the code needs C++{version or '17'} support)"
        elif version:
            need = f" (the build asks for {prog or 'the compiler'} {version})"
        else:
            need = ""
        return (
            f"{at}: {have} does not fit this source{need}. Install the required compiler "
            "(e.g. GCC 13: docs/toolchain.md gives the route per distribution; Debian 12 has no "
            "gcc-13 package), point CC/CXX at it, and pin it in the package's "
            "[[packages.X.requires]] so `nox -s toolchain` checks it before the build"
        )
    if category == "compiler_crash":
        return (
            f"{prog or 'the compiler'} crashed ({at}) — a compiler bug, not your code. Retry the "
            "failing file at -O2 (CFLAGS/CXXFLAGS -O3 -> -O2), or enable "
            'build.retry = ["compiler_crash"] to do that automatically; if it persists, try '
            f"another {rocm} compiler version and report the preprocessed source"
        )
    if category == "oom_compiler":
        jobs = f" (MAX_JOBS={reading.jobs})" if reading.jobs else ""
        return (
            f"{prog or 'the compiler'} ran out of memory ({at}){jobs}{because}: too many parallel "
            f"compile jobs for this RAM. Rerun with MAX_JOBS={_half(reading.jobs)} (HIP files need "
            'several GB each), add swap, or enable build.retry = ["oom_compiler"] to halve the '
            "jobs automatically"
        )
    if category == "cmake_hip_not_found":
        name = pkg or "hip"
        root = f"/opt/rocm-{reading.rocm_version}" if reading.rocm_version else "/opt/rocm"
        if any(h.signal.name == "cmake-hip-language-root" for h in hits):
            return (
                f"{at}: CMake's HIP language support could not find a ROCm root that holds the "
                f"hip-lang CMake package (it asks the HIP compiler where ROCm is). Point "
                f"CMAKE_HIP_COMPILER at the clang++ of a full ROCm install "
                f"({root}/lib/llvm/bin/clang++) and set ROCM_PATH={root}; a "
                "distro clang or a pip ROCm SDK without the -devel parts does not carry it"
            )
        return (
            f"{at}: CMake/clang cannot find the {name} package of the ROCm install. Point the "
            f"build at it: ROCM_PATH={root} HIP_PATH={root} CMAKE_PREFIX_PATH={root} (the "
            f"{name}-config.cmake lives in {root}/lib/cmake/{name}); check that hipcc and the "
            "libraries come from the same ROCm when several are installed"
        )
    if category == "missing_library_link":
        if lib is None and symbol and any(h.signal.name == "shlib-undefined" for h in hits):
            owner = re.match(r"[a-z]+(?=_)", symbol)
            which = f" (-l{owner.group()} for {owner.group()}_*?)" if owner else ""
            return (
                f"{at}: a shared library on the link line needs {symbol}, which no library on the "
                f"line defines: add the library that does{which} after it, from the same {rocm}"
            )
        if lib is None:
            return (
                f"{at}: the linker cannot find a library it was told to use. Install the package "
                f"that ships it ({rocm}'s -dev packages for ROCm libraries) and add its directory "
                "with -L (e.g. -L/opt/rocm/lib) or LIBRARY_PATH"
            )
        name = lib.replace("\\", "/").rsplit("/", 1)[-1]
        if name.lower().endswith(".lib"):  # MSVC / lld-link on Windows
            return (
                f"{at}: the linker cannot find {name}. Install the HIP SDK component that ships it "
                "and add its directory to LIB or the link line (/LIBPATH:, e.g. %HIP_PATH%\\lib)"
            )
        stem = re.sub(r"^lib|\.(?:so|a)\b.*$", "", name)
        return (
            f"{at}: the linker cannot find lib{stem}. Install the package that ships it "
            f"(for ROCm libraries the {stem}-dev / {stem} package of {rocm}) and add its directory "
            "with -L (e.g. -L/opt/rocm/lib) or LIBRARY_PATH"
        )
    if category == "link_flags":
        names = {h.signal.name for h in hits}
        if "fpic" in names:
            fix = (
                "an object or static library was built without -fPIC; rebuild it with -fPIC "
                "(CMAKE_POSITION_INDEPENDENT_CODE=ON)"
            )
        elif "wrong-elf-class" in names:
            fix = (
                f"{lib or 'a library'} is built for another ABI (32-bit?) than this 64-bit link; fix "
                "-L/LIBRARY_PATH/--sysroot so the 64-bit libraries are found first"
            )
        elif "cxx11-abi" in names:
            fix = (
                "objects disagree on _GLIBCXX_USE_CXX11_ABI; build everything with the value torch "
                "uses (python -c 'import torch; print(torch._C._GLIBCXX_USE_CXX11_ABI)')"
            )
        elif "hip-fatbin" in names or "no-device-code" in names:
            fix = (
                "device code compiled with -fgpu-rdc must be linked by hipcc/clang with -fgpu-rdc --hip-link"
            )
        elif "dso-missing" in names:
            fix = "a library used directly is only linked indirectly; add it to the link line explicitly"
        elif "undefined-hip-symbol" in names or "empty-L" in names:
            fix = (
                "the HIP runtime is not on the link line (an empty -L swallowed -lamdhip64?); "
                "add -L/opt/rocm/lib -lamdhip64"
            )
        else:
            fix = (
                f"the link is missing an object or library that defines {symbol or 'the symbol'}; "
                "check link order and flags"
            )
        return f"{at}: {fix}"
    if category == "missing_library_runtime":
        name = lib or symbol or "a shared library"
        if symbol and symbol.startswith(("GLIBCXX", "CXXABI")):
            return (
                f"{at}: the libstdc++ that was loaded is older than the one the code was built with "
                f"({symbol}); a conda environment often shadows the system one — put the newer "
                "libstdc++ first or remove the old one from the environment"
            )
        return (
            f"{at}: {name} is not found when the program starts. If it is a ROCm library, add "
            f"{rocm}'s lib directory to LD_LIBRARY_PATH (e.g. /opt/rocm/lib) or install the "
            "package that ships it; check `ldd` on the failing .so"
        )
    if category == "version_mismatch":
        if _detail(hits, "pkg") and any(h.signal.name == "pip-requirement-conflict" for h in hits):
            return (
                f"{at}: pip installed {symbol}, which the others do not accept ({pkg} {version} is "
                "required); pin the exact pair"
            )
        if any(h.signal.name.startswith("numpy") for h in hits):
            return (
                f"{at}: an extension was built against another numpy; install the numpy it was "
                "built with, or rebuild it"
            )
        # Found while compiling: the source and what it compiles against come from different
        # releases, and the rule names the release to match (rounds 25 and 26).
        if fix := next((h.signal.fix for h in hits if h.signal.fix), ""):
            return f"{at}: {fix}"
        what = f" ({symbol})" if symbol else ""
        torch = f" torch {reading.torch_version}" if reading.torch_version else " torch"
        return (
            f"{at}: a compiled part was built against a different version than the one loaded{what}. "
            f"Rebuild the extension against the installed{torch}/triton/ROCm (same commit pins; "
            "`python -m rocmforge provenance` shows what each wheel was built with)"
        )
    if category == "build_isolation_torch":
        torch = f" (it got torch {reading.torch_version})" if reading.torch_version else ""
        return (
            f"{at}: pip built the package in an isolated environment{because}{torch}, so the build "
            "could not see the installed ROCm torch. Build with `pip install --no-build-isolation .` "
            "(or `python -m build --wheel --no-isolation`) after installing the ROCm torch and the "
            "build requirements yourself"
        )
    if category == "cuda_check_on_rocm":
        torch = f" torch {reading.torch_version}" if reading.torch_version else " a ROCm torch"
        return (
            f"{at}: the build script asks for CUDA (CUDA_HOME/nvcc){because} although it runs with{torch}. "
            "Use the project's ROCm path (e.g. VLLM_TARGET_DEVICE=rocm, the --variant rocm flag, or "
            "ROCM_HOME=/opt/rocm) and check torch.version.hip is set in the build environment; "
            "patch the check out only if the project has no ROCm path"
        )
    if category == "hipify":
        header = _detail(hits, "header")
        what = f"'{header}'" if header else "CUDA identifiers"
        return (
            f"{at}: {what} reached the HIP compiler, so the CUDA sources were not hipified. Run the "
            "project's hipify step first (PyTorch: python tools/amd_build/build_amd.py; extensions: "
            "torch.utils.hipify via BuildExtension) on a clean tree"
        )
    if category == "disk_full":
        return (
            f"{at}: the disk filled up, and every later error follows from it. Free space where the "
            "build and its temporary files go (`df -h` on the build directory and on TMPDIR, usually "
            "/tmp; `docker system df` for images), or point TMPDIR and build.work_dir at a larger "
            "disk, then rebuild; `python -m rocmforge doctor` checks the space before a build"
        )
    if category == "network_fetch":
        url = _detail(hits, "url")
        where = f" {url}" if url else ""
        return (
            f"{at}: a download or clone{where} failed during the build. On an air-gapped host, "
            "provide it locally: prefetch sources with rocmforge, and for Triton set "
            "TRITON_OFFLINE_BUILD=1 with LLVM_SYSPATH/JSON_SYSPATH; otherwise check the proxy/DNS"
        )
    if category == "no_gpu_visible":
        return (
            f"{at}: the ROCm runtime sees no usable GPU. Check `rocminfo`/`dmesg | grep kfd` "
            "(driver loaded, GPU supported by KFD); in containers pass --device=/dev/kfd "
            "--device=/dev/dri; check HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES are not empty"
        )
    if category == "device_permission":
        group = pkg or "render and video"
        return (
            f"{at}: this user may not open the GPU device nodes. Add the user to the {group} "
            "group(s) (sudo usermod -aG render,video $USER) and log in again; `ls -l /dev/kfd "
            "/dev/dri` shows the group that owns them"
        )
    return "no known failure recognised"


# --- retries --------------------------------------------------------------------------------

_OPT3 = re.compile(r"(?<!\S)-O3(?!\S)")


def retry_plan(
    diagnosis: Diagnosis, env: Mapping[str, str], cfg: Config
) -> tuple[dict[str, str], str] | None:
    """The environment for one more attempt, and a note for the wheel's provenance; or None.

    Only categories the user listed in ``build.retry`` are retried, and only while there is
    something left to change: a compiler crash is retried with ``-O3`` replaced by ``-O2`` in
    CFLAGS/CXXFLAGS/HIPFLAGS and CMake's release flags (once: after that no ``-O3`` is left);
    an out-of-memory compile with ``MAX_JOBS`` and ``CMAKE_BUILD_PARALLEL_LEVEL`` halved (until
    they reach 1).
    """
    if diagnosis.category not in cfg.build.retry:
        return None
    at = f" at line {diagnosis.evidence[0].line}" if diagnosis.evidence else ""
    new = dict(env)
    if diagnosis.category == "compiler_crash":
        changed = [name for name in ("CFLAGS", "CXXFLAGS", "HIPFLAGS") if _OPT3.search(new.get(name, ""))]
        if not changed:
            return None
        for name in changed:
            new[name] = _OPT3.sub("-O2", new[name])
        # CMake puts CMAKE_<LANG>_FLAGS_RELEASE (-O3) after CFLAGS, so -O3 would still win;
        # PyTorch's setup.py hands CMAKE_* environment variables to CMake, so lower them too.
        for lang in ("C", "CXX", "HIP"):
            new[f"CMAKE_{lang}_FLAGS_RELEASE"] = "-O2 -DNDEBUG"
        return new, f"retry after compiler_crash{at}: {'/'.join(changed)} -O3 -> -O2"
    if diagnosis.category == "oom_compiler":
        jobs = new.get("MAX_JOBS") or new.get("CMAKE_BUILD_PARALLEL_LEVEL")
        current = int(jobs) if jobs and jobs.isdigit() else (cfg.build.jobs or os.cpu_count() or 1)
        if current <= 1:
            return None
        half = str(current // 2)
        new["MAX_JOBS"] = new["CMAKE_BUILD_PARALLEL_LEVEL"] = half
        return new, f"retry after oom_compiler{at}: MAX_JOBS {current} -> {half}"
    return None


# --- command line ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``diagnose LOG [--json]``."""
    parser.add_argument("log", metavar="LOG", help="the build or run log ('-' reads standard input)")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--excerpt",
        metavar="PATH",
        help="also write the lines that matter as a corpus fixture (a file, or a directory to name it in); "
        "home directories are made anonymous, read it before you share it",
    )
    parser.add_argument("--source", metavar="URL", help="with --excerpt: the issue that records the failure")


def main(args: argparse.Namespace) -> int:
    """Print the diagnosis of one log; exit 0 when a cause was found, 1 when it is unknown."""
    from rocmforge.diagnose import excerpt

    if args.source and not args.excerpt:
        raise UserError("--source is for --excerpt: add --excerpt PATH, or drop --source")
    if args.excerpt:
        excerpt.check_request(args.excerpt, args.source)
        if args.log == "-":
            raise UserError("--excerpt reads the log a second time: give the log file, not '-'")
    if args.log == "-":
        diagnosis = _diagnose_text("standard input", sys.stdin.buffer)
    else:
        refuse_special(args.log, "the build or run log (or '-' and pipe it in)")
        try:
            with open(args.log, "rb") as f:
                diagnosis = _diagnose_text(args.log, f)
        except OSError:
            diagnosis = diagnose_file(args.log)  # its one-line message for each way to fail
    if args.json:
        print(json.dumps(diagnosis.to_json(), indent=2))
    else:
        from rich.markup import escape

        from rocmforge.console import console

        first = diagnosis.first_error
        if first is not None:
            console.print(f"first fatal error ({first.family}) at line {first.line}")
        title = diagnosis.category
        if diagnosis.category != "unknown":
            worth = LOW_TRUST if diagnosis.confidence == "low" else ""
            title += f" ({diagnosis.confidence} confidence{worth})"
        _print_cause(console, escape, title, diagnosis.hint, diagnosis.evidence)
        if (second := diagnosis.secondary) is not None:
            also = "also" if second.basis == "lines" else "or perhaps"
            _print_cause(console, escape, f"{also} {second.category}", second.hint, second.evidence)
    if args.excerpt:
        path = excerpt.write_excerpt(args.log, diagnosis, args.excerpt, args.source)
        # On stderr: --json's standard output stays one JSON document.
        print(
            f"excerpt written to {path}: set its '# category:' line to what fixed the failure, then add "
            "it to tests/data/diagnose/ (see its README) or attach it to the issue",
            file=sys.stderr,
        )
    return 0 if diagnosis.category != "unknown" else 1


def _diagnose_text(name: str, stream: BinaryIO) -> Diagnosis:
    """:func:`diagnose_stream`, after making sure the input is a text log at all.

    An empty file or a binary one (a core dump, a wheel) has no cause to find; "unknown"
    would send the user looking for one.
    """
    head = stream.read(_CHUNK)
    if not head:
        raise UserError(
            f"{name}: empty; give the log of the failed build or run (builds keep theirs in logs/)"
        )
    if looks_binary(head[:65536]):
        raise UserError(f"{name}: not a text log (binary data); give the log of the failed build or run")
    rest = iter(functools.partial(stream.read, _CHUNK), b"")
    return decide(read_chunks(itertools.chain([head], rest)), TUNING)


def _print_cause(console: Any, escape: Any, title: str, hint: str, evidence: tuple[Evidence, ...]) -> None:
    console.print(f"[bold]{title}[/bold]: {escape(hint)}")
    for e in evidence:
        # Evidence is copied from the log: one line each, however wide, so it can be searched.
        console.print(f"  {e.line:>7} | {escape(e.text)}", soft_wrap=True)
