"""Guarded access to a raw (not yet validated) configuration document.

Cross-section rules (`ai_factory.factory.model.loading.cross_check` and the layers' own
`config_checks`) read the raw document rather than the validated model, so they still run where a
section has field errors and every problem shows up in one report. Every access is guarded: a
value of the wrong shape reads as empty, and its field error is reported by validation instead.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable


def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A hint to append to an "unknown name" message: the closest choice, or the few choices there are."""
    choices = sorted(c for c in choices if isinstance(c, str))
    close = difflib.get_close_matches(word, choices, n=1) if isinstance(word, str) else []
    if close:
        return f" (did you mean {close[0]!r}?)"
    if 0 < len(choices) <= 12:
        return f" (expected one of: {', '.join(choices)})"
    return ""
