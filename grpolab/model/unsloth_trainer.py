"""One GRPO trainer on both profiles: Unsloth's generated `UnslothGRPOTrainer`.

On a CUDA machine `import unsloth` rewrites TRL's trainers, so `trl.GRPOTrainer` is Unsloth's
generated class. On a CPU Unsloth loads its CPU backend instead and patches nothing, so the CPU
profile would train through stock TRL, which differs from what a GPU user runs (its config's
defaults, the reference policy, the log-prob kernels, the precision rules). `grpo_trainer_class`
makes both profiles train through Unsloth's class; `keep_float32` keeps the CPU profile's float32
model out of the float16 autocast Unsloth's trainer would otherwise choose on a CPU.

On a CPU this costs time TRL's own trainer would not take: the first call generates Unsloth's
trainers (every TRL trainer, not only GRPO's), and the first step compiles Unsloth's log-prob code,
which unsloth_zoo wraps in torch.compile (`_maybe_compile`, unsloth_zoo/rl_replacements.py) unless
`UNSLOTH_COMPILE_DISABLE` is set (`cache_compiled_loss` lets torch keep that compile between
processes). What the CPU profile's run learns through this trainer, and how
long it takes, is measured on chapter 1's page (labs/grpo-first/README.md, "On a CPU"), with the
command and the date.
Under `loss_type="dr_grpo"` Unsloth's config turns an explicit `scale_rewards="group"` into "none";
`scale_rewards=None` keeps the scaling ("group") (tests/test_unsloth_trainer.py checks both).
"""

from __future__ import annotations

from typing import Any

GENERATED_NAME = "UnslothGRPOTrainer"
# What Dynamo writes into a graph for a `with torch.inference_mode():` inside a compiled function.
INFERENCE_MODE_NODES = (
    "torch.autograd.grad_mode._enter_inference_mode",
    "torch.autograd.grad_mode._exit_inference_mode",
)


def grpo_trainer_class() -> type:
    """The GRPO trainer class the lab trains with, on either profile: Unsloth's generated one.

    After this call `trl.GRPOTrainer` and `trl.GRPOConfig` are Unsloth's generated
    `UnslothGRPOTrainer` and `UnslothGRPOConfig` (the config renamed `GRPOConfig`, with Unsloth's
    defaults: warmup_steps 0.1, weight_decay 0.001, vllm_importance_sampling_correction False, and
    scale_rewards "none" under loss_type "dr_grpo"). Build the GRPOConfig after calling it.

    What it rests on (unsloth 2026.10.9, unsloth_zoo 2026.10.9, trl 1.15.0):

    - On CUDA, `import unsloth` runs unsloth/_gpu_init.py, which imports unsloth.models; importing
      unsloth/models/llama.py calls `PatchFastRL(FastLanguageModel=FastLlamaModel)`, which calls
      `patch_trl_rl_trainers()` (unsloth/models/rl.py). That writes
      `<UNSLOTH_COMPILE_LOCATION>/UnslothGRPOTrainer.py` (default `unsloth_compiled_cache/`,
      relative to the working directory, unsloth_zoo/compiler.py) and rebinds `trl.GRPOTrainer`,
      `trl.trainer.GRPOTrainer`, `trl.trainer.grpo_trainer.GRPOTrainer` and the three GRPOConfig
      names to the generated classes (rl.py, `_patch_trl_rl_trainers_impl`). The
      `import unsloth.models.rl` below is then a no-op.
    - On a CPU, `import unsloth` takes unsloth/_cpu_init.py and never imports unsloth.models. The
      `import unsloth.models.rl` below is an internal import, not a supported CPU feature: it
      imports unsloth.models (its package), which runs the same `PatchFastRL` and so the same
      rewriting (it generates every TRL trainer, not only GRPO's).
      `UNSLOTH_ALLOW_CPU=1` makes `PatchFastRL` skip the rewriting; then this raises.
    - The generated class must keep its name: the check below raises rather than return TRL's
      class silently if a release stops rewriting TRL.

    Unsloth must be imported before TRL's trainer modules are used (as grpolab.model.policy does).
    It also calls `cache_compiled_loss`, so the loss this trainer compiles is cached like any other,
    and `compile_each_graph_once`, so labs that start together on a cold cache compile it once.
    """
    from grpolab.model.compile_once import compile_each_graph_once

    cache_compiled_loss()
    compile_each_graph_once()
    import unsloth  # first: on CUDA this alone rewrites TRL
    import unsloth.models.rl  # noqa: F401  (on CPU: the internal import that runs PatchFastRL)

    # isort: split
    import trl

    trainer = trl.GRPOTrainer
    if trainer.__name__ != GENERATED_NAME:
        raise RuntimeError(
            f"trl.GRPOTrainer is {trainer.__module__}.{trainer.__name__}, not Unsloth's generated "
            f"{GENERATED_NAME}: Unsloth did not rewrite TRL (UNSLOTH_ALLOW_CPU=1 set, or an Unsloth "
            "release that no longer patches TRL this way)"
        )
    return trainer


def cache_compiled_loss() -> None:
    """Let torch's AOTAutograd cache keep Unsloth's compiled GRPO loss from one process to the next.

    Unsloth's loss (`grpo_compute_loss`, unsloth_zoo/rl_replacements.py) computes its metrics under
    `with torch.inference_mode():` inside the compiled function, so Dynamo writes
    `_enter_inference_mode` / `_exit_inference_mode` into the graph. Neither is on the allowlist of
    AOTAutograd's cache (torch 2.13, `check_node_safe` in torch/_functorch/_aot_autograd/
    autograd_cache.py), so every process bypassed the cache and traced the joint forward and backward
    graph again: about 1 s of CPU a forked two-step chapter 1 lab, measured 2026-12-07 (inductor's
    own cache still answered, so the kernels were the same either way). The two calls are safe to cache
    by torch's own rule (their behaviour is fixed by their arguments, constants in the graph that is
    hashed into the key; pytorch/pytorch#191363 proposed adding them), and torch's documented
    `torch._inductor.config.unsafe_marked_cacheable_functions` lets a caller say so, keyed by torch's
    version. Entries a user already set are kept.
    """
    import torch
    import torch._inductor.config as inductor

    marked = dict(inductor.unsafe_marked_cacheable_functions)
    for name in INFERENCE_MODE_NODES:
        marked.setdefault(name, torch.__version__)
    inductor.unsafe_marked_cacheable_functions = marked


def keep_float32(model: Any) -> Any:
    """Mark a model the caller loaded in float32 as such, so Unsloth's trainer trains it in float32.

    Unsloth's GPU loader stamps `model._unsloth_user_float32 = True` when the caller passes
    `dtype=torch.float32` (`_mark_requested_float32`, unsloth/models/_utils.py); its CPU loader
    does not. Without the stamp the generated trainer's precision code (from unsloth/models/rl.py)
    finds a float32 model, no bf16/fp16 flag and no native bf16, and switches the run to float16
    autocast (`args.fp16 = True`, `ACCELERATE_MIXED_PRECISION=fp16`); with it the run stays in
    float32 (`mixed_precision = "no"`, no autocast). `UNSLOTH_FORCE_FLOAT32=1` is not the same:
    it sets `mixed_precision = "no"` but the GRPO scoring passes then latch float16 autocast
    (`_unsloth_grpo_autocast`, "Gemma3 / gpt-oss ... still want float16 autocast").
    Returns the model.
    """
    model._unsloth_user_float32 = True
    return model
