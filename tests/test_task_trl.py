"""Every task's rewards run through TRL 1.15's own reward code, not a copy of its calling convention.

Importing GRPOTrainer costs ~30 s on 2 cores (torch, transformers), so these checks live apart from
the fast unit tests in test_task.py and test_task_tasks.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import task

torch = pytest.importorskip("torch")
trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
trl_utils = pytest.importorskip("trl.trainer.utils")

TASKS = list(task.TASKS.values())
IDS = [t.name for t in TASKS]


def wrong(t: task.Task, row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """A well-formed answer that is wrong for `row`: another row's right answer that differs from its."""
    return next(t.reference_answer(r) for r in rows if t.reference_answer(r) != t.reference_answer(row))


@pytest.mark.parametrize("t", TASKS, ids=IDS)
def test_trl_logs_rewards_under_their_function_names(t: task.Task) -> None:
    # GRPOTrainer names each callable with get_callable_name; the metric is rewards/<name>/mean,
    # and the lab's MLflow metrics and docs use these two names for every task.
    names = [trl_utils.get_callable_name(f) for f in t.reward_funcs]
    assert names == ["correctness_reward", "format_reward"]


@pytest.mark.parametrize("t", TASKS, ids=IDS)
def test_calculate_rewards_calls_our_functions(t: task.Task) -> None:
    from transformers import TrainerState

    ds = t.build_dataset(3, seed=0)
    group = 2
    inputs = [dict(row) for row in ds for _ in range(group)]  # TRL repeats each row per generation
    prompts = [row["prompt"] for row in inputs]
    contents = [
        f"<ans>{t.reference_answer(inputs[0])}</ans>",
        "no tag",
        f"<ans> {wrong(t, inputs[2], t.build_dataset(50, seed=1).to_list())} </ans>",
        None,
        f"<ans>{t.reference_answer(inputs[4])}</ans><ans>{t.reference_answer(inputs[4])}</ans>",
        f"Done: <ans>{t.reference_answer(inputs[5])}</ans>",
    ]
    completions = [[{"role": "assistant", "content": c}] for c in contents]
    # Only the attributes _calculate_rewards and profiling_context read: no model is needed.
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        state=TrainerState(),
        args=SimpleNamespace(report_to=[]),
        reward_funcs=list(t.reward_funcs),
        reward_processing_classes=[None] * len(t.reward_funcs),
        reward_func_names=[trl_utils.get_callable_name(f) for f in t.reward_funcs],
        _log_completion_extra=lambda *args, **kwargs: None,
        _log_metric=lambda *args, **kwargs: None,
        environments=None,
    )
    ids = [[1, 2, 3]] * len(completions)
    rewards = trl_grpo.GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, ids)
    expected = torch.tensor(
        [[1.0, 0.2], [0.0, 0.0], [0.0, 0.2], [0.0, 0.0], [0.0, 0.0], [1.0, 0.2]], dtype=torch.float32
    )
    torch.testing.assert_close(rewards, expected)
