"""The GPU path, checked on a CPU against the installed libraries' real signatures.

Nothing here needs a GPU except the tests marked gpu_only; the configuration objects
the 16 GB card would run with are built for real.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from conftest import LAB_DIR, REPO_ROOT, gpu_only

from grpolab.settings import load_lab


@pytest.fixture
def gpu_settings():
    return load_lab(LAB_DIR, "gpu")


def test_the_exact_grpo_config_of_the_real_run(lab_module, gpu_settings, tmp_path, monkeypatch):
    import transformers.training_args as training_args

    # Stand-in for the absent hardware only: TrainingArguments asks whether a GPU does bf16.
    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    config = lab_module.grpo_config(gpu_settings, tmp_path, on_gpu=True, bf16=True)

    assert type(config).__name__.endswith("GRPOConfig")
    assert (
        config.num_generations,
        config.per_device_train_batch_size,
        config.gradient_accumulation_steps,
    ) == (
        8,
        8,
        1,
    )
    assert config.generation_batch_size == 8  # one group per optimizer step
    assert config.max_completion_length == 768
    assert (config.learning_rate, config.beta, config.epsilon, config.num_iterations) == (5e-6, 0.02, 0.2, 1)
    assert (config.loss_type, config.temperature, config.top_p) == ("dr_grpo", 1.0, 1.0)
    assert (config.max_steps, config.logging_steps, config.save_steps, config.seed) == (100, 1, 50, 0)
    assert config.use_vllm and config.vllm_mode == "colocate"
    assert config.vllm_gpu_memory_utilization == gpu_settings.gpu_memory_utilization
    assert config.vllm_max_model_length == 1024
    assert config.bf16 and not config.fp16 and not config.use_cpu
    assert config.optim == "adamw_8bit"
    assert config.report_to == [] or config.report_to == "none" or config.report_to == ["none"]
    assert not hasattr(config, "max_prompt_length"), "TRL 1.x bounds prompts by filtering, not by this field"


def test_a_t4_gets_fp16_instead_of_bf16(lab_module, gpu_settings, tmp_path, monkeypatch):
    import transformers.training_args as training_args

    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: False)
    monkeypatch.setattr(
        training_args, "is_torch_fp16_available_on_device", lambda device: True, raising=False
    )
    try:
        config = lab_module.grpo_config(gpu_settings, tmp_path, on_gpu=True, bf16=False)
    except ValueError as err:  # transformers checks fp16 against the device it can see
        pytest.skip(f"fp16 config cannot be built without a GPU here: {err}")
    assert config.fp16 and not config.bf16


def _gpu_loader_parameters(method: str) -> set[str]:
    """Unsloth's CUDA loader's parameters, read from its source.

    Without a GPU Unsloth swaps FastLanguageModel.from_pretrained for its CPU loader
    (unsloth_zoo.cpu), which takes **kwargs; the signature the real run meets is the
    one in unsloth/models/loader.py.
    """
    import ast
    import importlib.util

    source = importlib.util.find_spec("unsloth.models.loader").origin
    tree = ast.parse(Path(source).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FastLanguageModel")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return {a.arg for a in fn.args.args + fn.args.kwonlyargs}


def test_unsloth_gpu_loader_accepts_every_argument_the_lab_passes():
    loader = _gpu_loader_parameters("from_pretrained")
    lab_passes = {"model_name", "max_seq_length", "load_in_4bit", "dtype", "fast_inference"}
    lab_passes |= {"gpu_memory_utilization", "max_lora_rank"}
    assert lab_passes <= loader, lab_passes - loader


def test_unsloth_get_peft_model_accepts_the_lora_arguments():
    from unsloth import FastLanguageModel

    peft = inspect.signature(FastLanguageModel.get_peft_model).parameters
    for name in ("r", "lora_alpha", "target_modules", "use_gradient_checkpointing", "random_state"):
        assert name in peft


def test_cpu_config_is_built_for_real(lab_module, tmp_path):
    s = load_lab(LAB_DIR, "cpu")
    config = lab_module.grpo_config(s, tmp_path, on_gpu=False)
    assert config.use_cpu and not config.bf16 and not config.use_vllm
    assert config.generation_batch_size % config.num_generations == 0


@gpu_only("loads Qwen3-4B in 4-bit with vLLM in-process at the lab's share and reads the engine's KV blocks")
def test_real_profile_starts_vllm_at_the_lab_share(gpu_settings):
    from grpolab import policy

    model, _ = policy.load_policy(gpu_settings)
    kv = policy.vllm_kv_cache_bytes(model)
    assert kv["kv_cache_tokens"] >= gpu_settings.num_generations * gpu_settings.max_seq_length


def test_unsloth_is_imported_before_trl_and_transformers():
    """On a GPU Unsloth swaps TRL's GRPOTrainer for its own when it is imported; a trainer
    class imported before that is TRL's plain one, which would not drive Unsloth's vLLM."""
    import ast

    tree = ast.parse((LAB_DIR / "train.py").read_text())
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    order = []
    for node in train.body:
        if isinstance(node, ast.ImportFrom):
            order += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            order += [a.name for a in node.names]
    first_heavy = min(
        i for i, name in enumerate(order) if name.split(".")[0] in {"trl", "transformers", "torch"}
    )
    assert order.index("grpolab.policy") < first_heavy, order
    policy_source = (REPO_ROOT / "grpolab" / "policy.py").read_text()
    assert "from unsloth import FastLanguageModel" in policy_source.split("def ")[0]
