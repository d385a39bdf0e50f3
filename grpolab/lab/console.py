"""The terminal while a lab trains: the progress bar and one compact line per logged step.

Transformers' progress callback prints every log row as a dict of about 30 keys, which pushes the
bar and the few numbers a reader follows off the screen. `StepLine` replaces it: the same bar, and
under it one line per step with the reward and each of its parts, the KL, the share of completions
cut at the length cap, the decoding speed and the step's peak memory. Every metric still goes to
MLflow (grpolab.lab.meter). `quiet_library_noise` keeps out what a user can do nothing about: warnings
libraries print at import about their own internals, MLflow's notes about its own store, and the data
set's map progress bars. `screen` drops the few lines a library prints that are untrue of the run (Unsloth's
"bfloat16 = True" and "this GPU has no bfloat16 support" on a machine with no GPU), once the lab has
said the truth in its own words (`said_by_the_lab`: the CPU banner says the backend and the precision).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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

    from grpolab.lifecycle.endings import STOPS

    class StepLine(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if not state.is_world_process_zero or self.training_bar is None:
                return
            if "train_runtime" in logs:  # the end-of-training summary: the lab prints its own
                return
            peak = meter.step_peaks[-1][1] if meter.step_peaks else None
            line = step_line(state.global_step, state.max_steps, logs, meter.speed(), peak)
            self.training_bar.write(line)
            STOPS.hold_after(line)  # a test's signal sent at this line lands in this step (a no-op else)

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
      rewriting of every TRL trainer; grpolab.model.unsloth_trainer raises if GRPO's is not rewritten).
    - datasets' "Map" / "Filter" progress bars while the prompts are built (a second, at most).
    - MLflow's note that it flushes its trace queue at exit (the harness flushed it already), its INFO
      lines about creating and migrating a new store's tables, and its system-metrics monitor's start
      (and, without a GPU, that it has no GPU to read): its warnings and errors stay.
    - bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community ... `pip install
      kernels`" (bitsandbytes/backends/cpu/ops.py, on CPUs with AVX512-BF16): the optional kernel is
      downloaded from the Hugging Face Hub at run time, which a locked, offline lab does not do; the
      stand-in runs bitsandbytes' built-in CPU kernels (the CPU banner says so), the same on every CPU.
    - torch's check that a custom op's output does not alias its input, on the first call of a
      compiled graph: inductor's own `alloc_from_pool` (Unsloth compiles with `memory_planning`)
      fails it. torch warns about it, or raises where `CI` is set
      (torch/_functorch/config.py: `error_on_custom_op_aliasing`), so a lab that runs at a desk
      would die in a user's CI job. It stays a warning, as torch makes it everywhere else.
    Everything else (Unsloth's notes about the device and precision, MLflow's warnings, errors) stays.
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
    # "Creating initial MLflow database tables...", "Updating database tables" (a new SQLite store),
    # "Started monitoring system metrics.", "Skip logging GPU metrics." (mlflow/system_metrics).
    for name in ("mlflow.store.db.utils", "mlflow.system_metrics.system_metrics_monitor"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
        _Drop("Failed to load CPU gemm_4bit_forward from kernels-community")
    )
    # datasets reads this when it is imported (later, with the prompts): importing it here would put
    # seconds of imports before the store check, which must refuse a bad store within seconds.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    # Read when torch is imported (`env_name_force`); a process that imported it already (the fork
    # server's children, a notebook) gets the setting itself.
    os.environ[ALIASING_ERROR_ENV] = "0"
    if "torch._functorch.config" in sys.modules:
        sys.modules["torch._functorch.config"].error_on_custom_op_aliasing = False


# --- the lab's screen: library lines that are untrue of the run, replaced by the lab's own ----------
# Unsloth's CPU backend at import (unsloth/_cpu_init.py): "bfloat16 = True" is torch's check of the
# CPU, not the run's precision (the CPU profile trains in float32), and its advice is for SFT users.
UNSLOTH_CPU_IMPORT = re.compile(r"Unsloth \S+: no GPU found, training on CPU \(")
# Unsloth's generated trainer (unsloth/models/rl.py) for a float32 model on a device without native
# bfloat16: on a machine with no GPU, "this GPU" is the CPU, and float32 is the recipe's choice.
UNSLOTH_FLOAT32 = re.compile(r"Unsloth: Model is in float32 and this GPU has no bfloat16 support")
UNSLOTH_CPU_LINES = (UNSLOTH_CPU_IMPORT, UNSLOTH_FLOAT32)

_said: list[re.Pattern[str]] = []  # the lines the lab has said in its own words, while a screen is up


def said_by_the_lab(lines: Iterable[re.Pattern[str]]) -> None:
    """The lab has said what these library lines say, truly: drop them from here on (under `screen`)."""
    _said.extend(lines)


class _LineFilter:
    """A text stream that passes every whole line on to `stream` but those the lab said itself."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.pending = stream, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        kept = [line for line in lines if not any(p.match(line) for p in _said)]
        if kept:
            self.stream.write("\n".join(kept) + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:  # a partial line flushed on purpose (a prompt, a progress mark): it goes now
            self.stream.write(self.pending)
            self.pending = ""
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty, buffer...: the stream's own
        return getattr(self.stream, name)


@contextmanager
def screen() -> Iterator[None]:
    """A lab's stdout while it runs: whole lines pass, but those `said_by_the_lab` names. Restored after."""
    original = sys.stdout
    filtered = _LineFilter(original)
    sys.stdout = filtered
    try:
        yield
    finally:
        filtered.flush()
        if sys.stdout is filtered:
            sys.stdout = original
        _said.clear()
