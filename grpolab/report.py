"""Budget beside measurement, in MLflow: the names, the chart, the table, the verdict.

Every budget line is logged as `budget/<line>` (GiB) before training starts. After the
run, every figure measured for the same line is logged as `measured/<line>`, with
`diff/<line>` (measured - budget, GiB) and `rel_error/<line>`. Figures with no budget
line (the resident set on a CPU, the torch allocator's peak) keep names of their own
and are listed as unpaired; budget lines nothing could measure are listed too. The
chart and the table land in the run's artifacts, the verdict in its description.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from grpolab.atomic import save_pretrained_atomically
from grpolab.probe import GIB, MEMORY_LABELS, MemoryProbe, model_bytes_by_kind

# Lines the lab measures, and how, for the notes in the table.
HOW_MEASURED = {
    "base_weights": "sum of the base model's tensors: packed 4-bit weights + quant_state constants + 16-bit layers",
    "lora_params": "sum of the LoRA A/B tensors",
    "lora_grads": "sum of .grad tensors just before the optimizer step (largest step)",
    "optimizer_states": "sum of the optimizer's per-parameter state tensors after a step",
    "cuda_context": "NVML process memory before the first tensor, minus torch's reservation",
    "kv_cache": "vLLM's cache_config.num_gpu_blocks x block_size x bytes per token",
    "host_runtime": "resident set after the imports, before the model loads",
    "host_shape_caches": "resident-set peak of the largest training step minus that of the first",
    "reference_policy": "sum of TRL's frozen 'ref' adapter tensors (a copy of the initial adapter)",
    "total": "GPU: NVML process peak, sampled; CPU: resident-set peak, sampled",
}


@dataclass
class Comparison:
    """The two columns side by side."""

    budget: dict[str, int]  # line -> bytes
    measured: dict[str, int]  # line -> bytes, only for lines that exist in the budget
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

    def verdict(self) -> str:
        held = self.total_measured <= self.total_budget
        worst = self.worst_line()
        worst_text = (
            f"; the line that missed most: {worst} ({human_bytes(self.diff(worst), sign=True)}, {self.rel_error(worst):+.1%})"
            if worst
            else ""
        )
        return (
            f"The budget {'held' if held else 'did not hold'}: measured peak {human_bytes(self.total_measured)} "
            f"vs budgeted {human_bytes(self.total_budget)} ({self.total_label}, {self.total_rel_error:+.1%})"
            f"{worst_text}; outside every line: {human_bytes(self.unattributed, sign=True)}."
        )


# --- before training ---------------------------------------------------------------------------


def log_budget(sheet) -> None:
    """Every line as `budget/<line>` in GiB, the total and capacity, and the sheet as artifacts."""
    import mlflow

    metrics = {f"budget/{line.name}": line.bytes / GIB for line in sheet.lines}
    metrics["budget/total"] = sheet.total_bytes / GIB
    metrics["budget/capacity"] = sheet.capacity_bytes / GIB
    mlflow.log_metrics(metrics, step=0)
    mlflow.set_tag("budget_fits", str(sheet.fits))
    mlflow.log_text(sheet.table(), "budget/sheet.txt")
    mlflow.log_dict(sheet.to_dict(), "budget/sheet.json")


# --- after training ----------------------------------------------------------------------------


def measure_lines(probe: MemoryProbe, callback, trainer) -> dict[str, int]:
    """What could be measured of each budget line, in bytes."""
    measured: dict[str, int] = {}
    if trainer is not None:
        measured.update(model_bytes_by_kind(trainer.model))
    measured.update(callback.measured)
    if probe.context_bytes is not None:
        measured["cuda_context"] = probe.context_bytes
    if probe.host_runtime_bytes is not None:
        measured["host_runtime"] = probe.host_runtime_bytes
    if probe.device != "cuda" and callback.step_peaks:
        # On a CPU the process grows as new tensor shapes arrive (oneDNN caches a kernel per shape).
        peaks = [peak for _, peak in callback.step_peaks]
        measured["host_shape_caches"] = max(peaks) - peaks[0]
    if trainer is not None:
        from grpolab.policy import vllm_kv_cache_bytes

        kv = vllm_kv_cache_bytes(trainer.model)
        if kv:
            measured["kv_cache"] = kv["kv_cache_bytes"]
    return measured


def compare(sheet, measured: dict[str, int], probe: MemoryProbe) -> Comparison:
    budget = {line.name: int(line.bytes) for line in sheet.lines}
    comparison = Comparison(
        budget=budget,
        measured={k: v for k, v in measured.items() if k in budget},
        unpaired_measured={k: v for k, v in measured.items() if k not in budget},
        formulas={line.name: line.formula for line in sheet.lines},
    )
    # The whole process against the sheet's peak: NVML on a GPU, the resident set on a CPU
    # (the CPU sheet has a host_runtime line for the interpreter and libraries).
    comparison.total_budget = int(sheet.total_bytes)
    comparison.total_measured = probe.process_peak_bytes
    comparison.total_label = "NVML process peak" if probe.device == "cuda" else "resident-set peak"
    peak_phase = max(sheet.phases, key=sheet.phases.get)
    comparison.peak_phase_lines = [line.name for line in sheet.lines if peak_phase in line.phases]
    if probe.device == "cuda":
        comparison.unpaired_measured["torch_allocated_peak"] = probe.torch_peak_bytes()[0]
    return comparison


def log_measurement(sheet, probe: MemoryProbe, callback, trainer, status: str) -> Comparison:
    """Log measured/<line>, diff/<line>, rel_error/<line>, totals, artifacts and the verdict."""
    import mlflow

    comparison = compare(sheet, measure_lines(probe, callback, trainer), probe)
    metrics = dict(probe.summary())
    for name in comparison.paired:
        metrics[f"measured/{name}"] = comparison.measured[name] / GIB
        metrics[f"diff/{name}"] = comparison.diff(name) / GIB
        metrics[f"rel_error/{name}"] = comparison.rel_error(name)
    for name, value in comparison.unpaired_measured.items():
        metrics[f"measured_unpaired/{name}"] = value / GIB
    metrics["measured/total"] = comparison.total_measured / GIB
    metrics["budget/total_compared"] = comparison.total_budget / GIB
    metrics["rel_error/total"] = comparison.total_rel_error
    metrics["diff/unattributed"] = comparison.unattributed / GIB
    mlflow.log_metrics(metrics)
    mlflow.set_tags(
        {
            "memory_labels": json.dumps(MEMORY_LABELS),
            "budget_unmeasured_lines": ",".join(comparison.unmeasured) or "none",
            "measured_unpaired": ",".join(comparison.unpaired_measured) or "none",
            "mlflow.note.content": comparison.verdict()
            + ("" if status == "FINISHED" else f" (run ended {status}: figures so far)"),
        }
    )
    mlflow.log_text(comparison_table(comparison), "memory/budget_vs_measured.md")
    mlflow.log_figure(
        comparison_chart(comparison, callback.step_peaks, sheet), "memory/budget_vs_measured.png"
    )
    return comparison


def human_bytes(n: float, sign: bool = False) -> str:
    """1.23 GiB, 45.6 MiB, 7.8 KiB: the tiny model's lines are kilobytes, the real ones gigabytes."""
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:{'+' if sign else ''}.2f} {unit}"
    return f"{n:{'+' if sign else ''}.0f} B"


def comparison_table(c: Comparison) -> str:
    rows = [
        "| line | formula | budget | measured | diff | rel. error | how measured |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, budget in c.budget.items():
        if name in c.measured:
            measured, diff, rel = (
                human_bytes(c.measured[name]),
                human_bytes(c.diff(name), sign=True),
                f"{c.rel_error(name):+.1%}",
            )
        else:
            measured = diff = rel = "not measured"
        formula = c.formulas.get(name, "").replace("|", "\\|")
        rows.append(
            f"| {name} | `{formula}` | {human_bytes(budget)} | {measured} | {diff} | {rel} | "
            f"{HOW_MEASURED.get(name, '')} |"
        )
    rows.append(
        f"| **total (peak)** | {c.total_label} | {human_bytes(c.total_budget)} | {human_bytes(c.total_measured)} | "
        f"{human_bytes(c.total_measured - c.total_budget, sign=True)} | {c.total_rel_error:+.1%} | "
        f"{HOW_MEASURED['total']} |"
    )
    rows.append(
        f"| outside every line | total diff minus the diffs of the measured lines the peak holds | | | "
        f"{human_bytes(c.unattributed, sign=True)} | | memory no line budgets (or over-budgeted unmeasured lines) |"
    )
    if c.unpaired_measured:
        rows += ["", "Measured with no budget line (never forced into a pair):", ""]
        rows += [f"- {name}: {human_bytes(value)}" for name, value in c.unpaired_measured.items()]
    return "\n".join([c.verdict(), "", *rows, ""])


def comparison_chart(c: Comparison, step_peaks: list[tuple[int, int]], sheet):
    # A bare Figure, not pyplot: no backend is switched, so a notebook's inline plots keep working.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.8))
    bars, curve = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    names = c.paired
    largest = max([c.budget[n] for n in names] + [c.measured[n] for n in names] + [1])
    unit, size = next(
        (u, s) for u, s in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024), ("B", 1)) if largest >= s
    )
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
    bars.legend()
    if step_peaks:
        steps, peaks = zip(*step_peaks, strict=True)
        curve.plot(steps, [p / GIB for p in peaks], marker=".", label="process peak per step")
    curve.axhline(sheet.total_bytes / GIB, color="#4c78a8", linestyle="--", label="budget (sheet peak)")
    curve.set_xlabel("step")
    curve.set_ylabel("GiB")
    curve.set_title("Peak memory over the run")
    curve.legend()
    fig.tight_layout()
    return fig


# --- the adapter and the last words ------------------------------------------------------------


def save_adapter(model, tokenizer, output_dir: Path) -> Path:
    """Write the LoRA adapter (and tokenizer) to output_dir/adapter, whole or not at all."""
    return save_pretrained_atomically(model, tokenizer, output_dir / "adapter")


def peak_lines(c: Comparison) -> list[str]:
    """The run's peak as logged (measured/total), so the console and MLflow say the same number."""
    if "torch_allocated_peak" in c.unpaired_measured:
        return [
            f"Peak memory (NVML, whole process incl. vLLM and CUDA context): {c.total_measured / GIB:.2f} GiB",
            "Peak memory (torch allocator only, misses vLLM's pool): "
            f"{c.unpaired_measured['torch_allocated_peak'] / GIB:.2f} GiB",
        ]
    return [f"Peak memory (resident set of this process, CPU): {c.total_measured / GIB:.2f} GiB"]


# --- when memory runs out ----------------------------------------------------------------------

# The phase that ran out, mapped to the budget line that grows there, and what to lower.
PHASE_LINES = {
    "load": ("base_weights", "use a smaller model or a pre-quantized 4-bit checkpoint"),
    "generate": ("kv_cache", "lower --num-generations or --max-completion-length, or gpu_memory_utilization"),
    "train_step": ("train_activations", "lower --max-completion-length or --num-generations"),
    "train": ("train_activations", "lower --max-completion-length or --num-generations"),
}
OVER_BUDGET = 0.05  # a measured line more than 5% over its budget line counts as exceeded
ADVICE = {
    "base_weights": "use a smaller model or 4-bit weights",
    "lora_params": "lower lora_rank",
    "lora_grads": "lower lora_rank",
    "optimizer_states": "use optimizer adamw_8bit or lower lora_rank",
    "kv_cache": "lower --num-generations or --max-completion-length",
    "generate_kv_cache": "lower --num-generations or --max-completion-length",
    "train_activations": "lower --max-completion-length or --num-generations",
    "logits": "lower --max-completion-length or --num-generations",
    "cuda_context": "close other processes on the card",
    "host_shape_caches": "set ONEDNN_PRIMITIVE_CACHE_CAPACITY lower (fewer cached kernels)",
}


def log_out_of_memory(sheet, probe: MemoryProbe, callback, trainer, error: BaseException) -> str:
    """FAILED run's record of an out-of-memory error: peak, phase, offending line, snapshot; returns the next step."""
    import mlflow

    phase = probe.failed_phase or probe.current_phase
    comparison = compare(sheet, measure_lines(probe, callback, trainer), probe)
    # A line measured well over its budget is the culprit; otherwise the line that grows in
    # the phase that ran out (static lines within a few percent are not to blame).
    exceeded = [n for n in comparison.paired if comparison.rel_error(n) > OVER_BUDGET]
    if exceeded:
        line = max(exceeded, key=comparison.rel_error)
    else:
        line = PHASE_LINES.get(phase, ("train_activations", ""))[0]
        if line == "kv_cache" and line not in comparison.budget:
            line = "generate_kv_cache"  # no vLLM: transformers' generate holds its own cache
    advice = ADVICE.get(line, PHASE_LINES.get(phase, ("", "lower --num-generations"))[1])
    peak = probe.process_peak_bytes
    mlflow.log_metrics({**probe.summary(), "oom/peak_gib": peak / GIB})
    for name in comparison.paired:
        mlflow.log_metric(f"measured/{name}", comparison.measured[name] / GIB)
    mlflow.set_tags(
        {
            "oom_phase": phase,
            "oom_line": line,
            "oom_error": str(error).splitlines()[0][:500] if str(error) else type(error).__name__,
            "mlflow.note.content": (
                f"Out of memory during {phase} at a peak of {peak / GIB:.2f} GiB; budget line most exceeded: "
                f"{line}. Next step: {advice}."
            ),
        }
    )
    snapshot = probe.dump_snapshot()
    if snapshot is not None:
        mlflow.log_artifact(str(snapshot), artifact_path="memory")
    return (
        f"out of memory during {phase} at {peak / GIB:.2f} GiB (budget line most exceeded: {line}): {advice}"
    )
