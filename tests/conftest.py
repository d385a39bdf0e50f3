"""Fixtures of the harness's own tests (tests/); the suite's shared ones are in the root conftest.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fake_gpu import CARDS, CUDA_INITIALISING, FakeNVML


@pytest.fixture
def gpu_machine(monkeypatch):
    """A machine with two cards as this process sees it before CUDA is up: torch.cuda is available,
    not initialised, and every call that would initialise it is recorded in `calls`."""
    import torch

    import grpolab.memory.device

    calls: list[str] = []
    cards = [
        {**CARDS[0], "capability": (8, 9)},
        {**CARDS[1], "capability": (12, 0), "procs": [SimpleNamespace(pid=1, usedGpuMemory=2 << 30)]},
    ]
    nvml = FakeNVML(cards, calls=calls)
    monkeypatch.setattr(grpolab.memory.device, "_nvml", lambda: nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in CUDA_INITIALISING:
        monkeypatch.setattr(
            torch.cuda, name, lambda *a, _n=name, **k: calls.append(f"cuda.{_n}"), raising=False
        )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return SimpleNamespace(calls=calls, nvml=nvml, cards=cards)
