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
# # Chapter 1 — a first GRPO run on one 16 GB GPU
#
# This notebook follows `labs/grpo-first/train.py` step by step. Every cell calls the lab's own
# code (the task, the budget, the policy loader, the lab's `main`), so what you see here is what the
# script does. On a CUDA GPU it runs the real profile (Qwen3-4B in 4-bit, vLLM in the same process);
# without one it runs the lab's CPU stand-in and says so below.
#
# Runs go to the same MLflow store as the lab (`mlflow.db` at the repository root, or
# `MLFLOW_TRACKING_URI` if you set it before starting Jupyter).

# %%
import importlib.util
from pathlib import Path

REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "labs" / "grpo-first" / "lab.toml").exists())
LAB_DIR = REPO / "labs" / "grpo-first"

# The lab script is the source of truth: load it as a module and use its functions.
spec = importlib.util.spec_from_file_location("grpo_first", LAB_DIR / "train.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)

from grpolab.memory.device import detect

profile = "gpu" if detect().on_gpu else "cpu"
if profile == "cpu":  # before torch computes anything: the CPU's arithmetic as the lab pins it
    from grpolab.config import numerics

    numerics.pin()
if profile == "cpu":
    print("No CUDA GPU found: this notebook runs the lab's CPU profile, a tiny Qwen3 stand-in on the CPU.")
    print("The loop, rewards, budget and tracking are the real ones; the numbers are not Qwen3-4B's.")
else:
    print("CUDA GPU found: this notebook runs the lab's real profile, Qwen3-4B in 4-bit with vLLM.")

# %% [markdown]
# ## 1. The settings
#
# Everything the lab trains with is the book's recipe (`grpolab/recipe.toml`: shared values at the
# top, a table per profile below), which chapter 1's `labs/grpo-first/lab.toml` trains as it is; a
# later chapter's lab.toml states only what it changes. The names are TRL's and Unsloth's, and each
# is a flag of the lab (`--num-generations 4`). If the store holds no run of the lab yet, section 6
# trains a short one: fewer steps than the script's default.

# %%
from grpolab.config.settings import check, lab_settings

STEPS = 30 if profile == "cpu" else 20
settings = lab_settings(LAB_DIR, profile, {"max_steps": STEPS})
check(settings)
{
    k: v
    for k, v in settings.as_params().items()
    if k
    in (
        "model",
        "num_generations",
        "max_completion_length",
        "learning_rate",
        "beta",
        "loss_type",
        "scale_rewards",
        "max_steps",
    )
}

# %% [markdown]
# ## 2. GRPO in one cell
#
# For one prompt the policy samples a group of completions, each scored by the rewards. The
# advantage of completion *i* is how much better it did than its group:
#
# $$A_i = r_i - \operatorname{mean}(r_1, \dots, r_G) \qquad \text{(GRPO divides by } \operatorname{std}(r_1, \dots, r_G)\text{ too)}$$
#
# Every token of completion *i* gets the same advantage. The loss pushes up the log-probability of
# completions with a positive advantage and down those with a negative one. Type your own rewards
# below: a group where everyone scores the same has no advantage at all, so nothing is learned.

# %%
import numpy as np


def advantages(rewards, scale_by_std):
    r = np.asarray(rewards, dtype=float)
    a = r - r.mean()  # the group-relative baseline
    return a / (r.std(ddof=1) + 1e-4) if scale_by_std else a  # TRL's std is unbiased (ddof 1)


for rewards in ([1.2, 0.2, 0.2, 0.0], [0.2, 0.2, 0.2, 0.2], [1.2, 0.0, 0.0, 0.0]):
    print(
        f"rewards {rewards}: GRPO (std-scaled) {np.round(advantages(rewards, True), 2)}, "
        f"Dr. GRPO (not scaled) {np.round(advantages(rewards, False), 2)}"
    )

# %% [markdown]
# Dividing by the std (GRPO, `scale_rewards="group"`) makes a group with one lucky success weigh as
# much as a group with a clear winner; Dr. GRPO (`scale_rewards="none"`) keeps the raw difference.
# Dr. GRPO also changes how token losses are summed: GRPO averages each completion over its own
# length, so a long wrong answer is punished less per token than a short one; `loss_type="dr_grpo"`
# divides every completion by the same constant (`max_completion_length`), which removes that bias.

# %%
completion_lengths = np.array([12, 30, 30, 300])  # tokens
a = advantages([1.2, 0.2, 0.2, 0.0], scale_by_std=False)
per_token_grpo = a / completion_lengths  # each completion averaged over its own length
per_token_dr = a / settings.max_completion_length  # one constant for all
print("weight per token, GRPO:   ", np.round(per_token_grpo, 4))
print("weight per token, Dr.GRPO:", np.round(per_token_dr, 4))

# %% [markdown]
# ## 3. The budget, before anything loads
#
# Each line of what one GRPO step holds, with its formula: exact arithmetic where the libraries'
# allocations can be computed (weights, LoRA, optimizer states), estimates where only a
# measurement settles it (activations, vLLM's profiling pass). The total is the peak over the phases
# of a step (start, generate, train). The budget needs no GPU, so this is the real lab's sheet,
# Qwen3-4B on a 16 GB card, on every machine.

# %%
import pandas as pd

from budgets import compute

GIB = 1024**3
real = compute(lab_settings(LAB_DIR, "gpu").plan())


def sheet_table(sheet):
    return pd.DataFrame(
        [
            {
                "line": ln.name,
                "GiB": ln.bytes / GIB,
                "kind": "estimate" if ln.estimate else "exact",
                "formula": ln.formula,
            }
            for ln in sheet.lines
        ]
    )


print(real.title)
print(real.verdict())
sheet_table(real).style.format({"GiB": "{:.2f}"})

# %%
import matplotlib.pyplot as plt

sheet = compute(settings.plan())  # the sheet of the profile this notebook runs
fig, axes = plt.subplots(
    1, 2 if profile == "cpu" else 1, figsize=(13 if profile == "cpu" else 8, 4), squeeze=False
)
for ax, (name, shown) in zip(
    axes[0], [("Qwen3-4B on a 16 GB card", real), ("the CPU stand-in", sheet)], strict=False
):
    sheet_table(shown).plot.barh(x="line", y="GiB", legend=False, ax=ax, log=shown is not real)
    ax.set_xlabel("GiB" + (" (log scale: the tiny model's lines are kilobytes)" if shown is not real else ""))
    ax.set_title(f"{name}: peak {shown.total_bytes / GIB:.2f} of {shown.capacity_bytes / GIB:.2f} GiB")
plt.tight_layout()

# %% [markdown]
# ## 4. The task and its rewards
#
# Addition of two integers in 0..999, answered as one integer inside `<ans></ans>` (on the CPU stand-in,
# in 0..19: task `small-addition`, the sums it can hold). Two rewards with TRL's signature: correctness
# (1.0 when the answer is the sum) and format (0.2 for exactly one well-formed tag). Try them on
# completions you write; several below should score zero.

# %%
from task import get_task
from task.rewards import correctness_reward, format_reward

task = get_task(settings.task)
prompts = task.build_dataset(4, seed=0)
print(prompts[0]["prompt"][-1]["content"], "->", prompts[0]["target"])

target = prompts[0]["target"]
completions = [
    f"<ans>{target}</ans>",  # right and well formed: 1.0 + 0.2
    f"The sum is <ans> {target} </ans>.",  # spaces around the number are fine
    f"<ans>{target + 1}</ans>",  # well formed, wrong: 0.2
    f"{target}",  # right number, no tag: 0
    f"<ans>{target}</ans><ans>{target}</ans>",  # two tags: 0
    "<ans>4 2</ans>",  # a space inside the number: not an integer
    "",  # empty: 0, and no exception
]
chat = [[{"role": "assistant", "content": c}] for c in completions]  # as TRL passes them
pd.DataFrame(
    {
        "completion": completions,
        "correctness": correctness_reward(
            prompts=[None] * len(chat), completions=chat, target=[target] * len(chat)
        ),
        "format": format_reward(prompts=[None] * len(chat), completions=chat),
    }
)

# %% [markdown]
# ## 5. Loading the policy
#
# Unsloth loads the base model in 4-bit (bitsandbytes `Linear4bit` layers) and attaches LoRA adapters.
# On the CPU profile we load it here to look inside; on a GPU the lab's run below loads it (a second
# in-process vLLM engine would not fit beside the first).

# %%
if profile == "cpu":
    from grpolab.memory.tensors import model_bytes_by_kind
    from grpolab.model import policy

    model, tokenizer = policy.load_policy(settings)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    print("q_proj of layer 0:", type(layer.base_layer).__name__, "with LoRA r =", layer.r["default"])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"trainable parameters: {trainable:,} (the budget says {sheet.to_dict()['trainable_params']:,})")
    print(
        {k: f"{v:,} B" for k, v in model_bytes_by_kind(model).items()},
        f"budget base_weights: {sheet.line('base_weights').bytes:,} B",
    )
    del model, tokenizer
else:
    print("On the GPU the policy is loaded by the run below.")

# %% [markdown]
# ## 6. The lab's run
#
# The run this notebook reads is the one the README's command trains
# (`uv run python labs/grpo-first/train.py`): its latest finished run of this profile in the store. If
# there is none yet, the cell below runs the lab's own `main` here, shorter than the script's default;
# either way the lab printed its budget sheet, trained, measured, saved the adapter and logged
# everything to MLflow.

# %%
import mlflow

from grpolab.lifecycle import tracking

tracking.use_store()


def latest_run():
    found = mlflow.search_runs(
        experiment_names=[settings.chapter],
        filter_string=(
            f"tags.run_kind = 'train' and tags.profile = '{profile}' and attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return found[0] if found else None


run = latest_run()
if run is None:
    exit_code = lab.main(["--profile", profile, "--max-steps", str(STEPS)])
    assert exit_code == 0, f"the lab exited with {exit_code}"
    run = latest_run()
print("run", run.info.run_id, run.info.run_name, run.info.status, f"({run.data.params['max_steps']} steps)")

# %% [markdown]
# ## 7. Reading the run back from MLflow
#
# The reward curves TRL logged per step, then the memory: the peak, and every budget line beside
# what the run measured for it.

# %%
client = mlflow.MlflowClient()


def curve(key):
    points = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
    return [m.step for m in points], [m.value for m in points]


fig, (rewards, memory) = plt.subplots(1, 2, figsize=(12, 3.5))
for key in ("rewards/format_reward/mean", "rewards/correctness_reward/mean"):
    rewards.plot(*curve(key), label=key.split("/")[1])
rewards.set_xlabel("step")
rewards.set_title("Rewards per step")
rewards.legend()
memory.plot(*curve("memory/step_peak_gib"), label="measured peak per step")
memory.axhline(sheet.total_bytes / GIB, linestyle="--", label="budget (sheet peak)")
memory.set_xlabel("step")
memory.set_ylabel("GiB")
memory.set_title("Peak memory")
memory.legend()
plt.tight_layout()

# %% [markdown]
# The book's first run says what to watch: `correctness_reward` climbs as the policy learns to emit
# the right integer in its tag, and `format_reward` rises towards its 0.2 ceiling. Whether that is
# learning or only the reward, the held-out prompts say (greedy, none of them a training prompt), and
# the run doctor reads the whole run.
#
# On the CPU stand-in, the README's command (`uv run python labs/grpo-first/train.py`, 2026-12-03; the
# same on every x86-64 machine, as the CPU profile pins its arithmetic) measured: `correctness_reward`
# 0.203 -> 0.684 (mean of the first and the last quarter of its 80 steps), `format_reward` 0.053 ->
# 0.181 (of 0.2), held-out accuracy 0.0% -> 78.1% on 64 prompts; the cells below show the figures of
# the run in your store.

# %%
metrics = run.data.metrics
print(
    f"held-out accuracy {metrics['eval/base_accuracy']:.1%} -> {metrics['eval/adapter_accuracy']:.1%}, "
    f"format {metrics['eval/base_format_rate']:.1%} -> {metrics['eval/adapter_format_rate']:.1%} (base -> adapter)"
)
print(next(p for p in run.data.tags["mlflow.note.content"].split("\n\n") if p.startswith("Run doctor:")))

# %%
from grpolab.memory.names import memory_key

metrics = run.data.metrics
# Memory figures carry their unit in their names: GiB on a GPU, MiB on the CPU stand-in (tag memory_unit).
unit = run.data.tags["memory_unit"]
unit_label = {"gib": "GiB", "mib": "MiB"}[unit]
comparison = pd.DataFrame(
    [
        {
            "line": line.name,
            "budget": metrics[memory_key(line.name, "budget", unit)],
            "measured": metrics.get(memory_key(line.name, "measured", unit)),
            "rel. error": metrics.get(f"{line.name}/rel_error"),
        }
        for line in sheet.lines
    ]
)
print(run.data.tags["mlflow.note.content"])
comparison.style.format(
    {"budget": "{:.6f}", "measured": "{:.6f}", "rel. error": "{:+.1%}"}, na_rep="not measured"
)

# %%
paired = comparison.dropna()
ax = paired.plot.bar(x="line", y=["budget", "measured"], logy=profile == "cpu", figsize=(8, 3.5), rot=30)
ax.set_ylabel(unit_label)
ax.set_title("Budget vs measured, per line")
plt.tight_layout()

# %% [markdown]
# ## 8. The same run in the MLflow UI
#
# From the repository root:
#
# ```bash
# uv run mlflow ui --backend-store-uri sqlite:///mlflow.db
# ```
#
# then open the run link the lab printed above: its Overview opens with the chart, the verdict and the
# table; *Model metrics* lists `at a glance` first (rewards, KL, the total's budget and peak, held-out),
# then one section per budget line (`kv_cache/budget_gib` beside `kv_cache/measured_gib`; MiB on the
# CPU stand-in); *Traces* holds every completion with its rewards and advantage.

# %%
print(f"experiment {settings.chapter}, run {run.info.run_id}, store {tracking.tracking_uri()}")
