"""Every notebook runs from a clean kernel, is committed without outputs, and matches its script.

Notebooks are authored as jupytext percent scripts (`notebooks/*.py`, readable diffs) paired
with the `.ipynb` users open; both are committed and must say the same thing. Each chapter's notebook
is found by the README's chapter table and executes against its chapter's README run (conftest.py:
`chapter_run`), which it reads back as it reads a user's store after the README's command, instead of
training a run of its own. A chapter with an environment of its own executes its notebook there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request

import jupytext
import nbformat
import pytest

from suite import HAS_CUDA, REPO_ROOT, chapters, command_words, free_port

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
# The notebooks of the chapters that run in this environment, each reading its chapter's README run.
HERE = [
    pytest.param(c.notebook, marks=pytest.mark.chapter(c.name), id=c.notebook.name)
    for c in chapters()
    if c.here
]


def test_there_is_a_notebook_for_every_lab():
    labs = {p.parent.name for p in (REPO_ROOT / "labs").glob("*/train.py")}
    covered = {lab for lab in labs for nb in NOTEBOOKS if nb.stem.endswith(lab)}
    assert labs and covered == labs, f"labs without a notebook: {labs - covered}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name}: a code cell has committed outputs"
            assert cell.execution_count is None, f"{path.name}: a code cell has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_and_its_script_are_in_sync(path):
    script = path.with_suffix(".py")
    assert script.exists(), f"{path.name} has no paired percent script"
    from_script = jupytext.read(script)
    from_notebook = nbformat.read(path, as_version=4)
    pairs = list(zip(from_script.cells, from_notebook.cells, strict=True))
    for a, b in pairs:
        assert (a.cell_type, a.source) == (b.cell_type, b.source), (
            f"{path.name} and {script.name} differ: run `uv run jupytext --sync {script.relative_to(REPO_ROOT)}`"
        )


@pytest.mark.slow
@pytest.mark.parametrize("path", HERE)
def test_notebook_executes_from_a_clean_kernel(path, tmp_path, monkeypatch, request):
    import mlflow
    from nbclient import NotebookClient

    # The kernel inherits this environment: its chapter's store, holding the chapter's README run (on a
    # GPU, where the suite runs no chapter, a store of its own: the notebook trains what it shows).
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    if not HAS_CUDA:
        store = request.getfixturevalue("chapter_run").uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    chapter = path.stem.split("-", 1)[1]
    mlflow.set_tracking_uri(store)
    before = {r.info.run_id for r in mlflow.search_runs(experiment_names=[chapter], output_format="list")}
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    first = next(c for c in nb.cells if c.cell_type == "code" and c.outputs)
    first_text = "".join(o.get("text", "") for o in first.outputs)
    assert "CPU profile" in first_text or "real profile" in first_text, (
        "the first output must say which profile"
    )
    images = sum(
        "image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert images >= 3, "budget chart, reward curves and budget-vs-measured bars are drawn inline"
    runs = mlflow.search_runs(experiment_names=[chapter], output_format="list")
    assert runs, f"no run in experiment {chapter} for the notebook to read"
    new = [run for run in runs if run.info.run_id not in before]
    if not HAS_CUDA:  # it read the chapter's README run back: it trained nothing of its own
        assert not new, f"{path.name} trained {len(new)} run(s) instead of reading its chapter's"
    for run in new:  # on a GPU, the notebook's own runs all finished
        assert run.info.status == "FINISHED", run.info.run_name
        shutil.rmtree(REPO_ROOT / "outputs" / chapter / run.info.run_name, ignore_errors=True)


README_JUPYTER = "uv run jupyter lab"


@pytest.mark.slow
def test_jupyter_lab_from_the_readme_serves_the_notebooks(tmp_path):
    port = free_port()
    base = command_words(README_JUPYTER)
    token = "grpo-test"
    headless = ["--no-browser", "--ip", "127.0.0.1", "--port", str(port), f"--IdentityProvider.token={token}"]
    if os.geteuid() == 0:  # CI runs as root; Jupyter refuses root without this
        headless.append("--allow-root")
    server = subprocess.Popen(
        [*base, *headless],
        cwd=REPO_ROOT,
        env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_DATA_DIR": str(tmp_path / "data")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/api/contents/notebooks",
                    headers={"Authorization": f"token {token}"},
                )
                listing = urllib.request.urlopen(request, timeout=5).read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("jupyter lab did not answer on loopback within 120 s")
                time.sleep(1)
        for nb in NOTEBOOKS:
            assert nb.name in listing
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10)
        assert page.status == 200
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
