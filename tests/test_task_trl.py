"""The task's rewards run through TRL 1.15's own reward code, not a copy of its calling convention.

Importing GRPOTrainer costs ~30 s on 2 cores (torch, transformers), so these checks live apart from
the fast unit tests in test_task.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from task import ADDITION

torch = pytest.importorskip("torch")
trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
trl_utils = pytest.importorskip("trl.trainer.utils")


def test_trl_logs_rewards_under_their_function_names() -> None:
    # GRPOTrainer names each callable with get_callable_name; the metric is rewards/<name>/mean.
    names = [trl_utils.get_callable_name(f) for f in ADDITION.reward_funcs]
    assert names == ["correctness_reward", "format_reward"]


def test_calculate_rewards_calls_our_functions() -> None:
    from transformers import TrainerState

    ds = ADDITION.build_dataset(3, seed=0)
    group = 2
    inputs = [dict(row) for row in ds for _ in range(group)]  # TRL repeats each row per generation
    prompts = [row["prompt"] for row in inputs]
    contents = [
        f"<ans>{inputs[0]['target']}</ans>",
        "no tag",
        f"<ans> {inputs[2]['target'] + 1} </ans>",
        None,
        "<ans>5</ans><ans>5</ans>",
        f"<ans>{inputs[5]['target']}</ans>",
    ]
    completions = [[{"role": "assistant", "content": c}] for c in contents]
    # Only the attributes _calculate_rewards and profiling_context read: no model is needed.
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        state=TrainerState(),
        args=SimpleNamespace(report_to=[]),
        reward_funcs=list(ADDITION.reward_funcs),
        reward_processing_classes=[None] * len(ADDITION.reward_funcs),
        reward_func_names=[trl_utils.get_callable_name(f) for f in ADDITION.reward_funcs],
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
