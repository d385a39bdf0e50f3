"""The protocol every task keeps: `Task`, what a lab, a budget and the check read of it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from task.dataset import prompt_chars
from task.rewards import RewardInfo, RewardRole, reward_info

if TYPE_CHECKING:
    import datasets


@dataclass(frozen=True)
class Task:
    """One verifiable task: how to build its prompts and how to score completions.

    Parameters that describe the task:
        name: the registry key, the lab's ``task`` setting.
        description: one line for people: what is asked and what the answer looks like.
        system_prompt: the system turn of every prompt.
    Parameters that build prompts (conversational rows; same (n, seed), same rows; n >= 1):
        build_dataset: ``(n, seed) -> Dataset`` of training rows.
        build_eval_dataset: ``(n, seed) -> Dataset`` of held-out rows; no row's problem (up to order
            where order does not matter) is in any training set, whatever the seeds.
        worst_case_prompt: ``() -> messages``, the longest prompt the builders can make;
            ``max_prompt_chars()`` counts its characters.
    Parameters that score completions:
        reward_funcs: ``(correctness_reward, format_reward)``, each
            ``(prompts, completions, **columns) -> list[float]``, total: one float per completion,
            and declared with ``declare_reward``; their names distinct, at least one an answer reward.
        reward_columns: the dataset columns the rewards read besides prompts and completions.
        parse_answer: ``text -> answer | None``, the one parser both rewards use.
        reference_answer: ``row -> str``, a correct answer for a row (what goes inside the tag).
    Its neighbours, where it has a ladder of questions (lastdigit's config):
        easier, harder: the ``task_config`` (JSON) of the next question down or up, or None.
    Where it came from:
        source: tags for the run's record (``task_source``: book, file, data file or reasoning-gym,
            with the file and its sha256, the data file's rows, or the dataset, config and version).
    """

    name: str
    system_prompt: str
    build_dataset: Callable[[int, int], datasets.Dataset]
    reward_funcs: tuple[Callable[..., list[float]], ...]
    description: str
    build_eval_dataset: Callable[[int, int], datasets.Dataset]
    worst_case_prompt: Callable[[], list[dict[str, str]]]
    reward_columns: tuple[str, ...]
    parse_answer: Callable[[str], Any]
    reference_answer: Callable[[dict[str, Any]], str]
    easier: str | None = field(default=None, compare=False)
    harder: str | None = field(default=None, compare=False)
    source: Mapping[str, str] = field(
        default_factory=lambda: {"task_source": "book"}, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        # Checked when the task is built (at import for the registry's): a reward nobody declared, or
        # two logged under one name, would otherwise reach the run doctor's verdicts unread.
        names = [r.name for r in self.rewards]
        if len(set(names)) != len(names):
            raise ValueError(
                f"task {self.name!r}: TRL logs one metric per name, and rewards share one: {names}"
            )
        if not any(r.role is RewardRole.ANSWER for r in self.rewards):
            raise ValueError(f"task {self.name!r}: no reward is declared an answer reward: {names}")

    @property
    def rewards(self) -> tuple[RewardInfo, ...]:
        """The declarations of ``reward_funcs``, in the same order."""
        return tuple(reward_info(f) for f in self.reward_funcs)

    @property
    def max_reward(self) -> float:
        """The most one completion can earn: TRL's ``reward`` is the sum of the rewards (weights 1)."""
        return sum(r.max_reward for r in self.rewards)

    def max_prompt_chars(self) -> int:
        """Characters in the longest prompt's messages, system and user, without the chat template.

        Every row's prompt is at most this long. With a character-level tokenizer (the CPU profile's
        tiny model) it bounds the prompt's tokens once the template's own tokens are added; for a
        real chat template, render ``worst_case_prompt()`` through it and count.
        """
        return prompt_chars(self.worst_case_prompt())


class UnknownTaskError(KeyError, ValueError):
    """A task name not in ``TASKS``; a KeyError for lookups, a ValueError for argument checks."""

    def __str__(self) -> str:
        # KeyError.__str__ would quote the message like a key; print it as the plain sentence it is.
        return str(self.args[0]) if self.args else ""
