"""The exact lines of the budget against the real libraries, on CPU (issue 3, point 9).

PEFT counts the LoRA parameters of real shapes built on the meta device; bitsandbytes quantizes a
tiny model and one real-size layer and the bytes it holds are summed; vLLM's KV page arithmetic is
built without a GPU; unsloth_zoo's estimator is run from its installed source; torch's profiler
measures the activation peak of a small model. Imports are heavy (~30 s), so they live here.
"""

from __future__ import annotations

import ast
import json
import math
import os
from pathlib import Path

import pytest
import torch

from budgets import Plan, compute, get_card, load_shape
from budgets.arithmetic import (
    adam_state_bytes,
    base_weight_parts,
    kv_bytes_per_token,
    lora_params,
    lora_tensor_sizes,
    nf4_bytes,
)
from budgets.shapes import LINEARS
from budgets.vllm_rules import unsloth_approximate, unsloth_weight_bytes
from grpolab.config.settings import lab_settings

from suite import LAB_DIR, gpu_only

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "budgets" / "models"


def hf_config(name: str):
    from transformers import LlamaConfig, Qwen3Config

    cfg = {
        k: v for k, v in json.loads((MODELS / f"{name}.json").read_text()).items() if not k.startswith("_")
    }
    return (Qwen3Config if cfg["model_type"] == "qwen3" else LlamaConfig)(**cfg)


def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages (shared tensors such as tied embeddings count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


# --- LoRA parameters: PEFT on meta-device models -----------------------------------------------


@pytest.mark.parametrize(
    "name, rank, targets",
    [
        ("qwen3-4b", 16, LINEARS),
        ("qwen3-8b", 64, LINEARS),
        ("llama-3.1-8b", 32, ("q_proj", "v_proj")),
        ("qwen3-0.6b", 8, ("gate_proj", "up_proj", "down_proj")),
    ],
)
def test_lora_params_equal_peft(name, rank, targets):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(name))
        base = sum(p.numel() for p in model.parameters())
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets)))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shape = load_shape(name)
    assert lora_params(shape, rank, targets) == trainable
    assert shape.total_params() == base  # tied embeddings counted once


# --- NF4 weights: what bitsandbytes allocates ------------------------------------------------------


def _quant_state_tensors(weight):
    qs = weight.quant_state
    out = [weight.data, qs.absmax, qs.code, getattr(qs, "offset", None)]
    if qs.state2 is not None:
        out += [qs.state2.absmax, qs.state2.code]
    return out


def test_nf4_real_size_layer_equals_bitsandbytes():
    import bitsandbytes as bnb

    shape = load_shape("qwen3-4b")
    n_in, n_out = shape.linear_shapes()["gate_proj"]  # 2560 -> 9728, 24.9 M weights
    w = torch.randn(n_out, n_in, dtype=torch.bfloat16)
    layer = bnb.nn.Linear4bit(
        n_in, n_out, bias=False, compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4"
    )
    layer.weight = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=True, quant_type="nf4")
    layer = layer.to("cpu")  # quantizes
    assert layer.weight.dtype == torch.uint8
    assert tensor_bytes(_quant_state_tensors(layer.weight)) == nf4_bytes(n_in * n_out)


def test_nf4_tiny_model_equals_bitsandbytes(tmp_path):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Qwen3Config

    cfg = {
        k: v for k, v in json.loads((MODELS / "tiny-qwen3.json").read_text()).items() if not k.startswith("_")
    }
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Qwen3Config(**cfg)).to(torch.bfloat16).save_pretrained(tmp_path)
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path, quantization_config=quant, dtype=torch.bfloat16, device_map="cpu"
    )
    tensors = []
    for module in model.modules():
        for p in module.parameters(recurse=False):
            tensors += _quant_state_tensors(p) if getattr(p, "quant_state", None) is not None else [p]
        tensors += list(module.buffers(recurse=False))
    rotary = sum(b.untyped_storage().nbytes() for n, b in model.named_buffers() if "rotary" in n)
    expected = sum(base_weight_parts(load_shape("tiny-qwen3"), "nf4", 2).values())
    assert tensor_bytes(tensors) - rotary == expected


# --- Optimizer states: bitsandbytes' 8-bit AdamW and torch's AdamW -------------------------------


def test_optimizer_states_equal_the_libraries():
    import bitsandbytes as bnb

    sizes = [*lora_tensor_sizes(load_shape("tiny-qwen3"), 16, LINEARS), 16 * 2560, 9728 * 16]  # < and > 4096
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    opt8 = bnb.optim.AdamW8bit(params)
    tensors = []
    for p in params:
        opt8.init_state(opt8.param_groups[0], p, 0, 0)
        tensors += [v for k, v in opt8.state[p].items() if isinstance(v, torch.Tensor)]
    assert tensor_bytes(tensors) == adam_state_bytes(sizes, "adamw_8bit")

    opt = torch.optim.AdamW(params)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    states = [v for p in params for k, v in opt.state[p].items() if k in ("exp_avg", "exp_avg_sq")]
    assert tensor_bytes(states) == adam_state_bytes(sizes, "adamw_torch")

    # bf16 parameters (Unsloth's CPU path): torch's states are bf16, bitsandbytes' are not.
    half = [torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16)) for n in sizes]
    opt = torch.optim.AdamW(half)
    for p in half:
        p.grad = torch.zeros_like(p)
    opt.step()
    states = [v for p in half for k, v in opt.state[p].items() if k in ("exp_avg", "exp_avg_sq")]
    assert tensor_bytes(states) == adam_state_bytes(sizes, "adamw_torch", 2)
    opt8 = bnb.optim.AdamW8bit(half)
    tensors = []
    for p in half:
        opt8.init_state(opt8.param_groups[0], p, 0, 0)
        tensors += [v for k, v in opt8.state[p].items() if isinstance(v, torch.Tensor)]
    assert tensor_bytes(tensors) == adam_state_bytes(sizes, "adamw_8bit", 2)


# --- The reference policy with LoRA: TRL's frozen "ref" adapter -------------------------------------


def test_reference_adapter_equals_the_cpu_profile_line():
    """TRL 1.15's GRPOTrainer, given a PeftModel (Unsloth's get_peft_model) and beta != 0, adds a "ref"
    adapter with the "default" config and copies the weights into it. Done here exactly as TRL does,
    on the tiny model in bf16 with the lab's LoRA settings."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpolab.config.settings import lab_settings

    settings = lab_settings(ROOT / "labs" / "grpo-first", "cpu")
    sheet = compute(settings.plan().with_(grpo_trainer="trl"))  # the line TRL's own trainer holds
    assert settings.beta > 0
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config("tiny-qwen3")).to(torch.bfloat16)
    config = LoraConfig(
        r=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        target_modules=list(settings.target_modules),
        lora_dropout=0.0,
        bias="none",
    )
    model = get_peft_model(model, config)
    model.add_adapter("ref", model.peft_config["default"])
    for name, param in model.named_parameters():
        if ".default." in name:
            model.get_parameter(name.replace(".default.", ".ref.")).data.copy_(param.data)
    ref = [p for n, p in model.named_parameters() if ".ref." in n]
    default = [p for n, p in model.named_parameters() if ".default." in n]
    assert {p.dtype for p in ref} == {torch.float32}  # PEFT upcasts the adapter of a bf16 model
    assert not any(p.requires_grad for p in ref)
    assert sum(p.numel() for p in ref) == sum(p.numel() for p in default) == sheet.metrics["trainable_params"]
    assert tensor_bytes(ref) == sheet.line("reference_policy").bytes

    # Unsloth's CPU training casts "default" (not "ref") to bf16: its params, grads and AdamW states
    # then take the sheet's bf16 lines.
    for p in default:
        p.data = p.data.to(torch.bfloat16)
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(default)
    opt.step()
    states = [v for p in default for k, v in opt.state[p].items() if k in ("exp_avg", "exp_avg_sq")]
    assert tensor_bytes(default) == sheet.line("lora_params").bytes
    assert tensor_bytes(p.grad for p in default) == sheet.line("lora_grads").bytes
    assert tensor_bytes(states) == sheet.line("optimizer_states").bytes
    assert tensor_bytes(ref) == sheet.line("reference_policy").bytes


# --- KV cache: vLLM's own page arithmetic --------------------------------------------------------


@pytest.mark.parametrize(
    "name, tp", [("qwen3-4b", 1), ("llama-3.1-8b", 1), ("qwen3-32b", 2), ("tiny-qwen3", 1)]
)
def test_kv_bytes_per_token_equal_vllm(name, tp):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    s = load_shape(name)
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=s.kv_heads // tp, head_size=s.head_dim, dtype=torch.bfloat16
    )
    # vLLM allocates one page of block_size tokens per layer.
    assert spec.page_size_bytes * s.layers == 16 * kv_bytes_per_token(s, 2, tp)


# --- unsloth_zoo's estimator, run from its installed source --------------------------------------


def _unsloth_functions(free: int, total: int):
    """approximate_vllm_memory_usage and its helpers, executed from unsloth_zoo's file without importing
    unsloth (23 s and a GPU check): only get_mem_info is replaced, by the card's (free, total)."""
    import importlib.util

    path = Path(importlib.util.find_spec("unsloth_zoo").origin).parent / "vllm_utils.py"
    tree = ast.parse(path.read_text())
    wanted = {
        "_config_get",
        "_kv_cache_elements_per_token",
        "_kv_cache_tokens",
        "approximate_vllm_memory_usage",
        "vllm_weights_memory_usage",
    }
    module = ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted], [])
    namespace = {"os": os, "torch": torch, "get_mem_info": lambda: (free, total)}
    exec(compile(module, str(path), "exec"), namespace)
    return namespace


@pytest.mark.parametrize(
    "name, util, nf4",
    [
        ("qwen3-4b", 0.45, True),
        ("qwen3-8b", 0.6, True),
        ("llama-3.1-8b", 0.9, False),
        ("qwen3-1.7b", 0.3, True),
    ],
)
def test_unsloth_estimator_port_equals_unsloth_zoo(name, util, nf4):
    from budgets import get_card

    total = get_card("rtx-5080").memory_bytes
    free = total - (512 << 20)
    fns = _unsloth_functions(free, total)
    config = hf_config(name)
    weights = fns["vllm_weights_memory_usage"](config, load_in_4bit=nf4)
    assert weights == unsloth_weight_bytes(load_shape(name), nf4)
    theirs = fns["approximate_vllm_memory_usage"](
        config,
        load_in_4bit=nf4,
        max_seq_length=1024,
        gpu_memory_utilization=util,
        max_lora_rank=16,
        weight_bytes=weights,
    )
    ours = unsloth_approximate(
        load_shape(name), free=free, total=total, util=util, max_seq_length=1024, nf4=nf4, max_lora_rank=16
    )
    assert ours[:2] == theirs[:2]
    assert ours[2] == pytest.approx(theirs[2]) and ours[3] == pytest.approx(theirs[3])


def test_sheet_kv_line_against_unsloths_estimate():
    """Not equal by design: Unsloth counts NF4 at 5 bits, keeps 5 % back and uses its own activation
    allowance. The sheet's KV line should land within 25 % of it for the first lab's plan."""
    from grpolab.config.settings import lab_settings

    sheet = compute(lab_settings(ROOT / "labs" / "grpo-first", "gpu").plan())
    info = sheet.metrics["vllm"]
    ratio = info["kv_cache_bytes"] / info["unsloth_kv_estimate_bytes"]
    ours, theirs = info["kv_cache_bytes"] / 2**30, info["unsloth_kv_estimate_bytes"] / 2**30
    print(f"\nsheet KV {ours:.2f} GiB vs unsloth_zoo {theirs:.2f} GiB: ratio {ratio:.3f}")
    assert 0.8 < ratio < 1.25


# --- Activations: the estimate against torch's profiler on CPU -----------------------------------


def _profiled_peak(fn) -> int:
    """Peak of live CPU allocations during fn: each op's own allocations (+) and frees (-) in order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("checkpointing", ["false", "true"])
def test_activation_line_against_the_profiler(checkpointing, tmp_path):
    """The sheet's train_activations (estimate) against the measured peak of forward + backward through
    the decoder of a small bf16 Qwen3 with PEFT LoRA on all seven linears (logits left out: their own
    line). The factor 2.5 is generous on purpose: PEFT upcasts each LoRA input to fp32 (Unsloth's fused
    LoRA kernels do not), CPU's math attention keeps T^2 scores and the profiler orders allocations by op
    start. The gap is printed."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = dict(
        model_type="qwen3",
        vocab_size=512,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    batch, prompt, completion = 4, 128, 128
    plan = Plan(
        model=str(tmp_path),
        gpu="cpu",
        fast_inference=False,
        use_gradient_checkpointing=checkpointing,
        per_device_train_batch_size=batch,
        num_generations=4,
        max_prompt_length=prompt,
        max_completion_length=completion,
        lora_rank=16,
        optim="adamw_torch",
        load_in_4bit=False,
    )
    predicted = compute(plan).line("train_activations").bytes

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**cfg), attn_implementation="sdpa").to(
        torch.bfloat16
    )
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=list(LINEARS)))
    if checkpointing == "true":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    decoder = model.base_model.model.model
    ids = torch.randint(0, cfg["vocab_size"], (batch, prompt + completion))

    def step():
        decoder(input_ids=ids).last_hidden_state.float().sum().backward()

    step()  # warm up: lazy inits and the LoRA grads exist before measuring
    for p in model.parameters():
        p.grad = None
    measured = _profiled_peak(step)
    ratio = measured / predicted
    print(
        f"\ntrain_activations ({checkpointing}): predicted {predicted / 2**20:.1f} MiB, "
        f"measured {measured / 2**20:.1f} MiB, measured/predicted {ratio:.2f}"
    )
    assert 1 / 2.5 < ratio < 2.5


# --- On a GPU only ------------------------------------------------------------------------------


@gpu_only("checks the cuda_context line against NVML's used memory after CUDA init")
def test_cuda_context_line_on_gpu():
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    before = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
    used = pynvml.nvmlDeviceGetMemoryInfo(handle).used - before - torch.cuda.memory_reserved()
    line = compute(Plan(gpu="h200")).line("cuda_context").bytes
    print(f"\ncuda_context: measured {used / 2**20:.0f} MiB vs line {line / 2**20:.0f} MiB")
    assert 0.25 < used / line < 2.5


def test_the_sheets_standby_follows_unsloth_zoos_source():
    """What standby does, read from the installed unsloth_zoo: the util it imposes (its tier table for
    vLLM >= 0.11, x 0.95), and what sleep frees: every vLLM allocation but the weights (Unsloth's, shared
    with the trainer), the KV cache discarded rather than copied out at sleep level 1. The sheet holds the
    KV cache in the start and generate phases only, the weights in every phase."""
    import importlib.util
    import re

    from budgets import compute
    from budgets.vllm_rules import unsloth_standby_util
    from grpolab.config.settings import lab_settings

    def function(module: str, name: str) -> str:
        """A function's source from the installed file, without importing it (no GPU here)."""
        path = Path(importlib.util.find_spec(module.split(".")[0]).origin).parent.joinpath(
            *module.split(".")[1:]
        )
        text = path.with_suffix(".py").read_text()
        (node,) = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name]
        return ast.get_source_segment(text, node)

    load = function("unsloth_zoo.vllm_utils", "load_vllm")
    # The branch for vLLM >= 0.11: the `else:` whose body opens with this comment.
    newer = load[load.index("# Standby mode sleep/wake cycle") :]
    tiers = [
        (float(a), float(b))
        for a, b in re.findall(r"ten_percent >= ([\d.]+): standby_target_gpu_util = ([\d.]+)", newer)
    ]
    lowest = float(re.search(r"else: standby_target_gpu_util = ([\d.]+)", newer).group(1))
    assert "standby_target_gpu_util *= 0.95" in newer
    for gib in (8, 14.74, 16, 24, 32, 80, 141):
        ten_percent = gib * 0.1
        tier = next((b for a, b in tiers if ten_percent >= a), lowest)
        assert unsloth_standby_util(int(gib * (1 << 30))) == pytest.approx(tier * 0.95), gib

    sleep = function("unsloth_zoo.vllm_utils", "patch_vllm_enable_sleep_mode")
    assert re.search(r"if data\.tag == 'weights':\s+# Weights are unsloth-managed[^\n]*\n\s+continue", sleep)
    assert "offload_tags = (MemAllocator.default_tag, )" in sleep  # level 1 backs up nothing but weights
    rl = (Path(importlib.util.find_spec("unsloth").origin).parent / "models" / "rl.py").read_text()
    assert "llm.sleep(1)" in rl

    sheet = compute(lab_settings("labs/grpo-first", "gpu").plan().with_(unsloth_vllm_standby=True))
    assert tuple(sheet.line("kv_cache").phases) == ("start", "generate")
    assert tuple(sheet.line("base_weights").phases) == ("start", "generate", "train")


def test_the_sheets_share_equals_unsloth_zoos_own_arithmetic():
    """The share the sheet budgets equals what unsloth_zoo's approximate_vllm_memory_usage hands vLLM,
    run from its installed source with the card's free memory."""
    total = get_card("rtx-5080").memory_bytes
    for other in (0.0, 1.5):
        sheet = compute(lab_settings(LAB_DIR, "gpu", {"other_processes_gib": other}).plan())
        info = sheet.metrics["vllm"]
        fns = _unsloth_functions(info["free_at_start_bytes"], total)
        handed = fns["approximate_vllm_memory_usage"](
            hf_config("qwen3-4b"),
            load_in_4bit=True,
            max_seq_length=1024,
            gpu_memory_utilization=lab_settings(LAB_DIR, "gpu").gpu_memory_utilization,
        )[2]
        assert info["requested_bytes"] == math.ceil(total * handed)
