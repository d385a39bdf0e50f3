"""The sheet: lines with their formulas, the phase totals, the verdict, and how it is printed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import BudgetError

GIB = 1 << 30
# The moments of a GRPO step at which memory peaks. A line is held in the phases it lists.
PHASES = ("start", "generate", "train")
ALL_PHASES = PHASES


def gib(n: float) -> float:
    return n / GIB


@dataclass
class Line:
    name: str  # stable snake_case: the lab logs budget/<name> and measured/<name>
    bytes: int
    formula: str  # the arithmetic as computed, with the numbers put in
    estimate: bool  # False: exact arithmetic of what the library allocates; True: to be measured
    note: str = ""
    phases: tuple[str, ...] = ALL_PHASES

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": int(self.bytes),
            "gib": round(gib(self.bytes), 4),
            "formula": self.formula,
            "estimate": self.estimate,
            "note": self.note,
            "phases": list(self.phases),
        }


@dataclass
class Card:
    """One card (or a group of identical cards) of a multi-card layout."""

    role: str  # "trainer", "vllm", "trainer+vllm"
    count: int
    lines: list[Line]
    capacity_bytes: int
    phases: dict[str, int] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return max(self.phases.values()) if self.phases else sum(ln.bytes for ln in self.lines)

    @property
    def fits(self) -> bool:
        return not self.problems and self.total_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "count": self.count,
            "lines": [ln.to_dict() for ln in self.lines],
            "phases": self.phases,
            "total_bytes": int(self.total_bytes),
            "capacity_bytes": int(self.capacity_bytes),
            "fits": self.fits,
            "problems": [f"{name}: {msg}" for name, msg in self.problems],
        }


def phase_totals(lines: list[Line], phases: tuple[str, ...] = PHASES) -> dict[str, int]:
    return {p: sum(ln.bytes for ln in lines if p in ln.phases) for p in phases}


@dataclass
class Sheet:
    """The budget of one plan. `lines` are the trainer card's (the card the lab runs on)."""

    title: str
    lines: list[Line]
    capacity_bytes: int
    phases: dict[str, int]
    problems: list[tuple[str, str]]  # (line or input, one-line message with what to change)
    metrics: dict[str, Any]
    inputs: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    per_card: list[Card] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """The peak over the phases of the step (start, generate, train)."""
        return max(self.phases.values())

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return not self.problems and all(c.fits for c in self.per_card)

    def line(self, name: str) -> Line | None:
        return next((ln for ln in self.lines if ln.name == name), None)

    def verdict(self) -> str:
        if self.fits:
            return (
                f"fits: peak {gib(self.total_bytes):.2f} GiB of {gib(self.capacity_bytes):.2f} GiB, "
                f"headroom {gib(self.headroom_bytes):.2f} GiB"
            )
        problems = self.problems or [p for c in self.per_card for p in c.problems]
        name, msg = problems[0]
        return f"does not fit: {name}: {msg}"

    def require_fits(self) -> None:
        """Raise BudgetError (one line: the line that does not fit and what to change) unless it fits."""
        if not self.fits:
            raise BudgetError(self.verdict().removeprefix("does not fit: "))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "title": self.title,
            "inputs": self.inputs,
            "lines": [ln.to_dict() for ln in self.lines],
            "phases": self.phases,
            "total_bytes": int(self.total_bytes),
            "capacity_bytes": int(self.capacity_bytes),
            "headroom_bytes": int(self.headroom_bytes),
            "fits": self.fits,
            "verdict": self.verdict(),
            "problems": [f"{name}: {msg}" for name, msg in self.problems],
        }
        out.update(self.metrics)
        out["per_card"] = [c.to_dict() for c in self.per_card]
        out["notes"] = self.notes
        return out

    def table(self) -> str:
        """The human table: one row per line, GiB with 2 decimals, exact/estimate, the formula."""
        rows = [self.title, ""]
        rows += _line_rows(self.lines)
        rows.append("")
        rows.append(
            "  ".join(f"{p} {gib(v):.2f} GiB" for p, v in self.phases.items())
            + f"  | capacity {gib(self.capacity_bytes):.2f} GiB"
        )
        for c in self.per_card:
            rows.append("")
            rows.append(
                f"per card: {c.count} x {c.role}: peak {gib(c.total_bytes):.2f} of "
                f"{gib(c.capacity_bytes):.2f} GiB, {'fits' if c.fits else 'does not fit'}"
            )
            rows += _line_rows(c.lines)
            rows += [f"  ! {name}: {msg}" for name, msg in c.problems]
        rows.append("")
        for key in (
            "trainable_params",
            "train_state_bytes",
            "kv_cache_bytes_per_token",
            "max_concurrent_rollouts",
            "decode_bytes_per_token",
            "decode_tokens_per_s_ceiling",
            "tokens_per_step",
            "generation_seconds_estimate",
            "weight_sync_bytes_per_step",
            "weight_sync_seconds",
        ):
            if self.metrics.get(key) is not None:
                rows.append(f"{key:<30} {_fmt(key, self.metrics[key])}")
        for key, value in (self.metrics.get("vllm") or {}).items():
            rows.append(f"vllm.{key:<25} {_fmt(key, value)}")
        alt = self.metrics.get("standby_alternative")
        if alt:
            rows.append(
                f"{'with standby' if alt['standby'] else 'without standby':<30} util "
                f"{alt['effective_util']}, {alt['max_concurrent_rollouts']} rollouts at once, "
                + "  ".join(f"{p} {gib(v):.2f}" for p, v in alt["phases"].items())
                + f" GiB: {alt['verdict']}"
            )
        rows.append("")
        rows += [f"note: {n}" for n in self.notes]
        rows.append(f"verdict: {self.verdict()}")
        return "\n".join(rows)


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key.endswith("bytes") or key.endswith("_bytes_per_step"):
        return f"{int(value):,} B ({gib(value):.2f} GiB)"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}"


def _line_rows(lines: list[Line]) -> list[str]:
    width = max([len(ln.name) for ln in lines] + [4])
    rows = [f"{'line':<{width}}  {'GiB':>7}  {'kind':<8}  {'held':<20}  formula"]
    for ln in lines:
        kind = "estimate" if ln.estimate else "exact"
        rows.append(
            f"{ln.name:<{width}}  {gib(ln.bytes):7.2f}  {kind:<8}  {','.join(ln.phases):<20}  "
            f"{ln.formula}" + (f"  [{ln.note}]" if ln.note else "")
        )
    return rows
