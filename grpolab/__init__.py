"""The machinery the labs share, one module per job.

The run, in order: flags (the flags every chapter has), settings (the book's recipe.toml, then a
chapter's lab.toml, then the command line; one validator), layouts (how a chapter's generation and
training share the cards), prepare (device, card, sheet and prompts before anything loads), cuda_env
(the standby switch and Unsloth's allocator, before CUDA starts), session (`run_lab`: the MLflow run
around the lesson), run (the lesson's `Run`). Beside it: device (which GPU, read through NVML),
policy (loading through Unsloth), unsloth_trainer (Unsloth's generated GRPO trainer on both
profiles), precision (bf16 / fp16 / fp32 as the model loaded), numerics (the CPU profile's arithmetic,
the same on every machine), tiny_model (the CPU stand-in and its shipped weights, `standins/`),
rehearsal (the model's shape with random weights), probe (the memory sampler and phases), tensors
(measuring the exact lines), vllm_ledger (vLLM's own start-up figures), meter (what a run measures
while it trains), comparison (budget vs measured, table, chart), oom (recognising and logging
out-of-memory), endings (how a run ended: decided here, written by tracking), store (the MLflow store
checked first), tracking (MLflow), evaluate (held-out accuracy), doctor (what held learning back),
run_result (a run's result file, for the process that started it), sweep (a grid of runs,
chapter 2: a package, one module per job), arms (one chapter trained several ways in one process,
each a nested run, chapter 4), chapters (another chapter's train.py as a module), claims (what a
chapter claims of its CPU run, read back), matrix (the claims on every seed and emulated machine), atomic
(saving whole or not at all), paths and errors (one home each).

`import grpolab` stays light: `Run`, `run_lab` and `exit_process` are imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Run", "exit_process", "run_lab"]


def __getattr__(name: str) -> Any:
    if name == "Run":
        from grpolab.run import Run

        return Run
    if name == "exit_process":
        from grpolab.endings import exit_process

        return exit_process
    if name == "run_lab":
        from grpolab.session import run_lab

        return run_lab
    raise AttributeError(f"module 'grpolab' has no attribute {name!r}")
