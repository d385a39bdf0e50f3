"""The chapter's driver loop, step by step, mapped onto the verl 0.9.1 code that runs each step.

HybridFlow's single controller runs a GRPO step as a sequence of calls on worker groups. In verl
0.9.1 the controller is the TaskRunner Ray actor (verl/trainer/main_ppo.py), the loop is
``PPOTrainer.fit``, and one step is ``PPOTrainer._step_once`` (verl/trainer/ppo/v1/trainer_base.py).
Two steps moved since the paper: rewards are computed by reward workers as each rollout finishes
(streaming, inside the agent loop), not on the driver after generation; and the weights reach vLLM
in the sync trainer's ``on_step_end`` hook.

Example::

    >>> [step.name for step in DRIVER_LOOP][:3]
    ['generate', 'reward', 'old log-probs']
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Step:
    name: str  # the chapter's word for it
    where: str  # module:qualified.name of the verl code that does it
    what: str


DRIVER_LOOP = (
    Step(
        "generate",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._step_once",
        "replay_buffer.sample(): the agent loop sends each prompt rollout.n times to the vLLM replicas",
    ),
    Step(
        "reward",
        "verl.experimental.agent_loop.agent_loop:AgentLoopWorker._compute_score",
        "each finished rollout goes to a RewardLoopWorker, which calls our compute_score",
    ),
    Step(
        "old log-probs",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._compute_old_log_prob",
        "the FSDP actor recomputes the log-probs of the sampled tokens (the PPO ratio's denominator)",
    ),
    Step(
        "ref log-probs",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._compute_ref_log_prob",
        "the same actor with its LoRA adapter disabled (ref_in_actor): the KL term's reference",
    ),
    Step(
        "advantage",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._compute_advantage",
        "on the driver: compute_advantage_for_multi_trajectories, the group mean as the baseline",
    ),
    Step(
        "update",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._update_actor",
        "the actor's PPO-clipped policy loss plus the KL loss, one optimizer step",
    ),
    Step(
        "weight sync",
        "verl.trainer.ppo.v1.trainer_sync:PPOTrainerSync.on_step_end",
        "vLLM wakes up and receives the new adapter (checkpoint_manager.update_weights)",
    ),
)


def resolve(where: str):
    """The verl object a step names (imports its module)."""
    module, _, qualname = where.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def locate(where: str) -> str:
    """``file:line`` of the step's code, relative to the installed verl package."""
    obj = resolve(where)
    path = Path(inspect.getsourcefile(obj))
    root = Path(importlib.import_module("verl").__file__).parent.parent
    return f"{path.relative_to(root)}:{inspect.getsourcelines(obj)[1]}"


def step_once_calls() -> list[str]:
    """The ``self._...`` methods ``PPOTrainer._step_once`` calls, in the order it calls them."""
    source = inspect.getsource(resolve("verl.trainer.ppo.v1.trainer_base:PPOTrainer._step_once"))
    calls = []
    for token in source.replace("(", " ").split():
        if token.startswith("self._") and token[5:] not in calls and token != "self._step_once":
            calls.append(token[5:])
    return calls
