"""The chapter contract (docs/chapters.md), checked on every folder under labs/.

A chapter is `labs/<name>/train.py` (a docstring with its usage, its GRPO config, `train(run)`, `main`)
+ `labs/<name>/lab.toml` (its name and what it changes from the book's recipe) + its page
(`labs/<name>/README.md`, opening with its picture where it trains here) + its tests
(`labs/<name>/test_*.py`, reading the suite's run of its README command) + its notebook pair
`notebooks/NN-<name>.ipynb` / `.py` + one row of the README's chapter table, linking to its page.
The chapters are discovered, not listed: a new folder is checked the moment it exists, the checker
itself is tested on chapters that break each clause, and a sketched chapter is shown picked up by the
suite with no edit outside what docs/chapters.md says a chapter touches.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from budgets import compute
from budgets.vocabulary import flag
from grpolab.config.settings import FLAGS, PROFILES, check, lab_settings

from suite import REPO_ROOT, chapters, load_lab_module, page_picture

CHAPTERS = sorted(toml.parent for toml in (REPO_ROOT / "labs").glob("*/lab.toml"))


def own_environment(lab: Path) -> bool:
    """A chapter with an environment of its own (verl's) is run and tested there, not here."""
    return "environment" in tomllib.loads((lab / "lab.toml").read_text())


def contract_problems(lab: Path, repo: Path = REPO_ROOT) -> list[str]:
    """What a chapter folder lacks of the contract's files, one line each (empty: none)."""
    name, problems = lab.name, []
    toml = lab / "lab.toml"
    if not toml.is_file():
        return [f"{name}: no lab.toml"]
    settings = tomllib.loads(toml.read_text())
    if settings.get("chapter") != name:
        problems.append(f"{name}: lab.toml's chapter is {settings.get('chapter')!r}, not the folder's name")
    script = lab / "train.py"
    if not script.is_file():
        problems.append(f"{name}: no train.py")
    else:
        tree = ast.parse(script.read_text())
        doc = ast.get_docstring(tree) or ""
        if "Usage" not in doc:
            problems.append(f"{name}: train.py's docstring has no Usage")
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        wanted = {"main"} if own_environment(lab) else {"main", "train", "grpo_config"}
        for missing in sorted(wanted - functions):
            problems.append(f"{name}: train.py has no {missing}()")
    page = lab / "README.md"
    if not page.is_file():
        problems.append(f"{name}: no labs/{name}/README.md (its page, which its README row links to)")
    elif not own_environment(lab) and page_picture(page) is None:
        problems.append(
            f"{name}: its page does not open with its picture (`![...](file.png)` under its title)"
        )
    elif not own_environment(lab) and not page_picture(page).is_file():
        problems.append(f"{name}: its page's picture {page_picture(page).name} is not there")
    notebooks = sorted((repo / "notebooks").glob(f"[0-9][0-9]-{name}.ipynb"))
    if not notebooks:
        problems.append(f"{name}: no notebooks/NN-{name}.ipynb")
    elif not notebooks[0].with_suffix(".py").is_file():
        problems.append(f"{name}: {notebooks[0].name} has no paired .py (jupytext)")
    rows = [
        line
        for line in (repo / "README.md").read_text().splitlines()
        if re.match(r"\| \d+\. ", line) and f"(labs/{name}/README.md)" in line
    ]
    if len(rows) != 1:
        problems.append(f"{name}: {len(rows)} rows in the README's chapter table (one wanted)")
    elif notebooks and f"`notebooks/{notebooks[0].name}`" not in rows[0]:
        problems.append(f"{name}: its README row does not name {notebooks[0].name}")
    if own_environment(lab):
        if not list((lab / "tests").glob("test_*.py")):
            problems.append(f"{name}: no tests in labs/{name}/tests/ (its own environment's)")
    elif not any("chapter_run" in p.read_text() for p in lab.glob("test_*.py")):
        problems.append(f"{name}: no labs/{name}/test_*.py reads its README run (the chapter_run fixture)")
    return problems


@pytest.mark.parametrize("lab", CHAPTERS, ids=lambda p: p.name)
def test_every_chapter_has_its_files(lab):
    assert contract_problems(lab) == []


@pytest.mark.parametrize("lab", [c for c in CHAPTERS if not own_environment(c)], ids=lambda p: p.name)
def test_every_chapter_runs_its_help_builds_its_config_and_resolves_its_budget(lab, tmp_path, capsys):
    module = load_lab_module(lab)
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0
    help_text = capsys.readouterr().out
    assert all(flag(name) in help_text for name in FLAGS), "every setting is a flag of every chapter"
    for profile in PROFILES:
        settings = lab_settings(lab, profile)
        check(settings)
        sheet = compute(settings.plan())
        assert sheet.lines and sheet.fits, f"{lab.name} {profile}: {sheet.verdict()}"
    cpu = lab_settings(lab, "cpu")
    config = module.grpo_config(cpu, tmp_path, {"bf16": False, "fp16": False, "use_cpu": True})
    assert config.num_generations == cpu.num_generations and config.max_steps == cpu.max_steps


def test_the_contract_catches_a_chapter_missing_a_clause(tmp_path):
    """A sketched fourth chapter, broken one clause at a time: each break is named."""
    repo = tmp_path
    (repo / "notebooks").mkdir()
    lab = repo / "labs" / "grpo-next"
    lab.mkdir(parents=True)
    (lab / "lab.toml").write_text('chapter = "grpo-next"\nbeta = 0.0\n')
    (lab / "train.py").write_text(
        '"""Chapter 4.\n\nUsage:\n    uv run python labs/grpo-next/train.py\n"""\n\n'
        "def grpo_config(s, output_dir, precision): ...\n\n"
        "def train(run): ...\n\n"
        "def main(argv=None): ...\n"
    )
    (lab / "test_chapter.py").write_text("def test_it(chapter_run):\n    assert chapter_run.code == 0\n")
    page = "# Chapter 4: next\n\n![Its run's chart](chart.png)\n"
    (lab / "README.md").write_text(page)
    (lab / "chart.png").write_bytes(b"")
    for suffix in (".ipynb", ".py"):
        (repo / "notebooks" / f"04-grpo-next{suffix}").write_text("")
    row = (
        "| 4. [Next](labs/grpo-next/README.md) | `uv run python labs/grpo-next/train.py` | "
        "`notebooks/04-grpo-next.ipynb` | CPU: it learns |"
    )
    (repo / "README.md").write_text(f"| chapter |\n{row}\n")
    assert contract_problems(lab, repo) == []
    assert [(c.name, c.command) for c in chapters(repo / "README.md")] == [
        ("grpo-next", "uv run python labs/grpo-next/train.py")
    ], "the row the contract finds is the row the suite reads"

    (repo / "notebooks" / "04-grpo-next.ipynb").unlink()
    assert contract_problems(lab, repo) == ["grpo-next: no notebooks/NN-grpo-next.ipynb"]
    (repo / "notebooks" / "04-grpo-next.ipynb").write_text("")
    (repo / "README.md").write_text("| chapter |\n")
    assert contract_problems(lab, repo) == ["grpo-next: 0 rows in the README's chapter table (one wanted)"]
    (repo / "README.md").write_text(f"| chapter |\n{row}\n")
    (lab / "README.md").unlink()
    assert contract_problems(lab, repo) == [
        "grpo-next: no labs/grpo-next/README.md (its page, which its README row links to)"
    ]
    (lab / "README.md").write_text("# Chapter 4: next\n\nA page with no picture.\n")
    assert contract_problems(lab, repo) == [
        "grpo-next: its page does not open with its picture (`![...](file.png)` under its title)"
    ]
    (lab / "README.md").write_text(page)
    (lab / "chart.png").unlink()
    assert contract_problems(lab, repo) == ["grpo-next: its page's picture chart.png is not there"]
    (lab / "chart.png").write_bytes(b"")
    (lab / "train.py").write_text('"""Chapter 4.\n\nUsage: ..."""\n\ndef main(argv=None): ...\n')
    assert contract_problems(lab, repo) == [
        "grpo-next: train.py has no grpo_config()",
        "grpo-next: train.py has no train()",
    ]
    (lab / "test_chapter.py").write_text("def test_it():\n    pass\n")
    assert contract_problems(lab, repo) == [
        "grpo-next: train.py has no grpo_config()",
        "grpo-next: train.py has no train()",
        "grpo-next: no labs/grpo-next/test_*.py reads its README run (the chapter_run fixture)",
    ]
    (lab / "lab.toml").write_text('chapter = "grpo-later"\n')
    assert "grpo-next: lab.toml's chapter is 'grpo-later', not the folder's name" in contract_problems(
        lab, repo
    )


# --- a sketched chapter, picked up by the suite -----------------------------------------------------
@pytest.mark.slow
def test_a_sketched_chapter_is_picked_up_by_the_suite_with_no_edit_outside_its_own(sketched):
    """A copy of this repository with chapter 5 sketched (a copy of chapter 1 with its own lab.toml,
    notebook and README row; nothing else edited, as docs/chapters.md lists): the suite collects its
    tests and its notebook's, would run its README command for them, and its shared checks (the
    contract, every command on every page exercised, every link resolving) pass on it. The copy and
    its pytest run in the background from the start (conftest.py `run_sketch`, suite.sketch_and_collect)."""
    touched, allowed, done = sketched["touched"], sketched["allowed"], sketched["done"]
    assert allowed and all(
        any(t == a or (a.endswith("/") and t.startswith(a)) for a in allowed) for t in touched
    ), (
        touched,
        allowed,
    )
    assert all(any(t == a or t.startswith(a) for t in touched) for a in allowed), (
        "the doc lists what was not touched"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for passed in (
        "tests/test_chapters.py::test_every_chapter_has_its_files[grpo-sketch]",
        "tests/test_readme.py::test_every_command_on_every_page_is_exercised",
        "tests/test_readme.py::test_every_relative_link_on_every_page_resolves",
        "tests/test_notebooks.py::test_there_is_a_notebook_for_every_lab",
    ):
        assert f"PASSED {passed}" in done.stdout, done.stdout[-3000:]
    tests = sketched["collected"]["tests"]
    assert "labs/grpo-sketch/test_chapter.py::test_run_finished_and_is_tagged_with_its_profile" in tests
    assert (
        "tests/test_notebooks.py::test_notebook_executes_from_a_clean_kernel[05-grpo-sketch.ipynb]" in tests
    )
    assert "tests/test_chapters.py::test_every_chapter_has_its_files[grpo-sketch]" in tests
    assert "chapter:grpo-sketch" in sketched["collected"]["runs"], sketched["collected"]["runs"]
