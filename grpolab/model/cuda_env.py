"""The process's CUDA set-up, done before anything initialises CUDA: Unsloth's standby switch and
the allocator configuration Unsloth chooses.

Two settings are read once and then fixed for the life of the process:
- `UNSLOTH_VLLM_STANDBY` is read by unsloth_zoo when it is imported (it decides the allocator
  configuration below and patches vLLM's sleep mode), and again by Unsloth's loader, which refuses
  `unsloth_vllm_standby=True` unless the variable is "1".
- `PYTORCH_ALLOC_CONF` is set by unsloth_zoo at import (`expandable_segments:True` without standby;
  without expandable segments under standby, which vLLM's CuMemAllocator cannot share a process
  with) and read by torch's caching allocator when CUDA initialises.

So the harness sets the standby variable from the lab's setting, then imports Unsloth, all before
the first CUDA call (grpolab.memory.device reads the card through NVML alone). `configure` does both and
returns what the run really got, for its tags: a run whose allocator differs from a normal Unsloth
run's (CUDA initialised earlier in this process, a notebook's second run) says so.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from grpolab.config.settings import LabSettingsError

STANDBY_ENV = "UNSLOTH_VLLM_STANDBY"
ALLOC_ENV = "PYTORCH_ALLOC_CONF"


@dataclass(frozen=True)
class CudaEnv:
    """What the process runs with: the standby variable, the allocator configuration Unsloth left
    for torch, and whether CUDA was already up (then torch kept an earlier configuration)."""

    standby: bool
    alloc_conf: str
    cuda_initialised_before: bool
    note: str = ""

    def tags(self) -> dict[str, str]:
        return {
            "unsloth_vllm_standby_env": "1" if self.standby else "0",
            "cuda_alloc_conf": self.alloc_conf or "torch's defaults",
            "cuda_alloc_conf_applied": (
                "no: CUDA was initialised before Unsloth configured the allocator"
                if self.cuda_initialised_before
                else "yes: set before CUDA initialised"
            ),
        }


def configure(standby: bool) -> CudaEnv:
    """Set UNSLOTH_VLLM_STANDBY from the lab's setting, then import Unsloth (which configures the
    allocator): before anything touches CUDA. Refuses, in one line, a standby value that differs
    from the one Unsloth was already imported with in this process."""
    import torch

    wanted = "1" if standby else "0"
    note = ""
    if "unsloth" in sys.modules:
        imported_with = os.environ.get(STANDBY_ENV, "0")
        if (imported_with != "0") != standby:
            raise LabSettingsError(
                f"unsloth_vllm_standby: Unsloth was imported in this process with {STANDBY_ENV}={imported_with} "
                f"and reads it once, at import: restart the Python process (or the notebook's kernel) to run "
                f"with --unsloth-vllm-standby {'true' if standby else 'false'}"
            )
    elif os.environ.get(STANDBY_ENV, "0") != wanted and STANDBY_ENV in os.environ:
        note = (
            f"{STANDBY_ENV}={os.environ[STANDBY_ENV]} in the environment is replaced by the lab's "
            f"unsloth_vllm_standby = {'true' if standby else 'false'} (pass --unsloth-vllm-standby to change it)"
        )
    cuda_before = bool(torch.cuda.is_initialized())
    os.environ[STANDBY_ENV] = wanted
    _import_unsloth()
    return CudaEnv(standby, os.environ.get(ALLOC_ENV, ""), cuda_before, note)


def _import_unsloth() -> None:
    """Unsloth, through the policy module (which first keeps a CPU-only process from importing vLLM)."""
    import grpolab.model.policy  # noqa: F401


def allocator_settings() -> str:
    """The settings torch's CUDA allocator really runs with, read from torch (GPU, once CUDA is up)."""
    import torch

    try:
        return str(torch._C._accelerator_getAllocatorSettings())
    except Exception:  # a torch without the query
        return "unknown"
