"""A task from reasoning-gym: any of its procedural datasets, scored by its own `score_answer`.

    uv run python labs/grpo-first/train.py --task reasoning-gym:basic_arithmetic
    uv run python labs/grpo-first/train.py --task reasoning-gym:count_bits --task-config '{"max_n": 1000}'

reasoning-gym (https://github.com/open-thought/reasoning-gym) generates each dataset's entries from a
seed alone, offline: `create_dataset(name, size=, seed=, **config)` holds entries with a `question`,
an `answer` and `metadata`, and `dataset.score_answer(answer, entry)` scores an answer in 0..1. Here a
row is one entry: its question is the user turn, after a system prompt that asks for the answer inside
the book's tag. The correctness reward is the dataset's own `score_answer` behind the book's parse (the
text inside exactly one `<ans>` tag, at most `MAX_ANSWER_CHARS`), so it pays what reasoning-gym pays,
partial credit included; the format reward pays when there is such a text.

A row keeps the seed and index of its entry (`gym_seed`, `gym_index`), and the reward regenerates the
entry from them: reasoning-gym's metadata holds tuples and objects a dataset column would flatten.
The held-out split is disjoint from training by content (a hash of the question's text), whatever the
seeds. Some of reasoning-gym's scorers evaluate the answer with SymPy or `eval` (../shared notes:
`countdown`'s `parse_expr`): `python -m task check` finds which, and a lab refuses them before it loads
anything (its page lists them, measured).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
from collections.abc import Mapping, Sequence
from functools import cache, lru_cache
from typing import Any

from task.dataset import SPLITS, check_size, messages, split_of
from task.protocol import Task
from task.rewards import (
    CORRECT_REWARD,
    FORMAT_REWARD,
    RewardRole,
    _listed,
    answer_text,
    completion_text,
    declare_reward,
    format_scores,
    per_completion,
)

PREFIX = "reasoning-gym:"
SYSTEM_PROMPT = "Solve the task. Put only the final answer inside <ans></ans>."
MAX_ANSWER_CHARS = 500
# Entries are drawn from a dataset of this size per seed (indices 0..POOL-1); reasoning-gym generates
# an entry when it is asked for, from the seed and its index, so the size costs nothing up front.
POOL = 100_000
# The budget's prompt length is bounded from this many entries of each split, with room beyond.
WORST_CASE_SAMPLE = 100
MARGIN = 16  # characters of room beyond the longest question sampled


class GymTaskError(ValueError):
    """A dataset name or config reasoning-gym does not take; one line saying how to fix it."""


@lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=POOL, seed=seed, **json.loads(config_json))


def parse_answer(text: str) -> str | None:
    """The text inside the completion's single `<ans>` tag, stripped; None when empty or too long."""
    return answer_text(text, MAX_ANSWER_CHARS)


def gym_task(spec: str, config: Mapping[str, Any]):
    """The Task of `reasoning-gym:<dataset>` with its config (the dataset's own keyword arguments)."""

    name = spec.removeprefix(PREFIX)
    try:
        import reasoning_gym
    except ImportError:
        raise GymTaskError(
            "reasoning-gym is not installed: uv sync installs the locked environment"
        ) from None
    known = sorted(reasoning_gym.factory.DATASETS)
    if name not in known:
        raise GymTaskError(
            f"reasoning-gym has no dataset {name!r}; it has {len(known)}, such as {', '.join(known[:8])}"
        )
    config_json = json.dumps(dict(config), sort_keys=True)
    try:
        first = _dataset(name, config_json, 0)[0]
    except Exception as error:
        raise GymTaskError(
            f"reasoning-gym:{name} with config {config_json}: {type(error).__name__}: {error}"
        ) from None
    if not isinstance(first.get("question"), str) or first.get("answer") is None:
        raise GymTaskError(f"reasoning-gym:{name}: its entries have no question and answer to train on")

    def entry(seed: int, index: int) -> dict[str, Any]:
        return _dataset(name, config_json, seed)[index]

    def rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
        check_size(n, seed)
        found: list[dict[str, Any]] = []
        for index in range(POOL):
            e = entry(seed, index)
            if split_of(" ".join(e["question"].split())) == split:
                found.append(
                    {
                        "prompt": messages(SYSTEM_PROMPT, e["question"]),
                        "target": str(e["answer"]),
                        "gym_seed": seed,
                        "gym_index": index,
                    }
                )
                if len(found) == n:
                    return found
        raise ValueError(f"reasoning-gym:{name} made only {len(found)} {split} questions in {POOL} entries")

    def build(split: str, n: int, seed: int):
        import datasets

        # The held-out rows come from a seed stream of their own, as the book's tasks' do.
        return datasets.Dataset.from_list(rows(n, seed if split == "train" else seed + 1_000_003, split))

    @cache  # reading hundreds of entries: once a process
    def worst_case_prompt() -> list[dict[str, str]]:
        """A bound on the longest prompt: a procedural dataset's longest cannot be listed, so the longest
        of a sample of each split, its question padded by a quarter (at least `MARGIN` characters)."""
        longest = max(
            (r["prompt"] for split in SPLITS for r in rows(WORST_CASE_SAMPLE, 0, split)),
            key=lambda p: len(p[1]["content"]),
        )
        question = longest[1]["content"]
        return messages(SYSTEM_PROMPT, question + " " * max(MARGIN, len(question) // 4))

    def score(answer: str, seed: Any, index: Any) -> float:
        value = float(
            _dataset(name, config_json, int(seed)).score_answer(answer, entry(int(seed), int(index)))
        )
        return min(max(value, 0.0), CORRECT_REWARD) if math.isfinite(value) else 0.0

    @declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
    def correctness_reward(
        prompts: Any, completions: Sequence[Any], gym_seed: Any, gym_index: Any, **kwargs: Any
    ) -> list[float]:
        """reasoning-gym's own score of the answer inside the tag (0..1, partial credit included)."""
        completions = _listed(completions)
        n = len(completions)
        out = []
        for completion, seed, index in zip(
            completions, per_completion(gym_seed, n), per_completion(gym_index, n), strict=True
        ):
            answer = parse_answer(completion_text(completion))
            try:
                out.append(0.0 if answer is None else score(answer, seed, index))
            except Exception:  # a scorer that raises on an odd answer pays nothing for it
                out.append(0.0)
        return out

    @declare_reward(FORMAT_REWARD, RewardRole.SHAPING)
    def format_reward(prompts: Any, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return format_scores(completions, parse_answer)

    return Task(
        name=f"{PREFIX}{name}",
        system_prompt=SYSTEM_PROMPT,
        build_dataset=lambda n, seed: build("train", n, seed),
        reward_funcs=(correctness_reward, format_reward),
        description=f"reasoning-gym's {name}; answer inside <ans></ans>, scored by its own score_answer.",
        build_eval_dataset=lambda n, seed: build("eval", n, seed),
        worst_case_prompt=worst_case_prompt,
        reward_columns=("gym_seed", "gym_index"),
        parse_answer=parse_answer,
        reference_answer=lambda row: str(row["target"]),
        source={
            "task_source": "reasoning-gym",
            "task_gym_dataset": name,
            "task_config": config_json,
            "task_gym_version": importlib.metadata.version("reasoning-gym"),
        },
    )
