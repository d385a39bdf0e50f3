"""The MLflow UI in a real browser, as a newcomer meets it: the link the lab printed, no clicks.

Starts the README's UI command (`uv run mlflow ui --backend-store-uri sqlite:///mlflow.db`) on
loopback over the store the CPU lab run wrote, opens the run link the lab printed in Debian's
Chromium through Playwright (a fresh profile: MLflow's assistant panel opens on first load, as it
does for a newcomer), and checks that a budget line's budget and measured charts are on screen
together in the Model training view; then the chart and the table among the artifacts. Screenshots
go to pytest's temporary folder, so a test run leaves the checkout clean;
`UPDATE_SCREENSHOTS=1 uv run pytest tests/test_mlflow_ui.py` rewrites the README's picture,
docs/mlflow-budget-vs-measured.png.
"""

from __future__ import annotations

import os
import re
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


def run_url(base: str, run, tab: str = "") -> str:
    return f"{base}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}{tab}?workflowType=machine_learning"


def printed_link(cpu_lab_run, base: str) -> str:
    """The run link the lab printed, on the test's own port."""
    (link,) = re.findall(r"then (http://127\.0\.0\.1:5000/\S+)", cpu_lab_run["stdout"])
    return link.replace("http://127.0.0.1:5000", base)


def test_the_printed_link_opens_budget_and_measured_together_in_the_model_training_view(
    mlflow_ui, page, cpu_lab_run, tmp_path
):
    """A newcomer pastes the link the lab printed: no clicks, the run's metrics in the Model training
    view, each budget line a section with its budget and measured charts side by side."""
    link = printed_link(cpu_lab_run, mlflow_ui)
    assert "workflowType=machine_learning" in link and "/model-metrics" in link
    page.goto(link)
    tab = page.get_by_role("tab", name="Model metrics")
    tab.wait_for(timeout=120_000)
    assert tab.get_attribute("aria-selected") == "true"
    # MLflow groups metrics into sections by the part of the name before the first "/".
    headers = page.locator('[data-testid="experiment-view-compare-runs-section-header"]')
    header = headers.filter(has_text=re.compile(r"^base_weights")).first
    header.wait_for(timeout=120_000)
    page.get_by_text("measured", exact=True).first.wait_for(timeout=60_000)
    top = header.bounding_box()["y"]
    below = [
        b["y"] for b in (headers.nth(i).bounding_box() for i in range(headers.count())) if b and b["y"] > top
    ]
    bottom = min(below, default=float("inf"))

    def charts_in_section(title: str) -> list[dict]:
        boxes = [loc.bounding_box() for loc in page.get_by_text(title, exact=True).all()]
        return [b for b in boxes if b and top < b["y"] < bottom]

    height = page.viewport_size["height"]
    budget, measured = charts_in_section("budget"), charts_in_section("measured")
    assert budget and measured, "the section lacks its budget or measured chart"
    assert all(b["y"] >= 0 and b["y"] + b["height"] <= height for b in (budget[0], measured[0])), (
        "the pair is not on screen together"
    )
    shot = (
        README_SCREENSHOT
        if os.environ.get("UPDATE_SCREENSHOTS") == "1"
        else tmp_path / README_SCREENSHOT.name
    )
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000


def test_artifact_view_opens_the_chart_and_the_table(mlflow_ui, page, cpu_lab_run):
    run = cpu_lab_run["run"]
    page.goto(run_url(mlflow_ui, run, "/artifacts"))
    page.get_by_text("memory", exact=True).first.click(timeout=120_000)
    page.get_by_text("budget_vs_measured.md", exact=True).first.click(timeout=30_000)
    page.get_by_text("The budget", exact=False).first.wait_for(timeout=30_000)
    page.get_by_text("budget_vs_measured.png", exact=True).first.click(timeout=30_000)
    image = page.locator(
        "img[src*='budget_vs_measured.png'], img[src*='get-artifact'], img[src^='blob:']"
    ).first
    image.wait_for(timeout=30_000)
    assert image.evaluate("img => img.complete && img.naturalWidth > 0")
