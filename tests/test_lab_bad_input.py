"""Bad input, as a user types it: one line on stderr, exit code 2, nothing half-written.

Each runs the lab's `main` in this process (suite.run_in_process) with its own MLflow store: the
refusals come before anything loads, except the prompts that cannot fit, found once the tokenizer
exists (after the imports: the `stack` fixture has them here already).
"""

from __future__ import annotations

import pytest

from suite import HAS_CUDA, run_in_process


def refused(lab_module, args: list[str], tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return run_in_process(lab_module, [*args, "--output-dir", str(tmp_path / "outputs")], uri=uri)


def assert_refused_cleanly(result, tmp_path, words: str) -> None:
    assert result.code == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and words in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "mlflow.db").exists(), "no MLflow run may be created for refused input"
    assert not (tmp_path / "outputs").exists(), "nothing may be written to outputs/"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-steps", "0"], "max_steps: must be positive"),
        (["--max-steps", "-5"], "max_steps: must be positive"),
        (["--num-generations", "1"], "--num-generations 2 or more"),
        (["--max-completion-length", "4096"], "leaves no room for the prompt"),
        (["--model", "/nowhere/model"], "no model at '/nowhere/model'"),
        (["--task", "chess"], "unknown task 'chess'"),
        (["--task", "reasoning-gym:chess"], "reasoning-gym has no dataset 'chess'"),
        (["--task", "nowhere.jsonl"], "nowhere.jsonl: no such file"),
        (["--task-config", "{not json"], "task_config: not JSON"),
        (["--task-config", '{"checker": "number"}'], "the book's task 'small-addition' takes no config"),
        (["--num-generations", "many"], "invalid int value"),
        (["--fast-inference", "perhaps"], "expected true or false"),
    ],
)
def test_refused_before_any_model_loads(lab_module, args, words, tmp_path):
    assert_refused_cleanly(refused(lab_module, ["--profile", "cpu", *args], tmp_path), tmp_path, words)


def test_prompts_that_cannot_fit_are_refused_before_the_run(lab_module, stack, tmp_path):
    # 200 completion tokens leave 56 for prompts of ~150 characters: every prompt is dropped.
    result = refused(lab_module, ["--profile", "cpu", "--max-completion-length", "200"], tmp_path)
    assert_refused_cleanly(result, tmp_path, "every prompt is longer than")


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal that happens only on a machine without a GPU")
def test_forcing_the_real_profile_without_a_gpu_fails_at_once(lab_module, tmp_path):
    result = refused(lab_module, ["--profile", "gpu"], tmp_path)
    assert_refused_cleanly(result, tmp_path, "--profile gpu needs a CUDA GPU")


def test_a_task_whose_reward_runs_the_completion_is_refused_before_anything_loads(lab_module, tmp_path):
    """The task check's fast part, before the sheet's model loads: a task file whose reward evaluates
    the answer (Python's eval) is refused by name, with the command that shows every check."""
    from task.__main__ import new

    path, _ = new("evaluates", tmp_path / "task")
    text = path.read_text()
    fault = "completions, parse_answer, lambda answer"
    assert fault in text
    path.write_text(
        text.replace(fault, "completions, lambda text: eval(answer_span(text) or '0'), lambda answer")
    )
    result = refused(lab_module, ["--profile", "cpu", "--task", str(path)], tmp_path)
    assert_refused_cleanly(result, tmp_path, "task check: evaluates failed code")
    assert f"uv run python -m task check {path}" in result.stderr and "--ignore-task-check" in result.stderr
