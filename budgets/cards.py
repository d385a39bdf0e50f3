"""Cards: the memory a process can use and the bandwidth that bounds decoding.

`memory_bytes` is the total CUDA reports for the card (`torch.cuda.mem_get_info()[1]`, the MiB
figure nvidia-smi prints): vLLM's `gpu_memory_utilization` is a fraction of exactly this number.
The figures are the usual ones for each card; a card you have can differ by a few MiB (driver,
ECC, display), so pass `--gpu-memory-gb` when you know better.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import BudgetError
from .units import GIB, MIB


@dataclass(frozen=True)
class Card:
    name: str
    label: str
    memory_bytes: int  # total memory the process sees
    bandwidth: float  # bytes per second (memory bandwidth, the decode roofline)
    cuda: bool = True  # False: the CPU profile (host RAM, no CUDA context, no vLLM)
    note: str = ""


def host_ram_bytes() -> int:
    """Total RAM of this machine (the CPU profile's capacity)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# name: (label, total MiB as CUDA reports it, bandwidth GB/s)
_CATALOG: dict[str, tuple[str, int, float]] = {
    "rtx-5080": ("RTX 5080 16 GB", 16303, 960),
    "rtx-4060-ti-16gb": ("RTX 4060 Ti 16 GB", 16380, 288),
    # A T4 has 16 GB of which ECC keeps some: CUDA (and Colab) report 15102 MiB = 14.75 GiB.
    "t4": ("Tesla T4 (ECC on)", 15102, 320),
    "rtx-3090": ("RTX 3090 24 GB", 24576, 936),
    "rtx-4090": ("RTX 4090 24 GB", 24564, 1008),
    "rtx-5090": ("RTX 5090 32 GB", 32607, 1792),
    "rtx-pro-6000": ("RTX PRO 6000 Blackwell Server 96 GB", 97887, 1792),
    "h100-sxm": ("H100 SXM 80 GB", 81559, 3350),
    "h200": ("H200 141 GB", 143771, 4800),
}
_ALIASES = {
    "rtx-4060-ti": "rtx-4060-ti-16gb",
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "rtx-pro-6000-blackwell-server": "rtx-pro-6000",
}
# The CPU profile: nominal dual-channel DDR4/DDR5 bandwidth; only the roofline line reads it.
CPU_BANDWIDTH = 50e9


def card_names() -> list[str]:
    return [*_CATALOG, "cpu"]


def get_card(name: str | Card) -> Card:
    """A catalog card by its lower-case, hyphenated name (`rtx-5080`, `t4`, ...) or `cpu`."""
    if isinstance(name, Card):
        return name
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key == "cpu":
        return Card(
            "cpu",
            "host CPU and RAM",
            host_ram_bytes(),
            CPU_BANDWIDTH,
            cuda=False,
            note="capacity = this machine's total RAM; bandwidth nominal",
        )
    if key not in _CATALOG:
        raise BudgetError(
            f"gpu: unknown card {name!r}; known: {', '.join(card_names())}; "
            "or give --gpu-memory-gb and --gpu-bandwidth-gbs"
        )
    label, mib, gbs = _CATALOG[key]
    return Card(key, label, mib * MIB, gbs * 1e9)


# How each card names itself (torch.cuda.get_device_name, NVML), lower case, most specific first.
_DEVICE_NAMES = (
    ("rtx 5080", "rtx-5080"),
    ("rtx 4060 ti", "rtx-4060-ti-16gb"),
    ("tesla t4", "t4"),
    ("rtx 3090", "rtx-3090"),
    ("rtx 4090", "rtx-4090"),
    ("rtx 5090", "rtx-5090"),
    ("rtx pro 6000", "rtx-pro-6000"),
    ("h100 80gb hbm3", "h100-sxm"),
    ("h200", "h200"),
)


def card_for_device(device_name: str, total_bytes: int) -> tuple[Card, str]:
    """The card a run is on, from what the driver reports: the catalog's entry for its name with the
    memory the card really has, else a card of that memory with an unknown bandwidth taken from the
    closest catalog card. Returns (card, how it was chosen)."""
    lowered = device_name.lower()
    for needle, key in _DEVICE_NAMES:
        if needle in lowered:
            known = get_card(key)
            card = Card(
                known.name,
                f"{device_name} ({total_bytes / GIB:.2f} GiB measured)",
                total_bytes,
                known.bandwidth,
            )
            return card, f"detected {device_name}: catalog entry {key} with its measured memory"
    closest = min(_CATALOG, key=lambda k: abs(_CATALOG[k][1] * MIB - total_bytes))
    bandwidth = _CATALOG[closest][2] * 1e9
    card = Card(
        f"detected-{total_bytes // MIB}mib",
        f"{device_name} ({total_bytes / GIB:.2f} GiB measured)",
        total_bytes,
        bandwidth,
    )
    return card, (
        f"detected {device_name}: not in the catalog; its measured memory, and the bandwidth of {closest} "
        "(the catalog card of the nearest memory) for the roofline"
    )


def custom_card(memory_gb: float, bandwidth_gbs: float) -> Card:
    """A card given by its memory (10^9 bytes) and bandwidth (10^9 bytes/s)."""
    if not memory_gb or memory_gb <= 0:
        raise BudgetError(f"gpu_memory_gb: must be > 0, got {memory_gb}")
    if not bandwidth_gbs or bandwidth_gbs <= 0:
        raise BudgetError(f"gpu_bandwidth_gbs: must be > 0, got {bandwidth_gbs}")
    return Card(
        f"custom-{memory_gb:g}gb",
        f"{memory_gb:g} GB, {bandwidth_gbs:g} GB/s",
        int(memory_gb * 1e9),
        bandwidth_gbs * 1e9,
    )
