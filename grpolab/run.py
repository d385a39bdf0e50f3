"""A lab run as the lesson sees it: its settings, its prompts, the policy loader and `train(trainer)`.

A chapter's `train(run)` loads the policy through the run (measured as the "load" phase), builds its
trainer and hands it to `run.train`, which measures every generation and training pass and scores
the held-out prompts before and after. Everything around it (the MLflow run, how it ends, what is
saved and logged) is grpolab.session's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpolab.settings import LabSettings


@dataclass
class Run:
    """One lab run, as the lesson sees it: its settings, the prompts, the policy loader, and
    `train(trainer)`, which measures the trainer while it trains."""

    settings: LabSettings
    sheet: Any
    device: Any
    options: argparse.Namespace
    train_dataset: Any
    output_dir: Path
    meter: Any = None
    mlflow_run: Any = None
    trainer: Any = None
    tokenizer: Any = None
    adapter_dir: Path | None = None
    comparison: Any = None
    evals: dict[str, Any] = field(default_factory=dict)  # "base" before training, "adapter" after
    summary: list[str] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)  # the run doctor's, once the run has ended

    @property
    def task(self):
        from task import get_task

        return get_task(self.settings.task)

    def load_policy(self):
        """The 4-bit base with its LoRA adapter, loaded and measured as the "load" phase."""
        from grpolab import policy
        from grpolab.unsloth_trainer import grpo_trainer_class
        from grpolab.vllm_ledger import capture

        with self.meter.probe.phase("load"), capture() as vllm_lines:
            model, self.tokenizer = policy.load_policy(self.settings)
        self.meter.vllm_log = vllm_lines  # vLLM's start-up lines, for what its engine does not keep
        # From here `from trl import GRPOTrainer` is Unsloth's generated trainer on both profiles: on a
        # GPU `import unsloth` swaps it in; on the CPU stand-in an internal import does the same.
        grpo_trainer_class()
        if self.options.memory_cap_gib is not None:
            self.meter.probe.cap(self.options.memory_cap_gib)  # rehearse an out-of-memory on purpose
        return model, self.tokenizer

    def precision(self, model) -> dict[str, bool]:
        """bf16 / fp16 as the model was really loaded (fp16 on a T4), and use_cpu on the CPU stand-in."""
        from grpolab.precision import model_dtype, trainer_precision

        return {
            **trainer_precision(model_dtype(model), self.device.on_gpu),
            "use_cpu": not self.device.on_gpu,
        }

    def train(self, trainer) -> None:
        """Train, with every generation and training pass measured; logs what really trains."""
        import mlflow

        from grpolab import tracking

        self.trainer = trainer
        self.meter.attach(trainer)
        tracking.log_trainer_args(trainer.args)
        mlflow.set_tag("trainer_class", type(trainer).__name__)
        self.evaluate("base", step=0)  # the adapter starts at zero: this is the base model
        with self.meter.probe.phase("train"):
            trainer.train()

    def reward_funcs(self) -> tuple[tuple[Any, ...], list[float] | None]:
        """The reward functions the trainer was built with and their weights (TRL's reward_weights,
        None: all 1), or the task's own when no trainer was built."""
        if self.trainer is None:
            return tuple(self.task.reward_funcs), None
        weights = getattr(self.trainer.args, "reward_weights", None)
        return tuple(self.trainer.reward_funcs), None if weights is None else [float(w) for w in weights]

    def evaluate(self, which: str, step: int) -> None:
        """Held-out accuracy, format rate and length of `which` ("base" or "adapter"), logged as eval/*."""
        from grpolab.evaluate import evaluate, log_eval

        if self.settings.eval_prompts == 0 or self.trainer is None:
            return
        with self.meter.probe.phase(f"eval_{which}"):
            result = evaluate(
                self.trainer.model,
                self.tokenizer,
                self.settings,
                which,
                self.adapter_dir,
                reward_funcs=self.reward_funcs()[0],  # the task's own, and any other the run trained on
            )
        self.evals[which] = result
        log_eval(result, step)
