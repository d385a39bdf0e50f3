"""The budget sheet: inputs, CLI, headroom and multi-card answers (pure arithmetic, fast).

The checks against the real libraries (PEFT, bitsandbytes, vLLM, unsloth_zoo, torch's profiler) are in
tests/test_budgets_libraries.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from budgets import (
    BudgetError,
    Plan,
    compute,
    custom_card,
    get_card,
    largest,
    load_shape,
    suggest_vllm_util,
)
from budgets.cli import main
from budgets.plan import PLAN_FIELDS
from budgets.units import GIB
from budgets.vllm_rules import unsloth_standby_util
from budgets.vocabulary import flag, flag_text
from grpolab.config.settings import add_flags, lab_settings, overrides_from

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "labs" / "grpo-first"

STABLE = {
    "cuda_context",
    "base_weights",
    "lora_params",
    "lora_grads",
    "optimizer_states",
    "vllm_profile_activations",
    "kv_cache",
    "cuda_graphs",
    "train_activations",
    "logits",
    "reference_policy",
    "generate_kv_cache",
    "vllm_lora_slots",
}


def lab_plan(profile: str = "gpu", **overrides) -> Plan:
    return lab_settings(LAB, profile, overrides).plan()


# --- shapes and cards ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["qwen3-4b", "Qwen3-4B", "QWEN3-4B", "unsloth/Qwen3-4B-unsloth-bnb-4bit", "Qwen/Qwen3-4B-Instruct-2507"],
)
def test_shape_lookup_by_name_and_hf_id(name):
    s = load_shape(name)
    assert (s.name, s.layers, s.hidden, s.ffn, s.heads, s.kv_heads, s.head_dim, s.vocab, s.tied) == (
        "Qwen3-4B",
        36,
        2560,
        9728,
        32,
        8,
        128,
        151936,
        True,
    )


def test_shape_lookup_prefers_the_longest_name():
    assert load_shape("unsloth/Qwen3-14B-unsloth-bnb-4bit").name == "Qwen3-14B"
    assert load_shape("meta-llama/Meta-Llama-3.1-8B-Instruct").name == "Llama-3.1-8B"


def test_facts_table_shapes():
    # FACTS.md's table, row by row: layers, hidden, ffn, heads, kv heads, head_dim, vocab, tied.
    table = {
        "Qwen3-0.6B": (28, 1024, 3072, 16, 8, 128, 151936, True),
        "Qwen3-1.7B": (28, 2048, 6144, 16, 8, 128, 151936, True),
        "Qwen3-4B": (36, 2560, 9728, 32, 8, 128, 151936, True),
        "Qwen3-8B": (36, 4096, 12288, 32, 8, 128, 151936, False),
        "Qwen3-14B": (40, 5120, 17408, 40, 8, 128, 151936, False),
        "Qwen3-32B": (64, 5120, 25600, 64, 8, 128, 151936, False),
        "Llama-3.1-8B": (32, 4096, 14336, 32, 8, 128, 128256, False),
        "Llama-3.3-70B": (80, 8192, 28672, 64, 8, 128, 128256, False),
    }
    for name, row in table.items():
        s = load_shape(name)
        assert (s.layers, s.hidden, s.ffn, s.heads, s.kv_heads, s.head_dim, s.vocab, s.tied) == row, name


def test_shape_from_path_and_folder(tmp_path):
    cfg = json.loads((ROOT / "budgets" / "models" / "qwen3-1.7b.json").read_text())
    cfg["quantization_config"] = {"llm_int8_skip_modules": ["lm_head", "model.layers.0.mlp"]}
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    for ref in (folder, folder / "config.json"):
        s = load_shape(str(ref))
        assert s.layers == 28 and s.hidden == 2048
        assert s.is_skipped(0, "down_proj") and not s.is_skipped(1, "down_proj")
        assert not s.is_skipped(0, "q_proj")


def test_cards():
    assert get_card("rtx-5080").memory_bytes == 16303 << 20
    assert abs(get_card("t4").memory_bytes / GIB - 14.74) < 0.02  # what Colab shows
    assert get_card("RTX-4090").bandwidth == 1008e9
    cpu = get_card("cpu")
    assert not cpu.cuda and cpu.memory_bytes > 0


# --- the first lab's sheet ---------------------------------------------------------------------------


def test_lab_sheet_lines_and_verdict():
    sheet = compute(lab_plan())
    names = [ln.name for ln in sheet.lines]
    assert set(names) <= STABLE
    assert {
        "cuda_context",
        "base_weights",
        "lora_params",
        "lora_grads",
        "optimizer_states",
        "kv_cache",
        "vllm_profile_activations",
        "cuda_graphs",
        "train_activations",
        "logits",
    } <= set(names)
    # beta 0.02 > 0, but Unsloth's trainer (the GPU profile's) takes the reference from the base with
    # the adapter disabled: no reference line; the sheet says why.
    assert "reference_policy" not in names
    assert any("adapter disabled" in note for note in sheet.notes)
    assert "generate_kv_cache" not in names  # vLLM generates: no HF cache line
    assert sheet.fits and sheet.total_bytes <= sheet.capacity_bytes
    # vLLM's share holds exactly what vLLM claims: weights + slots + profiling + graphs + KV.
    share = sum(
        sheet.line(n).bytes
        for n in ("base_weights", "vllm_lora_slots", "vllm_profile_activations", "cuda_graphs", "kv_cache")
    )
    assert share == sheet.metrics["vllm"]["requested_bytes"]
    exact = {ln.name for ln in sheet.lines if not ln.estimate}
    assert exact == {"base_weights", "lora_params", "lora_grads", "optimizer_states"}
    text = sheet.table()
    assert "kv_cache" in text and "verdict: fits" in text


def test_the_share_is_unsloths_util_times_free_memory():
    """unsloth_zoo hands vLLM util x free / total; vLLM claims ceil(total x that)."""
    total = get_card("rtx-5080").memory_bytes
    for other in (0.0, 1.0):
        sheet = compute(lab_plan(other_processes_gib=other, gpu_memory_utilization=0.45))
        free = total - sheet.line("cuda_context").bytes - int(other * GIB)
        requested = sheet.metrics["vllm"]["requested_bytes"]
        assert requested == pytest.approx(0.45 * free, rel=1e-6)
    # FACTS: on an RTX 5080 with 0.5 GiB in use (the CUDA context), 0.45 gives a 6.94 GiB share.
    share = compute(lab_plan(gpu_memory_utilization=0.45)).metrics["vllm"]["requested_bytes"]
    assert share / GIB == pytest.approx(6.94, abs=0.005)
    # A desktop holding 1 GiB takes 0.45 GiB of the share, all of it from the KV cache.
    kv = [
        compute(lab_plan(other_processes_gib=o, gpu_memory_utilization=0.45)).line("kv_cache").bytes
        for o in (0.0, 1.0)
    ]
    assert (kv[0] - kv[1]) / GIB == pytest.approx(0.45, abs=0.01)


def test_cpu_profile_sheet():
    sheet = compute(lab_plan("cpu"))
    names = {ln.name for ln in sheet.lines}
    assert "cuda_context" not in names and "kv_cache" not in names and "generate_kv_cache" in names
    assert sheet.capacity_bytes == get_card("cpu").memory_bytes and sheet.fits


def test_under_trls_trainer_the_cpu_adapter_is_bf16_with_an_fp32_ref_copy():
    # Measured with TRL's own GRPOTrainer on the CPU profile (TRL 1.15.0, PEFT 0.21.2, tiny-qwen3, r 16,
    # beta 0.02): the "default" adapter, its grads and AdamW's exp_avg / exp_avg_sq are bf16 once
    # training starts; the frozen "ref" adapter is an fp32 copy of it.
    sheet = compute(lab_plan("cpu").with_(grpo_trainer="trl"))
    n = sheet.metrics["trainable_params"]
    assert sheet.inputs["trainable_dtype_bytes"] == 2
    assert sheet.line("lora_params").bytes == n * 2
    assert sheet.line("lora_grads").bytes == n * 2
    assert sheet.line("optimizer_states").bytes == 2 * n * 2  # adamw_torch
    assert sheet.line("reference_policy").bytes == n * 4
    assert (
        "x 2 B" in sheet.line("lora_params").formula
        and "TRL's own GRPO trainer" in sheet.line("lora_params").note
    )
    assert "'ref' adapter" in sheet.line("reference_policy").formula
    assert sheet.metrics["train_state_bytes"] == sheet.line("base_weights").bytes + 8 * n
    assert compute(lab_plan("cpu", beta=0.0).with_(grpo_trainer="trl")).line("reference_policy") is None


def test_under_unsloths_trainer_the_cpu_adapter_stays_fp32_and_no_reference_is_held():
    """The lab trains through Unsloth's generated trainer on both profiles (grpolab.model.unsloth_trainer)."""
    sheet = compute(lab_plan("cpu"))
    n = sheet.metrics["trainable_params"]
    assert sheet.inputs["grpo_trainer"] == "unsloth" and sheet.inputs["trainable_dtype_bytes"] == 4
    assert sheet.line("lora_params").bytes == sheet.line("lora_grads").bytes == n * 4
    assert sheet.line("optimizer_states").bytes == 2 * n * 4
    assert sheet.line("reference_policy") is None


def test_the_reference_line_follows_the_trainer_that_runs():
    plan = lab_plan()
    assert compute(plan).line("reference_policy") is None
    trl = compute(plan.with_(grpo_trainer="trl"))
    assert trl.line("reference_policy").bytes == trl.metrics["trainable_params"] * 4
    assert compute(plan.with_(grpo_trainer="trl", beta=0.0)).line("reference_policy") is None


def test_gpu_profile_keeps_fp32_trainables():
    sheet = compute(lab_plan())
    n = sheet.metrics["trainable_params"]
    assert sheet.inputs["trainable_dtype_bytes"] == 4
    assert sheet.line("lora_params").bytes == sheet.line("lora_grads").bytes == n * 4
    # 8-bit AdamW keeps uint8 / fp32 state whatever the parameter's dtype.
    bf16 = compute(lab_plan().with_(trainable_dtype_bytes=2))
    assert bf16.line("lora_params").bytes == n * 2
    assert bf16.line("optimizer_states").bytes == sheet.line("optimizer_states").bytes


def test_a_new_group_size_keeps_the_prompts_per_step():
    plan = lab_plan(num_generations=4, max_completion_length=16)
    assert (plan.num_generations, plan.per_device_train_batch_size) == (4, 4)
    s = lab_settings(LAB, "gpu", {"num_generations": 4, "max_completion_length": 16})
    assert (plan.max_completion_length, plan.max_prompt_length) == (16, s.max_prompt_length)
    assert (
        Plan(num_generations=8, per_device_train_batch_size=16)
        .with_num_generations(4)
        .per_device_train_batch_size
        == 8
    )


def test_every_formula_prints_the_numbers_its_value_comes_from():
    """Numbers in a formula are the arithmetic's own: multiply the factors a product line prints."""
    for plan in (lab_plan(), lab_plan("cpu"), Plan(model="qwen3-8b", gpu="h100-sxm", load_in_4bit=False)):
        for ln in compute(plan).lines:
            if ln.name in ("lora_params", "lora_grads", "generate_kv_cache") or (
                ln.name == "logits" and "chunk" not in ln.formula
            ):
                text = re.sub(r"\([^()]* = ([\d,]+)\)", r" \1 ", ln.formula)  # a named term: its value
                factors = [
                    int(x.replace(",", "")) for x in re.findall(r"(?<![\w.])(\d[\d,]*)(?![\w.])", text)
                ]
                product = math.prod(f for f in factors if f)
                assert product == ln.bytes, (ln.name, ln.formula, product, ln.bytes)


def test_standby_takes_unsloths_tier_and_frees_the_kv_cache_for_training():
    plan = lab_plan(gpu_memory_utilization=0.45)
    total = get_card("rtx-5080").memory_bytes
    assert unsloth_standby_util(total) == pytest.approx(0.8 * 0.95)  # a 16 GB card: tier 0.8
    sheet = compute(plan.with_(unsloth_vllm_standby=True))
    free = sheet.metrics["vllm"]["free_at_start_bytes"]
    assert sheet.metrics["vllm"]["requested_bytes"] == pytest.approx(0.76 * free, rel=1e-6)
    assert "train" not in sheet.line("kv_cache").phases
    kept = compute(plan.with_(unsloth_vllm_standby=True, unsloth_vllm_standby_util_override=True))
    assert kept.metrics["vllm"]["requested_bytes"] == pytest.approx(0.45 * free, rel=1e-6)
    assert compute(plan).metrics["standby_alternative"]["unsloth_vllm_standby"] is True


def test_vllm_refuses_to_start_where_trl_passes_the_util_unchanged():
    """Under Unsloth the share is scaled by the free memory and always starts; TRL's colocate mode
    asks for util x total after the trainer's model is loaded, which can be more than is free."""
    assert compute(lab_plan(gpu_memory_utilization=0.99)).metrics["vllm"]["starts"]
    sheet = compute(
        Plan(
            model="qwen3-1.7b",
            gpu="rtx-4090",
            layout="colocate",
            load_in_4bit=False,
            gpu_memory_utilization=0.95,
        )
    )
    assert not sheet.fits and not sheet.metrics["vllm"]["starts"]
    with pytest.raises(BudgetError) as err:
        sheet.require_fits()
    msg = str(err.value)
    assert (
        "\n" not in msg
        and msg.startswith("gpu_memory_utilization:")
        and "lower --gpu-memory-utilization" in msg
    )


def test_too_big_names_the_line_and_what_to_change():
    sheet = compute(
        Plan(
            model="qwen3-8b", gpu="t4", load_in_4bit=False, max_completion_length=4096, max_prompt_length=512
        )
    )
    assert not sheet.fits
    with pytest.raises(BudgetError) as err:
        sheet.require_fits()
    msg = str(err.value)
    assert "\n" not in msg and msg.split(":")[0] in {ln.name for ln in sheet.lines}
    # What to change: flags of real settings, and never a "set" to the value the plan already has.
    named = re.findall(r"--([a-z0-9-]+)", msg)
    assert named, msg
    assert {n.replace("-", "_") for n in named} <= set(PLAN_FIELDS), msg
    for setting, value in re.findall(r"set --([a-z0-9-]+) (\S+)", msg):
        assert str(sheet.inputs[setting.replace("-", "_")]).lower() != value.lower(), msg


# --- bad inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, name",
    [
        ({"max_completion_length": -5}, "max_completion_length"),
        ({"max_prompt_length": 0}, "max_prompt_length"),
        ({"lora_rank": 0}, "lora_rank"),
        ({"lora_rank": None}, "lora_rank"),
        ({"gpu": "gtx-1080"}, "gpu"),
        ({"model": "qwen9-1t"}, "model"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
        ({"per_device_train_batch_size": 6}, "per_device_train_batch_size"),
        ({"layout": "torus"}, "layout"),
        ({"optim": "sgd"}, "optim"),
        ({"dtype": "int3"}, "dtype"),
        ({"full_finetuning": True}, "lora_rank"),
        ({"full_finetuning": True, "lora_rank": None}, "load_in_4bit"),
        ({"layout": "server", "gpus": 2, "vllm_gpus": 1}, "load_in_4bit"),
        ({"layout": "server", "gpus": 2, "vllm_gpus": 2, "load_in_4bit": False}, "vllm_gpus"),
        ({"max_seq_length": 100}, "max_seq_length"),
        ({"beta": -1}, "beta"),
        ({"use_gradient_checkpointing": "maybe"}, "use_gradient_checkpointing"),
        ({"trainable_dtype_bytes": 3}, "trainable_dtype_bytes"),
        ({"other_processes_gib": -1}, "other_processes_gib"),
        ({"grpo_trainer": "mine"}, "grpo_trainer"),
        (
            {"trainable_dtype_bytes": 2, "full_finetuning": True, "lora_rank": None, "load_in_4bit": False},
            "trainable_dtype_bytes",
        ),
    ],
)
def test_bad_inputs_name_the_input(changes, name):
    with pytest.raises(BudgetError) as err:
        compute(Plan(**changes))
    assert str(err.value).startswith(f"{name}:") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-completion-length", "-5"],
        ["--lora-rank", "0"],
        ["--gpu", "gtx-1080"],
        ["--model", "nope"],
        ["--gpu-memory-utilization", "1.5"],
        ["--gpu-memory-gb", "16"],
        ["--layout", "torus"],
        ["--lab", "labs/grpo-first"],  # gone: a chapter's sheet is its own train.py --budget-only
    ],
)
def test_cli_bad_input_is_one_line_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        raise SystemExit(main(argv))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(("budgets: ", "error: "))
    assert "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--num-generations", "0"], "num_generations: 0 leaves nothing to compare"),
        (["--gpu", "gtx-1080"], "gtx-1080"),
        (["--model", "/no/model"], "no model at '/no/model'"),
    ],
)
def test_a_chapters_budget_refuses_bad_settings_in_one_line(argv, words, lab_module, capsys):
    assert lab_module.main(["--budget-only", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and words in err and "\n" not in err


# --- CLI -------------------------------------------------------------------------------------------

SCHEMA = {
    "lines",
    "total_bytes",
    "capacity_bytes",
    "fits",
    "trainable_params",
    "train_state_bytes",
    "kv_cache_bytes_per_token",
    "max_concurrent_rollouts",
    "decode_bytes_per_token",
    "decode_tokens_per_s_ceiling",
    "decode_tokens_per_s_step_ceiling",
    "weight_sync_bytes_per_step",
    "weight_sync_seconds",
    "per_card",
}


def test_cli_json_schema_for_the_lab(lab_module, capsys):
    assert lab_module.main(["--budget-only", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= SCHEMA
    assert all({"name", "bytes", "formula", "estimate"} <= set(ln) for ln in data["lines"])
    assert data == json.loads(json.dumps(compute(lab_plan()).to_dict()))


def test_the_labs_budget_takes_its_own_flags_and_the_lab_settings_names(lab_module, capsys):
    """One vocabulary: what `train.py --budget-only --num-generations 4` prints is the plan the lab would run,
    and the budget CLI's flags under the same names print the same sheet."""
    flags = ["--num-generations", "4", "--max-completion-length", "512"]
    # The plan the lab would run: the same flags through the lab's own parser (grpolab.config.settings).
    lab_cli = argparse.ArgumentParser()
    add_flags(lab_cli)
    runs = lab_settings(LAB, "gpu", overrides_from(lab_cli.parse_args(flags))).plan()
    assert lab_module.main(["--budget-only", *flags, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(compute(runs).to_dict()))
    # The flags took (lab.toml's gpu profile says 8, 8 and 768); the batch follows the group.
    inputs = printed["inputs"]
    assert (inputs["num_generations"], inputs["per_device_train_batch_size"]) == (4, 4)
    assert inputs["max_completion_length"] == 512
    # The budget CLI, given the plan's settings as flags of the same names, prints the same sheet.
    default = Plan()
    cli = [
        word
        for field in dataclasses.fields(Plan)
        if getattr(runs, field.name) != getattr(default, field.name)
        for word in (flag(field.name), flag_text(getattr(runs, field.name)))
    ]
    assert main([*cli, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == printed


def test_cli_table_and_flags(capsys):
    argv = ["--model", "Qwen3-8B", "--gpu-memory-gb", "24", "--gpu-bandwidth-gbs", "1008"]
    argv += ["--num-generations", "4", "--per-device-train-batch-size", "4", "--optim", "adamw_torch"]
    assert main([*argv, "--beta", "0", "--json"]) == 0
    inputs = json.loads(capsys.readouterr().out)["inputs"]
    assert (inputs["gpu_memory_bytes"], inputs["gpu_bandwidth_bytes_per_s"]) == (24 * 10**9, 1008e9)
    assert (inputs["model"], inputs["num_generations"], inputs["per_device_train_batch_size"]) == (
        "Qwen3-8B",
        4,
        4,
    )
    assert (inputs["optim"], inputs["beta"]) == ("adamw_torch", 0.0)
    # The table is the sheet of the plan the flags spell, printed whole.
    assert main([*argv, "--beta", "0"]) == 0
    out = capsys.readouterr().out
    plan = Plan(
        model="Qwen3-8B",
        gpu=custom_card(24, 1008),
        num_generations=4,
        per_device_train_batch_size=4,
        optim="adamw_torch",
        beta=0.0,
    )
    assert out == compute(plan).table() + "\n"
    assert "Qwen3-8B" in out and "verdict:" in out
    cpu = ["--gpu", "cpu", "--model", "tiny-qwen3", "--max-prompt-length", "150", "--max-seq-length", "256"]
    assert main([*cpu, "--max-completion-length", "32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["gpu"] == "cpu"
    assert main(["--trainable-dtype-bytes", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["trainable_dtype_bytes"] == 2
    assert main(["--num-generations", "4", "--json"]) == 0  # Plan's default batch of 8 is one group of 8
    inputs = json.loads(capsys.readouterr().out)["inputs"]
    assert (inputs["num_generations"], inputs["per_device_train_batch_size"]) == (4, 4)


def test_the_card_list_in_help_is_the_catalog(capsys):
    from budgets import card_names

    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert ", ".join(card_names()) in out


# --- headroom ------------------------------------------------------------------------------------


@pytest.mark.parametrize("knob", ["num_generations", "max_completion_length", "per_device_train_batch_size"])
def test_headroom_is_the_edge(knob):
    plan = lab_plan().with_(gpu="t4")
    h = largest(plan, knob)
    assert h.largest and h.largest >= getattr(plan, knob) and h.binding
    from budgets.headroom import _variant

    assert compute(_variant(plan, knob, h.largest)).fits
    step = {
        "max_completion_length": 16,
        "per_device_train_batch_size": plan.num_generations,
        "num_generations": 1,
    }
    assert not compute(_variant(plan, knob, h.largest + step[knob])).fits


def test_suggest_vllm_util_for_the_lab():
    for gpu in ("rtx-5080", "t4", "rtx-4060-ti-16gb"):
        plan = lab_plan().with_(gpu=gpu)
        util, why = suggest_vllm_util(plan)
        assert 0 < util <= 1 and why
        assert compute(plan.with_(gpu_memory_utilization=util)).fits


def test_the_labs_share_is_the_one_the_sheet_suggests():
    """lab.toml's gpu_memory_utilization is derived from --suggest-util, not copied from elsewhere."""
    util, _ = suggest_vllm_util(lab_plan())
    assert lab_settings(LAB, "gpu").gpu_memory_utilization == util


# --- beyond one card -------------------------------------------------------------------------------


def test_server_layout_per_card_and_weight_sync():
    plan = Plan(
        model="qwen3-32b",
        gpu="h100-sxm",
        gpus=4,
        layout="server",
        vllm_gpus=2,
        load_in_4bit=False,
        gpu_memory_utilization=0.9,
        link_gbps=400,
        optim="adamw_torch",
        max_prompt_length=512,
        max_completion_length=1536,
        num_generations=8,
        per_device_train_batch_size=8,
        beta=0.0,
    )
    sheet = compute(plan)
    roles = {c.role: c for c in sheet.per_card}
    assert set(roles) == {"trainer", "vllm"} and roles["trainer"].count == 2 and roles["vllm"].count == 2
    params = load_shape("qwen3-32b").total_params()
    assert sheet.metrics["weight_sync_bytes_per_step"] == params * 2
    assert sheet.metrics["weight_sync_seconds"] == pytest.approx(params * 2 * 8 / 400e9, rel=1e-3)
    # Tensor parallel 2: each vLLM card holds half the weights and half the KV heads.
    assert sheet.metrics["kv_cache_bytes_per_token"] == 2 * 64 * 4 * 128 * 2
    vllm_w = next(ln for ln in roles["vllm"].lines if ln.name == "vllm_weights")
    assert vllm_w.bytes == math.ceil(params * 2 / 2)


def test_fsdp_shards_full_training_16_bytes_per_parameter():
    base = dict(
        model="qwen3-8b",
        gpu="h100-sxm",
        layout="server",
        load_in_4bit=False,
        full_finetuning=True,
        lora_rank=None,
        optim="adamw_torch",
        gpu_memory_utilization=0.9,
        num_generations=8,
        per_device_train_batch_size=8,
        beta=0.0,
    )
    n = load_shape("qwen3-8b").total_params()
    ddp = compute(Plan(**base, gpus=3, vllm_gpus=1))
    fsdp = compute(Plan(**base, gpus=5, vllm_gpus=1, trainer_sharding="fsdp"))
    state = {
        ln.name: ln.bytes for ln in ddp.lines if ln.name in ("base_weights", "full_grads", "optimizer_states")
    }
    assert sum(state.values()) == 16 * n  # fp32 weights 4 + grads 4 + Adam 8
    assert fsdp.line("base_weights").bytes == math.ceil(n * 4 / 4)
    assert not ddp.per_card[0].fits and fsdp.per_card[0].fits  # 8B full on one 80 GB card does not fit


def test_colocate_holds_a_second_copy_and_reference_copy_for_full():
    lora = compute(
        Plan(
            model="qwen3-1.7b",
            gpu="rtx-4090",
            layout="colocate",
            load_in_4bit=False,
            gpu_memory_utilization=0.3,
            beta=0.04,
            gpus=2,
            grpo_trainer="trl",
        )
    )
    assert lora.line("vllm_weights") is not None and lora.per_card[0].count == 2
    # A second copy: vLLM's weights beside the trainer's bf16 base, byte for byte.
    assert lora.line("vllm_weights").bytes == lora.line("base_weights").bytes
    # LoRA under TRL: its frozen "ref" adapter, an fp32 copy of the trainable one.
    assert lora.line("reference_policy").bytes == lora.metrics["trainable_params"] * 4
    full = compute(
        Plan(
            model="qwen3-1.7b",
            gpu="h100-sxm",
            layout="colocate",
            load_in_4bit=False,
            full_finetuning=True,
            lora_rank=None,
            gpu_memory_utilization=0.3,
            beta=0.04,
        )
    )
    params = load_shape("qwen3-1.7b").total_params()
    assert full.line("vllm_weights").bytes == params * 2  # vLLM's bf16 copy of the full model
    assert full.line("reference_policy").bytes > params * 2  # a bf16 model copy, and its log-probs


def test_roofline():
    sheet = compute(lab_plan())
    m = sheet.metrics
    assert m["tokens_per_step"] == 8 * 768
    assert m["decode_tokens_per_s_ceiling"] == pytest.approx(960e9 / m["decode_bytes_per_token"], rel=1e-3)
    assert m["generation_seconds_estimate"] > 768 * m["decode_bytes_per_token"] / 960e9 * 0.5
    assert m["decode_tokens_per_s_step_ceiling"] == pytest.approx(
        m["tokens_per_step"] / m["generation_seconds_estimate"], rel=1e-3
    )


def test_a_downloaded_checkpoints_own_quantization_config_is_read(tmp_path, monkeypatch):
    """Unsloth's dynamic 4-bit checkpoints keep some linears in 16 bit; once the checkpoint is in the
    Hugging Face cache, the sheet counts them at 2 B, not as NF4."""
    model_id = "unsloth/Qwen3-4B-unsloth-bnb-4bit"
    shipped = compute(Plan(model=model_id))
    assert any("not in the local Hugging Face cache" in note for note in shipped.notes)
    cfg = json.loads((ROOT / "budgets" / "models" / "qwen3-4b.json").read_text())
    cfg["quantization_config"] = {
        "llm_int8_skip_modules": ["lm_head", "model.layers.0.mlp", "model.layers.35.mlp"]
    }
    snapshot = tmp_path / f"models--{model_id.replace('/', '--')}" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(cfg))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    cached = compute(Plan(model=model_id))
    assert "Hugging Face cache" in cached.notes[0]
    from budgets.arithmetic import nf4_bytes

    mlp = [
        i * o
        for m, (i, o) in load_shape("qwen3-4b").linear_shapes().items()
        if m in ("gate_proj", "up_proj", "down_proj")
    ]
    diff = cached.line("base_weights").bytes - shipped.line("base_weights").bytes
    # Two layers' MLPs (3 linears each) at 2 B per weight instead of NF4.
    assert diff == 2 * sum(2 * n - nf4_bytes(n) for n in mlp)
    assert "linears kept in 16 bit" in cached.line("base_weights").formula
