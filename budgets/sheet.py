"""The sheet: lines with their formulas, the phase totals, the problems, and how it is printed."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from . import advice
from .errors import BudgetError
from .formula import Term
from .units import ALL, PHASES, gib


@dataclass(kw_only=True)
class Line:
    """One thing a GRPO step holds on the card."""

    name: str  # stable snake_case: the lab logs budget/<name> and measured/<name>
    term: Term  # the bytes and the formula that computes them, from the same numbers
    estimate: bool  # False: exact arithmetic of what the library allocates; True: to be measured
    note: str = ""
    phases: tuple[str, ...] = ALL

    @property
    def bytes(self) -> int:
        return int(self.term.value)

    @property
    def formula(self) -> str:
        return self.term.text

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "gib": round(gib(self.bytes), 4),
            "formula": self.formula,
            "estimate": self.estimate,
            "note": self.note,
            "phases": list(self.phases),
        }


@dataclass(frozen=True)
class Problem:
    """Why a plan does not fit: the line (or setting) at fault, what is wrong, what would shrink it."""

    name: str
    message: str
    changes: tuple[advice.Change, ...] = ()

    def text(self, values: dict[str, Any], accepts: Collection[str] | None = None) -> str:
        fix = advice.render(self.changes, values, accepts) if self.changes else ""
        return f"{self.name}: {self.message}" + (f": {fix}" if fix else "")


def phase_totals(lines: list[Line]) -> dict[str, int]:
    return {p: sum(ln.bytes for ln in lines if p in ln.phases) for p in PHASES}


@dataclass
class CardSheet:
    """One card (or a group of identical cards) of a multi-card layout."""

    role: str  # "trainer", "vllm", "trainer+vllm"
    count: int
    lines: list[Line]
    capacity_bytes: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def phases(self) -> dict[str, int]:
        return phase_totals(self.lines)

    @property
    def total_bytes(self) -> int:
        return max(self.phases.values())

    @property
    def fits(self) -> bool:
        return not self.problems and self.total_bytes <= self.capacity_bytes

    def to_dict(self, values: dict[str, Any]) -> dict[str, Any]:
        return {
            "role": self.role,
            "count": self.count,
            "lines": [ln.to_dict() for ln in self.lines],
            "phases": self.phases,
            "total_bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "problems": [p.text(values) for p in self.problems],
        }


@dataclass
class Sheet:
    """The budget of one plan. `lines` are the trainer card's (the card the lab runs on); a layout
    with more than one kind of card lists each in `per_card`."""

    title: str
    lines: list[Line]
    capacity_bytes: int
    problems: list[Problem]
    metrics: dict[str, Any]
    inputs: dict[str, Any]  # the resolved plan: what advice renders against
    notes: list[str] = field(default_factory=list)
    per_card: list[CardSheet] = field(default_factory=list)

    @property
    def phases(self) -> dict[str, int]:
        return phase_totals(self.lines)

    @property
    def total_bytes(self) -> int:
        """The peak over the phases of the step (start, generate, train)."""
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return not self.problems

    def line(self, name: str) -> Line | None:
        return next((ln for ln in self.lines if ln.name == name), None)

    def verdict(self, accepts: Collection[str] | None = None) -> str:
        """One line. `accepts`: the settings the printing command takes (None: every Plan setting)."""
        if self.fits:
            return (
                f"fits: peak {gib(self.total_bytes):.2f} GiB of {gib(self.capacity_bytes):.2f} GiB, "
                f"headroom {gib(self.headroom_bytes):.2f} GiB"
            )
        return "does not fit: " + self.problems[0].text(self.inputs, accepts)

    def require_fits(self, accepts: Collection[str] | None = None) -> None:
        """Raise BudgetError (one line: what does not fit and what to change) unless it fits."""
        if not self.fits:
            raise BudgetError(self.verdict(accepts).removeprefix("does not fit: "))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "title": self.title,
            "inputs": self.inputs,
            "lines": [ln.to_dict() for ln in self.lines],
            "phases": self.phases,
            "total_bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "fits": self.fits,
            "verdict": self.verdict(),
            "problems": [p.text(self.inputs) for p in self.problems],
        }
        out.update(self.metrics)
        out["per_card"] = [c.to_dict(self.inputs) for c in self.per_card]
        out["notes"] = self.notes
        return out

    def table(self, accepts: Collection[str] | None = None) -> str:
        """The human table: one row per line, GiB with 2 decimals, exact/estimate, the formula."""
        rows = [self.title, "", *_line_rows(self.lines), ""]
        rows.append(
            "  ".join(f"{p} {gib(v):.2f} GiB" for p, v in self.phases.items())
            + f"  | capacity {gib(self.capacity_bytes):.2f} GiB"
        )
        for c in self.per_card:
            rows += [
                "",
                f"per card: {c.count} x {c.role}: peak {gib(c.total_bytes):.2f} of "
                f"{gib(c.capacity_bytes):.2f} GiB, {'fits' if c.fits else 'does not fit'}",
                *_line_rows(c.lines),
                *[f"  ! {p.text(self.inputs, accepts)}" for p in c.problems],
            ]
        rows.append("")
        for key in TABLE_METRICS:
            if self.metrics.get(key) is not None:
                rows.append(f"{key:<30} {_fmt(key, self.metrics[key])}")
        for key, value in (self.metrics.get("vllm") or {}).items():
            rows.append(f"vllm.{key:<25} {_fmt(key, value)}")
        alt = self.metrics.get("standby_alternative")
        if alt:
            rows.append(
                f"{'with standby' if alt['unsloth_vllm_standby'] else 'without standby':<30} util "
                f"{alt['effective_util']}, {alt['max_concurrent_rollouts']} rollouts at once, "
                + "  ".join(f"{p} {gib(v):.2f}" for p, v in alt["phases"].items())
                + f" GiB: {alt['verdict']}"
            )
        rows += ["", *[f"note: {n}" for n in self.notes], f"verdict: {self.verdict(accepts)}"]
        return "\n".join(rows)


TABLE_METRICS = (
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
)


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
