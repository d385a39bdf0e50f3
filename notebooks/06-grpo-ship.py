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
# # Chapter 6 — ship it, and prove each step kept what GRPO taught
#
# This notebook follows `labs/grpo-ship/train.py`. The lab took chapter 1's adapter through the
# steps a user takes it (reload, the 16-bit merge, the 4-bit merge, GGUF, a server) and scored each
# on the training run's held-out prompts. Here we read that ship run back from MLflow, look at what
# each stage kept, see why the 4-bit merge loses what the 16-bit one keeps, and ask the registered
# model a question the way anyone who pulls it from the Model Registry would.
#
# Runs go to the same MLflow store as the lab (`mlflow.db` at the repository root, or
# `MLFLOW_TRACKING_URI` if you set it before starting Jupyter).

# %%
import importlib.util
from pathlib import Path

REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "labs" / "grpo-ship" / "lab.toml").exists())
LAB_DIR = REPO / "labs" / "grpo-ship"

# The lab script is the source of truth: load it as a module.
spec = importlib.util.spec_from_file_location("grpo_ship", LAB_DIR / "train.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)

import torch

profile = "gpu" if torch.cuda.is_available() else "cpu"
if profile == "cpu":  # before torch computes anything: the CPU's arithmetic as the lab pins it
    from grpolab.config import numerics

    numerics.pin()
    print("No CUDA GPU found: this notebook reads the CPU profile's ship run (the tiny stand-in's adapter).")
else:
    print(f"CUDA GPU found: the real profile, Qwen3-4B's adapter on {torch.cuda.get_device_name(0)}.")

# %% [markdown]
# ## 1. What a 16-bit merge costs, before anything loads
#
# The adapter trained on a 4-bit base, but a merged model others can run is a full 16-bit copy:
# every parameter at 2 bytes, in host memory while it is built, then on disk (and again for its GGUF
# file and for the copy MLflow logs). `budgets/shipping.py` computes it from the model's shape, as the
# VRAM sheet does; the lab prints it first (`--budget-only` prints nothing else).

# %%
import matplotlib.pyplot as plt

from budgets.shipping import merge_cost
from budgets.units import GIB

models = ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b"]
costs = [merge_cost(m) for m in models]
for cost in costs:
    print(cost.line())
fig, ax = plt.subplots(figsize=(7, 3))
ax.bar(
    [c.model for c in costs], [c.merged_bytes / GIB for c in costs], color="#7aa6c2", label="the 16-bit merge"
)
ax.bar(
    [c.model for c in costs],
    [c.merged_bytes / 4 / GIB for c in costs],
    color="#2f5f7f",
    label="the 4-bit base",
)
ax.set(ylabel="GiB", title="what the card held in 4 bit, and what shipping writes in 16")
ax.legend()
plt.show()

# %% [markdown]
# ## 2. The ship run, read back from MLflow
#
# The chapter's latest finished ship run of this profile (from `uv run python labs/grpo-ship/train.py`).
# If the store holds none, the cell runs the chapter here; with no run of chapter 1 either, on a CPU
# that trains chapter 1's short form first (a minute or two).

# %%
import mlflow
import pandas as pd
from IPython.display import Image, display

from grpolab.lifecycle import tracking

tracking.use_store()
client = mlflow.MlflowClient()


def latest_ship():
    found = mlflow.search_runs(
        experiment_names=["grpo-ship"],
        filter_string=f"tags.run_kind = 'ship' and tags.profile = '{profile}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return found[0] if found else None


ship = latest_ship()
if ship is None:
    exit_code = lab.main(["--profile", profile])
    assert exit_code == 0, f"the chapter's run ended with exit code {exit_code}"
    ship = latest_ship()
trained = client.get_run(ship.data.tags["ship.source_run"])
m = ship.data.metrics
prompts = int(ship.data.params["eval_prompts"])
stages = ["reload", "merged_16bit", "merged_4bit", "gguf", "served"]
print(f"Ship run {ship.info.run_id} shipped training run {trained.info.run_id} ({trained.info.run_name}).")
table = pd.DataFrame(
    [
        {
            "stage": stage,
            "held-out right": round(m[f"ship/{stage}/accuracy"] * prompts),
            "vs the adapter (prompts)": round(m[f"ship/{stage}/accuracy_diff"] * prompts),
            "answers changed": int(m[f"ship/{stage}/answers_changed"]),
        }
        for stage in stages
    ]
)
display(table)

# %% [markdown]
# Each stage beside the adapter as it was trained (the dashed line, the training run's own
# `eval/adapter_accuracy`) and the base before GRPO (dotted).

# %%
n = prompts
fig, ax = plt.subplots(figsize=(7.5, 3.4))
ax.bar(table["stage"], table["held-out right"], color="#4c956c")
ax.axhline(
    round(trained.data.metrics["eval/adapter_accuracy"] * n),
    color="black",
    linestyle="--",
    label="the adapter",
)
ax.axhline(
    round(trained.data.metrics["eval/base_accuracy"] * n), color="grey", linestyle=":", label="the base"
)
ax.set(ylabel=f"held-out prompts right, of {n}", ylim=(0, n * 1.1), title="what each stage kept")
ax.legend(loc="lower left")
plt.show()

# %% [markdown]
# ## 3. Why the 4-bit merge loses it
#
# The adapter adds B @ A x alpha / r to each layer's weights. A 4-bit weight is one of 16 levels,
# scaled per block of 64 weights: a change smaller than half the gap between two levels rounds back to
# the level it came from. The lab measured, over every weight the adapter changes, the share under
# half a step, and the share whose 4-bit code the requantized merge left as the base's.

# %%
print(f"weight changes under half a 4-bit step:       {m['ship/merged_4bit/delta_below_half_step']:.1%}")
print(f"weights whose 4-bit code stayed the base's:   {m['ship/merged_4bit/delta_rounded_away']:.1%}")
print(
    f"median change / half a step:                  {m['ship/merged_4bit/median_delta_over_half_step']:.2f}"
)
print(f"largest logit difference, 16-bit merge vs adapter: {m['ship/merged_16bit/max_logit_diff']:.2g}")
print()
print(ship.data.tags["mlflow.note.content"].split("\n\n")[0])

# %% [markdown]
# The chart the lab logged on the ship run (its Overview opens with the verdict above):

# %%
display(Image(filename=client.download_artifacts(ship.info.run_id, "ship/accuracy_by_stage.png")))

# %% [markdown]
# ## 4. The registered model, as anyone runs it
#
# The 16-bit merge is a version in MLflow's Model Registry, its tag `training_run` pointing at the run
# that trained it. Anyone with the store loads it by name, with neither PEFT nor Unsloth, and asks it
# a held-out question, greedy; the task's own checker scores the answer.

# %%
from grpolab.judging.evaluate import eval_rows
from grpolab.lifecycle.resume import logged_settings
from task import get_task

registered = ship.data.tags["ship.registered_model"]
version = client.get_model_version(*registered.removeprefix("models:/").split("/"))
print(f"{registered}: tags {version.tags}")
model = mlflow.pyfunc.load_model(registered)
settings = logged_settings(REPO / "labs" / "grpo-first", trained)
rows = eval_rows(settings).select(range(4))
# The registered model's own tokenizer, with the chat template the merge kept.
tokenizer = mlflow.transformers.load_model(registered, return_type="components")["tokenizer"]
asked = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in rows["prompt"]]
answers = model.predict(asked, params={"max_new_tokens": settings.max_completion_length, "do_sample": False})
task = get_task(settings.task)
columns = {c: list(rows[c]) for c in rows.column_names if c != "prompt"}
paid = task.reward_funcs[0](rows["prompt"], answers, **columns)
for row, answer, reward in zip(rows["prompt"], answers, paid, strict=True):
    print(f"{row[-1]['content']!r} -> {answer!r}  ({task.reward_funcs[0].__name__}: {reward})")
