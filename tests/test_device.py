"""Finding the device: NVML matched to torch by UUID, an unusable GPU named with its driver, the card
the sheet is checked against. NVML is a stand-in here (no GPU); the real path is the same code."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from budgets.cards import card_for_device
from grpolab import device as dev


class FakeNVML:
    """pynvml's calls the module makes, over a list of cards (the hardware this machine lacks)."""

    def __init__(self, cards, driver="580.65.06"):
        self.cards, self.driver = cards, driver

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


CARDS = [
    {"uuid": "GPU-aaaa-1111", "name": "NVIDIA GeForce RTX 4090", "used": 1 << 30, "total": 24 << 30},
    {"uuid": "GPU-bbbb-2222", "name": "NVIDIA GeForce RTX 5080", "used": 2 << 30, "total": 16 << 30},
]


def test_nvml_is_matched_to_torchs_device_by_uuid_not_by_index():
    # CUDA_VISIBLE_DEVICES=1 (or GPU-bbbb-2222): torch's device 0 is NVML's card 1.
    nvml = FakeNVML(CARDS)
    assert dev.nvml_handle_for(nvml, "bbbb-2222") is CARDS[1]  # torch gives the bare UUID
    assert dev.nvml_handle_for(nvml, "GPU-BBBB-2222") is CARDS[1]
    with pytest.raises(dev.DeviceError, match="no card with torch's device UUID"):
        dev.nvml_handle_for(nvml, "cccc")


def test_process_memory_falls_back_to_the_device_less_other_processes():
    card = {**CARDS[1], "used": 7 << 30}
    d = dev.Device("cuda", other_bytes_at_start=2 << 30, _nvml=FakeNVML([card]), _handle=card)
    assert d.process_bytes() == 5 << 30  # NVML cannot see this pid (a container): 7 - 2 GiB
    import os

    card["procs"] = [SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 << 30)]
    assert d.process_bytes() == 3 << 30


@pytest.mark.parametrize(
    ("driver", "cuda", "words"),
    [
        (
            "535.104.05",
            "13.0",
            "driver 535.104.05, but this torch is built for CUDA 13.0, which needs driver 580",
        ),
        ("580.65.06", "13.0", "torch.cuda.is_available() is False"),
    ],
)
def test_a_gpu_torch_cannot_use_is_one_line_with_the_driver(driver, cuda, words):
    message = dev.unusable_gpu_message(FakeNVML(CARDS, driver), cuda)
    assert words in message and "\n" not in message and "--profile cpu" in message


def test_detect_refuses_a_gpu_that_torch_cannot_use(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(dev, "_nvml", lambda: FakeNVML(CARDS, "535.104.05"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(dev.DeviceError, match="needs driver 580"):
        dev.detect()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # GPUs hidden on purpose: the CPU stand-in
    assert dev.detect().kind == "cpu"
    monkeypatch.setattr(dev, "_nvml", lambda: None)  # no driver at all: the CPU stand-in
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert dev.detect().kind == "cpu"


def test_the_card_is_the_catalogs_with_its_measured_memory():
    card, how = card_for_device("NVIDIA GeForce RTX 5080", 16 << 30)
    assert (card.name, card.memory_bytes, card.bandwidth) == ("rtx-5080", 16 << 30, 960e9)
    assert "catalog entry rtx-5080" in how
    card, how = card_for_device("Tesla T4", 15102 << 20)
    assert card.name == "t4"
    card, how = card_for_device("NVIDIA A10G", 23028 << 20)
    assert card.memory_bytes == 23028 << 20 and "not in the catalog" in how
