"""Chapter 7's three ways in, each trained from the command line alone on the CPU (the root conftest.py's
`run_own_tasks`: the page's commands, run once, in the background): a task file `uv run python -m task
new demo` wrote, with its own tests passing; a data file with a checker; a reasoning-gym dataset. Each
run ends FINISHED, checked before it loaded anything, with where its task came from in its tags.
"""

from __future__ import annotations

import hashlib
import json

import mlflow
import pytest

from suite import REPO_ROOT, cpu_only

pytestmark = [
    pytest.mark.slow,
    cpu_only("trains the CPU stand-in on each task; on a GPU they would train Qwen3-4B"),
]


def _run(own_tasks, key: str):
    lab = own_tasks["labs"][key]
    assert own_tasks["codes"][key] == 0, "\n".join(lab.lines[-40:]) + lab.stderr_path.read_text()[-3000:]
    client = mlflow.MlflowClient(lab.uri)
    [run] = client.search_runs([client.get_experiment_by_name("grpo-first").experiment_id])
    assert run.info.status == "FINISHED"
    return run


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_task_new_writes_a_task_that_trains_and_whose_own_tests_pass(own_tasks):
    folder = own_tasks["folder"]
    assert own_tasks["made"].returncode == 0, own_tasks["made"].stderr
    assert (
        f"--task {folder / 'demo.py'}" in own_tasks["made"].stdout.replace("\n", " ")
        or "demo.py" in own_tasks["made"].stdout
    )
    tested = own_tasks["tested"]
    assert tested.returncode == 0 and "3 passed" in tested.stdout, (
        tested.stdout[-3000:] + tested.stderr[-2000:]
    )
    tags = _run(own_tasks, "file").data.tags
    assert tags["task_source"] == "file" and tags["task_name"] == "demo"
    assert tags["task_file"] == str(folder / "demo.py") and tags["task_file_sha256"] == _sha256(
        folder / "demo.py"
    )
    assert tags["task_check"] == "passed"


def test_a_data_file_trains_with_its_checker_and_its_rows_in_the_tags(own_tasks):
    tags = _run(own_tasks, "data").data.tags
    data = REPO_ROOT / "labs" / "grpo-own-task" / "products.jsonl"
    assert tags["task_source"] == "data file" and tags["task_data"] == str(data)
    assert tags["task_data_rows"] == str(len(data.read_text().splitlines()))
    assert tags["task_data_sha256"] == _sha256(data) and tags["task_data_checker"] == "integer"
    assert tags["task_check"] == "passed"


def test_a_reasoning_gym_dataset_trains_with_its_dataset_config_and_version_in_the_tags(own_tasks):
    run = _run(own_tasks, "gym")
    tags = run.data.tags
    assert tags["task_source"] == "reasoning-gym" and tags["task_gym_dataset"] == "basic_arithmetic"
    assert json.loads(tags["task_config"]) == {"max_digits": 1, "max_terms": 2}
    assert tags["task_gym_version"] == "0.1.25" and tags["task_check"] == "passed"
    assert run.data.params["task"] == "reasoning-gym:basic_arithmetic"
