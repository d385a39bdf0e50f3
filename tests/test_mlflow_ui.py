"""The MLflow UI in a real browser, as a newcomer meets it: the link the lab printed, no clicks.

Starts the README's UI command (`uv run mlflow ui --backend-store-uri sqlite:///mlflow.db`) on
loopback over the store chapter 1's README run wrote (conftest.py: `chapter_run`), opens the run link
the lab printed in Debian's Chromium through Playwright (a fresh profile: MLflow's assistant panel
opens on first load, as it does for a newcomer), and checks what it shows without a click: the run's
Overview in the Model training view, the verdict with the total's budget beside its measured peak in
one unit, and the top of the Overview's figure (the rewards per step beside the budget-vs-measured
chart) as an image of the run's artifact. Then, as a newcomer would, the assistant panel closed and
the description unfolded: the whole figure on screen, nothing over it, which is the README's picture.
Then, one tab away each: the metrics view's first section (`at a glance`, the total's budget and
measured side by side), a group of completions with its rewards in the Traces tab, and the chart and
table among the artifacts. Screenshots go to pytest's temporary folder, so a test run leaves the
checkout clean; `UPDATE_SCREENSHOTS=1 uv run pytest tests/test_mlflow_ui.py` rewrites the README's
picture, docs/mlflow-budget-vs-measured.png (the page the printed link opens).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from suite import HAS_CUDA, REPO_ROOT, command_words, free_port, update_screenshots

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
README_SCREENSHOT = REPO_ROOT / "docs" / "mlflow-budget-vs-measured.png"
FIGURE_FILE = "rewards_and_memory.png"  # grpolab.judging.overview.FIGURE, the figure the Overview opens with
ASSISTANT_CLOSE = "[data-component-id='mlflow.assistant.chat_panel.close']"  # the panel's own close button

README_UI = "uv run mlflow ui --backend-store-uri sqlite:///mlflow.db"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.chapter("grpo-first"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (installed by .ci/run)"),
    pytest.mark.skipif(
        HAS_CUDA, reason="reads the CPU lab run; on a GPU run the lab and open the UI by hand"
    ),
]


@pytest.fixture(scope="module")
def cpu_lab_run(background):
    """Chapter 1's README run: its store, what it printed, its one run."""
    chapter_run = background.result("chapter:grpo-first")
    assert chapter_run.code == 0, chapter_run.log()
    (run,) = chapter_run.runs
    return {"run": run, "store": chapter_run.store, "stdout": chapter_run.stdout}


@pytest.fixture(scope="module")
def mlflow_ui(cpu_lab_run, request, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("mlflow-ui") / "server.log"  # shown when a test of this module fails
    command = command_words(README_UI)
    env = {**os.environ, "UV_PROJECT": str(REPO_ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    # MLflow's server starts a job runner and six huey consumers for its own server-side jobs (GenAI
    # evaluation, scheduled scorers), which no page read here uses: about 26 s of the suite's CPU
    # (2026-12-07, read from /proc). The pages are the same without them.
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    # Started where the lab's store lies, so the relative sqlite:///mlflow.db is that store.
    server = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        cwd=cpu_lab_run["store"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
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
        pytest.fail(f"mlflow ui did not come up on loopback within 120 s:\n{log.read_text()[-4000:]}")
    failed = request.session.testsfailed
    yield url
    os.killpg(server.pid, 15)
    server.wait(timeout=30)
    if request.session.testsfailed > failed:  # the server's side of what the browser waited for
        print(f"mlflow ui's log ({log}):\n{log.read_text()[-8000:]}")


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


def on_screen(page, box) -> bool:
    return bool(box) and box["height"] > 0 and 0 <= box["y"] < page.viewport_size["height"]


def test_the_printed_link_opens_the_overview_with_the_verdict_and_the_figure(
    mlflow_ui, page, cpu_lab_run, tmp_path
):
    """A newcomer pastes the link the lab printed: no clicks, the run's Overview in the Model training
    view; its description says whether the budget held, the total's budget beside its measured peak in
    one unit, and shows the top of its figure (an image of the run's own artifact, loaded). Then, as a
    newcomer would, MLflow's assistant panel closed and the description unfolded ("Show more"): the
    whole figure on screen, nothing over it. That view is the README's picture."""
    link = printed_link(cpu_lab_run, mlflow_ui)
    assert "workflowType=machine_learning" in link and link.split("?")[0].endswith(
        cpu_lab_run["run"].info.run_id
    )
    page.goto(link)
    tab = page.get_by_role("tab", name="Overview")
    tab.wait_for(timeout=180_000)
    assert tab.get_attribute("aria-selected") == "true"
    verdict = page.get_by_text(
        re.compile(r"The budget (held|did not hold): measured peak .* vs budgeted ")
    ).first
    verdict.wait_for(timeout=120_000)
    assert on_screen(page, verdict.bounding_box()), "the verdict is not on screen"
    assert set(re.findall(r"\b[KMG]iB\b", verdict.inner_text())) == {"MiB"}, verdict.inner_text()
    figure = page.locator(f"img[src*='{FIGURE_FILE}']").first
    figure.wait_for(timeout=60_000)
    page.wait_for_function(
        f"() => [...document.querySelectorAll(\"img[src*='{FIGURE_FILE}']\")].some(i => i.complete && i.naturalWidth > 0)",
        timeout=60_000,
    )
    assert on_screen(page, figure.bounding_box()), "the figure is not on screen"

    close_the_assistant(page)
    page.get_by_test_id("show-comment-toggle").first.click(timeout=30_000)  # MLflow's "Show more"
    verdict.scroll_into_view_if_needed()
    box, window = figure.bounding_box(), page.viewport_size
    assert box["y"] >= 0 and box["y"] + box["height"] <= window["height"], box
    assert box["x"] >= 0 and box["x"] + box["width"] <= window["width"], box
    # Nothing over it: the element at its left (the rewards), middle and right (the memory) is the figure.
    for share in (0.15, 0.5, 0.85):
        x, y = box["x"] + share * box["width"], box["y"] + box["height"] / 2
        on_top = page.evaluate("([x, y]) => document.elementFromPoint(x, y)?.outerHTML.slice(0, 200)", [x, y])
        assert on_top.startswith("<img"), f"at {share:.0%} of the figure's width: {on_top}"
    shot = README_SCREENSHOT if update_screenshots() else tmp_path / README_SCREENSHOT.name
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000


def close_the_assistant(page) -> None:
    """MLflow 3.17 opens its assistant panel, a third of the window, on a fresh profile's first page:
    closed with its own close button, as a user closes it (nothing to do where it did not open)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    close = page.locator(ASSISTANT_CLOSE).first
    try:
        close.wait_for(timeout=15_000)
    except PlaywrightTimeout:
        return
    close.click(timeout=30_000)
    close.wait_for(state="hidden", timeout=30_000)


def test_the_metrics_view_lists_the_glance_first_with_the_totals_budget_and_measured(
    mlflow_ui, page, cpu_lab_run
):
    page.goto(run_url(mlflow_ui, cpu_lab_run["run"], "/model-metrics"))
    headers = page.locator('[data-testid="experiment-view-compare-runs-section-header"]')
    headers.first.wait_for(timeout=180_000)
    assert headers.first.inner_text().startswith("at a glance")
    budget = page.get_by_text("total budget_mib", exact=True).first
    measured = page.get_by_text("total measured_mib", exact=True).first
    budget.wait_for(timeout=60_000)
    assert on_screen(page, budget.bounding_box()) and on_screen(page, measured.bounding_box())


def test_a_group_of_completions_with_its_rewards_is_in_the_traces_tab(mlflow_ui, page, cpu_lab_run):
    """One tab away: the Traces tab lists the run's groups, a column per reward (its assessments), and
    a group's prompt as its request with its completions as its response."""
    page.goto(run_url(mlflow_ui, cpu_lab_run["run"], "/traces"))
    # Each reward is a column of assessments; a group's prompt is a request, its completions the response.
    for reward in ("format_reward", "correctness_reward"):
        column = page.get_by_text(reward, exact=False).first
        column.wait_for(timeout=180_000)
        assert on_screen(page, column.bounding_box()), f"the {reward} column is not on screen"
    request = page.get_by_text(re.compile(r'"prompt": "What is \d+ \+ \d+\?"')).first
    request.wait_for(timeout=60_000)
    assert re.search(r"What is \d+ \+ \d+\?", request.inner_text()), request.inner_text()
    response = page.get_by_text(re.compile(r'"completion":')).first
    response.wait_for(timeout=60_000)
    assert '"completion":' in response.inner_text()


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
