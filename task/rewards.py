"""Verifiable rewards: the one ``<ans></ans>`` answer every task uses, and the integer-answer rewards.

Plain functions with TRL's reward signature ``(prompts, completions, **columns) -> list[float]``,
open-r1 style. TRL logs each one as ``rewards/<__name__>/mean``, so the names are part of the API:
every task names its two rewards ``correctness_reward`` and ``format_reward``. Each reward is declared
with ``declare_reward``: the most it pays and its role, an ``ANSWER`` reward (the right answer, what
the task is for) or a ``SHAPING`` one (a form on the way to it, which a policy can learn alone). Readers
such as the run doctor take every reward's metric, maximum and role from there, never from a list of
names of their own, so a new reward is read as soon as it is declared::

    >>> reward_info(format_reward)
    RewardInfo(name='format_reward', max_reward=0.2, role=<RewardRole.SHAPING: 'shaping'>)

They are total: whatever a model (or a caller) hands them, they return one float per completion and
never raise, as one bad completion must not crash a training step. Each task has one parser that
turns a completion into its answer or None; its format reward pays ``FORMAT_REWARD`` exactly when
that parser returns an answer, and its correctness reward compares that same answer with the target,
so the two can never disagree on what an answer is.

The integer answer, as the chapter defines it: the regex ``<ans>\\s*(-?\\d+)\\s*</ans>`` matching the
completion's one and only ``<ans>`` tag, with ASCII digits (``\\d`` would take '٣') and at most
``MAX_DIGITS`` of them. Example::

    >>> parse_answer("The sum is <ans> 579 </ans>.")
    579
    >>> [parse_answer(t) for t in ("<ans></ans>", "<ans>5 79</ans>", "<ans>5</ans><ans>5</ans>")]
    [None, None, None]
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

OPEN_TAG = "<ans>"
CLOSE_TAG = "</ans>"
FORMAT_REWARD = 0.2
CORRECT_REWARD = 1.0
# Bounds the parsed value and keeps int() far from Python's 4300-digit limit; the tasks' answers are short.
MAX_DIGITS = 12
# The most integers a list answer (or a list target) may hold before it is malformed.
MAX_ITEMS = 32

# ASCII digits only: int() would accept '٣' or full-width digits, which are not the format we ask for.
# No '+': the chapter's regex is -?\d+. Surrounding whitespace is \s, as in the chapter's regex.
_INTEGER = re.compile(rf"\s*(-?[0-9]{{1,{MAX_DIGITS}}})\s*")


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
    """The text inside the single ``<ans>...</ans>``, or None if there is not exactly one tag pair."""
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


# An answer tag as a reader would take it, exact or not: an opening then a closing tag, in any case, with
# spaces (`<ans>17</ans>`, `<ANS> 17 </ANS>`). Where completions hold one and a reward still pays nothing
# on any of them, it is the reward's parse that fails (the run doctor's `reward_never_pays`).
_TAG_LIKE = re.compile(r"<\s*ans\s*>.*?<\s*/\s*ans\s*>", re.IGNORECASE | re.DOTALL)


def tag_like(text: str) -> bool:
    """Whether `text` holds something a reader would take for an answer in its tag, exact or not."""
    return isinstance(text, str) and bool(_TAG_LIKE.search(text))


def answer_text(text: str, max_chars: int) -> str | None:
    """The text inside the completion's single ``<ans>`` tag, stripped; None when empty or longer than
    ``max_chars`` (which bounds whatever a checker does with it next)."""
    span = answer_span(text)
    if span is None:
        return None
    span = span.strip()
    return span if 0 < len(span) <= max_chars else None


def parse_int(raw: Any) -> int | None:
    """One integer with surrounding whitespace: optional '-', 1..MAX_DIGITS ASCII digits; else None."""
    if not isinstance(raw, str):
        return None
    match = _INTEGER.fullmatch(raw)
    return int(match.group(1)) if match else None


def parse_int_list(raw: Any) -> tuple[int, ...] | None:
    """Comma-separated integers, whitespace allowed around each, 1..MAX_ITEMS of them; else None."""
    if not isinstance(raw, str) or len(raw) > MAX_ITEMS * (MAX_DIGITS + 8):
        return None  # longer than any list of MAX_ITEMS well-formed items could be
    items = raw.split(",")
    if len(items) > MAX_ITEMS:
        return None
    values = [parse_int(item) for item in items]
    if any(v is None for v in values):
        return None
    return tuple(values)  # type: ignore[arg-type]


def parse_answer(text: str) -> int | None:
    """The integer inside the completion's single ``<ans>`` tag; None for anything else."""
    span = answer_span(text)
    return None if span is None else parse_int(span)


# ------------------------------------------------------------------ targets and columns


def int_value(value: Any) -> int | None:
    """A target given as int (or numpy integer) or as a string of one; None when malformed."""
    if isinstance(value, bool):  # bool is an int subclass, but True is not an answer.
        return None
    if isinstance(value, str):
        return parse_int(value)
    try:
        return operator.index(value)
    except TypeError:
        return None


def int_list_value(value: Any) -> tuple[int, ...] | None:
    """A list target: a sequence (list, tuple, numpy array) of ints or a string of them; else None."""
    if isinstance(value, str):
        return parse_int_list(value)
    if isinstance(value, (bytes, dict)) or not isinstance(value, Iterable):
        return None
    try:
        items = list(value)
    except Exception:  # a 0-d numpy array iterates with a TypeError; anything else odd is malformed too
        return None
    if not 1 <= len(items) <= MAX_ITEMS:
        return None
    values = [None if isinstance(v, str) else int_value(v) for v in items]
    if any(v is None for v in values):
        return None
    return tuple(values)  # type: ignore[arg-type]


def per_completion(column: Any, n: int) -> list[Any]:
    """One value of a dataset column per completion: a lone value is broadcast, a short column padded.

    TRL passes each column as a list with one value per completion. A scalar (an int, a string) is
    broadcast; a list, tuple or numpy array is taken as one value per completion, cut or padded with
    None so the lengths always match.
    """
    if column is None or isinstance(column, (str, bytes, int, dict)):
        return [column] * n
    try:
        values = list(column)  # a list, or a numpy array / tensor row
    except Exception:
        return [column] * n  # a numpy scalar or another lone value
    return values[:n] + [None] * (n - len(values))


# ------------------------------------------------------------------ reward helpers the tasks share


def format_scores(completions: Sequence[Any], parse: Callable[[str], Any]) -> list[float]:
    """FORMAT_REWARD for each completion whose text ``parse`` turns into an answer, else 0.0."""
    return [
        FORMAT_REWARD if _safe(parse, completion_text(c)) is not None else 0.0 for c in _listed(completions)
    ]


def correctness_scores(
    completions: Sequence[Any], parse: Callable[[str], Any], judge: Callable[..., bool], *columns: Any
) -> list[float]:
    """CORRECT_REWARD where ``judge(answer, *row_values)`` holds for the parsed answer, else 0.0.

    ``columns`` are the dataset columns the judge needs, each spread one value per completion.
    A judge that raises scores 0.0: a malformed row must not crash a training step either.
    """
    completions = _listed(completions)
    n = len(completions)
    rows = zip(completions, *(per_completion(c, n) for c in columns), strict=True)
    rewards: list[float] = []
    for completion, *values in rows:
        answer = _safe(parse, completion_text(completion))
        ok = answer is not None and _safe(judge, answer, *values) is True
        rewards.append(CORRECT_REWARD if ok else 0.0)
    return rewards


def _listed(completions: Any) -> list[Any]:
    """The completions as a list; a lone string or None is not a batch, so it yields no rewards."""
    if completions is None or isinstance(completions, (str, bytes, dict)):
        return []
    try:
        return list(completions)
    except Exception:
        return []


def _safe(func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)``, or None if it raises: parsers and judges see model output and malformed rows."""
    try:
        return func(*args)
    except Exception:
        return None


# ------------------------------------------------------------------ declarations


class RewardRole(StrEnum):
    """What a reward pays for; a shaping reward rising while an answer reward falls is reward hacking."""

    ANSWER = "answer"
    SHAPING = "shaping"


@dataclass(frozen=True)
class RewardInfo:
    """One reward function's declaration: its ``__name__``, the most it pays a completion, its role."""

    name: str
    max_reward: float
    role: RewardRole

    @property
    def metric(self) -> str:
        """The per-step mean TRL logs for this reward."""
        return f"rewards/{self.name}/mean"


class UndeclaredRewardError(TypeError):
    """A reward function without ``declare_reward``: nothing could say what it pays or for what."""


RewardFunc = Callable[..., list[float]]
F = TypeVar("F", bound=RewardFunc)


def declare_reward(max_reward: float, role: RewardRole | str) -> Callable[[F], F]:
    """Decorator: record a reward's maximum payout and role on the function, left otherwise unchanged."""
    role = RewardRole(role)  # a typo in the role fails here, at import, not in a reader much later

    def declare(func: F) -> F:
        # On the function itself, not in a table beside it: functools.wraps copies __dict__, so a
        # wrapper that keeps the __name__ TRL logs keeps the declaration too.
        func.reward_info = RewardInfo(func.__name__, float(max_reward), role)  # type: ignore[attr-defined]
        return func

    return declare


def reward_info(func: RewardFunc) -> RewardInfo:
    """The declaration of ``func``; UndeclaredRewardError if it has none or its name has changed since."""
    info = getattr(func, "reward_info", None)
    name = getattr(func, "__name__", repr(func))
    if not isinstance(info, RewardInfo):
        raise UndeclaredRewardError(
            f"reward function {name} has no declaration: decorate it with "
            f"task.rewards.declare_reward(max_reward, role)"
        )
    if info.name != name:  # TRL logs the current __name__; a stale name would point at no metric
        raise UndeclaredRewardError(f"reward function {name} carries the declaration of {info.name}")
    return info


# ------------------------------------------------------------------ the integer-answer rewards (addition)


def _same_int(answer: int, expected: Any) -> bool:
    return answer == int_value(expected)


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def correctness_reward(prompts: Any, completions: Sequence[Any], target: Any, **kwargs: Any) -> list[float]:
    """1.0 when the completion's one integer answer equals the target, else 0.0."""
    return correctness_scores(completions, parse_answer, _same_int, target)


@declare_reward(FORMAT_REWARD, RewardRole.SHAPING)
def format_reward(prompts: Any, completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """0.2 when the completion holds exactly one ``<ans>`` tag holding one integer, else 0.0."""
    return format_scores(completions, parse_answer)


REWARDS: dict[str, RewardFunc] = {
    "correctness_reward": correctness_reward,
    "format_reward": format_reward,
}
