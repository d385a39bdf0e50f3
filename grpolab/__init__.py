"""The machinery the labs share, one module per job.

settings (lab.toml, flags, checks), device (which GPU, NVML), policy (loading through Unsloth),
tiny_model (the CPU stand-in), probe (the memory sampler and phases), tensors (measuring the
exact lines), meter (what a run measures while it trains), comparison (budget vs measured, table,
chart), oom (recognising and diagnosing out-of-memory), tracking (MLflow), session (the chapter
harness: `run_lab`), atomic (saving whole or not at all).

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
