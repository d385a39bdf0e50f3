"""The device a lab runs on: which GPU (or none), how much memory, and how to read it.

`detect()` is the one place that decides. A GPU is read through torch (what trains) and NVML (what
the card really holds), matched by UUID, so CUDA_VISIBLE_DEVICES in any form (indices or
GPU-<uuid>) and NVML's own numbering cannot disagree. When NVML sees a GPU that torch cannot use,
the driver is usually too old for this torch's CUDA: that is an error with the versions, not a
silent fall back to the CPU stand-in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# The oldest driver each CUDA runtime of torch's wheels needs (NVIDIA's CUDA toolkit release notes).
MIN_DRIVER = {"13.0": 580, "12.9": 575, "12.8": 570, "12.6": 560, "12.4": 550, "12.1": 530}


class DeviceError(RuntimeError):
    """The GPU cannot be used as it is; the message says why and what to do, on one line."""


@dataclass
class Device:
    kind: str  # "cuda" or "cpu"
    name: str = "cpu"
    total_bytes: int = 0
    driver: str = ""
    uuid: str = ""
    capability: tuple[int, int] | None = None
    other_bytes_at_start: int = 0  # memory other processes held when the lab started
    _nvml: Any = field(default=None, repr=False)
    _handle: Any = field(default=None, repr=False)

    @property
    def on_gpu(self) -> bool:
        return self.kind == "cuda"

    def used_bytes(self) -> int:
        """Device memory in use by every process (nvidia-smi's figure)."""
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def process_bytes(self) -> int:
        """This process's device memory. Where NVML cannot see this pid (some containers), the
        device's use less what other processes held at start."""
        pid = os.getpid()
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if proc.pid == pid and proc.usedGpuMemory:
                return int(proc.usedGpuMemory)
        return max(self.used_bytes() - self.other_bytes_at_start, 0)

    def measure_context(self) -> int:
        """The CUDA context: this process's device memory once CUDA is up with one small tensor,
        less what torch reserved for it; one source (NVML's figure for this process)."""
        import torch

        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        return self.process_bytes() - int(torch.cuda.memory_reserved())

    def tags(self) -> dict[str, str]:
        if not self.on_gpu:
            return {"gpu_name": "cpu", "gpu_driver": "cpu", "gpu_memory_gib": "0"}
        import torch

        return {
            "gpu_name": self.name,
            "gpu_driver": self.driver,
            "gpu_memory_gib": f"{self.total_bytes / 1024**3:.2f}",
            "gpu_uuid": self.uuid,
            "gpu_capability": ".".join(map(str, self.capability or ())),
            "cuda_runtime": str(torch.version.cuda),
            "other_processes_gib_at_start": f"{self.other_bytes_at_start / 1024**3:.2f}",
        }


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no driver, no library: NVML is simply absent
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def normalise_uuid(uuid: Any) -> str:
    """NVML says 'GPU-8a2f...', torch gives the bare UUID: compare them without the prefix."""
    return _text(uuid).lower().removeprefix("gpu-")


def nvml_handle_for(nvml, uuid: str):
    """NVML's handle of the card with this UUID (NVML numbers cards physically, CUDA by visibility)."""
    wanted = normalise_uuid(uuid)
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        if normalise_uuid(nvml.nvmlDeviceGetUUID(handle)) == wanted:
            return handle
    raise DeviceError(f"NVML lists no card with torch's device UUID {uuid}: check CUDA_VISIBLE_DEVICES")


def required_driver(cuda_runtime: str | None) -> int | None:
    if not cuda_runtime:
        return None
    major_minor = ".".join(cuda_runtime.split(".")[:2])
    return MIN_DRIVER.get(major_minor)


def gpus_hidden() -> bool:
    """CUDA_VISIBLE_DEVICES set to nothing (or -1) hides every GPU on purpose."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.strip() in ("", "-1")


def detect() -> Device:
    """The GPU torch trains on (CUDA device 0), else the CPU; DeviceError when a GPU is there but
    this torch cannot use it."""
    import torch

    nvml = _nvml()
    if not torch.cuda.is_available():
        if nvml is not None and not gpus_hidden() and nvml.nvmlDeviceGetCount() > 0:
            raise DeviceError(unusable_gpu_message(nvml, torch.version.cuda))
        return Device("cpu")
    props = torch.cuda.get_device_properties(0)
    device = Device(
        "cuda",
        name=props.name,
        total_bytes=int(props.total_memory),
        uuid=str(props.uuid),
        capability=(props.major, props.minor),
    )
    if nvml is None:
        raise DeviceError(
            "torch sees a GPU but NVML does not answer: install the NVIDIA driver's NVML (libnvidia-ml)"
        )
    device._nvml, device._handle = nvml, nvml_handle_for(nvml, device.uuid)
    device.driver = _text(nvml.nvmlSystemGetDriverVersion())
    if not torch.cuda.is_initialized():
        # Before this process holds anything, everything in use belongs to other processes.
        device.other_bytes_at_start = device.used_bytes()
    return device


def unusable_gpu_message(nvml, cuda_runtime: str | None) -> str:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    name = _text(nvml.nvmlDeviceGetName(handle))
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    needed = required_driver(cuda_runtime)
    if needed is not None and int(driver.split(".")[0]) < needed:
        return (
            f"NVML sees {name} with driver {driver}, but this torch is built for CUDA {cuda_runtime}, which needs "
            f"driver {needed} or newer: update the NVIDIA driver, or pass --profile cpu to run the CPU stand-in"
        )
    return (
        f"NVML sees {name} (driver {driver}) but torch.cuda.is_available() is False: check CUDA_VISIBLE_DEVICES "
        "and that this torch is a CUDA build, or pass --profile cpu to run the CPU stand-in"
    )
