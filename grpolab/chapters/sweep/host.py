"""Where the sweep's cells run: the card every cell's sheet is computed on, chosen before any runs.

On a GPU it is the card the harness picks for a run (`grpolab.lab.prepare.card_plan`, the one function
that chooses it). On a CPU it is the sweep's own small host,
so that the tiny model's grid has an edge at all. The card is read through NVML alone: this process
never creates a CUDA context, which would sit on the card under every cell.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from budgets import compute, get_card
from budgets.units import GIB
from grpolab.config.settings import LabSettingsError, lab_settings


@dataclass
class Host:
    """Where the cells run: the card the sheets are computed on, and how it was chosen."""

    profile: str
    card: Any = None  # a budgets Card; None: the settings' own `gpu`
    other_processes_gib: float = 0.0
    note: str = ""
    memory_cap_gib: float | None = None  # the cap a refused cell runs under when it runs anyway


def cpu_host(lab_dir: Path, overrides: dict[str, Any], cap_gib: float) -> Host:
    """A small host for the CPU sweep: what the sheet says the process holds once loaded (the start
    phase: runtime and weights), the kernel caches it keeps for a long run, plus `cap_gib` for what the
    knobs move. The real host has tens of GiB: against it, no cell of the tiny model is ever refused."""
    sheet = compute(lab_settings(lab_dir, "cpu", overrides).plan())
    caches = sheet.line("host_shape_caches")
    held = sheet.phases["start"] + (caches.bytes if caches else 0)
    card = replace(
        get_card("cpu"),
        name="cpu-capped",
        label=f"this CPU host, capped: {held / GIB:.2f} GiB held + {cap_gib:g} GiB for the step",
        memory_bytes=held + int(cap_gib * GIB),
        note="the sweep's own host: the start phase + host_shape_caches + --memory-cap-gib",
    )
    return Host("cpu", card, 0.0, card.label, cap_gib)


def find_host(lab_dir: Path, profile: str, overrides: dict[str, Any], cap_gib: float) -> Host:
    """The card every cell's sheet is computed on, as the harness's `prepare` picks it for a run (with
    what other processes hold on it, read through NVML: detect() creates no CUDA context, so nothing
    of this process sits on the card under the cells); on a CPU, the sweep's capped host (`cap_gib`)."""
    from grpolab.memory.device import DeviceError, detect

    if profile in ("auto", "gpu"):
        try:
            found = detect()
        except DeviceError as err:
            raise LabSettingsError(str(err)) from None
        if found.on_gpu:
            from grpolab.lab.prepare import card_plan  # the harness's own choice, for one run

            plan, note, other_note = card_plan(lab_settings(lab_dir, "gpu", overrides), found, "gpu")
            if other_note:
                print(other_note, flush=True)
            card = get_card(plan.gpu) if isinstance(plan.gpu, str) else plan.gpu
            return Host("gpu", card, plan.other_processes_gib, note)
        if profile == "gpu":
            raise LabSettingsError(
                "--profile gpu needs a CUDA GPU and torch sees none: run on a machine with an NVIDIA GPU, or "
                "drop --profile to sweep the CPU stand-in"
            )
    if cap_gib <= 0:
        raise LabSettingsError(f"memory_cap_gib: the CPU sweep needs a positive cap, got {cap_gib}")
    return cpu_host(lab_dir, overrides, cap_gib)
