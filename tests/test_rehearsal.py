"""The rehearsal: the model's exact shape with random weights, saved in 4-bit offline, run through
the lab's own loader and trainer with every budget line measured."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from grpolab.model import rehearsal

from suite import LAB_DIR, cpu_only, run_in_process, script_and_args

README_REHEARSE = "uv run python labs/grpo-first/train.py --rehearse"


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


@pytest.mark.slow
def test_the_checkpoint_is_built_in_its_own_process_keeping_its_quantization_config(tmp_path):
    """Built from a checkpoint's config.json that keeps one layer in 16 bit (as Unsloth's uploads keep
    some): 4-bit where it quantizes, 16-bit where its config says, built once; and the process that
    asked imported neither transformers nor bitsandbytes (nor touched CUDA): the build ran in another."""
    import subprocess
    import sys

    from grpolab.tiny_model import CONFIG_PATH

    from suite import REPO_ROOT

    config = {k: v for k, v in json.loads(CONFIG_PATH.read_text()).items() if not k.startswith("_")}
    skipped = ["lm_head", "model.layers.1.mlp.down_proj"]
    config["quantization_config"] = {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
        "llm_int8_skip_modules": skipped,
    }
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(config))
    asking = (
        "import json, sys; from pathlib import Path; from grpolab.model import rehearsal; "
        f"path, _ = rehearsal.build({str(source)!r}, Path({str(tmp_path / 'root')!r})); "
        "print(json.dumps([str(path), sorted(m for m in ('transformers', 'bitsandbytes', 'unsloth') "
        "if m in sys.modules)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", asking], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    path, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == []
    path = Path(path)
    written = json.loads((path / "config.json").read_text())["quantization_config"]
    assert written["bnb_4bit_quant_type"] == "nf4" and written["llm_int8_skip_modules"] == skipped
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as weights:
        dtype = {k: weights.get_tensor(k).dtype for k in weights.keys()}  # noqa: SIM118
    import torch

    assert dtype["model.layers.0.mlp.down_proj.weight"] == torch.uint8  # packed NF4
    assert dtype["model.layers.1.mlp.down_proj.weight"] == torch.bfloat16  # its config keeps it
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".staging")]  # the 16-bit copy is gone
    stamp = (path / "config.json").stat().st_mtime_ns
    assert rehearsal.build(str(source), tmp_path / "root")[0] == path  # built once
    assert (path / "config.json").stat().st_mtime_ns == stamp


def test_a_folder_without_room_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    staging, checkpoint = rehearsal.space_needed("unsloth/Qwen3-4B-unsloth-bnb-4bit")
    assert 7.4 < staging / (1 << 30) < 7.6 and 2.0 < checkpoint / (1 << 30) < 3.0  # Qwen3-4B: 4.02B params
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(16 << 30, 12 << 30, 4 << 30))
    root = tmp_path / "rehearsal"
    with pytest.raises(rehearsal.RehearsalError) as err:
        rehearsal.build("unsloth/Qwen3-4B-unsloth-bnb-4bit", root)
    message = str(err.value)
    assert "\n" not in message and "4.00 GiB free" in message and "--rehearsal-dir" in message
    assert not root.exists()


def test_the_rehearsal_builds_under_the_lab_outputs_unless_told_otherwise(lab_module, monkeypatch, tmp_path):
    """Where the checkpoint is built: `<output-dir>/rehearsal`, or `--rehearsal-dir` (the build itself is
    recorded here and stopped: the real one is test_rehearse_runs_the_lab_...'s)."""
    from grpolab.lab import prepare

    class Built(Exception):
        pass

    roots = []

    def build(settings, cannot, root):
        roots.append(root)
        raise Built

    monkeypatch.setattr(prepare, "rehearse", build)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for extra in ([], ["--rehearsal-dir", str(tmp_path / "big-disk")]):
        with pytest.raises(Built):
            lab_module.main(
                ["--profile", "cpu", "--rehearse", "--output-dir", str(tmp_path / "runs"), *extra]
            )
    assert roots == [tmp_path / "runs" / "rehearsal", tmp_path / "big-disk"]


@pytest.mark.slow
@cpu_only("rehearses the CPU profile; on a GPU, --rehearse rehearses Qwen3-4B")
def test_rehearse_runs_the_lab_on_the_random_checkpoint_and_measures_it(lab_module, stack, tmp_path):
    """The README's `--rehearse`, in this process, its outputs (and so the checkpoint) in the test's folder."""
    script, args = script_and_args(README_REHEARSE)
    assert script == LAB_DIR / "train.py"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_in_process(lab_module, [*args, "--output-dir", str(tmp_path / "outputs")], uri=uri)
    assert result.code == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "=== Rehearsal: tiny-qwen3 with random weights" in result.stdout
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("grpo-first").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["run_kind"] == "rehearsal"
    assert run.info.run_name.startswith("rehearse-cpu-")
    assert run.data.params["max_steps"] == str(rehearsal.REHEARSAL_STEPS)
    # The checkpoint it trained on was built under the lab's outputs.
    assert Path(run.data.params["model"]).is_relative_to(tmp_path / "outputs" / "rehearsal")
    for line in ("base_weights", "lora_params", "optimizer_states"):
        assert f"{line}/measured_mib" in run.data.metrics and f"{line}/budget_mib" in run.data.metrics, line
    assert abs(run.data.metrics["lora_params/rel_error"]) < 0.01
