"""A lab run as the lesson sees it: its settings, its prompts, the policy loader and `train(trainer)`.

A chapter's `train(run)` loads the policy through the run (measured as the "load" phase), builds its
trainer and hands it to `run.train`, which measures every generation and training pass and scores
the held-out prompts before and after. Everything around it (the MLflow run, how it ends, what is
saved and logged) is grpolab.lab.session's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpolab.config.settings import LabSettings


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
    resume: Any = None  # grpolab.lifecycle.resume.Resume: the interrupted run this one continues
    boundary: Any = None  # grpolab.lifecycle.checkpoints.StepBoundary: each step's bookkeeping kept whole
    task_check: Any = None  # task.check.Report: the whole check of the task, logged when the run opened

    @property
    def measure_step(self) -> int:
        """The step this process's measurements are logged at: 0 for a run in one piece; a resumed
        run's at the step it reached, beside the first process's."""
        if self.resume is None:
            return 0
        return max(self.trainer.state.global_step if self.trainer else 0, self.resume.checkpoint.step)

    @property
    def trained_past_checkpoint(self) -> bool:
        """Whether the adapter in memory is this run's latest: a resumed run stopped before its
        checkpoint was loaded holds a fresh adapter, which must not replace the one it saved before."""
        if self.trainer is None:
            return False
        return self.resume is None or self.trainer.state.global_step >= self.resume.checkpoint.step

    @property
    def task(self):

        return self.settings.get_task()

    def load_policy(self):
        """The 4-bit base with its LoRA adapter, loaded and measured as the "load" phase."""
        from grpolab.lifecycle.endings import STOPS
        from grpolab.memory.vllm_ledger import capture
        from grpolab.model import policy
        from grpolab.model.unsloth_trainer import grpo_trainer_class

        STOPS.enter("the model's load (Unsloth's patching included)")
        with self.meter.probe.phase("load"), capture() as vllm_lines:
            model, self.tokenizer = policy.load_policy(self.settings)
        self.meter.vllm_log = vllm_lines  # vLLM's start-up lines, for what its engine does not keep
        # From here `from trl import GRPOTrainer` is Unsloth's generated trainer on both profiles: on a
        # GPU `import unsloth` swaps it in; on the CPU stand-in an internal import does the same.
        grpo_trainer_class()
        if self.options.memory_cap_gib is not None:
            self.meter.probe.cap(self.options.memory_cap_gib)  # rehearse an out-of-memory on purpose
        STOPS.enter("the trainer's construction")
        return model, self.tokenizer

    def precision(self, model) -> dict[str, bool]:
        """bf16 / fp16 as the model was really loaded (fp16 on a T4), and use_cpu on the CPU stand-in."""
        from grpolab.model.precision import model_dtype, trainer_precision

        return {
            **trainer_precision(model_dtype(model), self.device.on_gpu),
            "use_cpu": not self.device.on_gpu,
        }

    def train(self, trainer) -> None:
        """Train, with every generation and training pass measured; logs what really trains."""
        import mlflow

        from grpolab.judging import completions
        from grpolab.lab import console
        from grpolab.lifecycle import tracking
        from grpolab.lifecycle.endings import STOPS
        from grpolab.lifecycle.step_boundary import StepBoundary

        STOPS.enter("the training's set-up")
        self.trainer = trainer
        # First among the harness's callbacks: it keeps the RNG states before anything else logs.
        self.boundary = StepBoundary()
        trainer.add_callback(self.boundary)
        self.meter.attach(trainer)
        if not self.settings.rollout_adapter:  # chapter 8's unsynced arm: the rollouts from the base
            from grpolab.model.rollouts import serve_the_base

            serve_the_base(trainer)
        console.use_step_lines(trainer, self.meter)  # one compact line per step under the bar
        # What it wrote, as traces (a resumed run's steps already logged are not traced twice).
        trainer.add_callback(completions.CompletionLog(trainer, logged_through=self.meter.logged_through[1]))
        resume = self.resume
        tracking.log_trainer_args(trainer.args, resumed_from=resume.checkpoint.step if resume else None)
        mlflow.set_tag("trainer_class", type(trainer).__name__)
        if resume is None or not self._logged_base():
            self.evaluate("base", step=0)  # the adapter starts at zero: this is the base model
        # Rollouts and updates are TRL's and Unsloth's: a stop waits for the step's end (StepBoundary).
        STOPS.enter("training", until="the step in progress")
        try:
            with self.meter.probe.phase("train"):
                # The trainer restores the adapter, optimizer, scheduler, RNG, data order and step.
                trainer.train(resume_from_checkpoint=str(resume.checkpoint.path) if resume else None)
        except BaseException:
            self.boundary.close()
            raise
        finally:
            completions.flush()  # the steps' traces are in the store whatever ends the run

    def _logged_base(self) -> bool:
        """A resumed run's base evaluation, as its first process logged it (the base does not change)."""
        from grpolab.judging.evaluate import EvalResult

        metrics = self.resume.run.data.metrics
        names = ("accuracy", "format_rate", "mean_completion_length")
        if any(f"eval/base_{name}" not in metrics for name in names):
            return False
        self.evals["base"] = EvalResult(
            "base",
            int(self.resume.params.get("eval_prompts", self.settings.eval_prompts)),
            *(metrics[f"eval/base_{name}"] for name in names),
        )
        return True

    def reward_funcs(self) -> tuple[tuple[Any, ...], list[float] | None]:
        """The reward functions the trainer was built with and their weights (TRL's reward_weights,
        None: all 1), or the task's own when no trainer was built."""
        if self.trainer is None:
            return tuple(self.task.reward_funcs), None
        weights = getattr(self.trainer.args, "reward_weights", None)
        return tuple(self.trainer.reward_funcs), None if weights is None else [float(w) for w in weights]

    def evaluate(self, which: str, step: int) -> None:
        """Held-out accuracy, format rate and length of `which` ("base" or "adapter"), logged as eval/*."""
        from grpolab.judging import completions
        from grpolab.judging.evaluate import eval_rows, evaluate, log_eval
        from grpolab.lifecycle.endings import STOPS

        if self.settings.eval_prompts == 0 or self.trainer is None:
            return
        STOPS.enter(f"the {which}'s held-out evaluation")
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
        if which == "adapter":  # both have answered: their completions side by side
            completions.log_eval(eval_rows(self.settings)["prompt"], self.evals.get("base"), result)
            completions.flush()
