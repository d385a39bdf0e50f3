"""The README's lab command, run for real on CPU, then read back through MLflow's client.

`uv run python labs/grpo-first/train.py` on a machine without a GPU: the tiny Qwen3
through Unsloth's CPU path, 4-bit bitsandbytes layers, TRL's GRPOTrainer, the budget,
the probe and the MLflow run. One run is shared by the checks below; the out-of-memory run
is its own (Ctrl-C and every other ending: tests/test_run_endings.py).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import mlflow
import pytest
from conftest import HAS_CUDA, LAB_DIR, REPO_ROOT, only_run, run_lab

from grpolab.settings import lab_settings

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(HAS_CUDA, reason="runs the CPU profile; on a GPU the same command runs Qwen3-4B"),
]


def history(ctx, key: str) -> list[float]:
    points = ctx["client"].get_metric_history(ctx["run"].info.run_id, key)
    return [p.value for p in sorted(points, key=lambda p: p.step)]


def test_it_says_plainly_that_it_runs_the_cpu_stand_in(cpu_lab_run):
    out = cpu_lab_run["stdout"]
    assert "No CUDA GPU found" in out and "tiny-qwen3" in out and "not Qwen3-4B" in out
    assert out.index("No CUDA GPU found") < out.index("Adapter saved to")
    print(
        f"README lab command on CPU took {cpu_lab_run['seconds']:.0f} s"
    )  # shown with pytest -s / in CI logs


def test_run_finished_and_is_tagged_with_its_profile(cpu_lab_run):
    run = cpu_lab_run["run"]
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags["profile"], tags["backend"], tags["model_id"]) == ("cpu", "unsloth-cpu", "tiny-qwen3")
    assert tags["gpu_name"] == "cpu"
    assert len(tags["uv_lock_sha256"]) == 64
    assert tags["version/trl"] == "1.15.0" and tags["version/unsloth"]
    # The allocator configuration Unsloth really set at import, before anything touched CUDA (on a GPU
    # torch's allocator reads it when CUDA initialises), and the standby switch it was imported with.
    assert tags["cuda_alloc_conf"] == "expandable_segments:True"
    assert tags["cuda_alloc_conf_applied"].startswith("yes")
    assert tags["unsloth_vllm_standby_env"] == "0"


def test_every_config_value_is_a_param(cpu_lab_run):
    params = cpu_lab_run["run"].data.params
    expected = lab_settings(LAB_DIR, "cpu").as_params()
    for key, value in expected.items():
        assert params[key] == value, key


def test_the_trainers_effective_arguments_are_logged(cpu_lab_run):
    """What really trains, after the trainer's own defaults: the recipe lab.toml sets explicitly."""
    client, run = cpu_lab_run["client"], cpu_lab_run["run"]
    effective = json.loads(
        Path(client.download_artifacts(run.info.run_id, "trainer/effective_args.json")).read_text()
    )
    s = lab_settings(LAB_DIR, "cpu")
    for name in (
        "learning_rate",
        "warmup_steps",
        "weight_decay",
        "max_grad_norm",
        "beta",
        "epsilon",
        "loss_type",
    ):
        assert effective[name] == getattr(s, name), name
        assert run.data.params[f"trainer.{name}"] == str(getattr(s, name)), name
    assert effective["scale_rewards"] == s.scale_rewards and effective["num_generations"] == s.num_generations


def test_decoding_speed_is_logged_against_the_roofline(cpu_lab_run):
    steps = lab_settings(LAB_DIR, "cpu").max_steps
    speed = history(cpu_lab_run, "perf/decode_tokens_per_s")
    ratio = history(cpu_lab_run, "perf/decode_roofline_ratio")
    assert len(speed) == len(ratio) == steps
    assert all(s > 0 for s in speed) and all(r > 0 for r in ratio)
    assert len(history(cpu_lab_run, "perf/generation_vs_estimate")) == steps


def test_per_step_rewards_and_the_learning_signal(cpu_lab_run):
    steps = lab_settings(LAB_DIR, "cpu").max_steps
    fmt = history(cpu_lab_run, "rewards/format_reward/mean")
    assert len(fmt) == steps
    assert len(history(cpu_lab_run, "rewards/correctness_reward/mean")) == steps
    assert len(history(cpu_lab_run, "loss")) == steps
    first, last = statistics.mean(fmt[:10]), statistics.mean(fmt[-10:])
    print(f"format reward: first 10 steps {first:.4f}, last 10 steps {last:.4f}")
    assert last - first >= 0.02, f"no learning signal: first 10 {first:.4f}, last 10 {last:.4f}"


def test_memory_is_measured_and_paired_with_the_budget(cpu_lab_run):
    metrics = cpu_lab_run["run"].data.metrics
    assert metrics["memory/process_peak_gib"] > 0.1  # a Python process with torch imported
    steps = lab_settings(LAB_DIR, "cpu").max_steps
    assert len(history(cpu_lab_run, "memory/step_peak_gib")) == steps
    # Each step's generation and training pass are phases of their own.
    assert len(history(cpu_lab_run, "memory/generate_peak_gib")) == steps
    assert len(history(cpu_lab_run, "memory/train_step_peak_gib")) == steps
    assert "memory/phase/load/process_peak_gib" in metrics
    # MLflow's own system metrics run beside the probe.
    assert any(key.startswith("system/") for key in metrics)
    for line in ("base_weights", "lora_params", "lora_grads", "optimizer_states"):
        assert f"{line}/budget_mib" in metrics and f"{line}/measured_mib" in metrics, line
        assert f"{line}/diff_mib" in metrics
    # Unsloth's trainer (both profiles) takes the reference from the base with the adapter disabled:
    # no reference copy is budgeted, and none was found among the tensors the run held.
    assert cpu_lab_run["run"].data.tags["trainer_class"] == "UnslothGRPOTrainer"
    assert not any(key.startswith("reference_policy/") for key in metrics)
    # The exact lines agree with the tensors the run really held.
    for line in ("lora_params", "lora_grads", "optimizer_states"):
        assert abs(metrics[f"{line}/rel_error"]) < 0.01, (line, metrics[f"{line}/rel_error"])
    assert abs(metrics["base_weights/rel_error"]) < 0.05
    assert "total/measured_mib" in metrics and "total/rel_error" in metrics
    # The CPU sheet's own lines: the runtime after the imports and what the loop grows by.
    for line in ("host_runtime", "host_shape_caches"):
        assert f"{line}/measured_mib" in metrics and f"{line}/diff_mib" in metrics, line
    # What no line explains: the total's miss less the misses of the lines held at the sheet's peak.
    sheet = json.loads(
        (
            Path(
                cpu_lab_run["client"].download_artifacts(cpu_lab_run["run"].info.run_id, "budget/sheet.json")
            )
        ).read_text()
    )
    peak_phase = max(sheet["phases"], key=sheet["phases"].get)
    held = [
        ln["name"]
        for ln in sheet["lines"]
        if peak_phase in ln["phases"] and f"{ln['name']}/diff_mib" in metrics
    ]
    expected = (
        metrics["total/measured_mib"]
        - metrics["total/budget_compared_mib"]
        - sum(metrics[f"{n}/diff_mib"] for n in held)
    )
    assert metrics["total/unattributed_mib"] == pytest.approx(expected, abs=1e-6)
    labels = json.loads(cpu_lab_run["run"].data.tags["memory_labels"])
    assert "resident set" in labels["memory/process_peak_gib"]


def test_the_budget_logged_is_the_one_the_cli_prints(cpu_lab_run, lab_module, capsys):
    """`train.py --budget-only` (in-process: it loads nothing) prints the sheet the run logged."""
    capsys.readouterr()
    assert lab_module.main(["--budget-only", "--profile", "cpu", "--json"]) == 0
    sheet = json.loads(capsys.readouterr().out)
    metrics = cpu_lab_run["run"].data.metrics
    for line in sheet["lines"]:
        assert metrics[f"{line['name']}/budget_mib"] == pytest.approx(line["bytes"] / 1024**2, rel=1e-9), (
            line["name"]
        )
    assert metrics["total/budget_mib"] == pytest.approx(sheet["total_bytes"] / 1024**2)
    # The CPU stand-in's lines in MiB (in GiB its small lines read 0.00 in MLflow's charts), named so.
    assert cpu_lab_run["run"].data.tags["memory_unit"] == "mib"
    assert 0.01 < metrics["base_weights/budget_mib"] < 1.0


def test_artifacts_adapter_chart_table_and_sheet(cpu_lab_run):
    client, run_id = cpu_lab_run["client"], cpu_lab_run["run"].info.run_id
    adapter = {a.path for a in client.list_artifacts(run_id, "adapter")}
    assert {"adapter/adapter_model.safetensors", "adapter/adapter_config.json"} <= adapter
    memory = {a.path for a in client.list_artifacts(run_id, "memory")}
    assert {"memory/budget_vs_measured.png", "memory/budget_vs_measured.md"} <= memory
    budget = {a.path for a in client.list_artifacts(run_id, "budget")}
    assert {"budget/sheet.txt", "budget/sheet.json"} <= budget
    # The Overview (grpolab.overview): the verdict, then the chart as an image of this run's artifact.
    note = cpu_lab_run["run"].data.tags["mlflow.note.content"]
    assert note.startswith("**The budget ")
    assert f"get-artifact?path=memory%2Fbudget_vs_measured.png&run_uuid={run_id})" in note


def test_running_out_of_memory_leaves_a_failed_run_with_peak_phase_and_line(wave, tmp_path):
    """`train.py --profile cpu --max-steps 3 --memory-cap-gib 0.02`, run in the wave (tests/conftest.py)."""
    lab = wave["labs"]["oom"]
    assert wave["codes"]["oom"] == 3, lab.log()
    (error,) = [line for line in lab.stderr.splitlines() if line.startswith("error: out of memory")]
    assert "lower" in error or "use" in error
    run = only_run(wave["client"], lab)
    assert (run.info.status, run.data.tags["ending"]) == ("FAILED", "out of memory"), lab.log()
    assert run.data.tags["mlflow.note.content"].startswith("Out of memory during ")
    assert run.data.metrics["oom/peak_gib"] > 0
    assert run.data.tags["oom_phase"] in {"load", "generate", "train_step", "train"}
    assert run.data.tags["oom_line"] in json.dumps(
        json.loads(
            Path(
                wave["client"].download_artifacts(run.info.run_id, "budget/sheet.json", str(tmp_path))
            ).read_text()
        )["lines"]
    )
    assert not list(lab.output.glob("*/*/adapter")), "no adapter for a run that never trained"


def test_held_out_accuracy_is_logged_before_and_after_training(cpu_lab_run):
    s = lab_settings(LAB_DIR, "cpu")
    client, run_id = cpu_lab_run["client"], cpu_lab_run["run"].info.run_id
    for key in ("eval/accuracy", "eval/format_rate", "eval/mean_completion_length"):
        points = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [p.step for p in points] == [0, s.max_steps], key  # the base, then the adapter
    metrics = cpu_lab_run["run"].data.metrics
    assert {"eval/base_accuracy", "eval/adapter_accuracy", "eval/adapter_format_rate"} <= set(metrics)
    out = cpu_lab_run["stdout"]
    assert "Held-out, base: accuracy" in out and f"({s.eval_prompts} held-out prompts, greedy)" in out
    print(
        f"held-out format rate: base {metrics['eval/base_format_rate']:.1%}, adapter {metrics['eval/adapter_format_rate']:.1%}"
    )


def test_the_run_doctors_verdict_is_printed_and_in_the_description(cpu_lab_run):
    note = cpu_lab_run["run"].data.tags["mlflow.note.content"]
    assert "Run doctor:" in note and "Run doctor:" in cpu_lab_run["stdout"]
    doctor = note[note.index("Run doctor:") :]
    assert doctor in cpu_lab_run["stdout"].replace("\n", " ") or doctor.split(".")[0] in cpu_lab_run["stdout"]


def test_a_saved_adapter_is_evaluated_alone(cpu_lab_run, tmp_path):
    adapter = REPO_ROOT / "outputs" / "grpo-first" / cpu_lab_run["run"].info.run_name / "adapter"
    assert adapter.is_dir()
    result = run_lab(["--eval-only", str(adapter)], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Held-out, adapter: accuracy" in result.stdout
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["grpo-first"], output_format="list")
    assert run.info.status == "FINISHED" and run.data.tags["run_kind"] == "eval"
    # The same adapter, the same greedy prompts: the training run's final figures come back.
    trained = cpu_lab_run["run"].data.metrics
    assert run.data.metrics["eval/adapter_format_rate"] == pytest.approx(trained["eval/adapter_format_rate"])
    assert run.data.metrics["eval/base_accuracy"] == pytest.approx(trained["eval/base_accuracy"])
    assert not (tmp_path / "outputs").exists(), "evaluating trains and saves nothing"


def test_the_run_keeps_every_key_it_had_before_the_chapter_redesign(cpu_lab_run):
    """The chapter-folder redesign (the recipe, the split harness) changed where things live, not what a run
    records: the README run's params, metrics, tags and artifacts have the keys they had before it
    (tests/data/readme_run_keys.json, read from the README run of 2026-12-01 on the commit before). Since
    then, by design (issue 19): memory figures name their unit (`base_weights/budget_mib` on the CPU),
    the `at a glance/*` copies, `perf/completions_logging_seconds`, the tag `memory_unit` and the
    held-out completions table (`completions/held_out.json`, tag `mlflow.loggedArtifacts`); and (issue 20) the
    tag `output_dir`, the run's folder, which `--resume <run id>` finds its checkpoints by."""
    before = json.loads((REPO_ROOT / "tests" / "data" / "readme_run_keys.json").read_text())
    run, client = cpu_lab_run["run"], cpu_lab_run["client"]

    def artifacts(path=None):
        found = []
        for f in client.list_artifacts(run.info.run_id, path):
            found += artifacts(f.path) if f.is_dir else [f.path]
        return found

    def stable(tags):  # git's tags depend on the checkout, not on the run
        return sorted(t for t in tags if not t.startswith("mlflow.source.git."))

    assert sorted(run.data.params) == before["params"]
    assert sorted(run.data.metrics) == before["metrics"]
    assert stable(run.data.tags) == stable(before["tags"])
    assert sorted(artifacts()) == before["artifacts"]
