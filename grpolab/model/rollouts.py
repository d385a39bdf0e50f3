"""Rollouts from the base while the adapter trains: the GPU failure, reproduced on the trainer's own generation.

On a GPU the rollouts come from vLLM, which must receive the LoRA adapter after every step. When it
never does (a known Unsloth + TRL 1.x failure, Unsloth PR 8701), every group is sampled from the
base while the trainer updates the adapter: the loss is finite, the reward never moves, and only
TRL's `sampling/sampling_logp_difference/mean` (vLLM's log-probs of its own samples against the
trainer's) shows it. On the CPU there is no vLLM, so `rollout_adapter = false` makes the trainer's
own generation sample with the adapter disabled (PEFT's `disable_adapter`), which is what that
engine did, and measures the same gap TRL measures: the sampler's log-probs of each completion
token against the trainer's, scored at the sampling temperature, logged under TRL's name.

`serve_the_base(trainer)` rewires one trainer instance; nothing else changes: the loss, the
rewards and the reference policy are TRL's.
"""

from __future__ import annotations

from typing import Any

# TRL's names (trl/trainer/grpo_trainer.py), so the run doctor reads one metric on both profiles
# (grpolab.judging.doctor.LOGP_METRIC, which this layer may not import; tests/test_rollouts.py holds
# the two equal).
LOGP_MEAN = "sampling/sampling_logp_difference/mean"
LOGP_MAX = "sampling/sampling_logp_difference/max"


def serve_the_base(trainer: Any) -> None:
    """Make `trainer` sample every group from the base (its adapter disabled while it generates) and
    log, each step, how far the sampler's log-probs of those completions are from the trainer's."""
    model = trainer.model
    if not hasattr(model, "disable_adapter"):
        raise TypeError(
            f"rollout_adapter false samples with the LoRA adapter disabled, and {type(model).__name__} has "
            "no adapter to disable: train a LoRA adapter (the book's recipe does)"
        )
    generate = trainer._generate_single_turn
    score = trainer._generate_and_score_completions

    def from_the_base(*args: Any, **kwargs: Any):
        with model.disable_adapter():
            return generate(*args, **kwargs)

    def scored(*args: Any, **kwargs: Any):
        output = score(*args, **kwargs)
        gap = logp_gap(trainer, output)
        if gap is not None:
            mode = "train" if model.training else "eval"
            trainer._metrics[mode][LOGP_MEAN].append(gap[0])
            trainer._metrics[mode][LOGP_MAX].append(gap[1])
        return output

    trainer._generate_single_turn = from_the_base
    trainer._generate_and_score_completions = scored


def logp_gap(trainer: Any, output: dict[str, Any]) -> tuple[float, float] | None:
    """Mean and largest |sampler's log-prob - trainer's| over the completion tokens of one scored
    batch (TRL's `sampling_logp_difference`), the sampler being the base; None with no tokens."""
    import torch

    model = trainer.model
    mask = output["completion_mask"].bool()
    if not mask.any():
        return None
    with torch.no_grad():
        trained = completion_logps(model, output, trainer.temperature)
        with model.disable_adapter():
            sampled = completion_logps(model, output, trainer.temperature)
    delta = (trained - sampled).abs()[mask]
    return float(delta.mean()), float(delta.max())


def completion_logps(model: Any, output: dict[str, Any], temperature: float):
    """Each completion token's log-prob under `model`, its logits divided by the sampling temperature
    (as TRL scores them), from the prompt and completion tensors of a scored batch."""
    import torch

    prompt, completion = output["prompt_ids"], output["completion_ids"]
    ids = torch.cat([prompt, completion], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    was_training = model.training
    model.eval()  # no dropout in a measurement
    try:
        logits = model(input_ids=ids, attention_mask=attention).logits
    finally:
        model.train(was_training)
    logits = logits[:, prompt.size(1) - 1 : -1, :].float() / temperature
    return logits.log_softmax(-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
