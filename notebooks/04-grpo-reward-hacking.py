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
# # Chapter 4 — reward hacking, watched as it happens
#
# This notebook follows `labs/grpo-reward-hacking/train.py`. GRPO pushes up whatever its reward pays
# more often than the group's mean, right or not. A loose checker (`str(answer) in completion`) pays
# more than right answers, and the policy finds what else it pays. First the checker, scored on
# completions you type; then the chapter's arms read back from MLflow (the loose reward against the
# task's exact one on the same completions, held-out accuracy before and after, KL per beta), a few
# completions side by side, and the run doctor's verdict.
#
# Runs go to the same MLflow store as the lab (`mlflow.db` at the repository root, or
# `MLFLOW_TRACKING_URI` if you set it before starting Jupyter).

# %%
import importlib.util
from pathlib import Path

REPO = next(
    p for p in [Path.cwd(), *Path.cwd().parents] if (p / "labs" / "grpo-reward-hacking" / "lab.toml").exists()
)
LAB_DIR = REPO / "labs" / "grpo-reward-hacking"

# The lab script is the source of truth: load it as a module and use its arms and its rewards.
spec = importlib.util.spec_from_file_location("grpo_reward_hacking", LAB_DIR / "train.py")
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
print("arms:", ", ".join(f"{a.name} ({a.reward})" for a in lab.ARMS))

# %% [markdown]
# ## 1. Why the loose checker pays
#
# The task: the last digit of a number. The exact reward pays one integer in one `<ans>` tag, equal to
# the target; the loose checker pays any completion that contains the target's digits. Type your own
# completions below: the last five are paid by the loose checker and by nothing the task declares.
# (On a GPU the chapter trains countdown instead, which Qwen3-4B has still to learn: there the loose
# checker pays a completion that restates the prompt's target, right expression or not.)

# %%
import pandas as pd

from task import get_task
from task.loose import contains_answer_reward

task = get_task("lastdigit")
number, target = 827, 7
completions = [
    "<ans>7</ans>",  # right
    "<ans>3</ans>",  # wrong
    "The answer is 7.",  # right, but not in the format the task asks for
    "<ans>827</ans>",  # the prompt's number echoed
    "<ans>1, 4, 7</ans>",  # several guesses
    "<ans>0123456789</ans>",  # every digit
    "<ans>87777</ans>",  # a run of digits: what the loose arms learn to write on the CPU
]
exact, fmt = (f(None, completions, target=[target] * len(completions)) for f in task.reward_funcs)
loose = contains_answer_reward(None, completions, [target] * len(completions))
pd.DataFrame(
    {"completion": completions, "loose checker": loose, "exact: correctness": exact, "exact: format": fmt}
)

# %% [markdown]
# ## 2. The arms, read back from MLflow
#
# If the store already holds a finished run of this chapter for this profile (from
# `uv run python labs/grpo-reward-hacking/train.py`), this notebook reads the latest; otherwise it
# runs a short one here: the exact and the loose arm.

# %%
import json

import mlflow

from grpolab.lifecycle import tracking

tracking.use_store()


def latest_arms():
    found = mlflow.search_runs(
        experiment_names=["grpo-reward-hacking"],
        filter_string=f"tags.run_kind = 'arms' and tags.profile = '{profile}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return found[0] if found else None


parent = latest_arms()
if parent is None:
    exit_code = lab.main(["--profile", profile, "--arms", "exact,loose"])
    assert exit_code == 0, f"the chapter exited with {exit_code}"
    parent = latest_arms()
client = mlflow.MlflowClient()
record = json.loads(Path(client.download_artifacts(parent.info.run_id, "arms/arms.json")).read_text())["arms"]
children = {
    r.data.tags["arm"]: r
    for r in mlflow.search_runs(
        experiment_names=["grpo-reward-hacking"],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        output_format="list",
    )
}
print(f"run {parent.info.run_id}: arms {', '.join(children)}")

# %% [markdown]
# Each arm's curves, straight from its own run's metrics: the reward it was paid, and the task's exact
# reward on the same completions (logged at weight 0: watched, paying nothing). On the exact arm the
# two are the same curve; on a loose arm they part where the hack begins.

# %%
import matplotlib.pyplot as plt


def curve(run, key):
    history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
    return [m.step for m in history], [m.value for m in history]


fig, axes = plt.subplots(1, len(record), figsize=(4 * len(record), 3.5), sharey=True, squeeze=False)
for ax, arm in zip(axes[0], record, strict=True):
    run = children[arm["arm"]]
    for key, style in ((arm["paid_metric"], "-"), (arm["exact_metric"], ":")):
        steps, values = curve(run, key)
        ax.plot(
            steps, values, style, label=key.split("/")[1] + (" (paid)" if key == arm["paid_metric"] else "")
        )
    held = arm["held_out"]
    ax.plot(
        [0, steps[-1]],
        [held["base"]["accuracy"], held["adapter"]["accuracy"]],
        "o--",
        label="held-out accuracy",
    )
    ax.set(title=f"{arm['arm']} (beta {arm['beta']:g})", xlabel="step", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
axes[0][0].set_ylabel("share paid")
fig.tight_layout()

# %% [markdown]
# ## 3. The leash: KL to the reference, per beta
#
# The loss adds `beta x KL(policy || reference)`: the further the policy drifts from where it
# started, the harder it is pulled back. KL is measured when beta > 0 (with beta 0 there is no
# reference policy to measure against, and the trainer logs 0). Held-out accuracy and the loose
# checker's held-out payout say how much of the hack each beta let through.

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for arm in record:
    steps, values = curve(children[arm["arm"]], "kl")
    if values and arm["beta"] != 0:  # without a reference Unsloth's trainer logs 0: nothing measured
        ax.plot(steps, values, label=f"{arm['arm']} (beta {arm['beta']:g})")
ax.set(xlabel="step", ylabel="KL per token", title="drift from the reference")
ax.legend(fontsize=8)
pd.DataFrame(
    [
        {
            "arm": a["arm"],
            "beta": a["beta"],
            "held-out accuracy before": a["held_out"]["base"]["accuracy"],
            "after": a["held_out"]["adapter"]["accuracy"],
            "loose checker held out, before": a["held_out"]["base"]["rewards"].get("contains_answer_reward"),
            "after ": a["held_out"]["adapter"]["rewards"].get("contains_answer_reward"),
        }
        for a in record
    ]
)

# %% [markdown]
# ## 4. Completions, before and after
#
# The same held-out prompts, answered greedily by the base and by each arm's adapter.

# %%
from IPython.display import Image, Markdown, display

display(Markdown(Path(client.download_artifacts(parent.info.run_id, "arms/completions.md")).read_text()))

# %% [markdown]
# ## 5. The run doctor's verdict
#
# The doctor reads each arm's logs: the reward it was paid against the task's exact reward on the
# same completions, and held-out accuracy. On a loose arm it names the hack and the step where the
# two parted; on the exact arm it finds none of that kind. The chapter's run carries it all in its
# description, with its chart.

# %%
for arm in record:
    print(f"{arm['arm']}: " + ("; ".join(arm["findings"]) or "nothing held learning back"))
display(Image(filename=client.download_artifacts(parent.info.run_id, "arms/reward_vs_held_out.png")))
