"""The GPU path, checked on a CPU against the installed libraries' real signatures.

Nothing here needs a GPU except the tests marked gpu_only; the configuration objects the 16 GB card
would run with are built for real, for every chapter that trains in this environment.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from grpolab.config.settings import lab_settings

from suite import LAB_DIR, REPO_ROOT, TRAINER_LABS, gpu_only, load_lab_module

# GRPOConfig fields the lab sets from a setting of the same name.
SAME_NAME = (
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_completion_length",
    "temperature",
    "top_p",
    "loss_type",
    "scale_rewards",
    "epsilon",
    "beta",
    "num_iterations",
    "optim",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "max_grad_norm",
    "max_steps",
    "seed",
    "logging_steps",
    "save_steps",
    "vllm_importance_sampling_correction",
)


def without_unsloths_cpu_rewrite(monkeypatch) -> None:
    """Once Unsloth is imported in a process without a GPU, its CPU backend rewrites every training config
    for the CPU (8-bit optimizers become fused AdamW, fp16 becomes bf16, use_cpu is forced): a GPU run's
    config is built without that rewrite, as a GPU machine builds it."""
    from trl import GRPOConfig

    for cls in GRPOConfig.__mro__:
        post_init = cls.__dict__.get("__post_init__")
        if getattr(post_init, "_unsloth_cpu", False):
            monkeypatch.setattr(cls, "__post_init__", post_init.__wrapped__)


@pytest.mark.parametrize("lab", TRAINER_LABS, ids=lambda p: p.name)
def test_the_grpo_config_of_the_real_run_carries_every_setting(lab, tmp_path, monkeypatch):
    import transformers.training_args as training_args

    # Stand-in for the absent hardware only: TrainingArguments asks whether a GPU does bf16.
    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    without_unsloths_cpu_rewrite(monkeypatch)
    s = lab_settings(lab, "gpu")
    config = load_lab_module(lab).grpo_config(s, tmp_path, {"bf16": True, "fp16": False, "use_cpu": False})
    for name in SAME_NAME:
        value = getattr(config, name)
        value = value.value if hasattr(value, "value") else value  # enums (optim, schedulers)
        assert value == getattr(s, name), name
    assert config.use_vllm and config.vllm_mode == "colocate"
    assert config.vllm_gpu_memory_utilization == s.gpu_memory_utilization
    assert config.vllm_max_model_length == s.max_seq_length
    assert config.generation_batch_size == s.generation_batch_size
    assert config.bf16 and not config.fp16 and not config.use_cpu
    assert not hasattr(config, "max_prompt_length"), "TRL 1.x bounds prompts by filtering, not by this field"


def test_a_t4_gets_fp16_instead_of_bf16(lab_module, tmp_path, monkeypatch):
    import transformers.training_args as training_args

    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: False)
    monkeypatch.setattr(
        training_args, "is_torch_fp16_available_on_device", lambda device: True, raising=False
    )
    without_unsloths_cpu_rewrite(monkeypatch)
    try:
        config = lab_module.grpo_config(
            lab_settings(LAB_DIR, "gpu"), tmp_path, {"bf16": False, "fp16": True, "use_cpu": False}
        )
    except ValueError as err:  # transformers checks fp16 against the device it can see
        pytest.skip(f"fp16 config cannot be built without a GPU here: {err}")
    assert config.fp16 and not config.bf16


def _gpu_loader_parameters(method: str) -> set[str]:
    """Unsloth's CUDA loader's parameters, read from its source.

    Without a GPU Unsloth swaps FastLanguageModel.from_pretrained for its CPU loader
    (unsloth_zoo.cpu), which takes **kwargs; the signature the real run meets is the
    one in unsloth/models/loader.py.
    """
    import importlib.util

    def parameters(module: str, cls_name: str) -> tuple[set[str], bool]:
        source = importlib.util.find_spec(module).origin
        tree = ast.parse(Path(source).read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
        fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
        return {a.arg for a in fn.args.args + fn.args.kwonlyargs}, fn.args.kwarg is not None

    names, more = parameters("unsloth.models.loader", "FastLanguageModel")
    if more and method == "from_pretrained":
        # The rest goes on, as **kwargs, to the model's own loader: Qwen3's passes it on to Llama's.
        qwen3, passes_on = parameters("unsloth.models.qwen3", "FastQwen3Model")
        assert passes_on
        names |= qwen3 | parameters("unsloth.models.llama", "FastLlamaModel")[0]
    return names


def _keywords_of(call_name: str, source: Path) -> set[str]:
    """The keywords a call passes, those of a `**{"name": ...}` (or a conditional one) included."""
    tree = ast.parse(source.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == call_name:
            for kw in node.keywords:
                if kw.arg is not None:
                    found.add(kw.arg)
                    continue
                for inner in ast.walk(kw.value):
                    if isinstance(inner, ast.Dict):
                        found |= {k.value for k in inner.keys if isinstance(k, ast.Constant)}
    return found


def test_unsloth_gpu_loader_accepts_every_argument_the_lab_passes():
    lab_passes = _keywords_of("from_pretrained", REPO_ROOT / "grpolab" / "model" / "policy.py")
    assert {"model_name", "fast_inference", "gpu_memory_utilization", "max_lora_rank"} <= lab_passes
    assert "unsloth_vllm_standby" in lab_passes
    assert lab_passes <= _gpu_loader_parameters("from_pretrained"), lab_passes - _gpu_loader_parameters(
        "from_pretrained"
    )


def test_unsloth_get_peft_model_accepts_the_lora_arguments():
    from unsloth import FastLanguageModel

    lab_passes = _keywords_of("get_peft_model", REPO_ROOT / "grpolab" / "model" / "policy.py")
    assert {"r", "lora_alpha", "target_modules", "use_gradient_checkpointing"} <= lab_passes
    assert lab_passes <= set(inspect.signature(FastLanguageModel.get_peft_model).parameters)


@pytest.mark.parametrize("lab", TRAINER_LABS, ids=lambda p: p.name)
def test_cpu_config_is_built_for_real(lab, tmp_path):
    s = lab_settings(lab, "cpu")
    config = load_lab_module(lab).grpo_config(s, tmp_path, {"bf16": False, "fp16": False, "use_cpu": True})
    assert config.use_cpu and not config.bf16 and not config.use_vllm
    assert config.generation_batch_size == s.generation_batch_size


@pytest.mark.slow
@gpu_only("loads Qwen3-4B in 4-bit with vLLM in-process at the lab's share and reads the engine's KV blocks")
def test_real_profile_starts_vllm_at_the_lab_share():
    from grpolab.memory.tensors import vllm_kv_cache
    from grpolab.model import policy

    s = lab_settings(LAB_DIR, "gpu")
    model, _ = policy.load_policy(s)
    kv = vllm_kv_cache(model)
    assert kv["kv_cache_tokens"] >= s.num_generations * s.max_seq_length


@pytest.mark.parametrize("lab", TRAINER_LABS, ids=lambda p: p.name)
def test_unsloth_is_imported_before_trl(lab):
    """On a GPU Unsloth swaps TRL's GRPOTrainer for its own when it is imported; a trainer class
    imported before that is TRL's plain one, which would not drive Unsloth's vLLM. The chapter
    loads the policy (which imports Unsloth) before it imports TRL's trainer."""
    tree = ast.parse((lab / "train.py").read_text())
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    order = []
    for node in ast.walk(train):
        if isinstance(node, ast.ImportFrom):
            order.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load_policy":
            order.append((node.lineno, "load_policy"))
    order.sort()
    names = [name for _, name in order]
    delegates = [
        node
        for node in ast.walk(train)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "train"
    ]
    if not ("load_policy" not in names and delegates):  # else another chapter's lesson runs (chapter 2's)
        assert "load_policy" in names and names.index("load_policy") < names.index("trl"), names
    top = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)} | {
        a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names
    }
    assert not top & {"trl", "transformers", "torch"}, top
    policy_source = (REPO_ROOT / "grpolab" / "model" / "policy.py").read_text()
    assert "from unsloth import FastLanguageModel" in policy_source.split("def ")[0]


def test_allocation_stacks_are_recorded_only_when_asked():
    """Recording every CUDA allocation's stack slows the steps perf/* times: by default the run records
    none (an out-of-memory snapshot still shows every segment), with the flag or a memory cap it does."""
    from grpolab.lab.session import parser, records_memory_history

    assert not records_memory_history(parser("").parse_args([]))
    assert records_memory_history(parser("").parse_args(["--record-memory-history"]))
    assert records_memory_history(parser("").parse_args(["--memory-cap-gib", "0.5"]))


@pytest.mark.slow
@gpu_only(
    "loads Qwen3-4B with standby in a fresh process (UNSLOTH_VLLM_STANDBY=1 set before Unsloth): the allocator "
    "without expandable segments, the engine in sleep mode, and vLLM's ledger read from its worker"
)
def test_standby_loads_vllm_in_sleep_mode_and_its_ledger_reads():
    import json
    import subprocess
    import sys

    script = (
        "import json, os; from grpolab.model import cuda_env; env = cuda_env.configure(True); "
        "from grpolab.model import policy; from grpolab.memory import vllm_ledger; "
        "from grpolab.config.settings import lab_settings; "
        "from grpolab.memory.tensors import vllm_engine; "
        "s = lab_settings('labs/grpo-first', 'gpu').replace(unsloth_vllm_standby=True); "
        "model, _ = policy.load_policy(s); engine = vllm_engine(model); "
        "print(json.dumps({'alloc': os.environ.get('PYTORCH_ALLOC_CONF', ''), "
        "'sleep': engine.llm_engine.vllm_config.model_config.enable_sleep_mode, "
        "'ledger': vllm_ledger.from_engine(engine).metrics()}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "expandable_segments:True" not in found["alloc"] and found["sleep"] is True
    assert found["ledger"]["vllm/kv_cache_tokens"] >= 8 * 1024 and found["ledger"]["vllm/weights_gib"] > 2
