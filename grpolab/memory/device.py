"""The device a lab runs on: which GPU (or none), how much memory, and how to read it.

`detect()` is the one place that decides, and it never initialises CUDA in this process. Two things
must happen before CUDA is up, and both are lost once it is: reading what *other* processes hold on
the card (afterwards NVML's figure includes this process's own context), and configuring torch's
caching allocator, which reads PYTORCH_ALLOC_CONF once, when CUDA initialises (Unsloth sets it when
imported: grpolab.model.cuda_env). So the card is read from NVML alone (name, memory, compute capability,
driver, what is in use), chosen the way CUDA_VISIBLE_DEVICES chooses it (an index or a UUID), and
checked against torch's device 0 by UUID once CUDA is up (`Device.verify_cuda`). When NVML sees a
GPU that torch cannot use, the driver is usually too old for this torch's CUDA: that is an error
with the versions, not a silent fall back to the CPU stand-in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from budgets.units import GIB

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
    other_measured: bool = True  # False: NVML could not tell (other_note says why)
    other_note: str = ""  # how other_bytes_at_start was read
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
        note = self.verify_cuda()  # CUDA is up now: read the card torch really uses
        if note:
            print(note, flush=True)
        return self.process_bytes() - int(torch.cuda.memory_reserved())

    def tags(self) -> dict[str, str]:
        if not self.on_gpu:
            return {"gpu_name": "cpu", "gpu_driver": "cpu", "gpu_memory_gib": "0"}
        import torch

        return {
            "gpu_name": self.name,
            "gpu_driver": self.driver,
            "gpu_memory_gib": f"{self.total_bytes / GIB:.2f}",
            "gpu_uuid": self.uuid,
            "gpu_capability": ".".join(map(str, self.capability or ())),
            "cuda_runtime": str(torch.version.cuda),
            "other_processes_gib_at_start": (
                f"{self.other_bytes_at_start / GIB:.2f}" if self.other_measured else "not measured"
            ),
            "other_processes_how": self.other_note,
        }

    def verify_cuda(self) -> str:
        """Once CUDA is up: check that torch's device 0 is the card NVML was read from (CUDA numbers
        cards fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML by bus), and follow torch's if
        not. Returns a note for the user, empty when they agree."""
        import torch

        uuid = str(torch.cuda.get_device_properties(0).uuid)
        if normalise_uuid(uuid) == normalise_uuid(self.uuid):
            return ""
        self._handle = nvml_handle_for(self._nvml, uuid)
        before, self.uuid = self.name, uuid
        self.name = _text(self._nvml.nvmlDeviceGetName(self._handle))
        return (
            f"CUDA's device 0 is {self.name} ({uuid}), not {before}, the card NVML read first (set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID to number cards as NVML does): the probe reads CUDA's card"
        )


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
    """The GPU torch will train on (CUDA device 0), else the CPU; DeviceError when a GPU is there but
    this torch cannot use it. Reads NVML only: CUDA is not initialised here (see the module's doc).
    `torch.cuda.is_available()` asks the driver how many devices there are (cuInit), which creates
    no context and leaves torch's CUDA state, and so its allocator, untouched."""
    import torch

    nvml = _nvml()
    if not torch.cuda.is_available():
        if nvml is not None and not gpus_hidden() and nvml.nvmlDeviceGetCount() > 0:
            raise DeviceError(unusable_gpu_message(nvml, torch.version.cuda))
        return Device("cpu")
    if nvml is None:
        raise DeviceError(
            "torch sees a GPU but NVML does not answer: install the NVIDIA driver's NVML (libnvidia-ml)"
        )
    handle = nvml.nvmlDeviceGetHandleByIndex(visible_nvml_index(nvml))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    device = Device(
        "cuda",
        name=_text(nvml.nvmlDeviceGetName(handle)),
        total_bytes=int(memory.total),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        capability=tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)),
        driver=_text(nvml.nvmlSystemGetDriverVersion()),
        _nvml=nvml,
        _handle=handle,
    )
    other, device.other_note = other_processes_bytes(nvml, handle, torch.cuda.is_initialized())
    device.other_measured = other is not None
    device.other_bytes_at_start = other or 0
    return device


def visible_nvml_index(nvml) -> int:
    """NVML's index of CUDA's device 0, read from CUDA_VISIBLE_DEVICES as CUDA reads it: unset, the
    first card; else its first entry, an index or a UUID (or a UUID's prefix)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return 0
    first = value.split(",")[0].strip()
    if first.isdigit():
        return int(first)
    wanted = normalise_uuid(first)
    for index in range(nvml.nvmlDeviceGetCount()):
        if normalise_uuid(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))).startswith(wanted):
            return index
    raise DeviceError(
        f"CUDA_VISIBLE_DEVICES={value}: NVML lists no card whose UUID starts with {first!r}: check the variable "
        "against nvidia-smi -L"
    )


def other_processes_bytes(nvml, handle, cuda_initialised: bool) -> tuple[int | None, str]:
    """What other processes hold on the card, in bytes, and how it was read; None when NVML cannot tell.

    Before this process has initialised CUDA, everything in use on the card is someone else's
    (nvidia-smi's "used": other processes, and the driver's own reservation, which is not free for
    vLLM either). NVML's list of processes only explains it: in a container NVML lists other
    containers' processes without their pids, or none at all. Once CUDA is up in this process (a
    notebook that ran a lab before), this process's share is subtracted when NVML lists this pid;
    when it does not, nobody can tell the two apart."""
    try:
        used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception as err:  # some virtualised GPUs refuse the query
        return None, f"NVML cannot read the card's memory ({type(err).__name__})"
    processes = _listed_processes(nvml, handle)
    mine = sum(int(p.usedGpuMemory or 0) for p in processes if p.pid == os.getpid())
    others = [p for p in processes if p.pid != os.getpid()]
    if cuda_initialised:
        if mine:
            return max(used - mine, 0), "NVML's memory in use less this process's own (CUDA was up already)"
        return None, (
            "CUDA was already initialised in this process and NVML does not list this pid (a container): "
            "this process's share cannot be told from other processes'"
        )
    before = "NVML's memory in use before this process touched CUDA"
    if not processes and used > 0:
        return used, f"{before}; NVML lists no process (a container hides them)"
    return used, f"{before}; {len(others)} other process(es) listed"


def _listed_processes(nvml, handle) -> list:
    listed: list = []
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            listed += list(getattr(nvml, query)(handle))
        except Exception:  # not supported on this card or driver
            continue
    return listed


def resolve_other_processes(device: Device, given_gib: float, given_by: str) -> tuple[float, str]:
    """The GiB of other processes the sheet takes: the larger of what NVML measured and what the user
    gave (`given_by`: where the given value comes from), and the line that says which and why. A
    value the user gave is never silently replaced."""
    if not device.other_measured:
        return given_gib, (
            f"other processes: not measured ({device.other_note}); the sheet takes {given_gib:.2f} GiB from "
            f"{given_by} (pass --other-processes-gib with what nvidia-smi shows)"
        )
    measured = device.other_bytes_at_start / GIB
    if given_gib > measured:
        return given_gib, (
            f"other processes: {given_gib:.2f} GiB from {given_by}, more than the {measured:.2f} GiB measured "
            f"({device.other_note}): the sheet takes the larger, {given_gib:.2f} GiB"
        )
    note = f"other processes: {measured:.2f} GiB measured ({device.other_note})"
    if given_gib > 0:
        note += f", more than the {given_gib:.2f} GiB from {given_by}: the sheet takes the larger"
    return measured, note


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
