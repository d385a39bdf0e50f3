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
# # Chapter 7 — your own task, checked before a GPU minute is spent
#
# This notebook follows `labs/grpo-own-task/train.py`. The chapter trains a task that lives in a file of
# the reader's own (`labs/grpo-own-task/largest_digit.py`, what `uv run python -m task new` writes), and
# every lab checks its task before anything loads. First the file's task, then the check on it and on
# rewards a user could write that break or fool a run, then the chapter's run read back from MLflow:
# where its task came from, the check's table, held-out accuracy before and after.
#
# Runs go to the same MLflow store as the lab (`mlflow.db` at the repository root, or
# `MLFLOW_TRACKING_URI` if you set it before starting Jupyter).

# %%
from pathlib import Path

REPO = next(
    p for p in [Path.cwd(), *Path.cwd().parents] if (p / "labs" / "grpo-own-task" / "lab.toml").exists()
)
LAB_DIR = REPO / "labs" / "grpo-own-task"

from grpolab.config.settings import lab_settings
from grpolab.memory.device import detect

profile = "gpu" if detect().on_gpu else "cpu"
print(
    "No CUDA GPU found: the run below is the lab's CPU profile, the tiny Qwen3 stand-in."
    if profile == "cpu"
    else "CUDA GPU found: the run below is the lab's real profile, Qwen3-4B in 4-bit with vLLM."
)
settings = lab_settings(LAB_DIR, profile)  # the chapter's task, as its lab.toml names it
task = settings.get_task()
print(f"task {task.name!r} from {settings.task}")
print("source:", dict(task.source))
print("rewards:", [(r.name, r.max_reward, r.role.value) for r in task.rewards])
row = task.build_dataset(1, seed=0)[0]
print(row["prompt"][1]["content"], "->", task.reference_answer(row))

# %% [markdown]
# ## 1. The check, one line a check
#
# `uv run python -m task check labs/grpo-own-task/largest_digit.py` prints the same. Every check passes
# for the chapter's file; the worst example each check found is in its line.

# %%
from task.check import check

report = check(task)
print("\n".join(report.lines()))

# %% [markdown]
# ## 2. What the check refuses
#
# Two rewards a user could write for the same task: one that pays any answer the right digit is in (the
# loose checker of chapter 4), and one that evaluates the answer with Python. The first is paid by a
# completion that holds every digit; the second runs what the model wrote. Both are refused, by name.

# %%
import dataclasses

from task.rewards import CORRECT_REWARD, RewardRole, answer_span, completion_text, declare_reward


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def digit_anywhere(prompts, completions, target, **kwargs):
    return [
        1.0 if str(t) in (answer_span(completion_text(c)) or "") else 0.0
        for c, t in zip(completions, target, strict=True)
    ]


@declare_reward(CORRECT_REWARD, RewardRole.ANSWER)
def evaluated(prompts, completions, target, **kwargs):
    out = []
    for c, t in zip(completions, target, strict=True):
        try:
            out.append(1.0 if eval(answer_span(completion_text(c))) == t else 0.0)
        except Exception:
            out.append(0.0)
    return out


for reward in (digit_anywhere, evaluated):
    broken = dataclasses.replace(task, name=reward.__name__, reward_funcs=(reward, task.reward_funcs[1]))
    print(check(broken, rows=2).verdict())

# %% [markdown]
# ## 3. What it costs: the sheet from the task's own longest prompt
#
# The budget's prompt length is the task's `worst_case_prompt()`, in Qwen3's chat format: here the sheet
# of the profile this notebook runs (the CPU stand-in's lines are kilobytes: a log scale).

# %%
import matplotlib.pyplot as plt

from budgets import compute
from budgets.units import GIB

sheet = compute(settings.plan())
print(f"max_prompt_length {settings.max_prompt_length} (the task's longest prompt, in characters of ChatML)")
lines = [(line.name, line.bytes / GIB) for line in sheet.lines]
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.barh([n for n, _ in lines], [b for _, b in lines], log=profile == "cpu")
ax.set_xlabel("GiB")
ax.set_title(f"The sheet: peak {sheet.total_bytes / GIB:.2f} of {sheet.capacity_bytes / GIB:.2f} GiB")
plt.tight_layout()

# %% [markdown]
# ## 4. The chapter's run: where its task came from, and what it learned
#
# The run's tags say where the task came from (the file and its sha256) and what the check found;
# `task_check/table.md` is the table; held-out accuracy is the adapter's against the base's on numbers no
# training prompt holds. On the CPU stand-in, the README command (2026-12-05, the same on every x86-64
# machine) went from 0.0% to 42.2%: the base wrote the right digit first on 27 of the 64 numbers, never in
# the tag, and the adapter writes it in the tag on as many (the chapter's page says how that was seen).

# %%
import mlflow
import pandas as pd

from grpolab.lifecycle.tracking import tracking_uri

client = mlflow.MlflowClient(tracking_uri())
experiment = client.get_experiment_by_name("grpo-own-task")
runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
run = runs[0]
tags = {k: v for k, v in run.data.tags.items() if k.startswith("task_")}
print(pd.Series(tags).to_string())
m = run.data.metrics
print(f"held-out accuracy: base {m['eval/base_accuracy']:.1%} -> adapter {m['eval/adapter_accuracy']:.1%}")
print(Path(client.download_artifacts(run.info.run_id, "task_check/table.md")).read_text())


# %%
def curve(key):
    points = sorted(client.get_metric_history(run.info.run_id, key), key=lambda p: p.step)
    return [p.step for p in points], [p.value for p in points]


fig, ax = plt.subplots(figsize=(8, 3.5))
for key in ("rewards/format_reward/mean", "rewards/correctness_reward/mean"):
    ax.plot(*curve(key), label=key.split("/")[1])
ax.set_xlabel("step")
ax.set_title("Rewards per step")
ax.legend()
plt.tight_layout()

# %%
from grpolab.memory.names import memory_key

unit = run.data.tags["memory_unit"]
paired = pd.DataFrame(
    [
        {"line": line.name, "budget": m[memory_key(line.name, "budget", unit)], "measured": m[key]}
        for line in sheet.lines
        if (key := memory_key(line.name, "measured", unit)) in m
    ]
)
ax = paired.plot.bar(x="line", y=["budget", "measured"], logy=profile == "cpu", figsize=(8, 3.5), rot=30)
ax.set_ylabel({"gib": "GiB", "mib": "MiB"}[unit])
ax.set_title("Budget vs measured, per line")
plt.tight_layout()
