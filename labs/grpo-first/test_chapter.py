"""Chapter 1's README command, run once by the suite (conftest.py: `chapter_run`), then read back
through MLflow's client: on a machine without a GPU, the tiny Qwen3 through Unsloth's CPU path, 4-bit
bitsandbytes layers, Unsloth's GRPO trainer, the budget, the probe and the MLflow run.

The README's other chapter 1 commands are here too: the command with flags (the wave's `finish-1`,
conftest.py) and `--eval-only` on the adapter the README run saved. How a run ends (a signal, out of
memory, a full disk) is tests/test_run_endings.py's; resuming is tests/test_run_resume.py's.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
from pathlib import Path

import mlflow
import pytest

from grpolab.config.settings import lab_settings
from grpolab.judging.claims import quarter_means

from suite import (
    LAB_DIR,
    README,
    README_FLAGS,
    REPO_ROOT,
    WAVE_TIMEOUT_S,
    Lab,
    chapter,
    cpu_only,
    only_run,
    prose,
    script_and_args,
)

pytestmark = [
    pytest.mark.slow,
    cpu_only("reads the CPU profile's README run; on a GPU the same command runs Qwen3-4B"),
]
README_EVAL_ONLY = "uv run python labs/grpo-first/train.py --eval-only outputs/grpo-first/<run>/adapter"
README_WITH_FLAGS = (
    "uv run python labs/grpo-first/train.py --max-steps 20 --num-generations 4 --max-completion-length 16 "
    "--learning-rate 2e-2 --output-dir /tmp/grpo"
)


@pytest.fixture
def readme(chapter_run):
    """The README run: it ended well, and opened exactly one run in the chapter's experiment."""
    assert chapter_run.code == 0, chapter_run.log()
    (run,) = chapter_run.runs
    return chapter_run, run


def history(chapter_run, run, key: str) -> list[float]:
    points = chapter_run.client.get_metric_history(run.info.run_id, key)
    return [p.value for p in sorted(points, key=lambda p: p.step)]


def test_it_says_plainly_that_it_runs_the_cpu_stand_in(readme):
    chapter_run, _ = readme
    out = chapter_run.stdout
    assert "No CUDA GPU found" in out and "tiny-qwen3" in out and "not Qwen3-4B" in out
    assert out.index("No CUDA GPU found") < out.index("Adapter saved to")
    print(f"README lab command on CPU took {chapter_run.seconds:.0f} s")  # shown with pytest -s / in CI logs


def test_run_finished_and_is_tagged_with_its_profile(readme):
    _, run = readme
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
    # The CPU profile's arithmetic, pinned before anything computed: the same bits on any x86-64 machine.
    assert tags["cpu_numerics"] == "book (1 thread, AVX2 kernels, MKL COMPATIBLE)"


def test_every_config_value_is_a_param(readme):
    _, run = readme
    expected = lab_settings(LAB_DIR, "cpu").as_params()
    for key, value in expected.items():
        assert run.data.params[key] == value, key


def test_the_trainers_effective_arguments_are_logged(readme):
    """What really trains, after the trainer's own defaults: the recipe lab.toml sets explicitly."""
    chapter_run, run = readme
    effective = json.loads(
        Path(
            chapter_run.client.download_artifacts(
                run.info.run_id, "trainer/effective_args.json", str(chapter_run.store)
            )
        ).read_text()
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


def test_decoding_speed_is_logged_against_the_roofline(readme):
    steps = lab_settings(LAB_DIR, "cpu").max_steps
    speed = history(*readme, "perf/decode_tokens_per_s")
    ratio = history(*readme, "perf/decode_roofline_ratio")
    assert len(speed) == len(ratio) == steps
    assert all(s > 0 for s in speed) and all(r > 0 for r in ratio)
    assert len(history(*readme, "perf/generation_vs_estimate")) == steps


def test_per_step_rewards_and_the_learning_signal(readme):
    steps = lab_settings(LAB_DIR, "cpu").max_steps
    fmt = history(*readme, "rewards/format_reward/mean")
    assert len(fmt) == steps
    assert len(history(*readme, "rewards/correctness_reward/mean")) == steps
    assert len(history(*readme, "loss")) == steps
    first, last = statistics.mean(fmt[:10]), statistics.mean(fmt[-10:])
    print(f"format reward: first 10 steps {first:.4f}, last 10 steps {last:.4f}")
    assert last - first >= 0.02, f"no learning signal: first 10 {first:.4f}, last 10 {last:.4f}"


def test_the_books_claims_hold_correctness_climbs_and_held_out_accuracy_rises(readme, chapter_claims):
    """The book's first run (labs/grpo-first/claims.py, which the matrix checks on every seed): the
    correctness reward climbs as the policy learns to put the right integer in its tag, held-out
    accuracy (greedy, prompts disjoint from training) rises with it, the adapter answers in the tag, and
    the doctor finds nothing. Held-out figures are counted in prompts, so a margin is a count of them."""
    figures = chapter_claims.figures
    print({k: round(v, 3) for k, v in figures.items()})
    assert chapter_claims.failures == [], chapter_claims.failures
    assert lab_settings(LAB_DIR, "cpu").eval_prompts == 64


def test_the_pages_quote_this_runs_figures_digit_for_digit(readme, chapter_claims):
    """The CPU profile computes the same bits on every x86-64 machine (docs/every-machine.md), so the
    figures the front page, the chapter's page and docs/every-machine.md quote for the README command
    are the ones this run computes, here or on any user's machine, to the last digit they print. Where
    a machine computes otherwise, that claim is false there, and this is the test that says so."""
    chapter_run, run = readme
    f = chapter_claims.figures
    s = lab_settings(LAB_DIR, "cpu")
    n, steps = s.eval_prompts, s.max_steps
    base, adapter = f["held_out_base"] / n, f["held_out_adapter"] / n
    first, last = f["correctness_first"], f["correctness_last"]
    format_first, format_last = quarter_means(history(chapter_run, run, "rewards/format_reward/mean"))
    tagged = f"{f['adapter_format'] / n:.1%}"
    quoted = {
        "the README's row": (
            chapter("grpo-first").measured,
            [f"held-out accuracy {base:.1%} -> {adapter:.1%}, correctness reward {first:.3f} -> {last:.3f};"],
        ),
        "the README's opening": (
            prose(README),
            [
                f"climbs from {first:.3f} to {last:.3f} over the {steps} steps and held-out accuracy from "
                f"{base:.1%} to {adapter:.1%},"
            ],
        ),
        "the chapter's page": (
            prose(LAB_DIR / "README.md"),
            [
                f"the correctness reward's mean goes from {first:.3f} over the first quarter of the {steps} "
                f"steps to {last:.3f} over the last, the format reward's from {format_first:.3f} to "
                f"{format_last:.3f}",
                f"accuracy goes from {base:.1%} for the base to {adapter:.1%} for the adapter and the format "
                f"rate from {run.data.metrics['eval/base_format_rate']:.1%} to {tagged};",
            ],
        ),
        "docs/every-machine.md": (
            prose(REPO_ROOT / "docs" / "every-machine.md"),
            [
                f"correctness {first:.3f} -> {last:.3f}, {f['held_out_rise']:.0f} of {n} held-out prompts "
                f"gained, {f['adapter_format']:.0f} in the tag",
                f"correctness {f['correctness_climb']:.3f} climbed, {f['held_out_rise']:.0f} held-out prompts of {n} "
                f"gained, {f['adapter_format']:.0f} answered in the tag",
            ],
        ),
    }
    for where, (text, phrases) in quoted.items():
        for phrase in phrases:
            assert phrase in text, f"{where} does not quote this run: {phrase!r}"


def test_the_doctor_finds_nothing_on_the_readme_run_and_says_how_it_learned(readme):
    """A run that learned: none of the book's culprits (nor any other finding), and the verdict states
    the curves and the held-out rise, in the summary and on the Overview."""
    chapter_run, run = readme
    (printed,) = [line for line in chapter_run.stdout.splitlines() if line.startswith("Run doctor:")]
    assert printed.startswith("Run doctor: nothing held learning back. Rewards: correctness_reward "), printed
    assert "format_reward" in printed and re.search(r"Held-out accuracy [\d.]+% -> [\d.]+%", printed)
    note = run.data.tags["mlflow.note.content"]
    assert printed in note


def test_memory_is_measured_and_paired_with_the_budget(readme):
    chapter_run, run = readme
    metrics = run.data.metrics
    assert metrics["memory/process_peak_gib"] > 0.1  # a Python process with torch imported
    steps = lab_settings(LAB_DIR, "cpu").max_steps
    assert len(history(*readme, "memory/step_peak_gib")) == steps
    # Each step's generation and training pass are phases of their own.
    assert len(history(*readme, "memory/generate_peak_gib")) == steps
    assert len(history(*readme, "memory/train_step_peak_gib")) == steps
    assert "memory/phase/load/process_peak_gib" in metrics
    # MLflow's own system metrics run beside the probe.
    assert any(key.startswith("system/") for key in metrics)
    for line in ("base_weights", "lora_params", "lora_grads", "optimizer_states"):
        assert f"{line}/budget_mib" in metrics and f"{line}/measured_mib" in metrics, line
        assert f"{line}/diff_mib" in metrics
    # Unsloth's trainer (both profiles) takes the reference from the base with the adapter disabled:
    # no reference copy is budgeted, and none was found among the tensors the run held.
    assert run.data.tags["trainer_class"] == "UnslothGRPOTrainer"
    assert not any(key.startswith("reference_policy/") for key in metrics)
    # The exact lines agree with the tensors the run really held.
    for line in ("lora_params", "lora_grads", "optimizer_states"):
        assert abs(metrics[f"{line}/rel_error"]) < 0.01, (line, metrics[f"{line}/rel_error"])
    assert abs(metrics["base_weights/rel_error"]) < 0.05
    assert "total/measured_mib" in metrics and "total/rel_error" in metrics
    # The CPU sheet's own lines: the runtime after the imports and what the loop grows by.
    for line in ("host_runtime", "host_shape_caches"):
        assert f"{line}/measured_mib" in metrics and f"{line}/diff_mib" in metrics, line
    # What no line explains (its arithmetic: tests/test_comparison.py, on figures built by hand) is the
    # figure the printed verdict gives: logged in the unit it names, from this run, not another.
    (outside,) = re.findall(r"outside every line: ([+-][\d.]+) MiB", chapter_run.stdout)
    assert metrics["total/unattributed_mib"] == pytest.approx(float(outside), abs=0.006)
    labels = json.loads(run.data.tags["memory_labels"])
    assert "resident set" in labels["memory/process_peak_gib"]


def test_the_budget_logged_is_the_one_the_cli_prints(readme, lab_module, capsys):
    """`train.py --budget-only` (in-process: it loads nothing) prints the sheet the run logged."""
    _, run = readme
    capsys.readouterr()
    assert lab_module.main(["--budget-only", "--profile", "cpu", "--json"]) == 0
    sheet = json.loads(capsys.readouterr().out)
    metrics = run.data.metrics
    for line in sheet["lines"]:
        assert metrics[f"{line['name']}/budget_mib"] == pytest.approx(line["bytes"] / 1024**2, rel=1e-9), (
            line["name"]
        )
    assert metrics["total/budget_mib"] == pytest.approx(sheet["total_bytes"] / 1024**2)
    # The CPU stand-in's lines in MiB (in GiB its small lines read 0.00 in MLflow's charts), named so.
    assert run.data.tags["memory_unit"] == "mib"
    assert 0.01 < metrics["base_weights/budget_mib"] < 1.0


def test_artifacts_adapter_chart_table_and_sheet(readme):
    chapter_run, run = readme
    client, run_id = chapter_run.client, run.info.run_id
    adapter = {a.path for a in client.list_artifacts(run_id, "adapter")}
    assert {"adapter/adapter_model.safetensors", "adapter/adapter_config.json"} <= adapter
    memory = {a.path for a in client.list_artifacts(run_id, "memory")}
    assert {"memory/budget_vs_measured.png", "memory/budget_vs_measured.md"} <= memory
    budget = {a.path for a in client.list_artifacts(run_id, "budget")}
    assert {"budget/sheet.txt", "budget/sheet.json"} <= budget
    # The Overview (grpolab.judging.overview): the verdict, in the run's unit alone, then the figure (the rewards
    # per step beside the memory chart) as an image of this run's artifact.
    note = run.data.tags["mlflow.note.content"]
    verdict = note.split("\n\n")[0]
    assert verdict.startswith("**The budget ") and set(re.findall(r"\b[KMG]iB\b", verdict)) == {"MiB"}
    assert {a.path for a in client.list_artifacts(run_id, "overview")} == {"overview/rewards_and_memory.png"}
    assert f"get-artifact?path=overview%2Frewards_and_memory.png&run_uuid={run_id})" in note


def test_held_out_accuracy_is_logged_before_and_after_training(readme):
    chapter_run, run = readme
    s = lab_settings(LAB_DIR, "cpu")
    for key in ("eval/accuracy", "eval/format_rate", "eval/mean_completion_length"):
        points = sorted(chapter_run.client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [p.step for p in points] == [0, s.max_steps], key  # the base, then the adapter
    metrics = run.data.metrics
    assert {"eval/base_accuracy", "eval/adapter_accuracy", "eval/adapter_format_rate"} <= set(metrics)
    out = chapter_run.stdout
    assert "Held-out, base: accuracy" in out and f"({s.eval_prompts} held-out prompts, greedy)" in out
    print(
        f"held-out format rate: base {metrics['eval/base_format_rate']:.1%}, "
        f"adapter {metrics['eval/adapter_format_rate']:.1%}"
    )


def test_the_run_doctors_verdict_is_printed_and_in_the_description(readme):
    """The verdict the lab printed is the description's doctor paragraph, whole: every finding."""
    chapter_run, run = readme
    (printed,) = [line for line in chapter_run.stdout.splitlines() if line.startswith("Run doctor:")]
    note = run.data.tags["mlflow.note.content"]
    (described,) = [part for part in note.split("\n\n") if part.startswith("Run doctor:")]
    assert described == printed


def test_a_saved_adapter_is_evaluated_alone(readme, tmp_path):
    """The README's `--eval-only outputs/grpo-first/<run>/adapter`, on the adapter the README run saved,
    as a lab process as the README run was (like with like): a run of its own, nothing trained, the
    training run's final figures exactly."""
    _, trained = readme
    script, args = script_and_args(README_EVAL_ONLY.replace("<run>", trained.info.run_name))
    assert script == LAB_DIR / "train.py" and (REPO_ROOT / args[1]).is_dir()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lab = Lab("eval-only", script, [*args, "--output-dir", str(tmp_path / "outputs")], uri, tmp_path)
    assert lab.wait(timeout=WAVE_TIMEOUT_S) == 0, lab.log()
    assert "Held-out, adapter: accuracy" in lab.stdout
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("grpo-first").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["run_kind"] == "eval"
    # The same adapter, the same greedy prompts, the same arithmetic: the training run's figures come back.
    metrics = trained.data.metrics
    for key in ("eval/adapter_format_rate", "eval/adapter_accuracy", "eval/base_accuracy"):
        assert run.data.metrics[key] == metrics[key], key
    assert not (tmp_path / "outputs").exists(), "evaluating trains and saves nothing"


def test_the_run_keeps_every_key_it_had_before_the_chapter_redesign(readme):
    """The chapter-folder redesign (the recipe, the split harness) changed where things live, not what a run
    records: the README run's params, metrics, tags and artifacts have the keys they had before it
    (readme_run_keys.json beside this file, read from the README run of 2026-12-01 on the commit before). Since
    then, by design (issue 19): memory figures name their unit (`base_weights/budget_mib` on the CPU),
    the `at a glance/*` copies, `perf/completions_logging_seconds`, the tag `memory_unit` and the
    held-out completions table (`completions/held_out.json`, tag `mlflow.loggedArtifacts`); (issue 20) the
    tag `output_dir`, the run's folder, which `--resume <run id>` finds its checkpoints by; and (issue 25)
    `completions/distinct_share` and `completions/tag_like_ratio`, what the run doctor reads of the
    completions themselves (a group with no spread, a parse that rejects written answers); and (issue
    30) the tags `cpu_numerics`, the arithmetic the run computed with, and `doctor_findings`, the
    doctor's findings by name; and (issue 32) the artifact `overview/rewards_and_memory.png`, the figure
    the Overview opens with: each reward's mean per step beside the budget-vs-measured chart; and (issue
    40) the setting `task_config`, the tags `task_source`, `task_name` and `task_check`, where the task
    came from and what its check found, and the check's table `task_check/table.md`; and (issue 42) the
    setting `rollout_adapter`, whether the rollouts were sampled with the adapter being trained."""
    chapter_run, run = readme
    before = json.loads((Path(__file__).with_name("readme_run_keys.json")).read_text())
    client = chapter_run.client

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


def test_the_readme_command_with_flags(wave):
    """The README's command with flags, run in the wave of lab processes (conftest.py: `finish-1`)."""
    words = shlex.split(README_WITH_FLAGS)
    flags = words[words.index("labs/grpo-first/train.py") + 1 : words.index("--output-dir")]
    assert flags == README_FLAGS, "suite.README_FLAGS no longer match the README"
    lab = wave["labs"]["finish-1"]
    assert wave["codes"]["finish-1"] == 0, lab.log()
    run = only_run(mlflow.MlflowClient(wave["uri"]), lab)
    params = run.data.params
    assert (params["max_steps"], params["num_generations"], params["per_device_train_batch_size"]) == (
        "20",
        "4",
        "4",
    )
    assert (params["max_completion_length"], params["learning_rate"]) == ("16", "0.02")
    assert run.data.tags["overridden"] == "learning_rate,max_completion_length,max_steps,num_generations"
    assert list(lab.output.glob("grpo-first/*/adapter/adapter_config.json"))
