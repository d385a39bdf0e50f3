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
# # Chapter 8 — when the reward won't move
#
# This notebook follows `labs/grpo-stuck/train.py`. Each arm breaks the book's run one way (a length
# with no room for the answer, a temperature near zero, a learning rate too small, a KL pull too
# strong, a reward that parses another tag than the prompt asks for, rollouts sampled from the base
# while the adapter trains, a question the model already answers and one it never does); the run
# doctor names what held it back and prints one next step; the chapter parses that step from the
# finding's text and trains it. Here: the table of cause, finding, fix and held-out
# accuracy; correctness per step, broken beside mended; and each finding read back into flags.
#
# Runs go to the same MLflow store as the lab (`mlflow.db` at the repository root, or
# `MLFLOW_TRACKING_URI` if you set it before starting Jupyter).

# %%
import importlib.util
from pathlib import Path

REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "labs" / "grpo-stuck" / "lab.toml").exists())
LAB_DIR = REPO / "labs" / "grpo-stuck"

# The lab script is the source of truth: load it as a module and use its arms.
spec = importlib.util.spec_from_file_location("grpo_stuck", LAB_DIR / "train.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)

import torch

profile = "gpu" if torch.cuda.is_available() else "cpu"
if profile == "cpu":  # before torch computes anything: the CPU's arithmetic as the lab pins it
    from grpolab.config import numerics

    numerics.pin()
if profile == "cpu":
    print("No CUDA GPU found: the arms below are the lab's CPU profile, the tiny Qwen3 stand-in.")
else:
    print("CUDA GPU found: the arms below are the lab's real profile, Qwen3-4B in 4-bit with vLLM.")
print("arms:", ", ".join(f"{a.name} ({dict(a.changes) or a.reward}, {a.cause})" for a in lab.ARMS))

# %% [markdown]
# ## 1. The chapter's run, read back from MLflow
#
# If the store already holds a finished run of this chapter for this profile (from
# `uv run python labs/grpo-stuck/train.py`), this notebook reads the latest; otherwise it runs one
# cause here, broken and mended: the cold group.

# %%
import json

import mlflow
import pandas as pd

from grpolab.lifecycle import tracking

tracking.use_store()


def latest_arms():
    found = mlflow.search_runs(
        experiment_names=["grpo-stuck"],
        filter_string=f"tags.run_kind = 'arms' and tags.profile = '{profile}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return found[0] if found else None


parent = latest_arms()
if parent is None:
    exit_code = lab.main(["--profile", profile, "--arms", "cold"])
    assert exit_code == 0, f"the chapter exited with {exit_code}"
    parent = latest_arms()
client = mlflow.MlflowClient()
record = {
    a["arm"]: a
    for a in json.loads(Path(client.download_artifacts(parent.info.run_id, "arms/arms.json")).read_text())[
        "arms"
    ]
}
pd.DataFrame(
    [
        {
            "arm": a["arm"],
            "broken by": (a["changes"] or f"paying {a['reward']}") if a["cause"] else "",
            "the doctor named": ", ".join(a["finding_names"]) or "nothing",
            "its next step": a["fix"] or "",
            "held-out before": a["held_out"]["base"]["accuracy"],
            "after": a["held_out"]["adapter"]["accuracy"],
        }
        for a in record.values()
    ]
)

# %% [markdown]
# ## 2. What an arm costs: its sheet, and the memory it measured
#
# Every arm is the book's run with one setting changed, so every arm's sheet is the chapter's give or
# take that setting (the cut arm's is smaller: two tokens a completion). Here the chapter's sheet, and
# one mended arm's budget beside what it measured (the CPU stand-in's lines are kilobytes: a log scale).

# %%
import matplotlib.pyplot as plt

from budgets import compute
from budgets.units import GIB
from grpolab.config.settings import lab_settings

settings = lab_settings(LAB_DIR, profile)
sheet = compute(settings.plan())
lines = [(line.name, line.bytes / GIB) for line in sheet.lines]
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.barh([n for n, _ in lines], [b for _, b in lines], log=profile == "cpu")
ax.set_xlabel("GiB")
ax.set_title(f"The sheet: peak {sheet.total_bytes / GIB:.2f} of {sheet.capacity_bytes / GIB:.2f} GiB")
plt.tight_layout()

# %%
from grpolab.memory.names import memory_key

children = {
    r.data.tags["arm"]: r
    for r in mlflow.search_runs(
        experiment_names=["grpo-stuck"],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        output_format="list",
    )
}
mended = next(name for name in children if name.endswith("-fixed"))
m, unit = children[mended].data.metrics, children[mended].data.tags["memory_unit"]
paired = pd.DataFrame(
    [
        {"line": line.name, "budget": m[memory_key(line.name, "budget", unit)], "measured": m[key]}
        for line in sheet.lines
        if (key := memory_key(line.name, "measured", unit)) in m
    ]
)
ax = paired.plot.bar(x="line", y=["budget", "measured"], logy=profile == "cpu", figsize=(8, 3.5), rot=30)
ax.set_ylabel({"gib": "GiB", "mib": "MiB"}[unit])
ax.set_title(f"Budget vs measured, per line: arm {mended}")
plt.tight_layout()

# %% [markdown]
# ## 3. Broken beside mended
#
# The task's correctness per step on each broken arm and on the arm that applied the doctor's next
# step, with held-out accuracy before and after: the chapter's picture, as its run logged it.

# %%
from IPython.display import Image, display

display(Image(filename=client.download_artifacts(parent.info.run_id, "arms/broken_and_mended.png")))

# %% [markdown]
# ## 4. The doctor's finding, read back into flags
#
# The fix each mended arm trained is the finding's own text, parsed: `next_step` reads the changes a
# line of advice names (`budgets.advice.parse`, the inverse of how the doctor renders them) and types
# them as the settings hold them. The mended arm's MLflow params are those values. A parse that never
# pays is mended by a reward, not a flag: `reward_swap` reads which to pay in place of the silent one,
# and the mended arm's tag `arm.reward` names the rewards it was paid.

# %%
from grpolab.judging.doctor import Finding, next_step, reward_swap

for arm in lab.ARMS:
    if arm.name not in record:
        continue
    (printed,) = [f for f in record[arm.name]["findings"] if f.startswith(f"{arm.cause}: ")]
    finding = Finding(arm.cause, printed.split(": ", 1)[1])
    # Mended arms that came out the same (the same reward, settings and seed) share one run.
    mended = client.get_run(record[f"{arm.name}-fixed"]["run_id"]).data
    if (swap := reward_swap(finding)) is not None:
        step, trained = f"pay {swap[1]} in place of {swap[0]}", mended.tags["arm.reward"]
    else:
        step = next_step(finding, settings)
        trained = {k: mended.params[k] for k in step}
    print(f"{arm.name}: ...{printed[-90:]}\n    -> {step}; the mended arm trained with {trained}")
