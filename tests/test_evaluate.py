"""Held-out evaluation: the task's own rewards on greedy completions, the base against the adapter."""

from __future__ import annotations

import pytest
import torch

from grpolab.config.settings import lab_settings
from grpolab.judging.evaluate import _generate_hf, eval_rows, load_adapter, score

from suite import LAB_DIR


@pytest.fixture(scope="module")
def settings():
    return lab_settings(LAB_DIR, "cpu", {"eval_prompts": 6})


def test_scores_are_the_tasks_rewards_on_one_completion_per_prompt(settings):
    rows = eval_rows(settings)
    targets = rows["target"]
    completions = [
        f"<ans>{targets[0]}</ans>",
        f"<ans>{targets[1] + 1}</ans>",
        "no tag",
        "<ans></ans>",
        "",
        "x",
    ]
    result = score(settings, rows, completions, [5, 5, 2, 2, 1, 1], "adapter")
    assert (result.prompts, result.accuracy, result.format_rate, result.mean_length) == (
        6,
        1 / 6,
        2 / 6,
        16 / 6,
    )
    assert result.metrics()["eval/accuracy"] == result.accuracy
    assert "accuracy 16.7%" in result.line()


def test_the_held_out_prompts_are_not_training_prompts(settings):
    from task import get_task

    held_out = {str(p) for p in eval_rows(settings)["prompt"]}
    train = {
        str(p) for p in get_task(settings.task).build_dataset(settings.num_prompts, settings.seed)["prompt"]
    }
    assert held_out and not held_out & train


@pytest.fixture(scope="module")
def peft_model():
    from peft import LoraConfig, get_peft_model

    from grpolab.tiny_model import build_model, build_tokenizer

    model = get_peft_model(build_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    return model, build_tokenizer()


def test_base_and_adapter_generations_differ_only_through_the_adapter(settings, peft_model):
    model, tok = peft_model
    prompts = [
        tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in eval_rows(settings)["prompt"]
    ]
    base, base_lengths = _generate_hf(model, tok, prompts, settings, adapter=False)
    same, _ = _generate_hf(model, tok, prompts, settings, adapter=True)  # B = 0: the adapter adds nothing
    assert same == base and len(base) == 6
    assert all(0 < n <= settings.max_completion_length for n in base_lengths)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p))
    moved, _ = _generate_hf(model, tok, prompts, settings, adapter=True)
    assert moved != base
    assert _generate_hf(model, tok, prompts, settings, adapter=False)[0] == base  # greedy, base untouched


def test_a_saved_adapter_loads_back_and_a_wrong_folder_is_refused(peft_model, tmp_path):
    model, _ = peft_model
    model.save_pretrained(tmp_path / "adapter")
    saved = {n: p.clone() for n, p in model.named_parameters() if "lora_" in n}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.zero_()
    load_adapter(model, tmp_path / "adapter")
    for name, p in model.named_parameters():
        if "lora_" in name:
            assert torch.equal(p, saved[name]), name
    with pytest.raises(FileNotFoundError, match="no adapter at"):
        load_adapter(model, tmp_path)
