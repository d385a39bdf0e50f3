"""The chapter's map of the driver loop points at verl 0.9.1 code that does what the map says."""

from __future__ import annotations

import inspect

from grpo_verl.driver import DRIVER_LOOP, locate, resolve, step_once_calls

STEPS = {step.name: step for step in DRIVER_LOOP}


def test_every_step_resolves_to_verl_code():
    assert list(STEPS) == [
        "generate",
        "reward",
        "old log-probs",
        "ref log-probs",
        "advantage",
        "update",
        "weight sync",
    ]
    for step in DRIVER_LOOP:
        assert callable(resolve(step.where)), step.where
        assert locate(step.where).startswith("verl/"), step.where


def test_the_trainer_step_calls_them_in_the_chapters_order():
    methods = [step.where.rsplit(".", 1)[1] for step in DRIVER_LOOP if ":PPOTrainer._" in step.where]
    methods = [m for m in methods if m != "_step_once"]
    assert methods == [
        "_compute_old_log_prob",
        "_compute_ref_log_prob",
        "_compute_advantage",
        "_update_actor",
    ]
    calls = step_once_calls()
    assert [m for m in calls if m in methods] == methods
    generate = inspect.getsource(resolve(STEPS["generate"].where))
    assert generate.index("replay_buffer.sample") < generate.index("self._compute_old_log_prob")


def test_the_reward_and_the_weight_sync_steps_do_what_they_say():
    reward = inspect.getsource(resolve(STEPS["reward"].where))
    assert "compute_score.remote" in reward  # a RewardLoopWorker scores each finished rollout
    sync = inspect.getsource(resolve(STEPS["weight sync"].where))
    assert "update_weights" in sync
    advantage = inspect.getsource(resolve(STEPS["advantage"].where))
    assert "compute_advantage_for_multi_trajectories" in advantage  # what grpo_verl.advantages calls
