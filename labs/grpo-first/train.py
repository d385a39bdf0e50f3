"""Chapter 1: a first GRPO run on one 16 GB GPU.

Qwen3-4B, loaded in 4-bit through Unsloth with vLLM in the same process, learns to add two numbers
and to answer inside <ans></ans>. For each prompt the policy samples a group of G completions, each
scored exactly by the task's rewards (task/), and the LoRA adapter is pushed towards the completions
that beat their group.

GRPO in three lines. For a prompt with completions o_1..o_G and rewards r_1..r_G:

    A_i = r_i - mean(r_1..r_G)                       the advantage: better or worse than the group
    (GRPO divides by std(r_1..r_G) too; Dr. GRPO, used here, does not: scale_rewards = "none")
    loss = -sum_i sum_t min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i) / (G x max_completion_length)
           + beta x KL(pi || pi_ref)                 rho_it = pi(o_it) / pi_old(o_it), token by token

With one optimizer pass per batch (num_iterations 1) rho is 1 and the clip is idle: the gradient is
the advantage-weighted log-likelihood of each completion. Dr. GRPO's constant denominator keeps long
wrong answers from being penalised less than short ones.

What this lab simplifies: one prompt per step (a group of 8), LoRA on a 4-bit base, a toy task whose
answer is checked exactly. It trains the book's recipe as it is (grpolab/recipe.toml; its lab.toml
changes nothing). Before anything loads it prints its VRAM budget and refuses a plan that does not
fit; while it trains it measures what the card holds and logs both to MLflow; before and after, it
scores the held-out prompts, and the run doctor says what held learning back. Without a CUDA GPU the
same loop runs on a tiny Qwen3 on the CPU (random weights, briefly warm-started), and says so.

Usage:
    uv run python labs/grpo-first/train.py                    # GPU if there is one, else the CPU stand-in
    uv run python labs/grpo-first/train.py --profile gpu      # insist on the real run
    uv run python labs/grpo-first/train.py --max-steps 20 --num-generations 4 --learning-rate 1e-5
    uv run python labs/grpo-first/train.py --help             # every setting of the recipe is a flag
    uv run python labs/grpo-first/train.py --budget-only      # the VRAM sheet alone: nothing loads
    uv run mlflow ui --backend-store-uri sqlite:///mlflow.db  # then open the link the lab prints
"""

from __future__ import annotations

from pathlib import Path

import grpolab
from grpolab.config.settings import LabSettings

LAB_DIR = Path(__file__).resolve().parent


def grpo_config(s: LabSettings, output_dir: Path, precision: dict[str, bool]):
    """TRL's GRPOConfig for this lab; every value comes from lab.toml (or its flag)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        # The group: num_generations completions of each prompt, scored against each other.
        num_generations=s.num_generations,
        per_device_train_batch_size=s.per_device_train_batch_size,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        max_completion_length=s.max_completion_length,
        temperature=s.temperature,
        top_p=s.top_p,
        # The objective (formulas above). With beta > 0 Unsloth's trainer takes the reference
        # log-probs from the base with the adapter disabled: no second copy of anything is held.
        loss_type=s.loss_type,
        scale_rewards=s.scale_rewards,
        epsilon=s.epsilon,
        beta=s.beta,
        num_iterations=s.num_iterations,
        # The optimizer, every value explicit: Unsloth's config and TRL's default some differently.
        optim=s.optim,
        learning_rate=s.learning_rate,
        lr_scheduler_type=s.lr_scheduler_type,
        warmup_steps=s.warmup_steps,
        weight_decay=s.weight_decay,
        max_grad_norm=s.max_grad_norm,
        max_steps=s.max_steps,
        seed=s.seed,
        # Generation: vLLM inside this process on a GPU, transformers' generate on a CPU.
        use_vllm=s.fast_inference,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=s.gpu_memory_utilization,
        vllm_max_model_length=s.max_seq_length,
        vllm_importance_sampling_correction=s.vllm_importance_sampling_correction,
        # Precision: what the model was really loaded in (bf16, or fp16 on a T4); fp32 on the CPU.
        **precision,
        # Bookkeeping: the harness logs to MLflow itself.
        logging_steps=s.logging_steps,
        save_strategy="steps",
        save_steps=s.save_steps,
        report_to="none",
    )


def train(run: grpolab.Run, config=grpo_config) -> None:
    """The lesson: load the policy, build the trainer, train. (A later chapter passes its own config.)"""
    model, tokenizer = run.load_policy()  # Unsloth first: on a GPU it swaps in its own GRPOTrainer
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=list(run.task.reward_funcs),
        args=config(run.settings, run.output_dir, run.precision(model)),
        train_dataset=run.train_dataset,
    )
    run.train(trainer)


def main(argv: list[str] | None = None) -> int:
    return grpolab.run_lab(LAB_DIR, train, argv, doc=__doc__)


if __name__ == "__main__":
    grpolab.exit_process(main())
