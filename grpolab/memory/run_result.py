"""A run's result as a file: `result.json` beside its adapter, for whoever started the run.

The harness writes it when a run has measured itself (FINISHED, KILLED) or ran out of memory
(FAILED), in bytes, with the figures it logged to MLflow: every budget line's budget beside what was
measured, the totals, each step's generation seconds, and what the sheet said of vLLM's rollouts
and of the generation time. A process that starts a lab run (a sweep's cell) reads this file
instead of searching MLflow for the run and rebuilding it from metric names. A run that died before
measuring (a crash, SIGKILL) has no file: its exit code says what happened.

The file appears whole or not at all (written beside, then renamed), and failing to write it never
changes how the run ends: it is a copy, for a caller, of what MLflow holds.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from budgets.arithmetic import VLLM_BLOCK
from budgets.units import GIB

NAME = "result.json"
VERSION = 1


def write(run, status: str, comparison, oom: dict[str, Any] | None = None, ending: str = "") -> Path | None:
    """`run.output_dir/result.json` for a lab run (grpolab.lab.run.Run) ending with `status` (its tag
    `ending` as grpolab.lifecycle.endings named it), its measurement `comparison` and, after an out-of-memory,
    `oom` (phase, line, peak_gib). Returns the path, or None when it could not be written (a warning
    on stderr)."""
    path = Path(run.output_dir) / NAME
    try:
        _write_atomically(path, result_of(run, status, comparison, oom, ending))
    except OSError as err:
        print(f"warning: could not write the run's result file {path}: {err}", file=sys.stderr)
        return None
    return path


def result_of(run, status: str, c, oom: dict[str, Any] | None = None, ending: str = "") -> dict[str, Any]:
    """The result as a dict. A run that ran out of memory logged its peak and what each line had
    reached, not a comparison: its relative errors are None, as they are absent from its metrics."""
    sheet, meter = run.sheet, run.meter
    compared = oom is None
    ending = ending or ("finished" if status == "FINISHED" else status.lower())
    load = [p.process_bytes for p in meter.probe.phases if p.name == "load"]
    peak = c.total_measured if compared else round(oom["peak_gib"] * GIB)
    return {
        "version": VERSION,
        "run_id": run.mlflow_run.info.run_id,
        "run_name": run.mlflow_run.info.run_name,
        "status": status,
        "ending": ending,
        "adapter_dir": str(run.adapter_dir) if run.adapter_dir is not None else None,
        "total": {
            "budget_bytes": int(sheet.total_bytes),
            "capacity_bytes": int(sheet.capacity_bytes),
            "measured_bytes": peak,
            "compared": compared,
            "rel_error": c.total_rel_error if compared else None,
            "unattributed_bytes": c.unattributed if compared else None,
            "load_peak_bytes": load[-1] if load else None,
        },
        "lines": {
            name: {
                "budget_bytes": budget,
                "measured_bytes": c.measured.get(name),
                "rel_error": c.rel_error(name) if compared and name in c.measured else None,
            }
            for name, budget in c.budget.items()
        },
        "generation_seconds": list(meter.step_generation_seconds),  # steps that ended, as MLflow has them
        "generation_seconds_estimate": sheet.metrics.get("generation_seconds_estimate"),
        **_rollouts(sheet, c.measured.get("kv_cache")),
        "oom": None if compared else {"phase": oom["phase"], "line": oom["line"], "peak_bytes": peak},
    }


def _rollouts(sheet, kv_measured: int | None) -> dict[str, Any]:
    """vLLM's rollouts: the sheet's count, and what the engine's KV cache held in whole blocks."""
    held = None
    per_token = sheet.metrics.get("kv_cache_bytes_per_token")
    if kv_measured is not None and per_token:
        inputs = sheet.inputs
        per_rollout = math.ceil((inputs["max_prompt_length"] + inputs["max_completion_length"]) / VLLM_BLOCK)
        held = round(kv_measured / per_token) // VLLM_BLOCK // per_rollout
    vllm = sheet.metrics.get("vllm") or {}
    return {
        "vllm": bool(vllm),
        "rollouts_in_kv_sheet": vllm.get("rollouts_in_kv"),
        "rollouts_in_kv_measured": held,
        "max_concurrent_rollouts_sheet": sheet.metrics.get("max_concurrent_rollouts"),
    }


def _write_atomically(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(result, out, indent=2)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def read(path: Path) -> dict[str, Any] | None:
    """A result file, or None when there is none (the run died before measuring)."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
