"""A lab's settings: the book's recipe, then what a chapter's lab.toml changes, per profile, then the
command line; every setting a flag, and the one-line refusals. Parametrized over every chapter that
trains in this environment."""

from __future__ import annotations

import dataclasses
import json

import pytest

from budgets.vocabulary import flag_text
from grpolab.config.flags import parser
from grpolab.config.settings import (
    FLAGS,
    LabSettingsError,
    check,
    lab_settings,
    overrides_from,
    read_lab_toml,
    recipe,
)

from suite import LAB_DIR, REPO_ROOT, TRAINER_LABS

PROFILES = ["gpu", "cpu"]


@pytest.mark.parametrize("lab", TRAINER_LABS, ids=lambda p: p.name)
@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_loads_and_passes_its_checks(lab, profile):
    s = lab_settings(lab, profile)
    check(s)
    assert s.chapter == lab.name and s.profile == profile and not s.overridden


def test_a_chapter_states_only_what_it_changes_from_the_recipe(tmp_path):
    (tmp_path / "lab.toml").write_text('chapter = "x"\nmax_steps = 7\n[profile.cpu]\nbeta = 0.5\n')
    cpu, gpu = lab_settings(tmp_path, "cpu"), lab_settings(tmp_path, "gpu")
    assert (cpu.beta, cpu.max_steps) == (0.5, 7)  # its profile table, then its shared values
    assert (gpu.beta, gpu.max_steps) == (recipe("gpu")["beta"], 7)  # the recipe where it says nothing
    assert cpu.learning_rate == recipe("cpu")["learning_rate"] != recipe("gpu")["learning_rate"]


def test_chapter_1_is_the_recipe_on_a_gpu(tmp_path):
    """Chapter 1 trains the book's recipe as it is on a GPU (its settings are those of a lab.toml that
    says nothing else); on the CPU it changes only what its stand-in can hold (its lab.toml says why)."""
    toml = read_lab_toml(LAB_DIR)
    assert set(toml) == {"chapter", "profile"} and set(toml["profile"]) == {"cpu"}
    (tmp_path / "lab.toml").write_text('chapter = "grpo-first"\n')
    assert lab_settings(LAB_DIR, "gpu").as_params() == lab_settings(tmp_path, "gpu").as_params()


@pytest.mark.parametrize("lab", TRAINER_LABS, ids=lambda p: p.name)
def test_every_chapter_holds_only_its_differences_from_the_recipe(lab):
    """A chapter's lab.toml restates nothing the recipe already says, profile by profile (a shared
    value the profile table overrides counts as the profile's)."""
    toml = read_lab_toml(lab)
    for profile in PROFILES:
        values = recipe(profile)
        changed = {
            **{k: v for k, v in toml.items() if k not in ("profile", "chapter")},
            **toml.get("profile", {}).get(profile, {}),
        }
        restated = {k for k, v in changed.items() if values.get(k) == v}
        if "num_generations" in changed:  # batch = prompts x group: restated, it pins the prompts per step
            restated.discard("per_device_train_batch_size")
        restated = sorted(restated)
        assert not restated, f"{lab.name} [{profile}] restates the recipe: {restated}"


BEFORE_THE_RECIPE = json.loads(
    (REPO_ROOT / "tests" / "data" / "chapter_settings_before_the_recipe.json").read_text()
)


# What changed since, on purpose, each with its reason where it is set (issue 25): chapter 1's CPU
# stand-in learns a sum it can hold, at a learning rate that keeps what it knows, for 80 steps (every
# seed climbs, issue 30), scored on more held-out prompts (its lab.toml); on a GPU, every chapter holds vLLM's log-probs against the trainer's,
# so the run doctor can tell whether the rollouts are the adapter's (the recipe).
# Every chapter has a task_config since chapter 7 (a task from a data file or reasoning-gym takes one):
# the book's tasks take none. Every run says whether its rollouts were sampled with the adapter it
# trains since chapter 8 (`rollout_adapter`: false reproduces vLLM serving the base).
ON_A_GPU = {"vllm_importance_sampling_correction": "true"}
NO_TASK_CONFIG = {"task_config": "{}", "rollout_adapter": "true"}
CHANGED_SINCE = {
    **{key: NO_TASK_CONFIG for key in BEFORE_THE_RECIPE},
    "grpo-first/cpu": {
        "task": "small-addition",
        "learning_rate": "0.003",
        "max_steps": "80",
        "eval_prompts": "64",
        **NO_TASK_CONFIG,
    },
    **{key: ON_A_GPU | NO_TASK_CONFIG for key in BEFORE_THE_RECIPE if key.endswith("/gpu")},
}


@pytest.mark.parametrize("key", sorted(BEFORE_THE_RECIPE))
def test_every_chapters_effective_settings_are_what_they_were_before_the_recipe(key):
    """The recipe moved every value out of the chapters' lab.toml files; what each chapter trains did not
    move: its settings, both profiles, as they resolved before (tests/data, every chapter of that day),
    but for what a chapter changed since on purpose (CHANGED_SINCE)."""
    name, profile = key.split("/")
    expected = {**BEFORE_THE_RECIPE[key], **CHANGED_SINCE.get(key, {})}
    assert lab_settings(LAB_DIR.parent / name, profile).as_params() == expected


@pytest.mark.parametrize("lab", TRAINER_LABS, ids=lambda p: p.name)
def test_every_setting_is_a_flag_that_overrides_lab_toml(lab):
    """One vocabulary: each lab.toml setting is `--the-same-name` on the lab's command line."""
    ap = parser("")
    base = lab_settings(lab, "cpu")
    for name in FLAGS:
        value = getattr(base, name)
        args = ap.parse_args([f"--{name.replace('_', '-')}", flag_text(value)])
        assert overrides_from(args) == {name: value}, name


def test_overrides_are_recorded_and_the_batch_follows_the_group():
    s = lab_settings(LAB_DIR, "cpu", {"max_steps": 7, "num_generations": 4, "learning_rate": None})
    assert s.max_steps == 7 and s.learning_rate == lab_settings(LAB_DIR, "cpu").learning_rate
    assert (s.num_generations, s.per_device_train_batch_size) == (4, 4)
    assert s.overridden == {"max_steps", "num_generations"}
    # An explicit batch wins over the rule.
    s = lab_settings(LAB_DIR, "cpu", {"num_generations": 4, "per_device_train_batch_size": 8})
    assert s.per_device_train_batch_size == 8


def test_the_plan_is_the_settings_under_the_same_names():
    from budgets.plan import PLAN_FIELDS

    s = lab_settings(LAB_DIR, "gpu")
    plan = s.plan()
    shared = [name for name in PLAN_FIELDS if name in FLAGS]
    assert len(shared) >= 15
    for name in shared:
        assert getattr(plan, name) == getattr(s, name), name
    assert plan.max_prompt_length == s.max_prompt_length <= s.max_seq_length - s.max_completion_length


@pytest.mark.parametrize("task", ["addition", "countdown", "sorting"])
def test_the_budgets_prompt_length_follows_the_task_and_bounds_its_tokens(task):
    """The sheet's prompt is the task's longest, in ChatML, one token per character at most: the tiny
    tokenizer's real count of that prompt never exceeds it, and it moves with --task."""
    from grpolab.tiny_model import build_tokenizer
    from task import get_task

    s = lab_settings(LAB_DIR, "cpu", {"task": task})
    messages = get_task(task).worst_case_prompt()
    text = build_tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    tokens = len(build_tokenizer()(text, add_special_tokens=False)["input_ids"])
    assert tokens <= s.max_prompt_length == len(text)
    assert s.plan().max_prompt_length == s.max_prompt_length


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"max_steps": 0}, "max_steps: must be positive"),
        ({"max_steps": -3}, "--max-steps"),
        ({"num_generations": 3}, "whole number of groups of num_generations 3"),
        ({"num_generations": 1, "per_device_train_batch_size": 1}, "--num-generations 2 or more"),
        ({"max_completion_length": 256}, "leaves no room for the prompt"),
        ({"task": "multiplication"}, "unknown task 'multiplication'"),
        ({"model": "/no/such/model"}, "no model at '/no/such/model'"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization: must be in (0, 1]"),
        ({"lora_rank": 32}, "max_lora_rank: 16 is below lora_rank 32"),
        ({"optim": "sgd"}, "optim: must be one of"),
        ({"dtype": "float32", "fast_inference": True}, "does not run float32: pass --dtype auto"),
        ({"unsloth_vllm_standby": True}, "fast_inference is false (no vLLM)"),
        (
            {"rollout_adapter": False, "fast_inference": True, "dtype": "auto"},
            "pass --fast-inference false, or --rollout-adapter true",
        ),
    ],
)
def test_settings_that_cannot_work_get_one_line_with_the_fix(change, words):
    s = dataclasses.replace(lab_settings(LAB_DIR, "cpu"), **change)
    with pytest.raises(LabSettingsError) as err:
        check(s)
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_profile_and_missing_lab_are_refused(tmp_path):
    with pytest.raises(LabSettingsError, match="unknown profile"):
        lab_settings(LAB_DIR, "tpu")
    with pytest.raises(LabSettingsError, match="no lab settings"):
        lab_settings(tmp_path, "cpu")


def test_a_typo_in_lab_toml_is_named(tmp_path):
    (tmp_path / "lab.toml").write_text('chapter = "x"\n[profile.cpu]\nmax_step = 60\n')
    with pytest.raises(LabSettingsError, match=r"unknown setting.*max_step"):
        lab_settings(tmp_path, "cpu")
    (tmp_path / "lab.toml").write_text('chapter = "x"\n[profile.tpu]\nmax_steps = 60\n')
    with pytest.raises(LabSettingsError, match=r"unknown profile table.*tpu"):
        lab_settings(tmp_path, "cpu")


def test_a_setting_neither_the_recipe_nor_the_chapter_sets_is_named(tmp_path, monkeypatch):
    from grpolab.config import settings

    (tmp_path / "recipe.toml").write_text(settings.RECIPE.read_text().replace("seed = 0\n", ""))
    monkeypatch.setattr(settings, "RECIPE", tmp_path / "recipe.toml")
    with pytest.raises(LabSettingsError, match=r"leave seed unset"):
        lab_settings(LAB_DIR, "cpu")


def test_a_bad_flag_value_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        parser("").parse_args(["--num-generations", "many"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def test_help_lists_every_setting():
    text = parser("").format_help()  # argparse formats help with %: a stray % would raise here
    for name in FLAGS:
        assert f"--{name.replace('_', '-')}" in text, name
