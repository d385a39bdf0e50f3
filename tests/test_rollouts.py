"""grpolab.model.rollouts: the CPU's reproduction of rollouts from the base while the adapter trains.

A real PEFT model (the tiny Qwen3 with a LoRA adapter moved off zero, so it changes the logits); the
trainer is a stand-in holding the two methods `serve_the_base` rewires, with TRL's names and
signatures: TRL's trainer itself runs on chapter 8's unsynced arm (labs/grpo-stuck), whose run
logs the gap this module measures.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest

from grpolab.model.rollouts import LOGP_MAX, LOGP_MEAN, completion_logps, logp_gap, serve_the_base


@pytest.fixture(scope="module")
def moved():
    """The tiny model with a LoRA adapter whose B matrices are no longer zero: adapter != base."""
    import torch
    from peft import LoraConfig, get_peft_model

    from grpolab.tiny_model import build_model

    torch.manual_seed(0)
    model = get_peft_model(build_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model.train()  # as the trainer holds it


def _batch(model, prompt_len: int = 6, completion_len: int = 5, pad: int = 2):
    """A scored batch's tensors, two rows: the second's completion right-padded by `pad` tokens."""
    import torch

    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    completion_mask = torch.ones(2, completion_len, dtype=torch.long)
    completion_mask[1, completion_len - pad :] = 0
    return {
        "prompt_ids": torch.randint(0, vocab, (2, prompt_len), generator=g),
        "prompt_mask": torch.ones(2, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(0, vocab, (2, completion_len), generator=g),
        "completion_mask": completion_mask,
    }


def _lora_layer(model):
    return next(m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "disable_adapters"))


def _trainer(model, log: list):
    """The stand-in: `_generate_single_turn` records whether the adapter was on while it sampled."""

    layer = _lora_layer(model)

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        log.append(not layer.disable_adapters)  # peft's flag, True inside disable_adapter()
        return [[1, 2]] * len(prompt_ids), None

    return SimpleNamespace(
        model=model,
        temperature=1.0,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _generate_single_turn=generate,
        _generate_and_score_completions=lambda inputs: _batch(model),
    )


def test_the_rollouts_are_sampled_with_the_adapter_disabled_and_only_while_sampling(moved):
    log: list[bool] = []
    trainer = _trainer(moved, log)
    trainer._generate_single_turn([[5, 6]], None, {}, 2)
    assert log == [True]  # before: the adapter samples
    serve_the_base(trainer)
    trainer._generate_single_turn([[5, 6]], None, {}, 2)
    assert log == [True, False]
    assert not _lora_layer(moved).disable_adapters  # on again for the trainer's own passes


def test_each_scored_batch_logs_the_samplers_gap_to_the_trainer_under_trls_names(moved):
    import torch

    trainer = _trainer(moved, [])
    serve_the_base(trainer)
    output = trainer._generate_and_score_completions([{}])
    gap_mean, gap_max = trainer._metrics["train"][LOGP_MEAN], trainer._metrics["train"][LOGP_MAX]
    assert len(gap_mean) == len(gap_max) == 1 and 0 < gap_mean[0] <= gap_max[0]
    # The same numbers by hand: the adapter's log-probs against the base's, on unmasked tokens only.
    with torch.no_grad():
        trained = completion_logps(moved, output, 1.0)
        with moved.disable_adapter():
            base = completion_logps(moved, output, 1.0)
    delta = (trained - base).abs()[output["completion_mask"].bool()]
    assert gap_mean[0] == pytest.approx(float(delta.mean()))
    assert gap_max[0] == pytest.approx(float(delta.max()))
    assert delta.numel() == 8  # 5 + 3 tokens: the padded two left out


def test_an_adapter_the_base_has_not_left_shows_no_gap():
    """At the first step the adapter is zero (LoRA's B starts at zero): sampler and trainer agree."""
    from peft import LoraConfig, get_peft_model

    from grpolab.tiny_model import build_model

    model = get_peft_model(build_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    mean, largest = logp_gap(SimpleNamespace(model=model, temperature=0.7), _batch(model))
    assert mean == largest == 0.0


def test_the_log_probs_are_those_of_the_tokens_at_the_sampling_temperature(moved):
    import torch

    batch = _batch(moved)
    with torch.no_grad():
        logits = moved(
            input_ids=torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
        ).logits
        got = completion_logps(moved, batch, 0.5)
    # completion token j is predicted at position prompt_len - 1 + j
    j, token = 2, batch["completion_ids"][0, 2]
    want = torch.log_softmax(logits[0, 6 - 1 + j] / 0.5, -1)[token]
    assert float(got[0, j]) == pytest.approx(float(want), abs=1e-5)


def test_a_model_with_no_adapter_is_refused_with_what_to_do():
    from grpolab.tiny_model import build_model

    trainer = SimpleNamespace(model=build_model(), _generate_single_turn=None)
    with pytest.raises(TypeError, match="no adapter to disable: train a LoRA adapter"):
        serve_the_base(trainer)


def test_the_gap_is_logged_under_the_name_the_doctor_reads():
    from grpolab.judging.doctor import LOGP_METRIC

    assert LOGP_MEAN == LOGP_METRIC
