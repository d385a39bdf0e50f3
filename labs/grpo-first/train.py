"""Chapter 1 — a first GRPO run on one 16 GB GPU.

Qwen3-4B, loaded in 4-bit through Unsloth with vLLM in the same process, learns to add
two numbers and to answer inside <ans></ans>. TRL's GRPOTrainer samples a group of 8
completions per prompt, scores each exactly (task/rewards.py), and pushes the LoRA
adapter towards the completions that beat their group's mean.

Before anything loads, the lab prints its VRAM budget (budgets/) and refuses to start
when it does not fit. While it trains, it measures what the card really holds
(grpolab/probe.py) and logs both, line by line, to MLflow.

Without a CUDA GPU the same loop runs on a tiny random Qwen3 on the CPU (see the
`cpu` profile in lab.toml) and says so before it starts.

Usage:
    uv run python labs/grpo-first/train.py                    # GPU if there is one, else the CPU stand-in
    uv run python labs/grpo-first/train.py --profile gpu      # insist on the real run
    uv run python labs/grpo-first/train.py --max-steps 20 --num-generations 4 --learning-rate 1e-5
    uv run mlflow ui --backend-store-uri sqlite:///mlflow.db  # then open http://127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from budgets import BudgetError
from grpolab.settings import OVERRIDABLE, LabSettings, LabSettingsError, check, load_lab

LAB_DIR = Path(__file__).resolve().parent
REPO_ROOT = LAB_DIR.parents[1]


# ---------------------------------------------------------------------------------------------
# 0. The command line: every flag overrides one value of lab.toml
# ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profile",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="gpu: the real run (fails at once without CUDA); cpu: the tiny stand-in; auto: gpu if present",
    )
    parser.add_argument("--model", help="a Hub id or a local model folder (default: lab.toml's)")
    parser.add_argument("--max-steps", type=int, help="optimizer steps")
    parser.add_argument("--num-generations", type=int, help="completions per prompt (the GRPO group)")
    parser.add_argument("--max-completion-length", type=int, help="tokens per completion")
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--num-prompts", type=int, help="training prompts to build")
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--output-dir", type=Path, default=REPO_ROOT / "outputs", help="adapters and checkpoints"
    )
    parser.add_argument("--ignore-budget", action="store_true", help="start even when the budget says no")
    parser.add_argument(
        "--memory-sample-ms", type=float, default=5.0, help="how often the memory probe samples"
    )
    parser.add_argument(
        "--system-metrics-interval",
        type=float,
        default=2.0,
        help="seconds between MLflow's system metrics samples (too coarse for peaks: the probe catches those)",
    )
    parser.add_argument(
        "--memory-cap-gib",
        type=float,
        help="cap memory after loading (GPU: torch's allocator; CPU: address space) to rehearse an out-of-memory",
    )
    return parser.parse_args(argv)


def overrides(args: argparse.Namespace) -> dict[str, object]:
    values = {name: getattr(args, name) for name in OVERRIDABLE}
    if args.num_generations is not None:
        # One group per optimizer step, as in lab.toml: the batch is the group.
        values["per_device_train_batch_size"] = args.num_generations
    return values


# ---------------------------------------------------------------------------------------------
# 1. A 16 GB GPU, or the CPU stand-in
# ---------------------------------------------------------------------------------------------
def choose_profile(requested: str) -> str:
    import torch

    has_gpu = torch.cuda.is_available()
    if requested == "gpu" and not has_gpu:
        raise LabSettingsError(
            "--profile gpu needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False): "
            "run on a machine with an NVIDIA GPU, or drop --profile to use the CPU stand-in"
        )
    if requested == "auto":
        return "gpu" if has_gpu else "cpu"
    return requested


def announce_cpu(s: LabSettings) -> None:
    print(
        "\n"
        "=== No CUDA GPU found: running the CPU stand-in of this lab ===\n"
        f"  model:   {s.model} (a tiny random-weight Qwen3, built offline; not Qwen3-4B)\n"
        f"  backend: {s.backend} (bitsandbytes 4-bit layers on CPU, generation by transformers, no vLLM)\n"
        "  The loop, the rewards, the tracking and the budget are the real ones;\n"
        "  the numbers (reward, memory, speed) are the tiny model's, not Qwen3-4B's.\n",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# 2. The budget: what one GRPO step will hold, computed before anything loads
# ---------------------------------------------------------------------------------------------
def budget_sheet(s: LabSettings):
    import budgets

    return budgets.compute(budgets.plan_from_lab(s.lab_dir, s.profile, **_budget_overrides(s)))


def _budget_overrides(s: LabSettings) -> dict[str, object]:
    # The budget reads lab.toml itself; pass on only what the command line changed.
    base = load_lab(s.lab_dir, s.profile)
    return {k: v for k, v in vars(s).items() if k != "lab_dir" and getattr(base, k) != v}


# ---------------------------------------------------------------------------------------------
# 3. The task: prompts whose answers can be checked exactly
# ---------------------------------------------------------------------------------------------
def build_prompts(s: LabSettings, tokenizer):
    """The task's prompts, keeping only those that leave room for a full completion.

    TRL 1.x has no max_prompt_length: a prompt is bounded by dropping the ones that do
    not fit in max_seq_length - max_completion_length before training.
    """
    from task import get_task

    dataset = get_task(s.task).build_dataset(s.num_prompts, s.seed)

    def prompt_tokens(row: dict) -> dict:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        return {"prompt_tokens": len(tokenizer(text, add_special_tokens=False)["input_ids"])}

    dataset = dataset.map(prompt_tokens)
    kept = dataset.filter(lambda row: row["prompt_tokens"] <= s.max_prompt_length)
    if len(kept) == 0:
        longest = max(dataset["prompt_tokens"])
        raise LabSettingsError(
            f"every prompt is longer than max_seq_length - max_completion_length = {s.max_prompt_length} "
            f"tokens (longest: {longest}): lower --max-completion-length or raise max_seq_length"
        )
    return kept


# ---------------------------------------------------------------------------------------------
# 4. GRPO: how the group is sampled, scored and turned into a loss
# ---------------------------------------------------------------------------------------------
def grpo_config(s: LabSettings, output_dir: Path, on_gpu: bool, bf16: bool = True):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        # The group: 8 completions of one prompt per optimizer step.
        num_generations=s.num_generations,
        per_device_train_batch_size=s.per_device_train_batch_size,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        max_completion_length=s.max_completion_length,
        temperature=s.temperature,
        top_p=s.top_p,
        # The objective: Dr. GRPO's unbiased loss, PPO's clip, a small KL to the start. With
        # beta > 0 TRL keeps the reference as a frozen fp32 copy of the adapter ("ref"), not
        # a second model: budget line reference_policy.
        loss_type=s.loss_type,
        epsilon=s.epsilon,
        beta=s.beta,
        num_iterations=s.num_iterations,
        learning_rate=s.learning_rate,
        lr_scheduler_type=s.lr_scheduler_type,
        optim=s.optimizer,
        max_steps=s.max_steps,
        seed=s.seed,
        # Generation: vLLM inside this process on a GPU, transformers' generate on a CPU.
        use_vllm=s.fast_inference,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=s.gpu_memory_utilization,
        vllm_max_model_length=s.max_seq_length,
        # Precision: bf16 where the card has it (not on a T4: fp16 there), fp32 on a CPU.
        use_cpu=not on_gpu,
        bf16=on_gpu and bf16,
        fp16=on_gpu and not bf16,
        # Bookkeeping: the lab logs to MLflow itself (grpolab/callbacks.py).
        logging_steps=s.logging_steps,
        save_strategy="steps",
        save_steps=s.save_steps,
        report_to="none",
    )


# ---------------------------------------------------------------------------------------------
# 5. Train, measure, save
# ---------------------------------------------------------------------------------------------
def train(s: LabSettings, sheet, args: argparse.Namespace) -> int:
    # Unsloth first: on import it patches transformers and TRL (on a GPU, TRL's GRPOTrainer
    # becomes Unsloth's, which drives the in-process vLLM engine).
    from grpolab import policy

    # isort: split
    import mlflow
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from grpolab import report, tracking
    from grpolab.callbacks import LabCallback
    from grpolab.probe import MemoryProbe, is_out_of_memory
    from task import get_task

    # The prompts are checked against the tokenizer before a run or a folder exists.
    model_path = policy.resolve_model_path(s)
    prompts = build_prompts(s, AutoTokenizer.from_pretrained(model_path))

    on_gpu = s.profile == "gpu"
    probe = MemoryProbe("cuda" if on_gpu else "cpu", interval_s=args.memory_sample_ms / 1000).start()
    probe.record_history()
    run_name = f"{s.profile}-{time.strftime('%Y%m%d-%H%M%S')}"
    output_dir = args.output_dir / s.chapter / run_name
    tags = {"profile": s.profile, "backend": s.backend, "model_id": s.model, "chapter": s.chapter}

    with tracking.lab_run(s.chapter, run_name, tags, args.system_metrics_interval) as run:
        tracking.log_run_context(s, sheet)
        report.log_budget(sheet)
        callback = LabCallback(probe)
        trainer = tokenizer = None
        try:
            with probe.phase("load"):
                model, tokenizer = policy.load_policy(s)
            if args.memory_cap_gib is not None:
                probe.cap(args.memory_cap_gib)  # rehearse an out-of-memory on purpose
            bf16 = on_gpu and torch.cuda.is_bf16_supported()
            trainer = GRPOTrainer(
                model=model,
                processing_class=tokenizer,
                reward_funcs=list(get_task(s.task).reward_funcs),
                args=grpo_config(s, output_dir, on_gpu, bf16),
                train_dataset=prompts,
                callbacks=[callback],
            )
            probe.instrument(trainer)  # generation and training passes as phases of their own
            with probe.phase("train"):
                trainer.train()
        except KeyboardInterrupt:
            # Keep what was trained and what was measured; the run ends KILLED.
            if trainer is not None:
                report.save_adapter(trainer.model, tokenizer, output_dir)
            report.log_measurement(sheet, probe, callback, trainer, status="KILLED")
            print(f"\nInterrupted: run {run.info.run_id} ends KILLED; the adapter so far is in {output_dir}")
            raise
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            next_step = report.log_out_of_memory(sheet, probe, callback, trainer, error)
            raise OutOfMemory(next_step) from error

        adapter_dir = report.save_adapter(trainer.model, tokenizer, output_dir)
        mlflow.log_artifacts(str(adapter_dir), artifact_path="adapter")
        comparison = report.log_measurement(sheet, probe, callback, trainer, status="FINISHED")
    probe.stop()

    print(f"\nAdapter saved to {adapter_dir}")
    for line in report.peak_lines(comparison):
        print(line)
    print(comparison.verdict())
    print(f"MLflow run {run.info.run_id} in {tracking.tracking_uri()}")
    return 0


class OutOfMemory(RuntimeError):
    """Memory ran out; the message is the one-line next step."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        profile = choose_profile(args.profile)
        s = load_lab(LAB_DIR, profile, **overrides(args))
        check(s)
        sheet = budget_sheet(s)
        print(sheet.table(), flush=True)
        if not args.ignore_budget:
            sheet.require_fits()
    except (LabSettingsError, BudgetError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if profile == "cpu":
        announce_cpu(s)
    try:
        return train(s, sheet, args)
    except LabSettingsError as err:  # found only once the tokenizer exists (prompt lengths)
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OutOfMemory as err:
        print(f"\nerror: {err}", file=sys.stderr)  # on a line of its own, after the progress bar
        return 3
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
