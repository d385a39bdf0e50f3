"""What the model wrote, in MLflow: each logged step's completions with their rewards and advantage,
and the held-out prompts answered by the base and by the adapter, side by side.

Reading completions is how a broken reward, a length cap that cuts every answer or a hack shows up;
TRL's own `log_completions` sends them to W&B and Trackio only. Here each logged group is an MLflow
trace of the run (its Traces tab): the prompt as the request, every completion of the group with each
reward and its advantage as the response, each reward's group mean as an assessment (a column each,
with its average and a histogram), and a span per completion carrying its own rewards and advantage
as assessments. Tags say which step and group. A group is logged whole, never a sample of one: it is
what its advantages are measured against.

Where they come from: TRL's GRPOTrainer (and Unsloth's generated trainer, which keeps this code) fills
`trainer._logs` in `_generate_and_score_completions` with the last generation batch's prompts,
completions, rewards per function and advantages, whatever `log_completions` says; this callback reads
it when the trainer logs a step. A group is one trace (its completions are its spans), so a step costs
one trace write, not one per completion. The same code path serves vLLM's completions on a GPU and
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
    name: str,
    request: dict,
    response: Any,
    feedback: dict[str, float],
    tags: dict[str, str],
    children: Sequence[tuple[str, dict, Any, dict[str, float]]] = (),
) -> None:
    """One trace of the active run: its request, response and `feedback` (each value an assessment),
    and a child span per entry of `children` (name, inputs, outputs, its own assessments).

    Everything is attached while the trace is open, so MLflow's exporter writes it once, from its own
    thread (a trace per completion, each written apart, cost about 75 ms of a loaded 2-core machine's
    CPU each: more than a CPU step; one trace per group costs about as much as one of them)."""
    import mlflow
    from mlflow.entities import AssessmentSource

    source = AssessmentSource(source_type="CODE", source_id=SOURCE_ID)
    with mlflow.start_span(name=name, span_type="CHAIN") as root:
        root.set_inputs(request)
        mlflow.update_current_trace(tags=tags)
        for key, value in feedback.items():
            mlflow.log_feedback(trace_id=root.trace_id, name=key, value=value, source=source)
        for child_name, inputs, outputs, child_feedback in children:
            with mlflow.start_span(name=child_name, span_type="LLM") as span:
                span.set_inputs(inputs)
                span.set_outputs(outputs)
            for key, value in child_feedback.items():
                mlflow.log_feedback(
                    trace_id=root.trace_id, name=key, value=value, source=source, span_id=span.span_id
                )
        root.set_outputs(response)


def group_trace(step: int, g: int, rows: list[dict[str, Any]]) -> None:
    """A group as one trace: the prompt; every completion with each reward and its advantage (the
    response, and a span each with its own assessments); each reward's group mean as the trace's."""
    names = list(rows[0]["rewards"])
    log_trace(
        f"step {step} group {g}",
        {"prompt": rows[0]["prompt"]},
        [
            {"completion": r["completion"], **r["rewards"], "advantage": round(r["advantage"], 4)}
            for r in rows
        ],
        {name: sum(r["rewards"][name] for r in rows) / len(rows) for name in names},
        {"kind": "train", "step": str(step), "group": str(g)},
        [
            (
                f"completion {i}",
                {"prompt": r["prompt"]},
                r["completion"],
                {**r["rewards"], "advantage": r["advantage"]},
            )
            for i, r in enumerate(rows)
        ],
    )


def group_stats(logs: dict[str, Any], group_size: int) -> dict[str, float]:
    """What the run doctor reads of a step's completions (all of them, every group): how many of a
    group's completions differ (`completions/distinct_share`: 1 when all differ, 1/G when all are the
    same: sampling with no spread), and how many hold what a reader takes for an answer in its tag
    (`completions/tag_like_ratio`, task.rewards.tag_like: beside a reward that pays nothing on any of
    them, a parse that fails)."""
    from task.rewards import tag_like

    completions = [text(c) for c in logs.get("completion", [])]
    if not completions or group_size <= 0:
        return {}
    groups = [
        completions[i : i + group_size] for i in range(0, len(completions) - group_size + 1, group_size)
    ]
    return {
        "completions/distinct_share": sum(len(set(g)) / len(g) for g in groups) / max(len(groups), 1),
        "completions/tag_like_ratio": sum(map(tag_like, completions)) / len(completions),
    }


class CompletionLog(TrainerCallback):
    """Each logged step's groups as traces of the run (whole groups, `GROUPS_PER_STEP` of them)."""

    def __init__(self, trainer, max_groups: int = GROUPS_PER_STEP, logged_through: int = 0) -> None:
        self.trainer = trainer
        self.max_groups = max_groups
        # A resumed run: the steps its first process logged are trained again, not traced again.
        self.logged_step = logged_through
        self.seconds: list[float] = []  # what each step paid for it

    def on_log(self, args, state, control, logs=None, **kwargs):
        import mlflow

        logs = logs or {}
        if state.global_step <= self.logged_step or not any(k.startswith("rewards/") for k in logs):
            return  # the end-of-training summary, or a step already logged
        started = time.perf_counter()
        self.logged_step = state.global_step
        for g, rows in enumerate(groups(self.trainer._logs, self.trainer.num_generations, self.max_groups)):
            group_trace(state.global_step, g, rows)
        seconds = time.perf_counter() - started
        self.seconds.append(seconds)
        mlflow.log_metric("perf/completions_logging_seconds", seconds, step=state.global_step)


def log_eval(prompts: Sequence[Any], base, adapter) -> None:
    """The held-out prompts answered by the base and the adapter, side by side: the table
    `completions/held_out.json`, and one trace (`kind = held-out`) with a span per prompt whose
    assessments are `base_<reward>` and `adapter_<reward>`, each reward's mean on the trace."""
    import mlflow

    results = {r.which: r for r in (base, adapter) if r is not None and r.completions}
    if not results:
        return
    table: dict[str, list] = {"prompt": [text(p) for p in prompts]}
    for which, result in results.items():
        table[f"{which}_completion"] = list(result.completions)
        for name, values in result.rewards.items():
            table[f"{which}_{name}"] = list(values)
    mlflow.log_table(table, artifact_file="completions/held_out.json")
    scores = [k for k in table if k != "prompt" and not k.endswith("_completion")]
    log_trace(
        "held-out: " + " vs ".join(results),
        {"prompts": len(table["prompt"])},
        {which: r.line() for which, r in results.items()},
        {k: sum(table[k]) / len(table[k]) for k in scores},
        {"kind": "held-out"},
        [
            (
                f"held-out {i}",
                {"prompt": prompt},
                {which: table[f"{which}_completion"][i] for which in results},
                {k: table[k][i] for k in scores},
            )
            for i, prompt in enumerate(table["prompt"])
        ],
    )


def flush() -> None:
    """Wait for MLflow's background exporter: the run's traces are in the store when it ends."""
    import mlflow

    mlflow.flush_trace_async_logging()
