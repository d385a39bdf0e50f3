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
# # Chapter 2 — how much card a GRPO step needs
#
# This notebook follows `labs/grpo-sizing/train.py`. A GRPO step holds memory in proportion to
# *prompts per step x completions per prompt x completion length*: the rollouts vLLM keeps in its
# KV cache while it decodes them, the activations and logits the trainer keeps to take the loss.
# First the book's hardware tables, computed by the budget sheet (`budgets/`) for three model sizes
# and two layouts; then the sheet of this chapter's own grid, plotted against completion length and
# group size; then the sweep, run on this machine, read back from MLflow: the sheet's prediction
# beside the peak every cell measured.
#
# Runs go to the same MLflow store as the lab (`mlflow.db` at the repository root, or
# `MLFLOW_TRACKING_URI` if you set it before starting Jupyter).

# %%
import importlib.util
from pathlib import Path

REPO = next(
    p for p in [Path.cwd(), *Path.cwd().parents] if (p / "labs" / "grpo-sizing" / "lab.toml").exists()
)
LAB_DIR = REPO / "labs" / "grpo-sizing"

# The lab script is the source of truth: load it as a module and use its grids and its sweep.
spec = importlib.util.spec_from_file_location("grpo_sizing", LAB_DIR / "train.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)

import torch

profile = "gpu" if torch.cuda.is_available() else "cpu"
if profile == "cpu":  # before torch computes anything: the CPU's arithmetic as the lab pins it
    from grpolab.config import numerics

    numerics.pin()
if profile == "cpu":
    print("No CUDA GPU found: the sweep below runs the lab's CPU profile, the tiny random Qwen3 on the CPU.")
    print(
        "The tables and plots of the sheet are the real models'; the measured numbers are the tiny model's."
    )
else:
    print("CUDA GPU found: the sweep below runs the lab's real profile, Qwen3-4B in 4-bit with vLLM.")

# %% [markdown]
# ## 1. KV cache per token, from each model's config
#
# Every token a rollout holds in vLLM's cache costs a key and a value per layer and per KV head:
# `2 x layers x kv_heads x head_dim x 2 bytes` in bf16. The book's table: 128, 256 and 320 KiB for
# Llama-3.1-8B, Qwen3-32B and Llama-3.3-70B. The sheet reads the shapes from each model's `config.json`.

# %%
import pandas as pd

from budgets import Plan, compute, load_shape

GIB, GB = 1024**3, 1e9
MODELS = ["llama-3.1-8b", "qwen3-32b", "llama-3.3-70b"]
BOOK_KV_KIB = {"llama-3.1-8b": 128, "qwen3-32b": 256, "llama-3.3-70b": 320}

rows = []
for name in MODELS:
    s = load_shape(name)
    sheet = compute(Plan(model=name, gpu="h200", load_in_4bit=False, layout="colocate"))
    rows.append(
        {
            "model": s.name,
            "parameters (B)": s.total_params() / 1e9,
            "formula": f"2 x {s.layers} layers x {s.kv_heads} kv heads x {s.head_dim} x 2 B",
            "sheet (KiB/token)": sheet.metrics["kv_cache_bytes_per_token"] / 1024,
            "book (KiB/token)": BOOK_KV_KIB[name],
        }
    )
pd.DataFrame(rows).style.format({"parameters (B)": "{:.2f}", "sheet (KiB/token)": "{:.0f}"})

# %% [markdown]
# ## 2. How many rollouts vLLM holds: an 8B on a 96 GB card
#
# vLLM's cache is what is left of its share (`gpu_memory_utilization` x the card) once its own copy
# of the weights, its profiling pass and its CUDA graphs are in. The book: **21, 52 and 119**
# rollouts at 0.3, 0.5 and 0.92. Those three counts pin down the book's rollout: 4,608 tokens (512 of
# prompt and 4,096 of completion) on 96 x 10^9 bytes, weights subtracted and nothing else. The sheet
# models what vLLM allocates on the catalog's RTX PRO 6000 (97,887 MiB): a little more room, minus the
# profiling pass and the graphs, in whole 16-token blocks.
#
# Two layouts. **Server** (`trl vllm-serve`): vLLM alone on a card of its own. **Colocate** (TRL's
# `vllm_mode="colocate"`): vLLM in the trainer's process on the trainer's card, which already holds
# the trainer's weights when vLLM asks for its share; vLLM refuses to start when its share is not free.

# %%
BOOK_ROLLOUTS = {0.3: 21, 0.5: 52, 0.92: 119}
PROMPT, COMPLETION = 512, 4096


def rollouts_plan(util, layout):
    cards = {"gpus": 2, "vllm_gpus": 1} if layout == "server" else {}
    return Plan(
        model="llama-3.1-8b",
        gpu="rtx-pro-6000",
        load_in_4bit=False,
        optim="adamw_torch",
        layout=layout,
        gpu_memory_utilization=util,
        max_prompt_length=PROMPT,
        max_completion_length=COMPLETION,
        num_generations=8,
        per_device_train_batch_size=8,
        **cards,
    )


rows = []
for util, book in BOOK_ROLLOUTS.items():
    server, colocate = compute(rollouts_plan(util, "server")), compute(rollouts_plan(util, "colocate"))
    weights = next(ln for card in server.per_card for ln in card.lines if ln.name == "vllm_weights").bytes
    per_rollout = (PROMPT + COMPLETION) * server.metrics["kv_cache_bytes_per_token"]
    v, c = server.metrics["vllm"], colocate.metrics["vllm"]
    rows.append(
        {
            "gpu_memory_utilization": util,
            "book": book,
            "book's formula, sheet's bytes": int((util * 96 * GB - weights) // per_rollout),
            "sheet: server": v["rollouts_in_kv"],
            "server KV cache (GiB)": v["kv_cache_bytes"] / GIB,
            "sheet: colocate": c["rollouts_in_kv"]
            if c["starts"]
            else f"{c['rollouts_in_kv']} (vLLM cannot start)",
        }
    )
print(f"one rollout: {PROMPT + COMPLETION} tokens x 128 KiB = {per_rollout / GB:.3f} GB of KV cache")
pd.DataFrame(rows).style.format({"server KV cache (GiB)": "{:.1f}"})

# %% [markdown]
# The book's arithmetic fed the sheet's exact bytes (the bf16 weights and the KV per token) gives
# the book's numbers; the sheet's fuller model lands within 10% of them. Colocated at 0.92, the
# trainer's 16 GB of weights are already on the card, so vLLM's share is not free and it refuses to
# start. How far a colocated 8B can go on this card:

# %%
shares = {u / 100: compute(rollouts_plan(u / 100, "colocate")) for u in range(30, 100)}
starts = max(u for u, s in shares.items() if s.metrics["vllm"]["starts"])
fits = max(u for u, s in shares.items() if s.fits)
print(
    f"colocated: vLLM starts up to a share of {starts:.2f}; the whole step (trainer beside it) fits up to {fits:.2f}"
)
print("above that:", shares[round(fits + 0.01, 2)].verdict())

# %% [markdown]
# ## 3. What training holds: LoRA against full fine-tuning
#
# Full fine-tuning with AdamW keeps fp32 master weights (4 B), their gradients (4 B) and Adam's two
# moments (8 B): **16 bytes per parameter**. LoRA pays the same 16 bytes on the adapter only, beside
# frozen bf16 base weights (2 B per parameter).

# %%
rows = []
for name in MODELS:
    n = load_shape(name).total_params()
    common = dict(model=name, gpu="h200", load_in_4bit=False, optim="adamw_torch", layout="colocate")
    full = compute(Plan(**common, full_finetuning=True, lora_rank=None))
    lora = compute(Plan(**common, lora_rank=16))
    adapter = lora.metrics["train_state_bytes"] - lora.line("base_weights").bytes
    rows.append(
        {
            "model": name,
            "full: states (GB)": full.metrics["train_state_bytes"] / GB,
            "full: bytes/param": full.metrics["train_state_bytes"] / n,
            "LoRA r16: adapter params (M)": lora.metrics["trainable_params"] / 1e6,
            "LoRA: adapter states (GB)": adapter / GB,
            "LoRA: + bf16 base (GB)": lora.metrics["train_state_bytes"] / GB,
        }
    )
pd.DataFrame(rows).style.format(precision=2)

# %% [markdown]
# ## 4. The weight sync every step pays
#
# After each optimizer step vLLM must generate with the new policy. Unsloth's shared layout
# (`fast_inference=True`) hands vLLM the LoRA adapter only; TRL's colocate mode merges the adapter and
# copies the full bf16 weights on the card; a **server** layout sends them over the link to the vLLM
# cards: **141 GB, about 2.2 s at 64 GB/s for a 70B**, every step.

# %%
LINK_GBPS = 64 * 8  # 64 GB/s in the budget's unit, 10^9 bits/s
rows = []
for name in MODELS:
    server = compute(
        Plan(
            model=name,
            gpu="h100-sxm",
            load_in_4bit=False,
            layout="server",
            gpus=8,
            vllm_gpus=4,
            link_gbps=LINK_GBPS,
            gpu_memory_utilization=0.9,
        )
    )
    colocate = compute(Plan(model=name, gpu="h200", load_in_4bit=False, layout="colocate"))
    shared = compute(Plan(model=name, gpu="h200", load_in_4bit=False, layout="shared"))
    rows.append(
        {
            "model": name,
            "shared (adapter, MB)": shared.metrics["weight_sync_bytes_per_step"] / 1e6,
            "colocate (on-card copy, GB)": colocate.metrics["weight_sync_bytes_per_step"] / GB,
            "colocate (s)": colocate.metrics["weight_sync_seconds"],
            "server (over the link, GB)": server.metrics["weight_sync_bytes_per_step"] / GB,
            "server at 64 GB/s (s)": server.metrics["weight_sync_seconds"],
        }
    )
pd.DataFrame(rows).style.format(precision=2)

# %% [markdown]
# ## 5. This chapter's grid on the sheet: memory against completion length and group size
#
# The grid the lab sweeps on a GPU, Qwen3-4B in 4-bit on a 16 GB card with vLLM in the same process,
# on the sheet, which needs no GPU: the peak of each cell, split into the lines the knobs move.
# vLLM's share is fixed (`gpu_memory_utilization`), so longer completions and bigger groups first
# shrink how many rollouts its cache holds at once, then grow the trainer's activations and logits
# until the card is full.

# %%
import matplotlib.pyplot as plt

from grpolab.chapters import sweep

gpu_grid = lab.GRIDS["gpu"]
lengths = [128, *gpu_grid.max_completion_length, 896]
groups = [2, *gpu_grid.num_generations, 32]


def cell_sheet(g, c):
    return sweep.plan_cell(LAB_DIR, sweep.Host("gpu"), {}, sweep.Cell(1, g, c)).sheet


fig, (by_length, by_group) = plt.subplots(1, 2, figsize=(13, 4.2))
for g in gpu_grid.num_generations:
    sheets = [cell_sheet(g, c) for c in lengths]
    by_length.plot(lengths, [s.total_bytes / GIB for s in sheets], "-o", label=f"group of {g}")
capacity = cell_sheet(8, 256).capacity_bytes / GIB
by_length.axhline(capacity, color="grey", linestyle=":", label=f"RTX 5080: {capacity:.2f} GiB")
by_length.set_xlabel("max_completion_length (tokens)")
by_length.set_ylabel("peak (GiB)")
by_length.set_title("Peak of a step against completion length")
by_length.legend()

moving = ["kv_cache", "train_activations", "logits"]
for c in gpu_grid.max_completion_length:
    sheets = [cell_sheet(g, c) for g in groups]
    for line, style in zip(moving, ["-", "--", ":"], strict=True):
        by_group.plot(
            groups,
            [s.line(line).bytes / GIB for s in sheets],
            style,
            marker="o",
            label=f"{line}, {c} tokens" if line != "kv_cache" or c == 256 else None,
        )
by_group.set_xscale("log", base=2)
by_group.set_xlabel("num_generations (the group)")
by_group.set_ylabel("GiB")
by_group.set_title("The lines that move, against the group")
by_group.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# The KV cache stays put: it is vLLM's share less its weights, whatever the group. What it changes is
# how many rollouts decode at once, and so how long generation takes:

# %%
rows = []
for g in gpu_grid.num_generations:
    for c in gpu_grid.max_completion_length:
        s = cell_sheet(g, c)
        rows.append(
            {
                "cell": f"1x{g}x{c}",
                "peak (GiB)": s.total_bytes / GIB,
                "fits": s.fits,
                "rollouts in KV": s.metrics["vllm"]["rollouts_in_kv"],
                "at once": s.metrics["max_concurrent_rollouts"],
                "generation s/step (roofline)": s.metrics["generation_seconds_estimate"],
            }
        )
largest = max(rows, key=lambda r: r["peak (GiB)"])["cell"]
print(f"the grid's largest cell: {largest}; the sweep's edge doubles its group")
pd.DataFrame(rows).style.format(precision=2)

# %% [markdown]
# ### Standby: memory for time
#
# Unsloth's standby (`--unsloth-vllm-standby true`) changes two things, read from unsloth_zoo's source:
# before loading, it raises vLLM's share to its own tier for the card (about 0.76 of a 16 GB card,
# `gpu_memory_utilization` is overridden); and every step, once the rollouts are decoded, vLLM goes to
# sleep: its KV cache is released (not copied anywhere: the next rollouts start from an empty cache),
# while the 4-bit weights, shared with the trainer, stay. The trainer then has the KV cache's memory for
# its activations and logits; before the next rollouts vLLM wakes and maps its cache again.
#
# So the sheet's `kv_cache` line is held while generating and not while training, and the step's peak
# is the larger of the two phases, where without standby the cache sits under both. The price is time:
# releasing and mapping several GiB every step. A GPU run logs both phases, budget beside measured
# (`phase/generate/*`, `phase/train/*`), and `perf/generation_seconds` per step, so a sweep of the grid
# with `--unsloth-vllm-standby true` beside one without shows on your card what it saves and what it
# costs. (No GPU has run it for this notebook: the numbers below are the sheet's.)

# %%
rows = []
for standby in (False, True):
    s = sweep.plan_cell(
        LAB_DIR, sweep.Host("gpu"), {"unsloth_vllm_standby": standby}, sweep.Cell(1, 8, 768)
    ).sheet
    rows.append(
        {
            "standby": standby,
            "vLLM util handed": s.metrics["vllm"]["effective_util"],
            "KV cache (GiB)": s.line("kv_cache").bytes / GIB,
            "rollouts in KV": s.metrics["vllm"]["rollouts_in_kv"],
            "generate phase (GiB)": s.phases["generate"] / GIB,
            "train phase (GiB)": s.phases["train"] / GIB,
            "peak (GiB)": s.total_bytes / GIB,
            "fits": s.fits,
        }
    )
pd.DataFrame(rows).style.format(precision=2)

# %% [markdown]
# ## 6. The sweep on this machine
#
# The lab's own sweep: every cell's sheet first, then each cell that fits as chapter 1's loop for a
# few steps in a process of its own, nested under one MLflow run. If this store already holds a
# finished sweep of this profile (from `uv run python labs/grpo-sizing/train.py`), this notebook reads
# the latest; otherwise it runs a short one here: two cells.

# %%
import mlflow

from grpolab.lifecycle import tracking

tracking.use_store()


def latest_sweep():
    found = mlflow.search_runs(
        experiment_names=["grpo-sizing"],
        filter_string=f"tags.run_kind = 'sweep' and tags.profile = '{profile}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return found[0] if found else None


SHORT = {
    "cpu": ["--grid-num-generations", "8,16", "--grid-max-completion-length", "16"],
    "gpu": ["--grid-num-generations", "4,8", "--grid-max-completion-length", "256"],
}
parent = latest_sweep()
if parent is None:
    exit_code = lab.main(["--profile", profile, *SHORT[profile]])
    assert exit_code == 0, f"the sweep exited with {exit_code}"
    parent = latest_sweep()
print("sweep", parent.info.run_id, parent.info.status, "-", parent.data.tags["mlflow.note.content"])

# %% [markdown]
# ## 7. Reading the sweep back from MLflow
#
# The sweep's run holds the grid: its chart, its table, every cell's figures in `sweep/cells.json`.
# Each cell is a child run (MLflow's tag `mlflow.parentRunId`) with chapter 1's names: `<line>/budget_<unit>`
# beside `<line>/measured_<unit>`, `total/budget_<unit>` beside `total/measured_<unit>` (the unit, GiB on a
# GPU and MiB on the CPU, is the run's tag `memory_unit`).

# %%
import json

from IPython.display import Image, Markdown, display

client = mlflow.MlflowClient()
folder = Path(client.download_artifacts(parent.info.run_id, "sweep"))
display(Image(filename=str(folder / "budget_vs_measured.png")))
display(Markdown((folder / "budget_vs_measured.md").read_text()))
cells = json.loads((folder / "cells.json").read_text())["cells"]

# %%
children = mlflow.search_runs(
    experiment_names=["grpo-sizing"],
    filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
    output_format="list",
)
ran = [r for r in children if r.info.status == "FINISHED"]
print(f"{len(children)} child runs under the sweep: " + ", ".join(r.info.run_name for r in children))
from budgets.units import MIB
from grpolab.memory.names import MEMORY_UNITS, memory_key


def in_mib(run, line: str, figure: str) -> float:
    """A cell's memory figure in MiB, whatever unit its run logged (tag memory_unit)."""
    unit = run.data.tags["memory_unit"]
    return run.data.metrics[memory_key(line, figure, unit)] * MEMORY_UNITS[unit] / MIB


lines = sorted(
    {
        k.split("/")[0]
        for r in ran
        for k in r.data.metrics
        if k.endswith(f"/measured_{r.data.tags['memory_unit']}") and not k.startswith("total/")
    }
)
fig, axes = plt.subplots(1, len(ran), figsize=(4.5 * len(ran), 3.6), squeeze=False, sharey=True)
for ax, run in zip(axes[0], sorted(ran, key=lambda r: r.info.run_name), strict=True):
    m = run.data.metrics
    shown = [n for n in lines if memory_key(n, "measured", run.data.tags["memory_unit"]) in m]
    x = range(len(shown))
    ax.bar([i - 0.2 for i in x], [in_mib(run, n, "budget") for n in shown], width=0.4, label="budget")
    ax.bar([i + 0.2 for i in x], [in_mib(run, n, "measured") for n in shown], width=0.4, label="measured")
    ax.set_xticks(list(x), shown, rotation=40, ha="right")
    ax.set_yscale("log")
    ax.set_title(
        f"{run.info.run_name}: peak {in_mib(run, 'total', 'measured') / 1024:.2f} of "
        f"{in_mib(run, 'total', 'budget') / 1024:.2f} GiB budgeted"
    )
axes[0][0].set_ylabel("MiB (log)")
axes[0][0].legend()
plt.tight_layout()

# %% [markdown]
# ## 8. The same sweep in the MLflow UI
#
# From the repository root:
#
# ```bash
# uv run mlflow ui --backend-store-uri sqlite:///mlflow.db
# ```
#
# then open the experiment `grpo-sizing`: the sweep's run shows its cells nested under it; its
# *Artifacts → sweep* holds the chart and the table, and each cell's *Model metrics* show one
# section per budget line, as in chapter 1.

# %%
print(f"experiment grpo-sizing, sweep {parent.info.run_id}, store {tracking.tracking_uri()}")
