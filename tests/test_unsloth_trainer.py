"""Unsloth's GRPO trainer, the one a GPU user really trains with, pinned on the CPU.

On CUDA `import unsloth` replaces TRL's GRPOTrainer with the `UnslothGRPOTrainer` it generates
from TRL's source (unsloth/models/rl.py); on a CPU nothing is replaced. So these tests generate
that class on the CPU themselves, in a subprocess (the rewriting of TRL is process-wide, and it
writes its code under UNSLOTH_COMPILE_LOCATION, here a temporary folder), and check in its code,
or by constructing it, every behaviour the lab and the budget rely on:

- the precision guard, run from the generated code for a T4 (sm_75) and an RTX 5080 (sm_120)
  with only the absent CUDA query stood in for (grpolab/model/precision.py decides the flags);
- the reference policy: no frozen 'ref' adapter under Unsloth's trainer (TRL 1.15 adds one);
- the config defaults Unsloth changes (warm-up, weight decay, reward scaling, IS correction);
- the per-token log-prob route and the chunk rule budgets/arithmetic.py ports.

Every expectation is read from the installed libraries, so an upgrade that changes one fails here.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from suite import REPO_ROOT, gpu_only

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Runs in its own process, with the temporary folder as working directory. Writes one JSON file.
PROBE = textwrap.dedent(
    r'''
    import ast, json, os, sys, types
    from pathlib import Path

    out = Path(sys.argv[1])
    R = {}

    from unsloth import FastLanguageModel  # noqa: E402  (first, as grpolab/model/policy.py)
    import datasets
    import torch
    import trl
    import trl.trainer.grpo_trainer as trl_grpo

    TRLTrainer = trl_grpo.GRPOTrainer  # TRL's own classes, before Unsloth rewrites them
    from trl.trainer.grpo_config import GRPOConfig as TRLConfig

    from grpolab.model.precision import load_dtype, trainer_precision
    from grpolab.model.unsloth_trainer import grpo_trainer_class, keep_float32

    Trainer = grpo_trainer_class()
    Config = trl.GRPOConfig
    gen = sys.modules[Trainer.__module__]
    R["trainer"] = Trainer.__name__
    R["generated_file"] = gen.__file__
    R["trl_source"] = trl_grpo.__file__
    R["trl_rebound"] = trl.GRPOTrainer is Trainer and trl.trainer.grpo_trainer.GRPOTrainer is Trainer
    R["config_is_generated"] = Config is gen.UnslothGRPOConfig and issubclass(Config, TRLConfig)

    # --- The precision guard, executed from the generated UnslothGRPOTrainer.__init__ -------------
    tree = ast.parse(Path(gen.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "UnslothGRPOTrainer")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    start = next(
        i for i, s in enumerate(init.body)
        if isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "_unsloth_precision_requested" for t in s.targets)
    )
    end = next(
        i for i, s in enumerate(init.body)
        if i > start and isinstance(s, ast.If) and ast.unparse(s.test) == "force_float32"
    )
    guard = compile(ast.Module(body=init.body[start : end + 1], type_ignores=[]), gen.__file__, "exec")
    R["guard_source"] = "\n".join(ast.unparse(s) for s in init.body[start : end + 1])

    import unsloth_zoo.device_type as zoo_device

    def run_guard(capability, flags, dtype):
        """The guard's own code; the one stand-in is the CUDA query this machine cannot answer."""
        native = zoo_device.device_is_bf16_supported
        saved_env = os.environ.get("ACCELERATE_MIXED_PRECISION")
        # On CUDA it returns torch.cuda.is_bf16_supported() as Unsloth rewraps it: capability >= 8.
        zoo_device.device_is_bf16_supported = lambda: capability[0] >= 8
        args = types.SimpleNamespace(fp16_full_eval=False, bf16_full_eval=False, mixed_precision=None, **flags)
        model = types.SimpleNamespace(config=types.SimpleNamespace(dtype=dtype))
        try:
            exec(guard, {"args": args, "model": model, "torch": torch, "os": os})
            return {"error": None, "bf16": args.bf16, "fp16": args.fp16, "mixed_precision": args.mixed_precision}
        except TypeError as error:
            return {"error": str(error)}
        finally:
            zoo_device.device_is_bf16_supported = native
            if saved_env is None:
                os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
            else:
                os.environ["ACCELERATE_MIXED_PRECISION"] = saved_env

    R["guard"] = {}
    for card, capability in {"sm_75": (7, 5), "sm_120": (12, 0)}.items():
        dtype = load_dtype(capability)
        flags = trainer_precision(dtype, on_gpu=True)
        R["guard"][card] = {
            "load_dtype": str(dtype),
            "flags": flags,
            "decided": run_guard(capability, flags, dtype),
            # What the lab asked before: bf16 = torch.cuda.is_bf16_supported(), True on both cards
            # (torch's default counts emulation: a T4 can make a bf16 tensor).
            "bf16_by_emulation": run_guard(capability, {"bf16": True, "fp16": False}, dtype),
            "float32_no_flags": run_guard(capability, {"bf16": False, "fp16": False}, torch.float32),
        }

    # --- The config: Unsloth's defaults against TRL's -------------------------------------------
    fields = ("warmup_steps", "weight_decay", "scale_rewards", "vllm_importance_sampling_correction")
    common = dict(output_dir=str(out.parent / "cfg"), use_cpu=True, bf16=False, fp16=False,
                  loss_type="dr_grpo", beta=0.02, report_to="none")
    explicit = dict(warmup_steps=0, weight_decay=0.0, scale_rewards="none",
                    vllm_importance_sampling_correction=False)

    def values(config):
        return {f: getattr(config, f) for f in fields}

    R["config"] = {
        "unsloth": values(Config(**common)),
        "trl": values(TRLConfig(**common)),
        "unsloth_explicit": values(Config(**common, **explicit)),
        "unsloth_group": Config(**common, scale_rewards="group").scale_rewards,
        "trl_group": TRLConfig(**common, scale_rewards="group").scale_rewards,
        "unsloth_none": Config(**common, scale_rewards=None).scale_rewards,
    }

    # --- Construct the trainers on the tiny model, beta 0.02 ------------------------------------
    from grpolab.tiny_model import ensure_tiny_model

    path = str(ensure_tiny_model())

    def policy():
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=path, max_seq_length=256, load_in_4bit=True, dtype=torch.float32,
            fast_inference=False, max_lora_rank=16,
        )
        model = FastLanguageModel.get_peft_model(
            model, r=16, lora_alpha=16, target_modules=TARGET_MODULES,
            use_gradient_checkpointing="unsloth", random_state=0,
        )
        return model, tokenizer

    prompts = datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}]] * 4})

    def reward(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    small = dict(num_generations=2, per_device_train_batch_size=2, max_completion_length=4,
                 max_steps=1, save_strategy="no")

    def build(trainer_class, config_class, model, tokenizer, name):
        args = config_class(**{**common, "output_dir": str(out.parent / name)}, **explicit, **small)
        trainer = trainer_class(model=model, processing_class=tokenizer, reward_funcs=[reward],
                                args=args, train_dataset=prompts)
        lora = [p for n, p in trainer.model.named_parameters() if "lora_A.default" in n]
        return {
            "adapters": sorted(trainer.model.peft_config),
            "ref_model": trainer.ref_model is not None,
            "beta": trainer.beta,
            "lora_dtype": str(lora[0].dtype),
            "fp16": trainer.args.fp16,
            "bf16": trainer.args.bf16,
            "mixed_precision": str(getattr(trainer.args, "mixed_precision", None)),
        }

    model, tokenizer = policy()
    R["unsloth_trainer"] = build(Trainer, Config, model, tokenizer, "u")
    model, tokenizer = policy()
    R["unsloth_trainer_float32"] = build(Trainer, Config, keep_float32(model), tokenizer, "u32")
    model, tokenizer = policy()
    R["trl_trainer"] = build(TRLTrainer, TRLConfig, model, tokenizer, "t")

    # --- Per-token log-probs: the function the generated trainer scores with -------------------
    from unsloth_zoo import rl_replacements
    from unsloth_zoo.fused_losses import chunked_logprob, fused_linear

    torch.manual_seed(0)
    hidden, head = torch.randn(2, 7, 64), torch.randn(131, 64)
    index = torch.randint(0, 131, (2, 7))
    calls = dict(fused_linear.CALLS)
    got = rl_replacements.grpo_chunked_hidden_states_logprobs(hidden, head, index)
    want = torch.log_softmax(hidden @ head.T, dim=-1).gather(-1, index[..., None])[..., 0]
    R["logprobs"] = {
        "max_abs_error": float((got - want).abs().max()),
        "fused_linear_calls": fused_linear.CALLS["logprobs"] - calls["logprobs"],
        "fused_linear_default": bool(chunked_logprob._FUSED_LINEAR),
        "chunk_gb_default": fused_linear._CHUNK_GB,
        "fp32_logits_default": fused_linear._ACCURACY,
    }
    # The fused path's chunk, with a 2 GiB budget (the default when half the free memory is more).
    fused_linear._budget_bytes = lambda device: int(2.0 * 1024**3)
    cases = [(151936, 2560, 8 * 768), (151936, 64, 16 * 32), (151936, 4096, 100_000), (128256, 4096, 4096),
             (101, 64, 512), (32000, 2048, 3)]
    R["chunk_rows"] = [
        [vocab, hidden, rows, fused_linear.fused_linear_rows(rows, hidden, vocab, 4, None)]
        for vocab, hidden, rows in cases
    ]
    out.write_text(json.dumps(R, default=str))
    '''
).replace("TARGET_MODULES", repr(TARGET_MODULES))


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """Generate Unsloth's GRPO trainer on this CPU and read what it does, once for the module."""
    work = tmp_path_factory.mktemp("unsloth_trainer")
    script = work / "probe.py"
    script.write_text(PROBE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        # Unsloth writes its generated trainers here (default: unsloth_compiled_cache/ in the cwd).
        "UNSLOTH_COMPILE_LOCATION": str(work / "unsloth_compiled_cache"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    for name in (
        "UNSLOTH_FORCE_FLOAT32",
        "UNSLOTH_ALLOW_CPU",
        "UNSLOTH_MIXED_PRECISION",
        "UNSLOTH_FUSED_LINEAR",
    ):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, str(script), str(work / "probe.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    facts = json.loads((work / "probe.json").read_text())
    facts["work"] = str(work)
    facts["generated_source"] = Path(facts["generated_file"]).read_text()
    facts["trl_source_text"] = Path(facts["trl_source"]).read_text()
    return facts


def _site_source(relative: str) -> str:
    """A file of the installed packages, found without importing them (importing unsloth patches)."""
    import importlib.util

    top = relative.split("/")[0]
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.origin is not None, top
    return (Path(spec.origin).parent.parent / relative).read_text()


# --- The trainer class --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_cpu_profile_gets_unsloths_generated_trainer(probe):
    assert probe["trainer"] == "UnslothGRPOTrainer"
    assert probe["trl_rebound"], "trl.GRPOTrainer must be the generated class after grpo_trainer_class()"
    assert probe["config_is_generated"], "trl.GRPOConfig must be Unsloth's generated config"
    # Written where UNSLOTH_COMPILE_LOCATION says, not into the working tree.
    assert Path(probe["generated_file"]).is_relative_to(Path(probe["work"]) / "unsloth_compiled_cache")


@pytest.mark.slow
@gpu_only(
    "import unsloth alone rewrites trl.GRPOTrainer on CUDA, and grpo_trainer_class() returns that class"
)
def test_on_cuda_import_unsloth_alone_gives_the_generated_trainer(tmp_path):
    code = (
        "import unsloth, trl; first = trl.GRPOTrainer\n"
        "from grpolab.model.unsloth_trainer import grpo_trainer_class\n"
        "assert first.__name__ == 'UnslothGRPOTrainer', first\n"
        "assert grpo_trainer_class() is first\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "UNSLOTH_COMPILE_LOCATION": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


# --- Precision ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("card", "loaded", "flag"), [("sm_75", "float16", "fp16"), ("sm_120", "bfloat16", "bf16")]
)
@pytest.mark.slow
def test_the_precision_decision_passes_unsloths_own_guard(probe, card, loaded, flag):
    case = probe["guard"][card]
    assert case["load_dtype"] == f"torch.{loaded}"
    assert case["flags"] == {"bf16": flag == "bf16", "fp16": flag == "fp16"}
    assert case["decided"]["error"] is None, case["decided"]["error"]
    assert case["decided"][flag] is True and case["decided"]["mixed_precision"] == flag


@pytest.mark.slow
def test_bf16_from_torchs_emulated_answer_crashes_on_a_t4_only(probe):
    # The lab's old decision (bf16 = torch.cuda.is_bf16_supported(), True on a T4 by emulation).
    t4 = probe["guard"]["sm_75"]["bf16_by_emulation"]
    assert (
        t4["error"] is not None
        and "Model is in float16 precision but you want to use bfloat16" in t4["error"]
    )
    assert probe["guard"]["sm_120"]["bf16_by_emulation"]["error"] is None


@pytest.mark.slow
def test_a_float32_model_without_flags_gets_autocast_from_unsloth(probe):
    # trainer_precision(float32, on_gpu=True) asks for neither flag; Unsloth's trainer then picks
    # the card's autocast itself (the model was not marked as a float32 request here).
    assert probe["guard"]["sm_75"]["float32_no_flags"]["mixed_precision"] == "fp16"
    assert probe["guard"]["sm_120"]["float32_no_flags"]["mixed_precision"] == "bf16"


@pytest.mark.slow
def test_the_guard_reads_the_dtype_where_model_dtype_reads_it(probe):
    guard = probe["guard_source"]
    assert "getattr(model.config, 'dtype', None) or getattr(model.config, 'torch_dtype', None)" in guard
    assert "model.get_input_embeddings().weight.dtype" in guard


def test_load_dtype_is_unsloths_rule():
    """Unsloth loads float16 below compute capability 8 and bfloat16 from 8 on (dtype=None)."""
    from grpolab.model.precision import load_dtype

    gpu_init = _site_source("unsloth/_gpu_init.py")
    utils = _site_source("unsloth/models/_utils.py")
    loader = _site_source("unsloth/models/loader.py")
    llama = _site_source("unsloth/models/llama.py")
    assert "SUPPORTS_BFLOAT16 = _cuda_cap is not None and _cuda_cap[0] >= 8" in gpu_init
    assert "SUPPORTS_BFLOAT16 = _bf16_cap is not None and _bf16_cap[0] >= 8" in utils
    for source in (loader, llama):
        assert "dtype = torch.float16 if not SUPPORTS_BFLOAT16 else torch.bfloat16" in source
    import torch

    assert [load_dtype(c) for c in ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (12, 0))] == [
        torch.float16
    ] * 2 + [torch.bfloat16] * 4


@pytest.mark.slow
@gpu_only(
    "Unsloth loads the tiny model in the dtype load_dtype() names for this card, and trains with its flags"
)
def test_load_dtype_matches_what_unsloth_loads_on_this_card(tmp_path):
    code = (
        "import torch\n"
        "from unsloth import FastLanguageModel\n"
        "from grpolab.model.precision import load_dtype, model_dtype\n"
        "from grpolab.tiny_model import ensure_tiny_model\n"
        "model, _ = FastLanguageModel.from_pretrained(model_name=str(ensure_tiny_model()), max_seq_length=256,\n"
        "    load_in_4bit=True, dtype=None, fast_inference=False)\n"
        "cap = torch.cuda.get_device_capability()\n"
        "assert model_dtype(model) == load_dtype(cap), (model_dtype(model), cap)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "UNSLOTH_COMPILE_LOCATION": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


@pytest.mark.slow
def test_keep_float32_sets_the_mark_unsloths_gpu_loader_sets_and_its_guard_reads(probe):
    utils = _site_source("unsloth/models/_utils.py")
    assert "model._unsloth_user_float32 = bool(requested)" in utils  # _mark_requested_float32
    assert "user_float32 = bool(getattr(model, '_unsloth_user_float32', False))" in probe["guard_source"]


@pytest.mark.slow
def test_on_the_cpu_a_float32_model_needs_keep_float32(probe):
    # Without the stamp Unsloth's trainer turns the CPU profile's float32 model into fp16 autocast.
    assert probe["unsloth_trainer"]["fp16"] is True and probe["unsloth_trainer"]["mixed_precision"] == "fp16"
    kept = probe["unsloth_trainer_float32"]
    assert (kept["fp16"], kept["bf16"], kept["mixed_precision"]) == (False, False, "no")


# --- The reference policy -----------------------------------------------------------------------


@pytest.mark.slow
def test_trl_adds_a_ref_adapter_block_that_unsloth_removes(probe):
    trl_source, generated = probe["trl_source_text"], probe["generated_source"]
    block = "elif is_peft_model(model) and args.beta != 0.0:"
    assert block in trl_source and 'model.add_adapter("ref", default_config)' in trl_source
    assert block not in generated and 'add_adapter("ref"' not in generated
    assert "# PEFT initialization logic removed via script for trl >= 1.4.0" in generated


@pytest.mark.slow
def test_the_reference_is_the_base_with_adapters_disabled(probe):
    unsloth, trl = probe["unsloth_trainer"], probe["trl_trainer"]
    assert unsloth["beta"] == trl["beta"] == 0.02
    assert unsloth["adapters"] == ["default"] and not unsloth["ref_model"]
    # TRL 1.15 on the same model: a frozen copy of the adapter named "ref".
    assert trl["adapters"] == ["default", "ref"] and not trl["ref_model"]


@pytest.mark.slow
def test_unsloth_keeps_lora_in_float32_where_trl_casts_it_to_bf16(probe):
    # TRL casts trainable params of a quantized model to bf16 (the QLoRA recipe); Unsloth's generated
    # trainer disables that block, so the adapter stays in the dtype PEFT gave it.
    assert probe["trl_trainer"]["lora_dtype"] == "torch.bfloat16"
    assert probe["unsloth_trainer"]["lora_dtype"] == "torch.float32"


# --- The config ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_unsloths_config_defaults_differ_from_trls(probe):
    config = probe["config"]
    assert config["trl"] == {
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "scale_rewards": "group",
        "vllm_importance_sampling_correction": True,
    }
    assert config["unsloth"] == {
        "warmup_steps": 0.1,
        "weight_decay": 0.001,
        "scale_rewards": "none",
        "vllm_importance_sampling_correction": False,
    }
    # Under dr_grpo Unsloth overrides an explicit "group" too; TRL keeps it. None is Unsloth's way
    # to keep the group's std scaling ("Set it to `None` to keep scaling"): it ends up "group".
    assert (config["unsloth_group"], config["trl_group"]) == ("none", "group")
    assert config["unsloth_none"] == "group"


@pytest.mark.slow
def test_explicit_values_survive_unsloths_config(probe):
    assert probe["config"]["unsloth_explicit"] == {
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "scale_rewards": "none",
        "vllm_importance_sampling_correction": False,
    }


# --- Log-probs ----------------------------------------------------------------------------------


def _function_source(source: str, name: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node)
    raise AssertionError(f"no function {name} in the generated trainer")


@pytest.mark.slow
def test_the_generated_trainer_scores_with_unsloth_zoos_chunked_hidden_states_logprobs(probe):
    body = _function_source(probe["generated_source"], "_get_per_token_logps_and_entropies")
    # Old and reference log-probs: hidden states x lm_head through unsloth_zoo, no full logits.
    assert "grpo_chunked_hidden_states_logprobs as chunked_hidden_states_selective_log_softmax" in body
    assert "lm_head = output_embeddings.weight" in body


@pytest.mark.slow
def test_unsloth_zoos_logprobs_are_exact_and_take_the_fused_linear_path(probe):
    logprobs = probe["logprobs"]
    assert logprobs["max_abs_error"] < 1e-4
    # By default (UNSLOTH_FUSED_LINEAR unset) unsloth_chunked_logprobs hands over to
    # fused_linear.fused_linear_logprobs, whose chunk is fused_linear_rows(), not chunked_logprob_rows().
    assert logprobs["fused_linear_default"] is True
    assert logprobs["fused_linear_calls"] >= 1


@pytest.mark.slow
def test_the_budgets_chunk_rule_is_unsloth_zoos_fused_linear_rows(probe):
    """The budget's logits line is one chunk of the fused path: fused_linear_rows x vocab x 4 B."""
    from budgets.arithmetic import FUSED_BYTES_PER_LOGIT, FUSED_CHUNK_BYTES, fused_linear_rows

    logprobs = probe["logprobs"]
    assert logprobs["chunk_gb_default"] * 1024**3 == FUSED_CHUNK_BYTES
    assert logprobs["fp32_logits_default"] == "1" and FUSED_BYTES_PER_LOGIT == 4
    for vocab, hidden, rows, zoo_rows in probe["chunk_rows"]:
        assert fused_linear_rows(rows, hidden, vocab) == zoo_rows, (vocab, hidden, rows)
