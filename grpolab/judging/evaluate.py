"""Held-out evaluation: did the policy learn the task, or only the reward?

The task's evaluation split (`task.build_eval_dataset`) shares no problem with any training set.
Each prompt gets one greedy completion, scored by the task's own rewards, whatever the run trained
on: accuracy (the share of completions every answer reward the task declares paid), format rate
(every shaping reward paid) and mean completion length in tokens. A run that trained on a reward the
task does not declare (chapter 4's loose checker) has it scored on the same completions too, beside
the task's, as `eval/rewards/<name>`: what it pays held out, against what the task's own rewards pay. On a GPU the
completions come from Unsloth's in-process vLLM engine (the base's weights, plus the adapter through
a LoRA request); on a CPU from transformers' `generate`, with the adapter disabled for the base.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EvalResult:
    which: str  # "base" or "adapter"
    prompts: int
    accuracy: float
    format_rate: float
    mean_length: float
    # What it wrote and what each reward paid, per prompt, in the held-out rows' order: the task's own
    # rewards and any the run trained on (grpolab.judging.completions logs them side by side).
    completions: tuple[str, ...] = field(default=(), compare=False, repr=False)
    rewards: dict[str, list[float]] = field(default_factory=dict, compare=False, repr=False)
    # The rewards the run trained on that the task does not declare (chapter 4's loose checker).
    foreign: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def reward_means(self) -> dict[str, float]:
        """Each reward's mean payout on these completions."""
        return {name: sum(values) / len(values) for name, values in self.rewards.items() if values}

    def metrics(self) -> dict[str, float]:
        means = self.reward_means()
        return {
            "eval/accuracy": self.accuracy,
            "eval/format_rate": self.format_rate,
            "eval/mean_completion_length": self.mean_length,
            # The task's own are accuracy and format rate; a foreign reward's held-out payout beside them.
            **{f"eval/rewards/{name}": means[name] for name in self.foreign if name in means},
        }

    def line(self) -> str:
        return (
            f"{self.which}: accuracy {self.accuracy:.1%}, format {self.format_rate:.1%}, "
            f"mean length {self.mean_length:.1f} tokens ({self.prompts} held-out prompts, greedy)"
        )


def eval_rows(settings) -> Any:

    return settings.get_task().build_eval_dataset(settings.eval_prompts, settings.seed)


def held_out_prompts(tokenizer, rows) -> list[str]:
    """Each held-out row's prompt as the model reads it: the tokenizer's chat template, ready for the answer."""
    return [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in rows["prompt"]
    ]


def score(
    settings,
    rows,
    completions: list[str],
    lengths: list[int],
    which: str,
    reward_funcs: Sequence[Callable[..., list[float]]] = (),
) -> EvalResult:
    """The task's own rewards on one completion per held-out prompt; `reward_funcs` (the run's, when
    it trained on rewards the task does not declare) are scored beside them, never in its accuracy."""
    from task import RewardRole, reward_info

    task = settings.get_task()
    n = len(completions)
    funcs = {reward_info(f).name: f for f in (*task.reward_funcs, *reward_funcs)}
    # Every column the rows hold, as TRL hands them to rewards: one the task does not declare may
    # read columns besides the task's reward_columns.
    every_column = {name: list(rows[name]) for name in rows.column_names if name != "prompt"}
    paid = {
        name: [float(v) for v in f(rows["prompt"], completions, **every_column)] for name, f in funcs.items()
    }
    own = {r.name for r in task.rewards}

    def share(role: RewardRole) -> float:
        # A completion counts when every reward of that role the task declares paid something.
        names = [r.name for r in task.rewards if r.role is role]
        if not names:
            return 0.0
        return sum(1 for i in range(n) if all(paid[name][i] > 0 for name in names)) / n

    return EvalResult(
        which=which,
        prompts=n,
        accuracy=share(RewardRole.ANSWER),
        format_rate=share(RewardRole.SHAPING),
        mean_length=sum(lengths) / n,
        completions=tuple(completions),
        rewards=paid,
        foreign=tuple(name for name in funcs if name not in own),
    )


def evaluate(
    model,
    tokenizer,
    settings,
    which: str,
    adapter_dir: Path | None = None,
    reward_funcs: Sequence[Callable[..., list[float]]] = (),
) -> EvalResult:
    """One greedy completion per held-out prompt, scored. `which` is "base" (the adapter off),
    "adapter", or the name of another model scored as it is (chapter 6's merges); on a GPU the adapter reaches vLLM from its saved folder. `reward_funcs`: the rewards the
    run trained on, scored beside the task's own."""
    rows = eval_rows(settings)
    prompts = held_out_prompts(tokenizer, rows)
    if getattr(model, "vllm_engine", None) is not None:
        completions, lengths = _generate_vllm(
            model, prompts, settings, adapter_dir if which != "base" else None
        )
    else:
        # Only "base" turns the adapter off; any other model (a merge, a reload) runs as it is.
        completions, lengths = _generate_hf(model, tokenizer, prompts, settings, adapter=which != "base")
    return score(settings, rows, completions, lengths, which, reward_funcs)


def _generate_vllm(model, prompts: list[str], settings, adapter_dir: Path | None):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=settings.max_completion_length)
    lora = model.load_lora(str(adapter_dir)) if adapter_dir is not None else None
    outputs = model.fast_generate(prompts, sampling_params=params, lora_request=lora, use_tqdm=False)
    return [o.outputs[0].text for o in outputs], [len(o.outputs[0].token_ids) for o in outputs]


def _generate_hf(model, tokenizer, prompts: list[str], settings, adapter: bool, batch: int = 16):
    import contextlib

    import torch

    completions, lengths = [], []
    off = contextlib.nullcontext() if adapter else model.disable_adapter()
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"  # batched generation continues each prompt from its own end
    with off, torch.no_grad():
        for start in range(0, len(prompts), batch):
            inputs = tokenizer(
                prompts[start : start + batch], return_tensors="pt", padding=True, add_special_tokens=False
            )
            out = model.generate(
                **inputs,
                do_sample=False,
                max_new_tokens=settings.max_completion_length,
                pad_token_id=tokenizer.pad_token_id,
            )
            new = out[:, inputs["input_ids"].shape[1] :]
            for ids in new:
                ids = ids[ids != tokenizer.pad_token_id]
                # Up to and including the end-of-turn token, as TRL counts a completion.
                ends = (ids == tokenizer.eos_token_id).nonzero()
                ids = ids[: int(ends[0]) + 1] if len(ends) else ids
                lengths.append(len(ids))
                completions.append(tokenizer.decode(ids, skip_special_tokens=True))
    model.train(was_training)
    tokenizer.padding_side = side
    return completions, lengths


def load_adapter(model, adapter_dir: Path) -> None:
    """Put a saved LoRA adapter's weights into the policy's own adapter (same rank and targets)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = adapter_dir / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"no adapter at {adapter_dir}: pass the adapter folder a lab run saved")
    result = set_peft_model_state_dict(model, load_file(str(weights)))
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"{adapter_dir} does not fit this policy: unexpected {result.unexpected_keys[:3]}")


def log_eval(result, step: int) -> None:
    """A held-out result as eval/* at `step` (a curve over the run) and as eval/<which>_* (its value,
    side by side with the other's in the run's metrics)."""
    import mlflow

    from grpolab.lifecycle import tracking

    metrics = result.metrics()
    mlflow.log_metrics(metrics | tracking.glance(metrics), step=step)
    mlflow.log_metrics({f"eval/{result.which}_{k.removeprefix('eval/')}": v for k, v in metrics.items()})


def evaluate_saved(settings, device, args, card_note: str, cuda=None) -> None:
    """`--eval-only ADAPTER`: the base and a saved adapter on the held-out prompts, in a run of
    its own (tag run_kind=eval); nothing is trained or saved. A folder without an adapter is refused
    (LabSettingsError) before anything loads."""
    from grpolab.model import policy  # Unsloth first: it patches transformers and TRL

    # isort: split
    import mlflow

    from grpolab.config.settings import LabSettingsError
    from grpolab.judging import completions
    from grpolab.judging.evaluate import eval_rows, evaluate, load_adapter
    from grpolab.lifecycle import tracking
    from grpolab.lifecycle.endings import STOPS

    adapter = args.eval_only.expanduser().resolve()
    if not (adapter / "adapter_model.safetensors").is_file():
        raise LabSettingsError(f"eval-only: no adapter at {adapter}: pass the adapter folder a lab run saved")
    settings = settings.replace(eval_prompts=settings.eval_prompts or 32)
    tags = {
        "profile": settings.profile,
        "chapter": settings.chapter,
        "run_kind": "eval",
        "adapter": str(adapter),
    }
    with tracking.lab_run(
        settings.chapter, f"eval-{tracking.run_name(settings.profile)}", tags
    ) as mlflow_run:
        tracking.log_context(settings, device, card_note, cuda)
        STOPS.enter("the model's load (Unsloth's patching included)")
        model, tokenizer = policy.load_policy(settings)
        load_adapter(model, adapter)
        results = []
        for which in ("base", "adapter"):
            STOPS.enter(f"the {which}'s held-out evaluation")
            results.append(evaluate(model, tokenizer, settings, which, adapter))
        STOPS.enter("the final logging")
        for step, result in enumerate(results):
            log_eval(result, step)
        completions.log_eval(eval_rows(settings)["prompt"], *results)
        completions.flush()
        note = " ".join(f"Held-out, {r.line()}." for r in results)
        mlflow.set_tag("mlflow.note.content", note)
    print("\n".join(f"Held-out, {r.line()}" for r in results))
    print(f"MLflow run {mlflow_run.info.run_id}: {tracking.run_url(mlflow_run)}")
