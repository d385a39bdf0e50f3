"""Verifiable rewards for tasks that answer with one integer inside ``<ans></ans>``.

Plain functions with TRL's reward signature ``(prompts, completions, **columns) -> list[float]``,
open-r1 style. TRL logs each one as ``rewards/<__name__>/mean``, so the names are part of the API.
They never raise on model output: one bad completion must not crash a training step.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

OPEN_TAG = "<ans>"
CLOSE_TAG = "</ans>"
FORMAT_REWARD = 0.2
CORRECT_REWARD = 1.0
# Bounds the parsed value and keeps int() far from Python's 4300-digit limit; the tasks' answers are short.
MAX_DIGITS = 12

# ASCII digits only: int() would accept '٣' or full-width digits, which are not the format we ask for.
_INTEGER = re.compile(rf"[+-]?[0-9]{{1,{MAX_DIGITS}}}", re.ASCII)


def completion_text(completion: Any) -> str:
    """Return the text of one completion: a plain string or a list of chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, dict)]
        # With tool calls a completion holds several turns; the answer is in the last assistant turn.
        assistant = [m for m in messages if m.get("role", "assistant") == "assistant"]
        if assistant:
            return _content_text(assistant[-1].get("content"))
    return ""


def _content_text(content: Any) -> str:
    """Message content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif (
                isinstance(part, dict)
                and part.get("type", "text") == "text"
                and isinstance(part.get("text"), str)
            ):
                texts.append(part["text"])
        return "".join(texts)
    return ""


def answer_span(text: str) -> str | None:
    """The text inside the single well-formed ``<ans>...</ans>``, or None if there is not exactly one."""
    if not isinstance(text, str):
        return None
    # Exactly one of each tag with the open first also rules out nesting and repeats.
    if text.count(OPEN_TAG) != 1 or text.count(CLOSE_TAG) != 1:
        return None
    start = text.index(OPEN_TAG) + len(OPEN_TAG)
    end = text.index(CLOSE_TAG)
    if end < start:
        return None
    return text[start:end]


def parse_answer(text: str) -> int | None:
    """The integer inside the single well-formed tag; None for anything else."""
    span = answer_span(text)
    if span is None:
        return None
    return _parse_int(span)


def _parse_int(raw: str) -> int | None:
    """Surrounding whitespace, one sign, 1..MAX_DIGITS ASCII digits (leading zeros allowed)."""
    candidate = raw.strip()
    if _INTEGER.fullmatch(candidate) is None:
        return None
    return int(candidate)


def _target_value(target: Any) -> int | None:
    """A target given as int (or numpy integer) or as a string of one; None when malformed."""
    if isinstance(target, bool):  # bool is an int subclass, but True is not a sum.
        return None
    if isinstance(target, str):
        return _parse_int(target)
    try:
        return operator.index(target)
    except TypeError:
        return None


def _targets_for(target: Any, n: int) -> list[Any]:
    """One target per completion: a scalar is broadcast and a short list padded, so lengths always match."""
    if target is None or isinstance(target, (str, bytes, int)):
        return [target] * n
    try:
        values = list(target)  # a list, or a numpy array / tensor row
    except TypeError:
        return [target] * n  # a numpy scalar or another lone value
    return values[:n] + [None] * (n - len(values))


def correctness_reward(prompts: Any, completions: Sequence[Any], target: Any, **kwargs: Any) -> list[float]:
    """1.0 when the answer in the completion equals the target, else 0.0."""
    targets = _targets_for(target, len(completions))
    rewards: list[float] = []
    for completion, expected in zip(completions, targets, strict=True):
        answer = parse_answer(completion_text(completion))
        wanted = _target_value(expected)
        rewards.append(CORRECT_REWARD if answer is not None and answer == wanted else 0.0)
    return rewards


def format_reward(prompts: Any, completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """0.2 when the completion holds exactly one well-formed ``<ans>...</ans>``, else 0.0."""
    # Only the tag structure counts here; whether its content is a number is correctness_reward's job.
    return [FORMAT_REWARD if answer_span(completion_text(c)) is not None else 0.0 for c in completions]


RewardFunc = Callable[..., list[float]]

REWARDS: dict[str, RewardFunc] = {
    "correctness_reward": correctness_reward,
    "format_reward": format_reward,
}
