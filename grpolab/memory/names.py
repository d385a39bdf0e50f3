"""The MLflow names of memory figures, with their unit: one home for the unit a run logs its
memory lines in and for the key each figure gets (the harness writes them; notebooks and tests read
them back)."""

from __future__ import annotations

import math

from budgets.units import GIB, MIB

__all__ = ["MEMORY_UNITS", "in_unit", "memory_key", "memory_unit"]

# The unit of a run's memory lines, named in each key. A 16 GB card's lines are tens of MiB to GiBs:
# GiB. The CPU stand-in's are KiB (its 4-bit weights: 77 KiB) beside a GiB runtime: in GiB most read
# 0.00 in MLflow's charts, in MiB each keeps its size (0.07 ... 1280).
MEMORY_UNITS = {"gib": GIB, "mib": MIB}
UNIT_NAMES = {"gib": "GiB", "mib": "MiB"}


def memory_unit(on_gpu: bool) -> str:
    """`gib` on a GPU, `mib` on the CPU stand-in (tag `memory_unit` of the run)."""
    return "gib" if on_gpu else "mib"


def memory_key(line: str, figure: str, unit: str) -> str:
    """The MLflow key of a memory line's figure: `base_weights/budget_mib`, `total/measured_gib`."""
    return f"{line}/{figure}_{unit}"


def in_unit(n: float, unit: str, sign: bool = False) -> str:
    """`n` bytes in the run's unit, so a sentence holds one unit: `1009.12 MiB`, `+0.0771 MiB`.

    Two decimals from 1 up; below 1 (the CPU stand-in's KiB-sized lines, in MiB) three significant
    digits, so a small line never reads 0.00.

    Example:
        >>> in_unit(1009.12 * MIB, "mib"), in_unit(1.55 * GIB, "mib"), in_unit(79 * 1024, "mib", sign=True)
        ('1009.12 MiB', '1587.20 MiB', '+0.0771 MiB')
    """
    value = n / MEMORY_UNITS[unit]
    decimals = 2 if value == 0 or abs(value) >= 1 else 2 - math.floor(math.log10(abs(value)))
    return f"{value:{'+' if sign else ''}.{decimals}f} {UNIT_NAMES[unit]}"
