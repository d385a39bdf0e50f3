"""What a reader sees of a run without the lab: the completions as MLflow traces with their rewards,
the Overview's Markdown, the `at a glance` section and memory units, the compact terminal line.

In-process against a real MLflow store (SQLite in a temporary folder); the lab's own run is read by
tests/test_lab_end_to_end.py and opened in a browser by tests/test_mlflow_ui.py.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict, deque
from types import SimpleNamespace

import mlflow
import pytest

from budgets.units import MIB
from grpolab.config.settings import lab_settings
from grpolab.judging import completions, overview
from grpolab.judging.evaluate import EvalResult, eval_rows
from grpolab.lab import console
from grpolab.lifecycle import tracking
from grpolab.memory import names as memory_names

from suite import LAB_DIR
from suite import sample_comparison as comparison


def trainer_logs(groups: int, size: int) -> dict:
    """`trainer._logs` as TRL's `_generate_and_score_completions` leaves it: chat prompts and
    completions, each reward per completion, each completion's advantage."""
    logs = {
        "prompt": deque(),
        "completion": deque(),
        "rewards": defaultdict(deque),
        "advantages": deque(),
    }
    for g in range(groups):
        for i in range(size):
            logs["prompt"].append(
                [{"role": "system", "content": "sys"}, {"role": "user", "content": f"{g} + {g}?"}]
            )
            logs["completion"].append([{"role": "assistant", "content": f"<ans>{g + i}</ans>"}])
            logs["rewards"]["correctness_reward"].append(1.0 if i == g else 0.0)
            logs["rewards"]["format_reward"].append(0.2)
            logs["advantages"].append((1.0 if i == g else 0.0) - 1 / size)
    return logs


def test_whole_groups_are_read_with_each_reward_and_advantage_and_a_partial_group_is_left_out():
    logs = trainer_logs(groups=3, size=4)
    logs["prompt"].append("one more")  # a partial group: never logged as if whole
    found = completions.groups(logs, group_size=4, max_groups=2)
    assert [len(g) for g in found] == [4, 4]
    row = found[1][1]
    assert row == {
        "prompt": "1 + 1?",
        "completion": "<ans>2</ans>",
        "rewards": {"correctness_reward": 1.0, "format_reward": 0.2},
        "advantage": pytest.approx(0.75),
    }


@pytest.mark.slow
def test_each_logged_group_is_a_trace_of_the_run_with_its_rewards_and_advantages(store):
    trainer = SimpleNamespace(_logs=trainer_logs(groups=3, size=4), num_generations=4)
    callback = completions.CompletionLog(trainer, max_groups=2)
    state = SimpleNamespace(global_step=7)
    with mlflow.start_run() as run:
        callback.on_log(None, state, None, logs={"rewards/format_reward/mean": 0.2, "loss": 0.1})
        callback.on_log(None, state, None, logs={"train_runtime": 1.0})  # the summary row: nothing
        completions.flush()
    traces = mlflow.search_traces(
        locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list", max_results=100
    )
    assert sorted(t.info.tags["mlflow.traceName"] for t in traces) == ["step 7 group 0", "step 7 group 1"]
    (trace,) = [t for t in traces if t.info.tags["group"] == "1"]
    assert (trace.info.tags["step"], trace.info.tags["kind"]) == ("7", "train")
    assert "1 + 1?" in trace.data.request and '"completion": "<ans>2</ans>"' in trace.data.response
    # The group's means on the trace (the Traces tab's columns); each completion's own on its span.
    on_trace = {a.name: a.value for a in trace.info.assessments if a.span_id is None}
    assert on_trace == {"correctness_reward": 0.25, "format_reward": pytest.approx(0.2)}
    spans = {s.span_id: s.name for s in trace.data.spans}
    second = {a.name: a.value for a in trace.info.assessments if spans.get(a.span_id) == "completion 1"}
    assert second == {"correctness_reward": 1.0, "format_reward": 0.2, "advantage": pytest.approx(0.75)}
    assert len([s for s in trace.data.spans if s.name.startswith("completion ")]) == 4
    seconds = mlflow.MlflowClient().get_metric_history(run.info.run_id, "perf/completions_logging_seconds")
    assert [m.step for m in seconds] == [7] and seconds[0].value > 0


@pytest.mark.slow
def test_each_trace_is_written_once_whole_with_its_assessments(store, monkeypatch):
    """MLflow's exporter writes a trace's spans first, then the trace, whose INSERT then collides with
    the row the spans made: it merges each assessment apart, most of what a trace cost. The labs' store
    writes a trace once, whole (tracking.write_traces_whole): no span written apart, one write of the
    trace with every assessment, and each group read back with all its spans."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    spans_written: list[int] = []
    traces_written: list[int] = []  # the assessments each trace's write carried
    log_spans, start_trace = SqlAlchemyStore.log_spans, SqlAlchemyStore.start_trace

    def spans_counted(self, location, spans, *args, **kwargs):
        spans_written.append(len(spans))
        return log_spans(self, location, spans, *args, **kwargs)

    def traces_counted(self, trace_info, *args, **kwargs):
        traces_written.append(len(trace_info.assessments))
        return start_trace(self, trace_info, *args, **kwargs)

    monkeypatch.setattr(SqlAlchemyStore, "log_spans", spans_counted)
    monkeypatch.setattr(SqlAlchemyStore, "start_trace", traces_counted)
    trainer = SimpleNamespace(_logs=trainer_logs(groups=4, size=8), num_generations=8)
    with mlflow.start_run() as run:
        completions.CompletionLog(trainer, max_groups=4).on_log(
            None, SimpleNamespace(global_step=1), None, logs={"rewards/format_reward/mean": 0.2}
        )
        completions.flush()
    assert spans_written == [], f"spans were written apart from their trace: {spans_written}"
    # Each group: its two rewards' means on the trace, and each completion's two rewards and advantage.
    assert traces_written == [2 + 8 * 3] * 4
    traces = mlflow.search_traces(
        locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list", max_results=100
    )
    assert sorted(len(t.data.spans) for t in traces) == [1 + 8] * 4
    assert os.environ["MLFLOW_ASYNC_TRACE_LOGGING_MAX_INTERVAL_MILLIS"] == str(
        tracking.TRACE_SPAN_INTERVAL_MS
    )


@pytest.mark.slow
def test_two_runs_seeded_alike_in_one_store_keep_their_own_traces(store):
    """Every lab seeds Python's `random`, from which OpenTelemetry draws trace ids unless MLflow keeps a
    generator of its own: two runs of one seed in one store wrote the same ids, and the second run took
    the first's traces (the first's Traces tab empty, each trace holding both runs' assessments)."""
    import random

    trainer = SimpleNamespace(_logs=trainer_logs(groups=1, size=4), num_generations=4)
    runs = []
    for _ in range(2):
        random.seed(0)  # as transformers' set_seed does at the start of each lab
        with mlflow.start_run() as run:
            completions.CompletionLog(trainer, max_groups=1).on_log(
                None, SimpleNamespace(global_step=1), None, logs={"rewards/format_reward/mean": 0.2}
            )
            completions.flush()
        runs.append(run)
    found = [
        mlflow.search_traces(
            locations=[r.info.experiment_id], run_id=r.info.run_id, return_type="list", max_results=10
        )
        for r in runs
    ]
    assert [len(traces) for traces in found] == [1, 1], "a run lost its trace to the other"
    (first,), (second,) = found
    assert first.info.trace_id != second.info.trace_id
    # Its group's two reward means, and each of 4 completions' two rewards and advantage: no more.
    assert len(first.info.assessments) == len(second.info.assessments) == 2 + 4 * 3


def test_held_out_completions_of_base_and_adapter_side_by_side(store):
    settings = lab_settings(LAB_DIR, "cpu").replace(task="addition", eval_prompts=3, seed=0)

    def result(which, texts):
        return EvalResult(
            which, 3, 0.0, 1.0, 5.0, completions=tuple(texts), rewards={"format_reward": [0.2, 0.2, 0.0]}
        )

    with mlflow.start_run() as run:
        prompts = eval_rows(settings)["prompt"]
        completions.log_eval(prompts, result("base", ["a", "b", "c"]), result("adapter", ["x", "y", "z"]))
        completions.flush()
    table = mlflow.load_table("completions/held_out.json", run_ids=[run.info.run_id])
    assert list(table["base_completion"]) == ["a", "b", "c"] and list(table["adapter_completion"]) == [
        "x",
        "y",
        "z",
    ]
    (trace,) = mlflow.search_traces(
        locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list"
    )
    assert trace.info.tags["kind"] == "held-out"
    (third,) = [s for s in trace.data.spans if s.name == "held-out 2"]
    assert third.outputs == {"base": "c", "adapter": "z"}
    assert {a.name: a.value for a in trace.info.assessments if a.span_id == third.span_id} == {
        "base_format_reward": 0.0,
        "adapter_format_reward": 0.0,
    }


def test_the_overview_opens_with_the_verdict_then_the_figure_the_total_and_each_line():
    c = comparison()
    before = EvalResult("base", 32, 0.0, 0.5, 6.0)
    after = EvalResult("adapter", 32, 0.125, 1.0, 5.5)
    text = overview.description(
        "abc123", c, "Run doctor: nothing held learning back.", {"base": before, "adapter": after}
    )
    assert text.startswith("**The budget did not hold: measured peak 500.00 MiB vs budgeted 450.00 MiB")
    chart = text.index(
        "![Rewards per step, budget vs measured]"
        "(get-artifact?path=overview%2Frewards_and_memory.png&run_uuid=abc123)"
    )
    table = text.index("| **total (peak)** | 450.00 MiB | 500.00 MiB |")
    assert chart < table < text.index("| base_weights | 100.00 MiB | 110.00 MiB | +10.00 MiB |")
    assert "| train_activations | 80.00 MiB | not measured |" in text
    assert text.index("Run doctor:") < text.index("| accuracy | 0.0% | 12.5% |")
    assert "**Traces** tab" in text
    assert "![" not in overview.description("abc", c, "", {}, chart=False)


def test_the_overviews_figure_plots_each_rewards_mean_per_step_beside_the_memory_chart():
    """What a reader came for (the rewards climbing), from the rows TRL logged, then the budget-vs-measured
    chart, every memory axis in the run's unit: a Figure of real matplotlib, its lines' data read back."""
    history = [
        {"step": 1, "rewards/correctness_reward/mean": 0.1, "rewards/format_reward/mean": 0.2, "loss": 0.0},
        {"step": 2, "rewards/correctness_reward/mean": 0.4, "rewards/format_reward/mean": 0.6, "loss": 0.0},
        {"step": 3, "rewards/correctness_reward/mean": 0.7, "rewards/format_reward/mean": 0.9, "loss": 0.0},
        {"train_runtime": 12.0},  # the end-of-training summary row: not a step
    ]
    assert overview.reward_curves(history) == {
        "correctness_reward": ([1, 2, 3], [0.1, 0.4, 0.7]),
        "format_reward": ([1, 2, 3], [0.2, 0.6, 0.9]),
    }
    c = comparison()
    fig = overview.figure(c, history, [(1, 400 * MIB), (2, 500 * MIB)], c.total_budget)
    rewards, bars, peaks = fig.axes
    assert rewards.get_title() == "Rewards per step"
    drawn = {line.get_label(): list(line.get_ydata()) for line in rewards.get_lines()}
    assert drawn == {"correctness_reward": [0.1, 0.4, 0.7], "format_reward": [0.2, 0.6, 0.9]}
    assert bars.get_title() == "Budget vs measured, per line" and bars.get_ylabel() == "MiB"
    assert [t.get_text() for t in bars.get_xticklabels()] == c.paired
    assert peaks.get_ylabel() == "MiB" and list(peaks.get_lines()[0].get_ydata()) == [400.0, 500.0]
    # A run stopped before its first logged step still gets its figure, saying so.
    empty = overview.figure(c, [], [], c.total_budget).axes[0]
    assert not empty.get_lines() and empty.texts[0].get_text() == "no step logged"


def test_memory_keys_name_their_unit_and_the_glance_section_sorts_first():
    assert memory_names.memory_unit(on_gpu=True) == "gib" and memory_names.memory_unit(on_gpu=False) == "mib"
    assert memory_names.memory_key("base_weights", "budget", "mib") == "base_weights/budget_mib"
    logged = {
        "reward": 0.2,
        "rewards/format_reward/mean": 0.2,
        "rewards/format_reward/std": 0.1,
        "kl": 0.01,
        "loss": 0.3,
        "total/budget_mib": 1591.0,
        "total/measured_mib": 1290.0,
    }
    assert tracking.glance(logged, "mib") == {
        "at a glance/reward": 0.2,
        "at a glance/format_reward": 0.2,
        "at a glance/kl": 0.01,
        "at a glance/total budget_mib": 1591.0,
        "at a glance/total measured_mib": 1290.0,
    }
    # MLflow's metrics view sorts its sections by name (localeCompare): the glance comes before every
    # section the lab logs (the lines, clip_ratio, completions, eval, memory, perf, rewards, total ...).
    sections = [
        "base_weights",
        "clip_ratio",
        "completions",
        "eval",
        "host_runtime",
        "memory",
        "rewards/format_reward",
    ]
    assert sorted([*sections, tracking.GLANCE], key=str.casefold)[0] == tracking.GLANCE


def test_the_terminal_line_is_one_short_line_per_step():
    logs = {
        "loss": 0.01,
        "reward": 0.1875,
        "rewards/correctness_reward/mean": 0.0,
        "rewards/format_reward/mean": 0.1875,
        "kl": 0.19,
        "completions/clipped_ratio": 0.25,
        "step_time": 3.2,
        "epoch": 0.01,
    }
    line = console.step_line(12, 60, logs, {"perf/decode_tokens_per_s": 412.4}, 1290 * MIB)
    assert (
        line
        == "step 12/60  reward 0.188 (correctness 0.000 format 0.188)  kl 0.19  clipped 25%  412 tok/s  peak 1.26 GiB"
    )
    assert line.startswith(console.STEP_PREFIX)


def test_library_noise_is_dropped_and_what_a_user_can_act_on_stays(caplog):
    console.quiet_library_noise()
    pytree, unsloth = logging.getLogger("torch.utils._pytree"), logging.getLogger("unsloth_zoo.log")
    with caplog.at_level(logging.WARNING):
        pytree.warning(
            "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile"
        )
        unsloth.warning(
            "Unsloth: Could not build the patched trl.trainer.sft_trainer, so training will use trl's own"
        )
        unsloth.warning(
            "Unsloth: Could not build the patched trl.trainer.grpo_trainer, so training will use trl's own"
        )
        pytree.warning("something else about pytrees")
    messages = [r.getMessage() for r in caplog.records]
    assert not any("Enum subclass" in m or "sft_trainer" in m for m in messages), messages
    assert any("grpo_trainer" in m for m in messages) and "something else about pytrees" in messages


def test_a_lab_in_a_ci_job_survives_torchs_aliasing_check_as_at_a_desk(monkeypatch):
    """torch raises on a custom op whose output aliases its input where `CI` is set, and warns
    elsewhere; inductor's own `alloc_from_pool` trips it under Unsloth's `memory_planning` (it
    failed every forked CPU lab of CI's run on 2026-12-02). After `quiet_library_noise` it warns."""
    import torch
    import torch._functorch.config as functorch_config

    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(functorch_config, "error_on_custom_op_aliasing", True)  # torch's default in CI
    # A graph loaded from torch's on-disk cache skips the first-call check: compile it afresh.
    monkeypatch.setattr(functorch_config, "enable_autograd_cache", False)
    monkeypatch.delenv(console.ALIASING_ERROR_ENV, raising=False)

    # An op shaped like `torch.ops.inductor._alloc_from_pool` (memory_planning.py's wrapper): a schema
    # that claims a fresh tensor, an implementation that hands back memory it was given.
    library = torch.library.Library("grpolab_test", "DEF")
    library.define("same_tensor(Tensor x) -> Tensor")
    library.impl("same_tensor", lambda x: x, "CompositeExplicitAutograd")
    console.quiet_library_noise()
    compiled = torch.compile(lambda x: torch.ops.grpolab_test.same_tensor(x * 2) + 1, backend="aot_eager")
    with pytest.warns(UserWarning, match="must not also be an input"):
        assert compiled(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]
