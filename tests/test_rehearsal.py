"""The rehearsal: the model's exact shape with random weights, saved in 4-bit offline, run through
the lab's own loader and trainer with every budget line measured."""

from __future__ import annotations

import json

import pytest
from conftest import HAS_CUDA, only_run

from grpolab import rehearsal


def test_the_shape_comes_from_the_cached_checkpoint_else_the_shipped_config(tmp_path, monkeypatch):
    config, source = rehearsal.source_config("unsloth/Qwen3-4B-unsloth-bnb-4bit")
    assert source.endswith("budgets/models/qwen3-4b.json")
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (36, 2560, 151936)
    snapshot = tmp_path / "models--unsloth--Qwen3-4B-unsloth-bnb-4bit" / "snapshots" / "r1"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({**config, "quantization_config": {"x": 1}}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    cached, source = rehearsal.source_config("unsloth/Qwen3-4B-unsloth-bnb-4bit")
    assert source == str(snapshot / "config.json") and cached["quantization_config"] == {"x": 1}


def test_the_tokenizer_decodes_every_id_the_model_can_sample():
    tokenizer = rehearsal.rehearsal_tokenizer(1000)
    assert len(tokenizer) == 1000
    assert tokenizer.decode([999, 5, 998]) != ""
    assert (
        tokenizer("<ans>7</ans>", add_special_tokens=False)["input_ids"][0] < 110
    )  # the lab's own tokens stay


def test_the_checkpoint_is_4bit_and_built_once(tmp_path):
    path, source = rehearsal.build("tiny-qwen3", root=tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["quantization_config"]["bnb_4bit_quant_type"] == "nf4"
    assert source.endswith("tiny-qwen3.json")
    stamp = (path / "config.json").stat().st_mtime_ns
    assert rehearsal.build("tiny-qwen3", root=tmp_path)[0] == path
    assert (path / "config.json").stat().st_mtime_ns == stamp
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as weights:
        dtypes = {weights.get_tensor(k).dtype for k in weights.keys() if k.endswith("q_proj.weight")}  # noqa: SIM118
    import torch

    assert dtypes == {torch.uint8}  # packed NF4, as a downloaded bnb-4bit checkpoint holds them


@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason="rehearses the CPU profile; on a GPU, --rehearse rehearses Qwen3-4B")
def test_rehearse_runs_the_lab_on_the_random_checkpoint_and_measures_it(wave):
    """`train.py --profile cpu --rehearse`, run in the wave (tests/conftest.py)."""
    lab = wave["labs"]["rehearse"]
    assert wave["codes"]["rehearse"] == 0, lab.log()
    assert "=== Rehearsal: tiny-qwen3 with random weights" in lab.stdout
    run = only_run(wave["client"], lab)
    assert run.info.status == "FINISHED" and run.data.tags["run_kind"] == "rehearsal"
    assert run.info.run_name.startswith("rehearse-cpu-")
    assert run.data.params["max_steps"] == str(rehearsal.REHEARSAL_STEPS)
    assert "/rehearsal/" in run.data.params["model"]
    for line in ("base_weights", "lora_params", "optimizer_states"):
        assert f"{line}/measured" in run.data.metrics and f"{line}/budget" in run.data.metrics, line
    assert abs(run.data.metrics["lora_params/rel_error"]) < 0.01
