"""The lab's settings: lab.toml read per profile, overrides, and the one-line refusals."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import LAB_DIR

from grpolab.settings import LabSettingsError, check, load_lab


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_both_profiles_load_and_pass_their_own_checks(profile):
    s = load_lab(LAB_DIR, profile)
    check(s)
    assert s.chapter == "grpo-first" and s.task == "addition" and s.profile == profile
    assert s.generation_batch_size % s.num_generations == 0


def test_gpu_profile_is_the_issue_recipe():
    s = load_lab(LAB_DIR, "gpu")
    assert (s.model, s.load_in_4bit, s.fast_inference) == ("unsloth/Qwen3-4B-unsloth-bnb-4bit", True, True)
    assert (s.max_seq_length, s.max_lora_rank, s.lora_rank, s.lora_alpha) == (1024, 16, 16, 16)
    assert set(s.target_modules) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert s.gradient_checkpointing == "unsloth"
    assert (s.num_generations, s.per_device_train_batch_size, s.gradient_accumulation_steps) == (8, 8, 1)
    assert (s.max_completion_length, s.learning_rate, s.beta, s.epsilon) == (768, 5e-6, 0.02, 0.2)
    assert (s.num_iterations, s.loss_type, s.temperature, s.top_p) == (1, "dr_grpo", 1.0, 1.0)
    assert (s.max_steps, s.logging_steps, s.save_steps, s.seed, s.num_prompts) == (100, 1, 50, 0, 512)
    assert 0 < s.gpu_memory_utilization < 1
    assert s.max_prompt_length == 1024 - 768


def test_overrides_replace_values_and_a_new_model_brings_its_shape():
    s = load_lab(LAB_DIR, "cpu", max_steps=7, learning_rate=None, model="/some/model")
    assert s.max_steps == 7
    assert s.learning_rate == load_lab(LAB_DIR, "cpu").learning_rate
    assert s.model_shape == "/some/model"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"max_steps": 0}, "max_steps must be positive"),
        ({"max_steps": -3}, "max_steps must be positive"),
        ({"num_generations": 3}, "not divisible by num_generations 3"),
        ({"num_generations": 1, "per_device_train_batch_size": 1}, "2 or more"),
        ({"max_completion_length": 256}, "leaves no room for the prompt"),
        ({"task": "multiplication"}, "unknown task 'multiplication'"),
        ({"model": "/no/such/model"}, "no model at '/no/such/model'"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in (0, 1]"),
        ({"lora_rank": 32}, "exceeds max_lora_rank"),
    ],
)
def test_settings_that_cannot_work_get_one_line_with_the_fix(change, words):
    s = dataclasses.replace(load_lab(LAB_DIR, "cpu"), **change)
    with pytest.raises(LabSettingsError) as err:
        check(s)
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_profile_and_missing_lab_are_refused(tmp_path):
    with pytest.raises(LabSettingsError, match="unknown profile"):
        load_lab(LAB_DIR, "tpu")
    with pytest.raises(LabSettingsError, match="no lab settings"):
        load_lab(tmp_path, "cpu")


def test_a_typo_in_lab_toml_is_named(tmp_path):
    text = (LAB_DIR / "lab.toml").read_text().replace("max_steps = 60", "max_step = 60")
    (tmp_path / "lab.toml").write_text(text)
    with pytest.raises(LabSettingsError, match=r"unknown setting.*max_step"):
        load_lab(tmp_path, "cpu")
