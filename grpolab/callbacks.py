"""The lab's TrainerCallback: TRL's per-step metrics and the memory probe, into MLflow.

We log ourselves rather than through `report_to="mlflow"` so that the run the lab
opened (with its budget, params and final status) is the one that gets the curves.
"""

from __future__ import annotations

from transformers import TrainerCallback

from grpolab.probe import GIB, MemoryProbe, grad_bytes, optimizer_state_bytes
from grpolab.tracking import numeric_metrics


class LabCallback(TrainerCallback):
    """Logs every Trainer log line to MLflow, a memory peak per step, and the training-state bytes."""

    def __init__(self, probe: MemoryProbe) -> None:
        self.probe = probe
        self.measured: dict[str, int] = {}  # budget line -> bytes, filled in during training
        self.step_peaks: list[tuple[int, int]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        # The gradients exist only between backward and the optimizer's zero_grad: read them here.
        if model is not None:
            self.measured["lora_grads"] = max(self.measured.get("lora_grads", 0), grad_bytes(model))

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        import mlflow

        if optimizer is not None:
            self.measured["optimizer_states"] = max(
                self.measured.get("optimizer_states", 0), optimizer_state_bytes(optimizer)
            )
        peak = self.probe.step_peak_bytes()
        self.step_peaks.append((state.global_step, peak))
        metrics = {"memory/step_peak_gib": peak / GIB}
        # This step's generation and training pass, each measured as a phase of its own.
        for phase, peaks in self.probe.step_phase_peaks.items():
            if peaks:
                metrics[f"memory/{phase}_peak_gib"] = peaks[-1].process_bytes / GIB
                if self.probe.device == "cuda":
                    metrics[f"memory/{phase}_torch_allocated_peak_gib"] = (
                        peaks[-1].torch_allocated_bytes / GIB
                    )
        mlflow.log_metrics(metrics, step=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        import mlflow

        metrics = numeric_metrics(logs or {})
        if metrics:
            mlflow.log_metrics(metrics, step=state.global_step)
