"""Each training step ends whole, and a stopped run leaves a checkpoint of the last step it finished.

The trainer saves `checkpoint-N` every `save_steps` (grpolab.lifecycle.checkpoints). A run stopped between two
saves would lose every step since the last one, so the harness keeps a step's bookkeeping whole and
saves one more checkpoint when a run is stopped:

- **A step ends whole.** A stop that arrives during a step (its rollouts, its update: TRL's and
  Unsloth's code) is acted on when the next step begins (`StepBoundary`, grpolab.lifecycle.endings.STOPS).
  From the optimizer step until then (the update, the step counter, the logs, a scheduled
  checkpoint) even a second signal waits: the weights, optimizer state and counter always agree,
  and every step the counter counts is logged.
- **The stopped run's checkpoint.** A signal, or running out of memory, in the middle of step k+1
  finds the weights and optimizer of step k untouched (only the optimizer step changes them, and it
  is never cut). The harness saves them as `checkpoint-k` (`save_stopped`) with the RNG states as
  they were when step k ended, where the trainer's own save at step k reads them, so a resumed run
  draws the same rollouts as a run never stopped.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from grpolab.lifecycle.checkpoints import Checkpoint, latest
from grpolab.lifecycle.endings import STOPS, DeferredSignals, signals_deferred


def rng_states() -> dict[str, Any]:
    """The RNG states the trainer saves in a checkpoint (`Trainer._save_rng_state`), as they are now."""
    import numpy as np
    import torch

    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.random.get_rng_state()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.random.set_rng_state(states["cuda"])


class StepBoundary(TrainerCallback):
    """Keeps each step's bookkeeping whole: signals wait from the optimizer step until the next step
    begins (or training ends), and the RNG states are kept as each step ends, for `save_stopped`."""

    def __init__(self) -> None:
        self.deferred = DeferredSignals("the step's update, logs and checkpoint")
        self.rng_at_step_end: dict[str, Any] | None = None
        self.step_ended: int | None = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.deferred.hold()

    def on_step_end(self, args, state, control, **kwargs):
        # Where the trainer's own save at this step reads them (nothing between draws a random number).
        self.rng_at_step_end, self.step_ended = rng_states(), state.global_step

    def on_step_begin(self, args, state, control, **kwargs):
        self.deferred.release()  # a signal held through the last step's bookkeeping lands here
        STOPS.check()  # ... as does one recorded during the step (the training's own stopping point)

    def on_train_end(self, args, state, control, **kwargs):
        self.deferred.release()
        STOPS.check()

    def close(self) -> None:
        """Training ended in an error: what was held is dropped, the error ends the run."""
        self.deferred.release(deliver=False)


def save_stopped(trainer, boundary: StepBoundary | None) -> Checkpoint | None:
    """Save the stopped run's `checkpoint-k` (k: the steps it completed), unless a whole one is there
    already or nothing was trained; returns the newest whole checkpoint. A step was in progress (its
    rollouts drawn, perhaps its gradients), but the weights, optimizer and scheduler are step k's: the
    RNG states go back to where step k ended, so the resumed run draws step k+1's rollouts anew."""
    step = trainer.state.global_step
    output_dir = Path(trainer.args.output_dir)
    found = latest(output_dir)
    if step == 0 or (found is not None and found.step == step):
        return found
    if boundary is not None and boundary.rng_at_step_end is not None and boundary.step_ended == step:
        set_rng_states(boundary.rng_at_step_end)  # the process is ending: its RNG is ours to set
    with signals_deferred(f"saving checkpoint-{step}"):
        trainer._save_checkpoint(trainer.model, trial=None)
    return latest(output_dir)
