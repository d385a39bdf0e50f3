"""Chapter 3 — the same task on verl, for when one card is not enough.

labs/grpo-first trains on one 16 GB card with Unsloth, TRL and a 4-bit base. Past one card, move to
an engine built for it: verl (HybridFlow). Its driver loop, a single controller on a Ray cluster,
runs each step as a sequence of calls on worker groups that share the cards:

    generate      vLLM replicas, one per card here, sample rollout.n completions per prompt
    reward        reward workers score each completion as it finishes (compute_score, below)
    old log-probs the FSDP actor recomputes the sampling policy's log-probs
    ref log-probs the same actor with its LoRA adapter off (no second model)
    advantage     on the driver: the group mean as baseline (grpo_verl/advantages.py)
    update        the actor's PPO-clipped step; vLLM wakes up and receives the new adapter

This chapter moves labs/grpo-first's task, rewards and recipe there, unchanged: the prompts are
task/'s, written as Parquet in verl's schema (`prepare`); the reward is task/'s functions behind
verl's compute_score signature (grpo_verl/reward.py); the recipe (Dr. GRPO, beta 0.02, LoRA r 16) is
written as Hydra overrides of verl's own ppo_trainer.yaml in lab.toml, in three configurations: one
16 GB card, one node of 8 GPUs, several nodes on an existing Ray cluster. Before it launches, the
launcher prints each configuration's budget sheet (budgets/) and its per-card verdict.

What it simplifies:
  1. A bf16 base: verl cannot load bitsandbytes 4-bit weights, so one card holds Qwen3-1.7B, not 4B.
  2. One vLLM replica per card (tensor parallel 1), as the budget's colocate layout describes it.
  3. One optimizer step per generated batch (ppo_mini_batch_size = train_batch_size), like the lab.
  4. Console logging only (verl also speaks wandb, mlflow, ...: add trainer.logger=... after --).

Usage (from the repository root; verl has its own environment, labs/grpo-verl/uv.lock):
    uv run --project labs/grpo-verl python labs/grpo-verl/train.py prepare
    uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-card
    uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-node --dry-run
    uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config multi-node --ray-address http://head:8265
    uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-card --check
    ... launch --config one-card -- trainer.total_training_steps=10    # any verl key, after --
`launch` prints the sheet and the exact command, then runs it when this machine has the cards
(`local` configurations) or a Ray address is given (`ray-job`); without them it prints only.
`--check` runs verl's own entry point with Hydra's --cfg job: the composed config, no GPU needed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from grpo_verl import budget, data, launch, schema
from grpo_verl.settings import REPO_ROOT, LabError, load_lab


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser(
        "prepare", help="write the task's train and test splits as Parquet in verl's schema"
    )
    prep.add_argument("--task", help="any task of task/ (default: lab.toml's)")
    prep.add_argument("--data-dir", type=Path, help="where the Parquet goes (default: lab.toml's [data] dir)")
    run = sub.add_parser("launch", help="print a configuration's budget and command; run it where it can run")
    run.add_argument("--config", required=True, help="one of lab.toml's [config.*] tables")
    run.add_argument("--task", help="the task whose Parquet the run reads (default: lab.toml's)")
    run.add_argument("--data-dir", type=Path, help="where `prepare` wrote the Parquet")
    run.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS"), help="ray-job: the cluster")
    run.add_argument("--dry-run", action="store_true", help="print the sheet and the command, run nothing")
    run.add_argument("--check", action="store_true", help="run verl's entry point with --cfg job (no GPU)")
    run.add_argument("--ignore-budget", action="store_true", help="start even when the sheet says no")
    run.add_argument("extra", nargs="*", help="more verl overrides, key=value, after --")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# 1. The data: task/'s prompts, one Parquet row per prompt
# ---------------------------------------------------------------------------------------------
def prepare(args: argparse.Namespace) -> int:
    lab = load_lab()
    task = args.task or lab.task
    paths = data.prepare(
        task, args.data_dir or lab.data.dir, lab.data.train_size, lab.data.test_size, lab.data.seed
    )
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


# ---------------------------------------------------------------------------------------------
# 2. The run: the overrides, checked against verl's schema, the budget, the command
# ---------------------------------------------------------------------------------------------
def cards_here() -> int:
    import torch  # here: the printing path of the launcher needs no torch

    return torch.cuda.device_count()


def launch_run(args: argparse.Namespace) -> int:
    lab = load_lab()
    cfg = lab.config(args.config)
    task = args.task or lab.task
    values = launch.overrides(cfg, task, args.data_dir or lab.data.dir, launch.parse_extra(args.extra))
    schema.compose(launch.hydra_args(values))  # a misspelt or unknown key stops here, with Hydra's message
    sheet = budget.sheet(cfg, values)
    print(budget.describe(cfg, sheet, values), flush=True)
    command = launch.command(cfg, values, ray_address=args.ray_address)
    print("\ncommand:\n" + launch.format_command(command) + "\n", flush=True)

    if args.check:  # verl's own entry point composes and prints the config, then stops: no GPU needed
        return subprocess.call([*launch.entry_command(values), "--cfg", "job"], cwd=REPO_ROOT)
    if args.dry_run:
        return 0
    if cfg.submit == "local" and (found := cards_here()) < cfg.n_gpus_per_node:
        print(f"not started: {cfg.name} needs {cfg.n_gpus_per_node} CUDA GPU(s) here; torch sees {found}")
        return 0
    if cfg.submit == "ray-job" and not args.ray_address:
        print(f"not started: {cfg.name} is submitted to a Ray cluster; give --ray-address or set RAY_ADDRESS")
        return 0
    missing = [p for p in (values["data.train_files"], values["data.val_files"]) if not Path(p).exists()]
    if missing:
        print(f"error: no Parquet at {missing[0]}; run `train.py prepare` first", file=sys.stderr)
        return 2
    if not sheet.fits and not args.ignore_budget:
        print(
            f"error: the budget says no ({sheet.verdict()}); --ignore-budget to start anyway", file=sys.stderr
        )
        return 2
    return subprocess.call(command, cwd=REPO_ROOT)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return prepare(args) if args.command == "prepare" else launch_run(args)
    except (LabError, ValueError) as err:  # bad config, task, override or budget input: one line
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
