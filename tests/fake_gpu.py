"""A GPU machine as NVML and torch.cuda show it, for the tests of the order in which they are read:
the hardware this machine lacks, recorded call by call (the real paths are read from the installed
libraries beside these stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace


class FakeNVML:
    """pynvml's calls the module makes, over a list of cards (the hardware this machine lacks). Each
    call is appended to `calls`, so a test can see what was read and in which order."""

    def __init__(self, cards, driver="580.65.06", calls=None):
        self.cards, self.driver = cards, driver
        self.calls = calls if calls is not None else []

    def __getattribute__(self, name):
        if name.startswith("nvml"):
            object.__getattribute__(self, "calls").append(f"nvml.{name}")
        return object.__getattribute__(self, name)

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.cards[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=handle["used"], total=handle["total"])

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return handle.get("procs", [])

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return []

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return handle.get("capability", (12, 0))


CARDS = [
    {"uuid": "GPU-aaaa-1111", "name": "NVIDIA GeForce RTX 4090", "used": 1 << 30, "total": 24 << 30},
    {"uuid": "GPU-bbbb-2222", "name": "NVIDIA GeForce RTX 5080", "used": 2 << 30, "total": 16 << 30},
]


# torch.cuda's calls that initialise CUDA in this process (and with it torch's caching allocator,
# which reads PYTORCH_ALLOC_CONF then, once). A stand-in torch that records them, beside NVML's.
CUDA_INITIALISING = (
    "get_device_properties",
    "get_device_name",
    "get_device_capability",
    "mem_get_info",
    "current_device",
    "set_device",
    "init",
    "_lazy_init",
    "memory_reserved",
    "synchronize",
)
