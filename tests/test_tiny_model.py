"""The CPU profile's tiny Qwen3 and its character-level tokenizer, built offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpolab.tiny_model import CONFIG_PATH, build_model, build_tokenizer, ensure_tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_answer_tags_are_single_tokens_that_survive_decoding(tokenizer):
    ids = tokenizer("<ans>42</ans>", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["<ans>", "4", "2", "</ans>"]
    # TRL decodes completions with skip_special_tokens=True: the tags must not be special.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<ans>42</ans>"


def test_every_character_of_an_addition_prompt_round_trips(tokenizer):
    from task import get_task

    row = get_task("addition").build_dataset(4, 0)[0]
    text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert text.endswith("<|im_start|>assistant\n")


def test_vocabulary_matches_the_model_shape(tokenizer):
    config = json.loads(CONFIG_PATH.read_text())
    assert len(tokenizer) == config["vocab_size"], (
        "ids the tokenizer cannot decode would waste probability mass"
    )
    assert tokenizer.eos_token_id == config["eos_token_id"]
    assert tokenizer.pad_token_id == config["pad_token_id"]


def test_model_is_deterministic_and_qwen3(tmp_path):
    a, b = build_model(seed=0), build_model(seed=0)
    assert a.config.model_type == "qwen3"
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name


def test_cache_is_built_once_and_reloads_offline(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = ensure_tiny_model(tmp_path / "tiny")
    stamp = (path / "config.json").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path / "tiny") == path
    assert (path / "config.json").stat().st_mtime_ns == stamp
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    out = model(**tok("What is 1 + 2?", return_tensors="pt"))
    assert out.logits.shape[-1] == model.config.vocab_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"], "no staging folder left behind"


def test_an_interrupted_save_leaves_no_folder(tmp_path):
    from grpolab.atomic import save_pretrained_atomically

    class Breaks:
        def save_pretrained(self, path):
            (Path(path) / "half-written.bin").write_bytes(b"\0" * 10)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_pretrained_atomically(Breaks(), build_tokenizer(), tmp_path / "adapter")
    assert list(tmp_path.iterdir()) == []
