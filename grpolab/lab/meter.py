"""The meter: everything a run measures while it trains, in one object.

It is the trainer's callback (TRL's metrics and a memory peak per step go to MLflow), it times
and measures each generation and each training pass as phases of the memory probe, it reads the
training state's bytes at the moments they exist, and at the end it says what it measured of each
budget line. The harness creates one per run; nothing else passes the probe or the trainer around.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from grpolab.memory import vllm_ledger
from grpolab.memory.probe import GIB, MemoryProbe
from grpolab.memory.tensors import (
    grad_bytes,
    model_bytes_by_kind,
    optimizer_state_bytes,
    vllm_engine,
    vllm_kv_cache,
)

# TRL's methods wrapped as phases: decoding the rollouts, and one training pass.
PHASE_METHODS = (("_generate", "generate"), ("compute_loss", "train_step"))


class Meter(TrainerCallback):
    def __init__(self, probe: MemoryProbe, sheet) -> None:
        self.probe = probe
        self.sheet = sheet
        self.trainer = None
        self.measured: dict[str, int] = {}  # budget line -> bytes, filled in during training
        self.step_peaks: list[tuple[int, int]] = []
        self.history: list[dict[str, float]] = []  # every logged row, for the run doctor
        self._decode: list[tuple[int, float]] = []  # (completion tokens, seconds) per generation
        self.step_generation_seconds: list[float] = []  # perf/generation_seconds, as logged at each step
        self.vllm_log: list[str] = []  # vLLM's start-up lines, captured while the policy loads (GPU)
        # A resumed run: the last step its first process logged at a step's end and in the trainer's
        # logs. The steps after its checkpoint are trained again but not logged again (MLflow cannot
        # remove a point): one point per step.
        self.logged_through = (0, 0)

    # --- attaching ------------------------------------------------------------------------------
    def attach(self, trainer) -> None:
        """Measure each generation and training pass of this trainer, and listen to its steps."""
        self.trainer = trainer
        for method, phase in PHASE_METHODS:
            original = getattr(trainer, method)

            def measured(*args, _original=original, _phase=phase, **kwargs):
                with self.probe.phase(_phase, keep=False) as peak:
                    result = _original(*args, **kwargs)
                if _phase == "generate":
                    self._decode.append((sum(len(ids) for ids in result[1]), peak.seconds))
                return result

            setattr(trainer, method, measured)
        trainer.add_callback(self)

    # --- callbacks ------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        # A resumed run: the rows its checkpoint's trainer state carries, so the doctor reads them all.
        if state.global_step > 0 and not self.history:
            from grpolab.judging.doctor import step_rows

            self.history = step_rows([numeric(row) for row in state.log_history if "step" in row])

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        # The gradients exist only between backward and the optimizer's zero_grad: read them here.
        if model is not None:
            self.measured["lora_grads"] = max(self.measured.get("lora_grads", 0), grad_bytes(model))

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        import mlflow

        if optimizer is not None:
            states = optimizer_state_bytes(optimizer)
            self.measured["optimizer_states"] = max(self.measured.get("optimizer_states", 0), states)
        peak = self.probe.step_peak_bytes()
        self.step_peaks.append((state.global_step, peak))
        metrics = {"memory/step_peak_gib": peak / GIB}
        for phase, peaks in self.probe.step_phase_peaks.items():
            if peaks:
                metrics[f"memory/{phase}_peak_gib"] = peaks[-1].process_bytes / GIB
                if self.probe.on_gpu:
                    metrics[f"memory/{phase}_torch_allocated_peak_gib"] = (
                        peaks[-1].torch_allocated_bytes / GIB
                    )
        speed = self.speed()
        if speed:
            self.step_generation_seconds.append(speed["perf/generation_seconds"])
        metrics.update(speed)
        if state.global_step > self.logged_through[0]:
            mlflow.log_metrics(metrics, step=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        import mlflow

        from grpolab.lifecycle import tracking

        metrics = numeric(logs or {})
        if metrics and any(k.startswith("rewards/") for k in metrics) and self.trainer is not None:
            # The step's completions themselves, for the run doctor (grpolab.judging.completions.group_stats).
            from grpolab.judging.completions import group_stats

            metrics |= group_stats(getattr(self.trainer, "_logs", {}), self.trainer.num_generations)
        if metrics:
            self.history.append({"step": state.global_step, **metrics})
            if state.global_step > self.logged_through[1]:
                # TRL's keys as they are, and the reader's first ones again in the `at a glance` section.
                mlflow.log_metrics(metrics | tracking.glance(metrics), step=state.global_step)

    # --- what was measured ----------------------------------------------------------------------
    def speed(self) -> dict[str, float]:
        """This step's decoding speed against the sheet's roofline, and its generation time against
        the sheet's estimate."""
        if not self._decode:
            return {}
        tokens, seconds = self._decode[-1]
        if seconds <= 0:
            return {}
        per_s = tokens / seconds
        m = self.sheet.metrics
        return {
            "perf/decode_tokens_per_s": per_s,
            "perf/decode_roofline_ratio": per_s / m["decode_tokens_per_s_step_ceiling"],
            "perf/generation_seconds": seconds,
            "perf/generation_vs_estimate": seconds / max(m["generation_seconds_estimate"], 1e-9),
        }

    def vllm_ledger(self) -> vllm_ledger.Ledger | None:
        """What the in-process vLLM engine reported at start-up (GPU), or None without one."""
        engine = vllm_engine(self.trainer.model) if self.trainer is not None else None
        return None if engine is None else vllm_ledger.from_engine(engine, self.vllm_log)

    def lines(self) -> dict[str, int]:
        """What could be measured of each budget line, in bytes."""
        measured: dict[str, int] = {}
        if self.trainer is not None:
            measured.update(model_bytes_by_kind(self.trainer.model))
            kv = vllm_kv_cache(self.trainer.model)
            if kv:
                measured["kv_cache"] = kv["kv_cache_bytes"]
            ledger = self.vllm_ledger()
            if ledger is not None:  # vLLM's own figures for the lines of its share
                measured.update(ledger.lines({line.name for line in self.sheet.lines}))
        measured.update(self.measured)
        if self.probe.context_bytes is not None:
            measured["cuda_context"] = self.probe.context_bytes
        if self.probe.device.other_bytes_at_start:
            measured["other_processes"] = self.probe.device.other_bytes_at_start
        if self.probe.host_runtime_bytes is not None:
            measured["host_runtime"] = self.probe.host_runtime_bytes
        if not self.probe.on_gpu and self.step_peaks:
            # On a CPU the process grows as new tensor shapes arrive (oneDNN caches a kernel per shape).
            peaks = [peak for _, peak in self.step_peaks]
            measured["host_shape_caches"] = max(peaks) - peaks[0]
        if self.probe.on_gpu:
            measured["torch_allocated_peak"] = self.probe.torch_peak_bytes()[0]
        return measured


def numeric(logs: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a Trainer log dict."""
    import math

    return {
        k: float(v)
        for k, v in logs.items()
        if not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
    }
