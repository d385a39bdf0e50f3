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
# # Chapter 5 — spend the headroom, each GiB priced in learning
#
# This notebook follows `labs/grpo-headroom/train.py`. Chapter 1's recipe leaves part of a 16 GB card
# free. Each arm of this chapter spends the same share of it on one knob: more completions per group,
# longer completions, more prompts per step (on a GPU, standby too). First the sheet, which chooses
# each arm's value before anything loads; then the arms read back from MLflow: the peak each spent,
# held-out accuracy before and after, minutes of training, and what each GiB and each minute bought.
#
# Runs go to the same MLflow store as the lab (`mlflow.db` at the repository root, or
# `MLFLOW_TRACKING_URI` if you set it before starting Jupyter).

# %%
import importlib.util
from pathlib import Path

REPO = next(
    p for p in [Path.cwd(), *Path.cwd().parents] if (p / "labs" / "grpo-headroom" / "lab.toml").exists()
)
LAB_DIR = REPO / "labs" / "grpo-headroom"

# The lab script is the source of truth: load it as a module and use its fraction and its host.
spec = importlib.util.spec_from_file_location("grpo_headroom", LAB_DIR / "train.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)

import torch

profile = "gpu" if torch.cuda.is_available() else "cpu"
if profile == "cpu":  # before torch computes anything: the CPU's arithmetic as the lab pins it
    from grpolab.config import numerics

    numerics.pin()
if profile == "cpu":
    print(
        "No CUDA GPU found: this notebook reads the CPU profile's arms (the tiny stand-in on a small host)."
    )
else:
    print(f"CUDA GPU found: the real profile, Qwen3-4B on {torch.cuda.get_device_name(0)}.")

# %% [markdown]
# ## 1. The arms, as the sheet plans them on a 16 GB card
#
# For each knob the sheet finds the largest value that still fits (`--headroom`), then the arm's
# value: the largest whose peak spends the chapter's fraction of what the recipe leaves free. This is
# the GPU plan on lab.toml's card (the RTX 5080), computed here with no GPU at all: what
# `uv run python labs/grpo-headroom/train.py --budget-only --profile gpu` prints.

# %%
import matplotlib.pyplot as plt

from budgets.units import GIB
from grpolab.chapters import headroom
from grpolab.chapters.sweep.host import Host
from grpolab.config.settings import lab_settings

card = lab_settings(LAB_DIR, "gpu").gpu
gpu_host = Host("gpu", None, 0.0, f"{card} (lab.toml's card)")
planned = headroom.plan_arms(LAB_DIR, gpu_host, {}, lab.FRACTION)
print(headroom.sheet_lines(planned, gpu_host, lab.FRACTION))

fig, ax = plt.subplots(figsize=(7, 3.2))
names = [a.name for a in planned]
ax.bar(names, [a.spent_gib for a in planned], color="#7aa6c2")
ax.axhline(planned[0].planned.sheet.capacity_bytes / GIB, color="black", linestyle="--", label="the card")
ax.set(
    ylabel="the sheet's peak (GiB)", title=f"each arm's peak on {card}, {lab.FRACTION:.0%} of the headroom"
)
ax.legend()
plt.show()

# %% [markdown]
# ## 2. The arms, read back from MLflow
#
# The chapter's latest finished run of this profile (from
# `uv run python labs/grpo-headroom/train.py`); if the store holds none, the cell below runs a short
# one here (few steps: its ranking says little).

# %%
import json

import mlflow
import pandas as pd

from grpolab.lifecycle import tracking

tracking.use_store()


def latest_headroom():
    found = mlflow.search_runs(
        experiment_names=["grpo-headroom"],
        filter_string=f"tags.run_kind = 'headroom' and tags.profile = '{profile}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return found[0] if found else None


parent = latest_headroom()
if parent is None:
    exit_code = lab.main(["--profile", profile, "--max-steps", "4", "--eval-prompts", "16"])
    assert exit_code == 0, f"the chapter's run ended with exit code {exit_code}"
    parent = latest_headroom()
client = mlflow.MlflowClient()
record = json.loads(Path(client.download_artifacts(parent.info.run_id, headroom.RECORD)).read_text())["arms"]
children = {
    r.data.tags["headroom.arm"]: r
    for r in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
}
pd.DataFrame(
    [
        {
            "arm": r["arm"],
            "cell": r["cell"],
            "sheet's peak (GiB)": round(r["budget_gib"], 2),
            "measured peak (GiB)": None if r["measured_gib"] is None else round(r["measured_gib"], 2),
            "held-out before": r["accuracy_base"],
            "after": r["accuracy_adapter"],
            "minutes training": None if r["train_minutes"] is None else round(r["train_minutes"], 2),
        }
        for r in record
    ]
)

# %% [markdown]
# Each arm's peak, the sheet's beside the measured (each arm ran in a process of its own, so its peak
# is its own), and its correctness reward per step.

# %%
fig, (peaks, curves) = plt.subplots(1, 2, figsize=(11, 3.5))
x = range(len(record))
peaks.bar([i - 0.2 for i in x], [r["budget_gib"] for r in record], 0.4, label="sheet")
peaks.bar([i + 0.2 for i in x], [r["measured_gib"] or 0 for r in record], 0.4, label="measured")
peaks.set_xticks(list(x), [r["arm"] for r in record])
peaks.set(ylabel="peak (GiB)", title="budget beside measured, per arm")
peaks.legend()
for r in record:
    history = sorted(
        client.get_metric_history(children[r["arm"]].info.run_id, "rewards/correctness_reward/mean"),
        key=lambda m: m.step,
    )
    curves.plot([m.step for m in history], [m.value for m in history], label=r["arm"])
curves.set(xlabel="step", ylabel="correctness reward", title="what each arm was paid")
curves.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 3. What each GiB and each minute bought
#
# Held-out accuracy gained (adapter minus base, the same held-out prompts for every arm) per GiB the
# arm spent beyond the recipe, and per minute of training; the verdict opens the chapter's run in
# MLflow, with this chart.

# %%
from IPython.display import Image, Markdown, display

display(Markdown(Path(client.download_artifacts(parent.info.run_id, headroom.TABLE)).read_text()))
print(parent.data.tags["mlflow.note.content"].split("\n\n")[0])
display(Image(filename=client.download_artifacts(parent.info.run_id, headroom.CHART)))
