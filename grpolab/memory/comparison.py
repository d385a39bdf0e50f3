"""Budget beside measurement: the two columns, what each line missed by, the table and the chart.

Every budget line is paired with what the run measured for the same line; figures with no budget
line (the torch allocator's peak) keep names of their own and are listed as unpaired, and budget
lines nothing could measure are listed too. Nothing here talks to MLflow (see grpolab.lifecycle.tracking).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from budgets.units import GIB
from grpolab.memory.names import MEMORY_UNITS, UNIT_NAMES, in_unit, memory_unit

# How each line is measured, for the table.
HOW_MEASURED = {
    "base_weights": "sum of the base model's tensors: packed 4-bit weights + quant_state constants + 16-bit layers",
    "lora_params": "sum of the LoRA A/B tensors",
    "lora_grads": "sum of .grad tensors just before the optimizer step (largest step)",
    "optimizer_states": "sum of the optimizer's per-parameter state tensors after a step",
    "cuda_context": "NVML process memory after CUDA init, less torch's reservation",
    "kv_cache": "vLLM's cache_config.num_gpu_blocks x block_size x bytes per token",
    "vllm_profile_activations": "vLLM's worker: the profiling pass's transient peak + its non-torch memory",
    "cuda_graphs": "vLLM's captured graph pool (its log), else the worker's profiled estimate",
    "vllm_weights": "vLLM's model_runner.model_memory_usage",
    "host_runtime": "resident set after the imports, before the model loads",
    "host_shape_caches": "resident-set peak of the largest training step minus that of the first",
    "reference_policy": "sum of TRL's frozen 'ref' adapter tensors (a copy of the initial adapter)",
    "other_processes": "NVML device use before this process touched the card",
    "total": "GPU: NVML process peak, sampled; CPU: resident-set peak, sampled",
}


@dataclass
class Comparison:
    """The two columns side by side."""

    budget: dict[str, int]  # line -> bytes
    measured: dict[str, int]  # line -> bytes, only for lines that exist in the budget
    unit: str  # the run's memory unit (grpolab.memory.names): every figure below is written in it
    unpaired_measured: dict[str, int] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)
    total_budget: int = 0
    total_measured: int = 0
    total_label: str = ""
    peak_phase_lines: list[str] = field(default_factory=list)  # the lines the sheet's peak holds

    @property
    def paired(self) -> list[str]:
        return [name for name in self.budget if name in self.measured]

    @property
    def unmeasured(self) -> list[str]:
        return [name for name in self.budget if name not in self.measured]

    def diff(self, name: str) -> int:
        return self.measured[name] - self.budget[name]

    def rel_error(self, name: str) -> float:
        return self.diff(name) / self.budget[name] if self.budget[name] else 0.0

    @property
    def unattributed(self) -> int:
        """The part of the total's miss that no line explains: measured total - budgeted total,
        less the differences of the measured lines the peak holds. Positive: the process held
        memory no line budgets for; negative: lines nothing measured were over-budgeted."""
        explained = sum(self.diff(n) for n in self.paired if n in self.peak_phase_lines)
        return self.total_measured - self.total_budget - explained

    @property
    def total_rel_error(self) -> float:
        return (self.total_measured - self.total_budget) / self.total_budget if self.total_budget else 0.0

    def worst_line(self) -> str | None:
        """The paired line furthest from its budget, relative to the line's size."""
        return max(self.paired, key=lambda n: abs(self.rel_error(n)), default=None)

    def bytes(self, n: float, sign: bool = False) -> str:
        """`n` bytes in the run's unit: one unit in a sentence, in a column, and in MLflow's keys."""
        return in_unit(n, self.unit, sign)

    def verdict(self) -> str:
        held = self.total_measured <= self.total_budget
        worst = self.worst_line()
        worst_text = (
            f"; the line that missed most: {worst} ({self.bytes(self.diff(worst), sign=True)}, "
            f"{self.rel_error(worst):+.1%})"
            if worst
            else ""
        )
        return (
            f"The budget {'held' if held else 'did not hold'}: measured peak {self.bytes(self.total_measured)} "
            f"vs budgeted {self.bytes(self.total_budget)} ({self.total_label}, {self.total_rel_error:+.1%})"
            f"{worst_text}; outside every line: {self.bytes(self.unattributed, sign=True)}."
        )

    def peak_lines(self) -> list[str]:
        """The run's peak as logged (measured/total), so the console and MLflow say the same number."""
        if "torch_allocated_peak" not in self.unpaired_measured:
            return [f"Peak memory (resident set of this process, CPU): {self.total_measured / GIB:.2f} GiB"]
        return [
            f"Peak memory (NVML, whole process incl. vLLM and CUDA context): {self.total_measured / GIB:.2f} GiB",
            "Peak memory (torch allocator; vLLM's weights and KV cache included unless standby): "
            f"{self.unpaired_measured['torch_allocated_peak'] / GIB:.2f} GiB",
        ]


def compare(sheet, measured: dict[str, int], total_measured: int, on_gpu: bool) -> Comparison:
    """Pair what was measured with the sheet's lines; the whole process against the sheet's peak
    (NVML on a GPU; the resident set on a CPU, where the sheet has a host_runtime line)."""
    budget = {line.name: int(line.bytes) for line in sheet.lines}
    return Comparison(
        budget=budget,
        measured={k: v for k, v in measured.items() if k in budget},
        unit=memory_unit(on_gpu),
        unpaired_measured={k: v for k, v in measured.items() if k not in budget},
        formulas={line.name: line.formula for line in sheet.lines},
        total_budget=int(sheet.total_bytes),
        total_measured=total_measured,
        total_label="NVML process peak" if on_gpu else "resident-set peak",
        peak_phase_lines=[line.name for line in sheet.lines if sheet.peak_phase in line.phases],
    )


# The probe's per-step phases and the sheet's phases they measure.
STEP_PHASES = {"generate": "generate", "train_step": "train"}


def phase_pairs(sheet, step_phase_peaks: dict) -> dict[str, float]:
    """The step's two moments, budget beside measured, in GiB (GPU only): `phase/generate/*` (vLLM decoding the
    rollouts) and `phase/train/*` (the trainer's forward and backward). Standby moves memory between
    them (the KV cache is gone while training), so they are what it changes. The budget leaves out
    other processes' memory: the measured peak is this process's. The largest step counts."""
    other = sum(int(line.bytes) for line in sheet.lines if line.name == "other_processes")
    out: dict[str, float] = {}
    for probe_phase, sheet_phase in STEP_PHASES.items():
        peaks = step_phase_peaks.get(probe_phase) or []
        if not peaks:
            continue
        budget = sheet.phases[sheet_phase] - other
        measured = max(peak.process_bytes for peak in peaks)
        out[f"phase/{sheet_phase}/budget_gib"] = budget / GIB
        out[f"phase/{sheet_phase}/measured_gib"] = measured / GIB
        out[f"phase/{sheet_phase}/rel_error"] = (measured - budget) / budget if budget else 0.0
    return out


def table(c: Comparison) -> str:
    """Markdown: line, formula, budget, measured, difference, how measured; the verdict on top."""
    rows = [
        "| line | formula | budget | measured | diff | rel. error | how measured |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, budget in c.budget.items():
        if name in c.measured:
            cells = (
                c.bytes(c.measured[name]),
                c.bytes(c.diff(name), sign=True),
                f"{c.rel_error(name):+.1%}",
            )
        else:
            cells = ("not measured",) * 3
        formula = c.formulas.get(name, "").replace("|", "\\|")
        rows.append(
            f"| {name} | `{formula}` | {c.bytes(budget)} | {' | '.join(cells)} | {HOW_MEASURED.get(name, '')} |"
        )
    rows.append(
        f"| **total (peak)** | {c.total_label} | {c.bytes(c.total_budget)} | {c.bytes(c.total_measured)} | "
        f"{c.bytes(c.total_measured - c.total_budget, sign=True)} | {c.total_rel_error:+.1%} | {HOW_MEASURED['total']} |"
    )
    rows.append(
        "| outside every line | total diff minus the diffs of the measured lines the peak holds | | | "
        f"{c.bytes(c.unattributed, sign=True)} | | memory no line budgets (or over-budgeted unmeasured lines) |"
    )
    if c.unpaired_measured:
        rows += ["", "Measured with no budget line (never forced into a pair):", ""]
        rows += [f"- {name}: {c.bytes(value)}" for name, value in c.unpaired_measured.items()]
    return "\n".join([c.verdict(), "", *rows, ""])


def chart(c: Comparison, step_peaks: list[tuple[int, int]], budget_total: int):
    """Bars per line (budget vs measured) and the peak per step against the sheet's peak."""
    # A bare Figure, not pyplot: no backend is switched, so a notebook's inline plots keep working.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.8))
    bars, curve = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    draw_lines(bars, c)
    draw_peaks(curve, c, step_peaks, budget_total)
    fig.tight_layout()
    return fig


def draw_lines(bars, c: Comparison) -> None:
    """Each paired line's budget beside its measurement, in the run's unit."""
    names = c.paired
    size, unit = MEMORY_UNITS[c.unit], UNIT_NAMES[c.unit]
    budget = [c.budget[n] / size for n in names]
    measured = [c.measured[n] / size for n in names]
    x = range(len(names))
    bars.bar([i - 0.2 for i in x], budget, width=0.4, label="budget", color="#4c78a8")
    bars.bar([i + 0.2 for i in x], measured, width=0.4, label="measured", color="#f58518")
    bars.set_xticks(list(x), names, rotation=30, ha="right")
    bars.set_ylabel(unit)
    smallest = min([v for v in budget + measured if v > 0], default=1.0)
    if max(budget + measured, default=1.0) / smallest > 100:
        bars.set_yscale("log")  # a 1 GiB runtime beside a 50 KiB adapter: both stay readable
    bars.set_title("Budget vs measured, per line")
    bars.legend(fontsize=8)


def draw_peaks(curve, c: Comparison, step_peaks: list[tuple[int, int]], budget_total: int) -> None:
    """The process's peak at each step against the sheet's peak, in the run's unit."""
    size, unit = MEMORY_UNITS[c.unit], UNIT_NAMES[c.unit]
    if step_peaks:
        steps, peaks = zip(*step_peaks, strict=True)
        curve.plot(steps, [p / size for p in peaks], marker=".", label="process peak per step")
    curve.axhline(budget_total / size, color="#4c78a8", linestyle="--", label="budget (sheet peak)")
    curve.set_xlabel("step")
    curve.set_ylabel(unit)
    curve.set_title("Peak memory over the run")
    curve.legend(fontsize=8)
