"""What the model wrote, in MLflow: each logged step's completions with their rewards and advantage,
and the held-out prompts answered by the base and by the adapter, side by side.

Reading completions is how a broken reward, a length cap that cuts every answer or a hack shows up;
TRL's own `log_completions` sends them to W&B and Trackio only. Here every completion is an MLflow
trace of the run (its Traces tab): the prompt as the request, the completion as the response, and each
reward and the advantage as assessments (one column each, with its average and a histogram). Tags say
which step and which group a completion belongs to, so a group reads as a whole: every completion of
a group is logged, never a sample of one (a group is what its advantages are measured against).

Where they come from: TRL's GRPOTrainer (and Unsloth's generated trainer, which keeps this code) fills
`trainer._logs` in `_generate_and_score_completions` with the last generation batch's prompts,
completions, rewards per function and advantages, whatever `log_completions` says; this callback reads
it when the trainer logs a step. The same code path serves vLLM's completions on a GPU and
transformers' on the CPU. Traces are exported by MLflow's background thread (its async trace logging),
so a step pays for building them, not for writing them; the time it takes is logged per step as
`perf/completions_logging_seconds`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

# Completions of this many groups per logged step (all of each group's). A 16 GB card's step is one
# group of 8; the CPU stand-in's, one of 16: both log every completion they made.
GROUPS_PER_STEP = 2
SOURCE_ID = "task.rewards"  # the assessments' source: the task's exact reward functions


def text(message: Any) -> str:
    """The text of a prompt or a completion, as TRL logs it: a string, or chat messages (the last
    user turn of a prompt; the assistant's content of a completion)."""
    if isinstance(message, str):
        return message
    if isinstance(message, Sequence) and message and isinstance(message[-1], dict):
        users = [m for m in message if m.get("role") == "user"] or list(message)
        return str(users[-1].get("content", ""))
    return str(message)


def groups(logs: dict[str, Any], group_size: int, max_groups: int) -> list[list[dict[str, Any]]]:
    """The first `max_groups` whole groups of a trainer's `_logs`: one row per completion with its
    prompt, completion, each reward and its advantage. A partial group at the end is left out."""
    prompts, completions = list(logs["prompt"]), list(logs["completion"])
    rewards = {name: list(values) for name, values in logs["rewards"].items()}
    advantages = list(logs["advantages"])
    out = []
    for g in range(min(max_groups, len(prompts) // group_size)):
        rows = []
        for i in range(g * group_size, (g + 1) * group_size):
            rows.append(
                {
                    "prompt": text(prompts[i]),
                    "completion": text(completions[i]),
                    "rewards": {name: float(values[i]) for name, values in rewards.items()},
                    "advantage": float(advantages[i]),
                }
            )
        out.append(rows)
    return out


def log_trace(
    name: str, request: dict, response: Any, feedback: dict[str, float], tags: dict[str, str]
) -> None:
    """One trace of the active run: request, response, and each value of `feedback` as an assessment.
    Assessments logged while the trace is open travel with it (one write per trace, by MLflow's
    exporter), instead of one write each afterwards."""
    import mlflow
    from mlflow.entities import AssessmentSource

    source = AssessmentSource(source_type="CODE", source_id=SOURCE_ID)
    with mlflow.start_span(name=name, span_type="LLM") as span:
        span.set_inputs(request)
        span.set_outputs(response)
        mlflow.update_current_trace(tags=tags)
        for key, value in feedback.items():
            mlflow.log_feedback(trace_id=span.trace_id, name=key, value=value, source=source)


class CompletionLog(TrainerCallback):
    """Each logged step's completions as traces of the run (whole groups, `GROUPS_PER_STEP` of them)."""

    def __init__(self, trainer, max_groups: int = GROUPS_PER_STEP) -> None:
        self.trainer = trainer
        self.max_groups = max_groups
        self.logged_step = -1
        self.seconds: list[float] = []  # what each step paid for it

    def on_log(self, args, state, control, logs=None, **kwargs):
        import mlflow

        logs = logs or {}
        if state.global_step == self.logged_step or not any(k.startswith("rewards/") for k in logs):
            return  # the end-of-training summary, or a step already logged
        started = time.perf_counter()
        self.logged_step = state.global_step
        for g, rows in enumerate(groups(self.trainer._logs, self.trainer.num_generations, self.max_groups)):
            for i, row in enumerate(rows):
                log_trace(
                    f"step {state.global_step} group {g} completion {i}",
                    {"prompt": row["prompt"]},
                    row["completion"],
                    {**row["rewards"], "advantage": row["advantage"]},
                    {"kind": "train", "step": str(state.global_step), "group": str(g), "completion": str(i)},
                )
        seconds = time.perf_counter() - started
        self.seconds.append(seconds)
        mlflow.log_metric("perf/completions_logging_seconds", seconds, step=state.global_step)


def log_eval(settings, base, adapter) -> None:
    """The held-out prompts answered by the base and the adapter, side by side: a trace per prompt
    (`base_<reward>`, `adapter_<reward>` assessments) and the table `completions/held_out.json`."""
    import mlflow

    from grpolab.evaluate import eval_rows

    rows = eval_rows(settings)
    results = {r.which: r for r in (base, adapter) if r is not None and r.completions}
    if not results:
        return
    table: dict[str, list] = {"prompt": [text(p) for p in rows["prompt"]]}
    for which, result in results.items():
        table[f"{which}_completion"] = list(result.completions)
        for name, values in result.rewards.items():
            table[f"{which}_{name}"] = list(values)
    mlflow.log_table(table, artifact_file="completions/held_out.json")
    for i, prompt in enumerate(table["prompt"]):
        log_trace(
            f"held-out {i}",
            {"prompt": prompt},
            {which: table[f"{which}_completion"][i] for which in results},
            {k: v[i] for k, v in table.items() if k not in ("prompt",) and not k.endswith("_completion")},
            {"kind": "held-out", "prompt_index": str(i)},
        )


def flush() -> None:
    """Wait for MLflow's background exporter: the run's traces are in the store when it ends."""
    import mlflow

    mlflow.flush_trace_async_logging()
