"""Bad input, as a user types it: one line on stderr, a non-zero exit, nothing half-written."""

from __future__ import annotations

import pytest
from conftest import HAS_CUDA, run_lab


def assert_refused_cleanly(result, tmp_path, words: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
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
        (["--num-generations", "many"], "invalid int value"),
        (["--fast-inference", "perhaps"], "expected true or false"),
    ],
)
def test_refused_before_any_model_loads(args, words, tmp_path):
    assert_refused_cleanly(run_lab(["--profile", "cpu", *args], tmp_path, timeout=120), tmp_path, words)


def test_prompts_that_cannot_fit_are_refused_before_the_run(tmp_path):
    # 200 completion tokens leave 56 for prompts of ~150 characters: every prompt is dropped.
    result = run_lab(["--profile", "cpu", "--max-completion-length", "200"], tmp_path, timeout=600)
    assert_refused_cleanly(result, tmp_path, "every prompt is longer than")


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal that happens only on a machine without a GPU")
def test_forcing_the_real_profile_without_a_gpu_fails_at_once(tmp_path):
    result = run_lab(["--profile", "gpu"], tmp_path, timeout=120)
    assert_refused_cleanly(result, tmp_path, "--profile gpu needs a CUDA GPU")
