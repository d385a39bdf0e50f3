"""Finding the device: NVML matched to torch by UUID, an unusable GPU named with its driver, the card
the sheet is checked against. NVML is a stand-in here (no GPU); the real path is the same code."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from budgets.cards import card_for_device
from grpolab.memory import device as dev

from fake_gpu import CARDS, FakeNVML


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


# --- the card is read before CUDA is up (stand-ins: tests/conftest.py's gpu_machine) ---------------
def test_detect_reads_the_card_through_nvml_and_never_initialises_cuda(gpu_machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    device = dev.detect()
    assert not [c for c in gpu_machine.calls if c.startswith("cuda.")], gpu_machine.calls
    assert (device.name, device.total_bytes, device.capability) == (
        "NVIDIA GeForce RTX 5080",
        16 << 30,
        (12, 0),
    )
    assert device.uuid == "GPU-bbbb-2222" and device.driver == "580.65.06"
    # Before this process touched CUDA, all memory in use is other processes'.
    assert device.other_measured and device.other_bytes_at_start == 2 << 30
    assert "1 other process(es) listed" in device.other_note
    assert device.tags()["other_processes_gib_at_start"] == "2.00"


@pytest.mark.parametrize(
    ("visible", "name"),
    [
        (None, "NVIDIA GeForce RTX 4090"),
        ("1,0", "NVIDIA GeForce RTX 5080"),
        ("GPU-bbbb", "NVIDIA GeForce RTX 5080"),  # a UUID's prefix, as CUDA accepts it
        ("GPU-aaaa-1111,GPU-bbbb-2222", "NVIDIA GeForce RTX 4090"),
    ],
)
def test_cuda_visible_devices_chooses_the_card_as_cuda_does(gpu_machine, monkeypatch, visible, name):
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert dev.detect().name == name


def test_a_visible_uuid_no_card_has_is_one_line(gpu_machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffff")
    with pytest.raises(dev.DeviceError, match="no card whose UUID starts with 'GPU-ffff'"):
        dev.detect()


def test_cuda_numbering_the_cards_otherwise_is_followed_once_cuda_is_up(gpu_machine, monkeypatch):
    import torch

    device = dev.detect()  # NVML's first card: the RTX 4090
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="bbbb-2222"))
    note = device.verify_cuda()
    assert device.name == "NVIDIA GeForce RTX 5080" and device._handle is gpu_machine.cards[1]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in note and "\n" not in note
    assert device.verify_cuda() == ""  # now they agree


def test_other_processes_in_a_container_and_after_cuda_is_up(gpu_machine, monkeypatch):
    import os

    nvml, card = gpu_machine.nvml, {**CARDS[1], "used": 3 << 30}
    used, note = dev.other_processes_bytes(nvml, card, cuda_initialised=False)
    assert used == 3 << 30 and "lists no process (a container hides them)" in note
    # CUDA already up in this process (a notebook's second run): its own share is subtracted...
    card["procs"] = [SimpleNamespace(pid=os.getpid(), usedGpuMemory=1 << 30)]
    assert dev.other_processes_bytes(nvml, card, cuda_initialised=True)[0] == 2 << 30
    # ... unless NVML cannot see this pid: then nobody can tell, and the user's value is used.
    card["procs"] = []
    used, note = dev.other_processes_bytes(nvml, card, cuda_initialised=True)
    assert used is None and "cannot be told" in note

    def refuses(handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(nvml, "nvmlDeviceGetMemoryInfo", refuses)
    assert dev.other_processes_bytes(nvml, card, cuda_initialised=False)[0] is None


@pytest.mark.parametrize(
    ("measured_gib", "given_gib", "taken", "words"),
    [
        (1.0, 0.0, 1.0, "1.00 GiB measured"),
        (1.0, 3.0, 3.0, "3.00 GiB from --other-processes-gib, more than the 1.00 GiB measured"),
        (2.0, 0.5, 2.0, "more than the 0.50 GiB from --other-processes-gib: the sheet takes the larger"),
        (None, 1.5, 1.5, "not measured"),
    ],
)
def test_the_users_other_processes_gib_is_never_silently_replaced(measured_gib, given_gib, taken, words):
    device = dev.Device(
        "cuda",
        other_bytes_at_start=int((measured_gib or 0) * (1 << 30)),
        other_measured=measured_gib is not None,
        other_note="NVML",
    )
    gib, note = dev.resolve_other_processes(device, given_gib, "--other-processes-gib")
    assert gib == taken and words in note and "\n" not in note


def test_the_lab_keeps_a_given_other_processes_gib_above_the_measured_one(gpu_machine, monkeypatch, capsys):
    """The harness's `prepare` on a GPU: the sheet's other_processes line is the larger of NVML's 2 GiB
    and the flag, and the line printed says which."""
    from grpolab.lab.session import parser, prepare

    from suite import LAB_DIR

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")

    def other_line(flags):
        args = parser("").parse_args(["--profile", "gpu", "--ignore-budget", *flags])
        _, _, sheet, _ = prepare(LAB_DIR, args)
        return sheet.line("other_processes").bytes / (1 << 30)

    assert other_line(["--other-processes-gib", "3"]) == pytest.approx(3.0)
    assert "3.00 GiB from --other-processes-gib, more than the 2.00 GiB measured" in capsys.readouterr().out
    assert other_line(["--other-processes-gib", "0.5"]) == pytest.approx(2.0)
    assert other_line([]) == pytest.approx(2.0)
    assert not [c for c in gpu_machine.calls if c.startswith("cuda.")], gpu_machine.calls
