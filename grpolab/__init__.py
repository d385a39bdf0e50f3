"""The machinery the labs share, one module per job.

settings (lab.toml, flags, checks), device (which GPU, read through NVML before CUDA is up),
cuda_env (the standby switch and Unsloth's allocator configuration, before CUDA starts), policy
(loading through Unsloth), unsloth_trainer (Unsloth's generated GRPO trainer on both profiles),
precision (bf16 / fp16 / fp32 as the model loaded), tiny_model (the CPU stand-in), rehearsal (the
model's shape with random weights), probe (the memory sampler and phases), tensors (measuring the
exact lines), vllm_ledger (vLLM's own start-up figures), meter (what a run measures while it
trains), comparison (budget vs measured, table, chart), oom (recognising and diagnosing
out-of-memory), endings (how a run ends), store (the MLflow store checked first), tracking (MLflow),
evaluate (held-out accuracy), doctor (what held learning back), session (the chapter harness:
`run_lab`), run_result (a run's result file, for the process that started it), sweep (a grid of
runs, chapter 2: a package, one module per job), chapters (another chapter's train.py as a module),
atomic (saving whole or not at all).

`import grpolab` stays light: `Run` and `run_lab` are imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Run", "run_lab"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from grpolab import session

        return getattr(session, name)
    raise AttributeError(f"module 'grpolab' has no attribute {name!r}")
