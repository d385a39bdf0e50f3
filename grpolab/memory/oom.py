"""Recognising an out-of-memory error, and naming the budget line to blame and what to change."""

from __future__ import annotations

import resource
from collections.abc import Collection

from budgets import advice
from budgets.units import GIB


class OutOfMemory(RuntimeError):
    """Memory ran out; the message is the one-line next step."""


# The phase that ran out, mapped to the line that grows there.
PHASE_LINES = {
    "load": "base_weights",
    "generate": "kv_cache",
    "train_step": "train_activations",
    "train": "train_activations",
}
OVER_BUDGET = 0.05  # a measured line more than 5% over its budget line counts as exceeded


def is_out_of_memory(error: BaseException) -> bool:
    """torch's CUDA OOM, Python's MemoryError, torch's CPU allocator refusing an allocation, or
    oneDNN failing to build a kernel under a memory limit; in `error` or in what caused it
    (torch.compile wraps a MemoryError in its own InternalTorchDynamoError)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if _is_out_of_memory(error):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _is_out_of_memory(error: BaseException) -> bool:
    import torch

    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    text = str(error)
    if "can't allocate memory" in text or "not enough memory" in text or "out of memory" in text:
        return True
    # oneDNN reports a failed allocation for its JIT kernel only as "could not create a primitive".
    # Without a memory limit Linux overcommits and the OOM killer ends the process instead, so under
    # a limit (--memory-cap-gib's data limit, a container's ulimit -v or -d) that message means memory.
    return "could not create a primitive" in text and _memory_limited()


def _memory_limited() -> bool:
    return any(
        resource.getrlimit(limit)[0] != resource.RLIM_INFINITY
        for limit in (resource.RLIMIT_AS, resource.RLIMIT_DATA)
    )


def blame(phase: str, rel_errors: dict[str, float], budget_lines: Collection[str]) -> str:
    """The line to blame: one measured well over its budget, else the line that grows in the phase
    that ran out (static lines within a few percent are not to blame)."""
    exceeded = {name: err for name, err in rel_errors.items() if err > OVER_BUDGET}
    if exceeded:
        return max(exceeded, key=exceeded.get)
    line = PHASE_LINES.get(phase, "train_activations")
    if line == "kv_cache" and line not in budget_lines:
        line = "generate_kv_cache"  # no vLLM: transformers' generate holds its own cache
    return line


def next_step(line: str, values: dict, accepts: Collection[str]) -> str:
    """What to change, as flags the lab accepts and that are not already set."""
    return advice.for_line(line, values, accepts)


def log_out_of_memory(run, error: BaseException, flags: Collection[str]) -> str:
    """The FAILED run's record of an out-of-memory error: peak, phase, the line to blame, a CUDA
    snapshot; returns the one-line next step."""
    import tempfile
    from pathlib import Path

    import mlflow

    from grpolab.memory import comparison, run_result
    from grpolab.memory.names import MEMORY_UNITS, memory_key, memory_unit

    probe = run.meter.probe
    phase = probe.failed_phase or probe.current_phase
    c = comparison.compare(run.sheet, run.meter.lines(), probe.process_peak_bytes, run.device.on_gpu)
    line = blame(phase, {n: c.rel_error(n) for n in c.paired}, c.budget)
    advice = next_step(line, run.sheet.inputs, flags)
    peak_gib = probe.process_peak_bytes / GIB
    mlflow.log_metrics({**probe.summary(), "oom/peak_gib": peak_gib}, step=run.measure_step)
    unit = memory_unit(run.device.on_gpu)
    mlflow.log_metrics(
        {memory_key(n, "measured", unit): c.measured[n] / MEMORY_UNITS[unit] for n in c.paired},
        step=run.measure_step,
    )
    mlflow.set_tags(
        {
            "oom_phase": phase,
            "oom_line": line,
            "oom_error": str(error).splitlines()[0][:500] if str(error) else type(error).__name__,
            "mlflow.note.content": (
                f"Out of memory during {phase} at a peak of {peak_gib:.2f} GiB; budget line most exceeded: "
                f"{line}. Next step: {advice}."
            ),
        }
    )
    if run.device.on_gpu:
        import torch

        path = Path(tempfile.mkdtemp(prefix="memory-")) / "cuda_memory_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        mlflow.log_artifact(str(path), artifact_path="memory")
    run_result.write(
        run, "FAILED", c, oom={"phase": phase, "line": line, "peak_gib": peak_gib}, ending="out of memory"
    )
    return f"out of memory during {phase} at {peak_gib:.2f} GiB (budget line most exceeded: {line}): {advice}"
