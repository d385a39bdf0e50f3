"""The advantage, as the chapter writes it, and as verl computes it on the driver.

For a group of G completions of one prompt with rewards r_1..r_G:

    GRPO          A_i = (r_i - mean(r)) / (std(r) + eps)      std with G - 1 (unbiased), as both libraries
    Dr. GRPO      A_i =  r_i - mean(r)                        (no std: labs/grpo-first's scale_rewards "none")
    RLOO          A_i =  r_i - (sum(r) - r_i) / (G - 1)       the mean of the *other* completions

The two libraries differ only in eps: verl adds 1e-6 (core_algos.compute_grpo_outcome_advantage),
TRL 1.15 adds 1e-4 (GRPOTrainer._generate_and_score_completions). A group whose rewards are all equal
gets 0 everywhere, whatever eps.

Example::

    >>> group_advantages([1.2, 0.0, 0.2, 0.0], group_size=4, scale_by_std=False).round(2).tolist()
    [0.85, -0.35, -0.15, -0.35]
    >>> leave_one_out_advantages([1.2, 0.0, 0.2, 0.0], group_size=4).round(3).tolist()
    [1.133, -0.467, -0.2, -0.467]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

VERL_EPS = 1e-6  # verl 0.9.1, core_algos.compute_grpo_outcome_advantage(epsilon=1e-6)
TRL_EPS = 1e-4  # TRL 1.15, grpo_trainer.py: advantages / (std_rewards + 1e-4)


def _groups(rewards: Sequence[float], group_size: int) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if group_size < 2 or r.size % group_size:
        raise ValueError(f"{r.size} rewards do not split into groups of {group_size} (>= 2)")
    return r.reshape(-1, group_size)


def group_advantages(
    rewards: Sequence[float], group_size: int, scale_by_std: bool = True, eps: float = VERL_EPS
) -> np.ndarray:
    """GRPO's advantage (Dr. GRPO's with ``scale_by_std=False``); rewards ordered group by group."""
    r = _groups(rewards, group_size)
    advantages = r - r.mean(axis=1, keepdims=True)  # the group mean is the baseline
    if scale_by_std:
        advantages = advantages / (r.std(axis=1, ddof=1, keepdims=True) + eps)
    return advantages.reshape(-1)


def leave_one_out_advantages(rewards: Sequence[float], group_size: int) -> np.ndarray:
    """RLOO's advantage: each completion against the mean of the rest of its group."""
    r = _groups(rewards, group_size)
    baseline = (r.sum(axis=1, keepdims=True) - r) / (group_size - 1)
    return (r - baseline).reshape(-1)


def verl_advantages(
    rewards: Sequence[float], group_size: int, estimator: str, norm_adv_by_std_in_grpo: bool = True
) -> np.ndarray:
    """What verl's trainer computes for these rewards, through the function its driver calls.

    verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories is what
    PPOTrainer._compute_advantage runs; the reward sits on each response's last token (as verl's
    reward loop puts it) and responses have different lengths. Returns one advantage per completion.
    """
    import torch
    from verl import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    r = _groups(rewards, group_size).reshape(-1)
    n, width = r.size, 6
    lengths = [1 + (i * 7) % width for i in range(n)]  # 1..6 tokens: the reward is on the last one
    mask = torch.zeros(n, width)
    token_rewards = torch.zeros(n, width)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
        token_rewards[i, length - 1] = float(r[i])
    uids = np.array([f"prompt{i // group_size}" for i in range(n)], dtype=object)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask}, non_tensors={"uid": uids}
    )
    # The trainer's keys are "{uid}_{session}_{turn}": one session of one turn per completion here.
    keys = [f"{uid}_{i}_0" for i, uid in enumerate(uids)]
    out = compute_advantage_for_multi_trajectories(
        data,
        batch_keys=keys,
        adv_estimator=estimator,
        num_repeat=group_size,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        config=None,
    )
    advantages = out.batch["advantages"]
    # The advantage is broadcast over each response's tokens: read it once, check it is the same.
    per_completion = advantages[:, 0]
    if not torch.equal(advantages, per_completion[:, None] * mask):
        raise AssertionError("verl's advantage is not constant over a response's tokens")
    return per_completion.double().numpy()
