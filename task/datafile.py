"""A task from a data file: a question column, an answer column, and a named checker.

    uv run python labs/grpo-first/train.py --task data/questions.jsonl \\
        --task-config '{"question": "problem", "answer": "solution", "checker": "number", "tolerance": 0.01}'

The file is JSONL (or JSON), CSV or Parquet, read with `datasets`. Every row is a problem: its question
becomes the user turn (after the system prompt, `DEFAULT_SYSTEM_PROMPT` unless the config gives
`system_prompt`), its answer is what the checker compares the model's answer with. The model answers
inside the book's tag, `<ans>...</ans>`, and the format reward pays exactly when the checker's parse
takes what is inside.

The checkers (`CHECKERS`), each a parse of what is inside the tag and a comparison with the row's answer:

| checker | takes | right when |
|---|---|---|
| `exact` | any text, at most `MAX_ANSWER_CHARS`, surrounding whitespace dropped | it is the answer's text |
| `integer` | one integer, ASCII digits (`task.rewards.parse_int`) | it equals the answer |
| `number` | one decimal number, ASCII digits, finite | within `tolerance` (absolute, default 1e-6) |
| `math` | an expression (LaTeX or plain), at most `MAX_ANSWER_CHARS` | math-verify finds it equal (what TRL's `accuracy_reward` uses) |

The held-out split is disjoint from training by content: a question's text, whitespace-normalised,
puts it in one split or the other (`task.dataset.split_of`), whatever the seed, so a question that
appears twice in the file is in one split only. Training rows are drawn from the training split with
replacement (`build_dataset(n, seed)`: a shorter set is a prefix of a longer one); held-out rows are the
held-out split in a seeded order, without replacement.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from task.dataset import check_size, messages, split_of
from task.protocol import Task
from task.rewards import (
    CORRECT_REWARD,
    FORMAT_REWARD,
    RewardRole,
    answer_span,
    answer_text,
    correctness_scores,
    declare_reward,
    format_scores,
    parse_answer,
    parse_int,
)

SUFFIXES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
DEFAULT_SYSTEM_PROMPT = "Answer the question. Put only the final answer inside <ans></ans>."
MAX_ANSWER_CHARS = 200  # inside the tag: longer is not an answer (bounds every checker's work)
CONFIG_KEYS = ("question", "answer", "checker", "tolerance", "system_prompt")
_NUMBER = re.compile(r"\s*(-?[0-9]{1,30}(?:\.[0-9]{1,30})?(?:[eE][-+]?[0-9]{1,3})?)\s*")


class DataTaskError(ValueError):
    """A data file or config that cannot make a task; the message is one line saying how to fix it."""


# ------------------------------------------------------------------ the checkers


def parse_exact(text: str) -> str | None:
    return answer_text(text, MAX_ANSWER_CHARS)


def parse_number(text: str) -> float | None:
    span = answer_span(text)
    match = _NUMBER.fullmatch(span) if span is not None else None
    value = float(match.group(1)) if match else None
    return value if value is not None and math.isfinite(value) else None


def _math_parse(text: str) -> Any:
    from math_verify import parse

    return parse(text)


def parse_math(text: str) -> Any:
    """The expression inside the tag as math-verify reads it, or None when it reads nothing."""
    span = parse_exact(text)
    if span is None:
        return None
    parsed = _math_parse(span if "$" in span or "\\" in span else f"${span}$")
    return parsed or None


def _same_text(answer: str, target: Any) -> bool:
    return isinstance(target, str) and answer == target.strip()


def _same_integer(answer: int, target: Any) -> bool:
    return answer == parse_int(str(target))


def _close(answer: float, target: Any, tolerance: float) -> bool:
    match = _NUMBER.fullmatch(str(target))
    return match is not None and abs(answer - float(match.group(1))) <= tolerance


def _math_equal(answer: Any, target: Any) -> bool:
    from math_verify import verify

    gold = _math_parse(str(target) if "$" in str(target) or "\\" in str(target) else f"${target}$")
    return bool(gold) and verify(gold, answer) is True


@dataclass(frozen=True)
class Checker:
    """How a data task reads an answer and compares it with the row's."""

    name: str
    parse: Callable[[str], Any]
    same: Callable[..., bool]
    description: str


CHECKERS = {
    "exact": Checker("exact", parse_exact, _same_text, "the answer's text, exactly"),
    "integer": Checker("integer", parse_answer, _same_integer, "one integer"),  # the book's integer parse
    "number": Checker("number", parse_number, _close, "a number within the tolerance"),
    "math": Checker("math", parse_math, _math_equal, "an expression math-verify finds equal"),
}


# ------------------------------------------------------------------ the task


def read_rows(path: Path, question: str, answer: str) -> list[dict[str, str]]:
    """The file's (question, answer) rows as text; a one-line DataTaskError for what cannot be read."""
    import datasets

    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataTaskError(f"{path}: a data task is a .jsonl, .json, .csv or .parquet file")
    if not path.is_file():
        raise DataTaskError(f"{path}: no such file: pass --task with the path of your data file")
    try:
        table = datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as error:  # datasets raises many kinds, each with a long message
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataTaskError(f"{path}: datasets could not read it as {kind}: {first}") from None
    missing = [c for c in (question, answer) if c not in table.column_names]
    if missing:
        raise DataTaskError(
            f"{path}: no column {missing[0]!r} (it has {', '.join(table.column_names)}): name the columns with "
            f'--task-config \'{{"question": "...", "answer": "..."}}\''
        )
    rows = [
        {"question": str(q).strip(), "answer": str(a).strip()}
        for q, a in zip(table[question], table[answer], strict=True)
        if q is not None and a is not None and str(q).strip() and str(a).strip()
    ]
    if not rows:
        raise DataTaskError(f"{path}: no row has both a question and an answer")
    return rows


def _key(question: str) -> str:
    return " ".join(question.split())  # the same question however it is spaced


def data_task(path: Path, config: Mapping[str, Any]):
    """The Task of a data file and its config (`CONFIG_KEYS`)."""

    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise DataTaskError(
            f"task_config: a data task takes {', '.join(CONFIG_KEYS)}, not {', '.join(unknown)}"
        )
    checker_name = config.get("checker", "exact")
    if checker_name not in CHECKERS:
        raise DataTaskError(f"task_config: checker {checker_name!r} is not one of {', '.join(CHECKERS)}")
    tolerance = config.get("tolerance", 1e-6)
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not tolerance >= 0:
        raise DataTaskError(f"task_config: tolerance must be a number >= 0, got {tolerance!r}")
    checker = CHECKERS[checker_name]
    same = partial(checker.same, tolerance=float(tolerance)) if checker_name == "number" else checker.same
    system = str(config.get("system_prompt", DEFAULT_SYSTEM_PROMPT))
    rows = read_rows(path, str(config.get("question", "question")), str(config.get("answer", "answer")))
    splits = {"train": [], "eval": []}
    for row in rows:
        splits[split_of(_key(row["question"]))].append(row)
    for split, found in splits.items():
        if not found:
            raise DataTaskError(
                f"{path}: its {len(rows)} questions leave the {split} split empty (one question in ten is "
                "held out, by a hash of its text): add questions"
            )

    def _row(problem: dict[str, str]) -> dict[str, Any]:
        return {"prompt": messages(system, problem["question"]), "target": problem["answer"]}

    def build_dataset(n: int, seed: int):
        import datasets

        check_size(n, seed)
        rng = random.Random(seed)
        train = splits["train"]
        return datasets.Dataset.from_list([_row(train[rng.randrange(len(train))]) for _ in range(n)])

    def build_eval_dataset(n: int, seed: int):
        import datasets

        check_size(n, seed)
        held_out = list(splits["eval"])
        if n > len(held_out):
            raise ValueError(
                f"{path.name} holds {len(held_out)} held-out questions (one in ten), not {n}: pass "
                f"--eval-prompts {len(held_out)} or fewer, or add questions"
            )
        random.Random(f"eval/{seed}").shuffle(held_out)
        return datasets.Dataset.from_list([_row(p) for p in held_out[:n]])

    def worst_case_prompt() -> list[dict[str, str]]:
        return messages(system, max((r["question"] for r in rows), key=len))

    @declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
    def correctness_reward(
        prompts: Any, completions: Sequence[Any], target: Any, **kwargs: Any
    ) -> list[float]:
        return correctness_scores(completions, checker.parse, same, target)

    @declare_reward(FORMAT_REWARD, RewardRole.SHAPING)
    def format_reward(prompts: Any, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return format_scores(completions, checker.parse)

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return Task(
        name=path.stem,
        system_prompt=system,
        build_dataset=build_dataset,
        reward_funcs=(correctness_reward, format_reward),
        description=f"Questions of {path.name}; answer inside <ans></ans>, checked as {checker.description}.",
        build_eval_dataset=build_eval_dataset,
        worst_case_prompt=worst_case_prompt,
        reward_columns=("target",),
        parse_answer=checker.parse,
        reference_answer=lambda row: str(row["target"]),
        source={
            "task_source": "data file",
            "task_data": str(path),
            "task_data_rows": str(len(rows)),
            "task_data_sha256": digest,
            "task_data_checker": checker_name,
            "task_config": json.dumps(dict(config), sort_keys=True),
        },
    )
