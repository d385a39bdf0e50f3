"""A lab's settings: lab.toml read per profile, shared values and overrides, every setting a flag,
and the one-line refusals. Parametrized over every chapter that trains in this environment."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import LAB_DIR, TRAINER_LABS

from grpolab.session import parser
from grpolab.settings import FLAGS, LabSettingsError, check, flag_text, lab_settings, overrides_from

PROFILES = ["gpu", "cpu"]


@pytest.mark.parametrize("lab", TRAINER_LABS, ids=lambda p: p.name)
@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_loads_and_passes_its_checks(lab, profile):
    s = lab_settings(lab, profile)
    check(s)
    assert s.chapter == lab.name and s.profile == profile and not s.overridden


def test_profile_tables_override_the_shared_values(tmp_path):
    text = (LAB_DIR / "lab.toml").read_text()
    (tmp_path / "lab.toml").write_text(text.replace("[profile.cpu]\n", "[profile.cpu]\nbeta = 0.5\n"))
    assert lab_settings(tmp_path, "cpu").beta == 0.5
    assert lab_settings(tmp_path, "gpu").beta == lab_settings(LAB_DIR, "gpu").beta  # the shared value


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
    text = (LAB_DIR / "lab.toml").read_text().replace("max_steps = 60", "max_step = 60")
    (tmp_path / "lab.toml").write_text(text)
    with pytest.raises(LabSettingsError, match=r"unknown setting.*max_step"):
        lab_settings(tmp_path, "cpu")


def test_a_missing_setting_is_named(tmp_path):
    text = (LAB_DIR / "lab.toml").read_text().replace("seed = 0\n", "")
    (tmp_path / "lab.toml").write_text(text)
    with pytest.raises(LabSettingsError, match=r"lacks seed"):
        lab_settings(tmp_path, "cpu")


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
