# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 3 — the same task on verl, for when one card is not enough
#
# `labs/grpo-first` trains on one 16 GB card. Past one card, the book's advice is to move to an engine
# built for many: verl (HybridFlow). This notebook follows `labs/grpo-verl/train.py` and shows, against
# verl 0.9.1's own code, that the move keeps the task: the driver loop's steps in verl's source, the
# Parquet rows verl reads, the reward it computes, the advantage its driver takes, and what each
# configuration holds per card.
#
# Nothing trains here: every cell runs on a CPU, in the chapter's own environment (verl cannot share
# the main lock). Open it with `uv run --project labs/grpo-verl --with jupyterlab jupyter lab`.

# %%
from importlib.metadata import version
from pathlib import Path

REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "labs" / "grpo-verl" / "lab.toml").exists())
try:
    from grpo_verl.settings import load_lab
except ModuleNotFoundError as err:
    raise RuntimeError(
        "this notebook runs in the verl chapter's environment: "
        "uv run --project labs/grpo-verl --with jupyterlab jupyter lab"
    ) from err

lab = load_lab()
print(f"chapter {lab.chapter}, task {lab.task}, environment {lab.environment}")
print(", ".join(f"{name} {version(name)}" for name in ("verl", "vllm", "torch", "transformers", "ray")))

# %% [markdown]
# ## 1. The driver loop, in verl's code
#
# HybridFlow's single controller runs each GRPO step as calls on worker groups that share the cards:
# generate, reward, recompute the old log-probs, the reference log-probs, the advantage (on the
# driver), the update. In verl 0.9.1 the controller is a Ray actor (`TaskRunner`), one step is
# `PPOTrainer._step_once`, and two things moved since the paper: rewards are computed by reward
# workers as each rollout finishes, and the new weights reach vLLM in the trainer's `on_step_end`.
# Each row below is resolved in the installed verl (the tests check that the trainer calls them in
# this order).

# %%
import pandas as pd
from grpo_verl.driver import DRIVER_LOOP, locate, step_once_calls

pd.set_option("display.max_colwidth", 120)
pd.DataFrame([{"step": s.name, "verl code": locate(s.where), "what happens": s.what} for s in DRIVER_LOOP])

# %%
print("PPOTrainer._step_once calls, in order:", " -> ".join(step_once_calls()))

# %% [markdown]
# ## 2. The data: one Parquet row per prompt
#
# `train.py prepare` writes the task's prompts, built by `task/` itself, in verl's schema. The reward
# function is chosen by `data_source`; `reward_model.ground_truth` and `extra_info` reach it with each
# completion. verl's `RLHFDataset` then reads the file, renders each prompt with the tokenizer's chat
# template to drop prompts over `data.max_prompt_length`, and hands the raw messages to the rollout.
# The tokenizer here is the CPU lab's character-level one (no Hub on this machine); a real run uses
# Qwen3's.

# %%
import tempfile

from grpo_verl import data, launch, schema

from grpolab.tiny_model import build_tokenizer

work = Path(tempfile.mkdtemp(prefix="grpo-verl-notebook-"))
paths = data.prepare(lab.task, work / "data", train_size=8, test_size=4, seed=lab.data.seed)
rows = pd.read_parquet(paths["train"])
rows.head(3)

# %%
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import hf_tokenizer

tokenizer_dir = work / "tokenizer"
build_tokenizer().save_pretrained(str(tokenizer_dir))
tokenizer = hf_tokenizer(str(tokenizer_dir))

cfg = lab.config("one-card")
values = launch.overrides(cfg, lab.task, work / "data", {"actor_rollout_ref.model.path": str(tokenizer_dir)})
config = schema.compose(launch.hydra_args(values))  # verl's ppo_trainer.yaml with our overrides
dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
item = dataset[0]
print(f"{len(dataset)} rows; the first as the rollout's chat template renders it:\n")
print(tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False))

# %% [markdown]
# ## 3. The reward: task/'s functions behind verl's signature
#
# verl calls `compute_score(data_source, solution_str, ground_truth, extra_info)` once per completion.
# `grpo_verl/reward.py` returns the sum of the task's own rewards and each one by name, so verl logs
# them as TRL does. Below, the same completions scored three ways: the task's rewards called as TRL
# calls them, `compute_score`, and verl's own reward worker decoding the tokens first.

# %%
from grpo_verl.reward import compute_score

from task import get_task

task = get_task(lab.task)
truth = item["reward_model"]["ground_truth"]
texts = [
    f"<ans>{truth}</ans>",
    f"I think <ans> {truth} </ans>",
    f"<ans>{truth + 1}</ans>",
    f"{truth}",
    "<ans></ans>",
]
table = []
for text in texts:
    trl_style = {
        fn.__name__: fn(
            prompts=[item["raw_prompt"]],
            completions=[[{"role": "assistant", "content": text}]],
            target=[truth],
        )[0]
        for fn in task.reward_funcs
    }
    score = compute_score(item["data_source"], text, truth, dict(item["extra_info"]))
    table.append({"completion": text, **trl_style, "compute_score": score["score"]})
pd.DataFrame(table)

# %%
from grpo_verl.scoring import rollout_batch, verl_scores

# verl's RewardLoopWorker loads reward.py by path, decodes each response and calls compute_score.
batch = rollout_batch(tokenizer, ["a prompt"] * len(texts), texts, [item] * len(texts))
scored, rm_scores = verl_scores(config, batch)
pd.DataFrame(
    [
        {"completion": t, **o["reward_extra_info"], "rm_scores (last token)": rm_scores[i].sum().item()}
        for i, (t, o) in enumerate(zip(texts, scored, strict=True))
    ]
)

# %% [markdown]
# ## 4. The advantage, on the driver
#
# The chapter's formulas, for a group of G completions with rewards r:
# GRPO `A = (r - mean) / (std + eps)`, Dr. GRPO `A = r - mean` (what `lab.toml` trains:
# `norm_adv_by_std_in_grpo=false`), RLOO `A = r - (sum - r) / (G - 1)`. Below, one group of 8 from
# `tests/trl_advantages.json`, scored by the task's rewards and passed through TRL 1.15's own
# advantage lines (in the main environment), beside verl's driver function on the same rewards.

# %%
import json

import torch
from grpo_verl.advantages import (
    VERL_EPS,
    group_advantages,
    leave_one_out_advantages,
    verl_advantages,
)

fixture = json.loads((REPO / "labs" / "grpo-verl" / "tests" / "trl_advantages.json").read_text())
case = next(c for c in fixture["cases"] if c["num_generations"] == 8)
G = case["num_generations"]
r = torch.tensor(case["rewards_per_func"]).nansum(dim=1).double().numpy()
group = slice(G, 2 * G)  # the second group (the first is the all-correct one, below)
pd.DataFrame(
    {
        "completion": case["completions"][group],
        "reward": r[group],
        "GRPO formula (verl eps)": group_advantages(r, G, True, VERL_EPS)[group],
        "GRPO verl": verl_advantages(r, G, "grpo", True)[group],
        "GRPO TRL": case["grpo_advantages"]["group"][group],
        "Dr. GRPO formula": group_advantages(r, G, False)[group],
        "Dr. GRPO verl": verl_advantages(r, G, "grpo", False)[group],
        "Dr. GRPO TRL": case["grpo_advantages"]["none"][group],
        "RLOO formula": leave_one_out_advantages(r, G)[group],
        "RLOO verl": verl_advantages(r, G, "rloo")[group],
        "RLOO TRL": case["rloo_advantages"][group],
    }
).round(5)

# %% [markdown]
# verl and TRL differ only in eps (1e-6 and 1e-4), a visible difference in the fourth decimal where the
# group's std is small. One more thing shows in float32: in a group where all 8 completions are right
# (every reward 1.2), the formula gives 0, but a float32 mean of eight 1.2s misses 1.2 by one unit in
# the last place, and dividing that by a std of the same order gives every completion a small push.
# Dr. GRPO has no division, so the push is ~1e-7: one more reason `lab.toml` trains without the std.

# %%
uniform = slice(0, G)
pd.DataFrame(
    {
        "reward": r[uniform],
        "formula": group_advantages(r, G, True, VERL_EPS)[uniform],
        "verl GRPO (float32)": verl_advantages(r, G, "grpo", True)[uniform],
        "TRL GRPO (float32)": case["grpo_advantages"]["group"][uniform],
        "verl Dr. GRPO": verl_advantages(r, G, "grpo", False)[uniform],
    }
).head(3)

# %% [markdown]
# ## 5. What each configuration holds per card
#
# The budget sheet of each configuration is read from its verl overrides (`grpo_verl/budget.py`): verl's
# hybrid engine is the budget's `colocate` layout (vLLM with its own copy of the weights beside an FSDP
# shard of the actor) with vLLM asleep while the actor trains. The sheet leaves out vLLM's own CUDA
# context (verl runs vLLM in processes of its own, ~0.5 GiB), vLLM's LoRA slots, and overstates the
# weight sync: with LoRA, verl sends the adapter only.

# %%
from grpo_verl import budget

sheets = {name: budget.sheet(c) for name, c in lab.configs.items()}
pd.DataFrame([budget.card_summary(lab.config(name), s) for name, s in sheets.items()]).drop(columns="verdict")

# %% [markdown]
# One 16 GB card cannot hold Qwen3-4B in bf16 twice (the actor and vLLM's copy), so the one-card
# configuration takes the largest Qwen3 whose sheet fits:

# %%
pd.DataFrame(budget.candidates(lab.config("one-card")))

# %% [markdown]
# The one-card sheet, line by line; the budget CLI prints the same from the flags below (in either
# environment), and explores around it with `--headroom` or `--suggest-util`:

# %%
print("python -m budgets", " ".join(budget.cli_args(budget.plan(lab.config("one-card")))), "\n")
print(sheets["one-card"].table())

# %% [markdown]
# ## 6. The commands
#
# `train.py launch --config NAME` prints the sheet above and this command, then runs it where the cards
# are (or, for `multi-node`, submits it to the Ray cluster at `--ray-address`). Here it only prints.

# %%
for name, c in lab.configs.items():
    command = launch.command(c, launch.overrides(c, lab.task, lab.data.dir), python="python")
    head = command[: command.index("verl.trainer.main_ppo") + 1]
    print(f"{name}: {' '.join(head)} ... ({len(command) - len(head)} overrides)")
