"""A log line as the terminal showed it: what the engine reads and what an excerpt keeps."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def terminal_text(raw: bytes | str) -> str:
    """One log line as the terminal showed it: no colours, the last state of a ``\\r`` redraw."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.rstrip("\n")
    if text.endswith("\r"):
        text = text[:-1]
    if "\r" in text:
        text = next((seg for seg in reversed(text.split("\r")) if seg.strip()), "")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text
