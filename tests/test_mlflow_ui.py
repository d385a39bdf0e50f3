"""The MLflow UI in a real browser: budget and measured memory side by side, the chart, the table.

Starts the README's UI command (`uv run mlflow ui --backend-store-uri sqlite:///mlflow.db`)
on loopback over the store the CPU lab run wrote, drives Debian's Chromium through
Playwright, and saves screenshots. They go to pytest's temporary folder, so a test run leaves
the checkout clean; `UPDATE_SCREENSHOTS=1 uv run pytest tests/test_mlflow_ui.py` rewrites the
README's picture, docs/mlflow-budget-vs-measured.png.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import HAS_CUDA, REPO_ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
README_SCREENSHOT = REPO_ROOT / "docs" / "mlflow-budget-vs-measured.png"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (installed by .ci/run)"),
    pytest.mark.skipif(
        HAS_CUDA, reason="reads the CPU lab run; on a GPU run the lab and open the UI by hand"
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_ui(cpu_lab_run):
    port = free_port()
    ui = ["mlflow", "ui", "--backend-store-uri", "sqlite:///mlflow.db"]  # the README's command
    command = ["uv", "run", *ui] if shutil.which("uv") else [sys.executable, "-m", *ui]
    env = {**os.environ, "UV_PROJECT": str(REPO_ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    # Started where the lab's store lies, so the relative sqlite:///mlflow.db is that store.
    server = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        cwd=cpu_lab_run["store"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        server.kill()
        pytest.fail("mlflow ui did not come up on loopback within 120 s")
    yield url
    os.killpg(server.pid, 15)
    server.wait(timeout=30)


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        yield page
        browser.close()


def run_url(base: str, run) -> str:
    return f"{base}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"


def test_run_page_shows_budget_and_measured_side_by_side(mlflow_ui, page, cpu_lab_run, tmp_path):
    run = cpu_lab_run["run"]
    page.goto(run_url(mlflow_ui, run))
    page.get_by_text("FINISHED", exact=False).first.wait_for(timeout=60_000)
    for name in (
        "budget/lora_params",
        "measured/lora_params",
        "budget/base_weights",
        "measured/base_weights",
    ):
        search = page.get_by_placeholder("Search metrics", exact=False)
        if search.count():
            search.first.fill(name)
        page.get_by_text(name, exact=True).first.wait_for(timeout=30_000)
    if page.get_by_placeholder("Search metrics", exact=False).count():
        page.get_by_placeholder("Search metrics", exact=False).first.fill("lora_params")
        page.wait_for_timeout(500)
    page.screenshot(path=str(tmp_path / "run-page.png"), full_page=True)


def test_artifact_view_opens_the_chart_and_the_table(mlflow_ui, page, cpu_lab_run, tmp_path):
    run = cpu_lab_run["run"]
    page.goto(run_url(mlflow_ui, run) + "/artifacts")
    training = page.get_by_text("Model training", exact=True)
    training.first.wait_for(timeout=60_000)
    training.first.click()  # MLflow 3 opens in its GenAI view; the lab's runs are model training
    page.goto(run_url(mlflow_ui, run) + "/artifacts")
    page.get_by_text("memory", exact=True).first.click(timeout=60_000)
    page.get_by_text("budget_vs_measured.md", exact=True).first.click(timeout=30_000)
    page.get_by_text("The budget", exact=False).first.wait_for(timeout=30_000)
    page.get_by_text("budget_vs_measured.png", exact=True).first.click(timeout=30_000)
    image = page.locator(
        "img[src*='budget_vs_measured.png'], img[src*='get-artifact'], img[src^='blob:']"
    ).first
    image.wait_for(timeout=30_000)
    assert image.evaluate("img => img.complete && img.naturalWidth > 0")
    assistant = page.get_by_label("New Chat", exact=True)
    if assistant.count():  # MLflow 3's assistant side panel: close it so the chart gets the width
        page.get_by_label("Close", exact=True).click()
        assistant.wait_for(state="hidden", timeout=10_000)
    shot = (
        README_SCREENSHOT
        if os.environ.get("UPDATE_SCREENSHOTS") == "1"
        else tmp_path / README_SCREENSHOT.name
    )
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
