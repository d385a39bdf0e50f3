"""The terminal while a lab trains: the progress bar and one compact line per logged step.

Transformers' progress callback prints every log row as a dict of about 30 keys, which pushes the
bar and the few numbers a reader follows off the screen. `StepLine` replaces it: the same bar, and
under it one line per step with the reward and each of its parts, the KL, the share of completions
cut at the length cap, the decoding speed and the step's peak memory. Every metric still goes to
MLflow (grpolab.meter). `quiet_library_noise` keeps out what a user can do nothing about: warnings
libraries print at import about their own internals, and the data set's map progress bars.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

from budgets.units import human_bytes

ALIASING_ERROR_ENV = "TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING"
STEP_PREFIX = "step "  # every compact line starts so (tests count steps by it)


def step_line(
    step: int, max_steps: int, logs: dict[str, Any], speed: dict[str, float], peak: int | None
) -> str:
    """`step 12/60  reward 0.188 (correctness 0.000 format 0.188)  kl 0.19  clipped 0%  412 tok/s  peak 1.26 GiB`."""
    parts = [f"{STEP_PREFIX}{step}/{max_steps}"]
    if "reward" in logs:
        rewards = [
            f"{k.removeprefix('rewards/').removesuffix('/mean').removesuffix('_reward')} {float(v):.3f}"
            for k, v in logs.items()
            if k.startswith("rewards/") and k.endswith("/mean")
        ]
        parts.append(f"reward {float(logs['reward']):.3f}" + (f" ({' '.join(rewards)})" if rewards else ""))
    if "kl" in logs:
        parts.append(f"kl {float(logs['kl']):.3g}")
    if "completions/clipped_ratio" in logs:
        parts.append(f"clipped {float(logs['completions/clipped_ratio']):.0%}")
    if speed.get("perf/decode_tokens_per_s"):
        parts.append(f"{speed['perf/decode_tokens_per_s']:.0f} tok/s")
    if peak:
        parts.append(f"peak {human_bytes(peak)}")
    return "  ".join(parts)


def use_step_lines(trainer, meter) -> None:
    """Swap the trainer's progress callback for one that writes `step_line` under the same bar."""
    from transformers.trainer_callback import ProgressCallback  # imports torch: not at module level

    class StepLine(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if not state.is_world_process_zero or self.training_bar is None:
                return
            if "train_runtime" in logs:  # the end-of-training summary: the lab prints its own
                return
            peak = meter.step_peaks[-1][1] if meter.step_peaks else None
            self.training_bar.write(step_line(state.global_step, state.max_steps, logs, meter.speed(), peak))

    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(StepLine())


class _Drop(logging.Filter):
    """Drops records whose message says `fragment` and not `keep`."""

    def __init__(self, fragment: str, keep: str | None = None) -> None:
        super().__init__()
        self.fragment, self.keep = fragment, keep

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return self.fragment not in message or (self.keep is not None and self.keep in message)


def quiet_library_noise() -> None:
    """Before Unsloth is imported: drop the import-time warnings nobody running a lab can act on.

    - torch's "is an Enum subclass and is now natively supported by torch.compile" (torch/utils/_pytree.py),
      printed twice when torchao registers its enums: a deprecation inside the libraries.
    - Unsloth's "Could not build the patched trl.trainer.<x>" for trainers other than GRPO's (its
      rewriting of every TRL trainer; grpolab.unsloth_trainer raises if GRPO's is not rewritten).
    - datasets' "Map" / "Filter" progress bars while the prompts are built (a second, at most).
    - MLflow's note that it flushes its trace queue at exit (the harness flushed it already).
    - torch's check that a custom op's output does not alias its input, on the first call of a
      compiled graph: inductor's own `alloc_from_pool` (Unsloth compiles with `memory_planning`)
      fails it. torch warns about it, or raises where `CI` is set
      (torch/_functorch/config.py: `error_on_custom_op_aliasing`), so a lab that runs at a desk
      would die in a user's CI job. It stays a warning, as torch makes it everywhere else.
    Everything else (Unsloth's notes about the device and precision, MLflow's, errors) stays.
    """
    # Python's own warning when a library's source has an invalid escape (torchao's, compiled once).
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    logging.getLogger("torch.utils._pytree").addFilter(_Drop("is an Enum subclass"))
    logging.getLogger("unsloth_zoo.log").addFilter(
        _Drop("Could not build the patched trl.trainer.", keep="trl.trainer.grpo_trainer")
    )
    # MLflow's "Flushing the async trace logging queue before program exit": printed after the lab's
    # own last line (its error, when it failed), about MLflow's exporter, which the lab flushed itself.
    logging.getLogger("mlflow.tracing.export.async_export_queue").setLevel(logging.WARNING)
    # datasets reads this when it is imported (later, with the prompts): importing it here would put
    # seconds of imports before the store check, which must refuse a bad store within seconds.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    # Read when torch is imported (`env_name_force`); a process that imported it already (the fork
    # server's children, a notebook) gets the setting itself.
    os.environ[ALIASING_ERROR_ENV] = "0"
    if "torch._functorch.config" in sys.modules:
        sys.modules["torch._functorch.config"].error_on_custom_op_aliasing = False
