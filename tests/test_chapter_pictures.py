"""Each chapter's page opens with its picture, from a CPU run of its README command.

A chapter whose picture lies in its own folder (`labs/<name>/<chart>.png`, the line under the page's
title) shows a chart its README run logged to MLflow under the same file name, on the chapter's run
(the one nobody's child: the sweep's, the arms'): chapter 2's `sweep/budget_vs_measured.png`, chapter
4's `arms/reward_vs_held_out.png`, chapter 5's `headroom/gain_per_gib_and_minute.png`. The test reads
the suite's run of the command (`chapter_run`, conftest.py) and fetches that artifact; with
`UPDATE_SCREENSHOTS=1` it writes it over the page's picture, as tests/test_mlflow_ui.py writes the
README's (which chapter 1's page opens with). Chapter 3 (verl) trains nowhere here and has no
picture. That every page opens with a picture that is there is the chapter contract's
(tests/test_chapters.py).

    UPDATE_SCREENSHOTS=1 uv run pytest tests/test_chapter_pictures.py -k grpo-sizing
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from suite import HAS_CUDA, LABS, chapters, page_picture, update_screenshots


def own_pictures() -> list:
    """The chapters run here whose page opens with a picture in their own folder."""
    found = []
    for c in chapters():
        picture = page_picture(c.folder / "README.md") if c.here else None
        if picture is not None and picture.parent == c.folder.resolve():
            found.append(pytest.param(c.name, marks=pytest.mark.chapter(c.name), id=c.name))
    return found


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(HAS_CUDA, reason="the pages' pictures are from CPU runs; a GPU run draws its own"),
]


@pytest.mark.parametrize("name", own_pictures())
def test_a_chapters_picture_is_the_chart_its_readme_run_logged(name, chapter_run, tmp_path):
    assert chapter_run.code == 0, chapter_run.log()
    picture = page_picture(LABS / name / "README.md")
    client = chapter_run.client

    def pngs(run_id: str, path: str | None = None) -> list[str]:
        found = []
        for f in client.list_artifacts(run_id, path):
            found += pngs(run_id, f.path) if f.is_dir else [f.path] if f.path.endswith(".png") else []
        return found

    found = [
        (run.info.run_id, path)
        for run in chapter_run.top
        for path in pngs(run.info.run_id)
        if path.rpartition("/")[2] == picture.name
    ]
    assert len(found) == 1, f"{picture.name}: not one chart of {chapter_run.command!r}'s run: {found}"
    ((run_id, artifact),) = found
    fetched = client.download_artifacts(run_id, artifact, str(tmp_path))
    data = Path(fetched).read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000, f"{artifact}: {len(data)} bytes"
    if update_screenshots():
        shutil.copyfile(fetched, picture)
