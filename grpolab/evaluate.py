"""Held-out evaluation: did the policy learn the task, or only the reward?

The task's evaluation split (`task.build_eval_dataset`) shares no problem with any training set.
Each prompt gets one greedy completion, scored by the task's own rewards: accuracy (the correctness
reward paid), format rate (the format reward paid) and mean completion length in tokens. On a GPU the
completions come from Unsloth's in-process vLLM engine (the base's weights, plus the adapter through
a LoRA request); on a CPU from transformers' `generate`, with the adapter disabled for the base.
"""

from __future__ import annotations

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
    # What it wrote and what each reward paid, per prompt (grpolab.completions logs them side by side).
    completions: tuple[str, ...] = field(default=(), compare=False, repr=False)
    rewards: dict[str, list[float]] = field(default_factory=dict, compare=False, repr=False)

    def metrics(self) -> dict[str, float]:
        return {
            "eval/accuracy": self.accuracy,
            "eval/format_rate": self.format_rate,
            "eval/mean_completion_length": self.mean_length,
        }

    def line(self) -> str:
        return (
            f"{self.which}: accuracy {self.accuracy:.1%}, format {self.format_rate:.1%}, "
            f"mean length {self.mean_length:.1f} tokens ({self.prompts} held-out prompts, greedy)"
        )


def eval_rows(settings) -> Any:
    from task import get_task

    return get_task(settings.task).build_eval_dataset(settings.eval_prompts, settings.seed)


def score(settings, rows, completions: list[str], lengths: list[int], which: str) -> EvalResult:
    """The task's own rewards on one completion per held-out prompt."""
    from task import get_task

    task = get_task(settings.task)
    columns = {name: rows[name] for name in task.reward_columns}
    paid = {
        f.__name__: [float(v) for v in f(rows["prompt"], completions, **columns)] for f in task.reward_funcs
    }
    correctness, fmt = paid.values()
    n = len(completions)
    return EvalResult(
        which=which,
        prompts=n,
        accuracy=sum(1 for c in correctness if c > 0) / n,
        format_rate=sum(1 for f in fmt if f > 0) / n,
        mean_length=sum(lengths) / n,
        completions=tuple(completions),
        rewards=paid,
    )


def evaluate(model, tokenizer, settings, which: str, adapter_dir: Path | None = None) -> EvalResult:
    """One greedy completion per held-out prompt, scored. `which` is "base" (the adapter off) or
    "adapter"; on a GPU the adapter reaches vLLM from its saved folder."""
    rows = eval_rows(settings)
    prompts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in rows["prompt"]
    ]
    if getattr(model, "vllm_engine", None) is not None:
        completions, lengths = _generate_vllm(
            model, prompts, settings, adapter_dir if which == "adapter" else None
        )
    else:
        completions, lengths = _generate_hf(model, tokenizer, prompts, settings, adapter=which == "adapter")
    return score(settings, rows, completions, lengths, which)


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

    from grpolab import tracking

    mlflow.log_metrics(result.metrics() | tracking.glance(result.metrics()), step=step)
    mlflow.log_metrics(
        {f"eval/{result.which}_{k.removeprefix('eval/')}": v for k, v in result.metrics().items()}
    )


def evaluate_saved(settings, device, args, card_note: str, cuda=None) -> None:
    """`--eval-only ADAPTER`: the base and a saved adapter on the held-out prompts, in a run of
    its own (tag run_kind=eval); nothing is trained or saved. A folder without an adapter is refused
    (LabSettingsError) before anything loads."""
    from grpolab import policy  # Unsloth first: it patches transformers and TRL

    # isort: split
    import mlflow

    from grpolab import completions, tracking
    from grpolab.evaluate import eval_rows, evaluate, load_adapter
    from grpolab.settings import LabSettingsError

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
        model, tokenizer = policy.load_policy(settings)
        load_adapter(model, adapter)
        results = [evaluate(model, tokenizer, settings, which, adapter) for which in ("base", "adapter")]
        for step, result in enumerate(results):
            log_eval(result, step)
        completions.log_eval(eval_rows(settings)["prompt"], *results)
        completions.flush()
        note = " ".join(f"Held-out, {r.line()}." for r in results)
        mlflow.set_tag("mlflow.note.content", note)
    print("\n".join(f"Held-out, {r.line()}" for r in results))
    print(f"MLflow run {mlflow_run.info.run_id}: {tracking.run_url(mlflow_run)}")
