"""The chapter contract (docs/chapters.md), checked on every folder under labs/.

A chapter is `labs/<name>/train.py` (a docstring with its usage, its GRPO config, `train(run)`, `main`)
+ `labs/<name>/lab.toml` (its name and what it changes from the book's recipe) + its notebook pair
`notebooks/NN-<name>.ipynb` / `.py` + one row of the README's chapter table. The chapters are
discovered, not listed: a new folder is checked the moment it exists, and the checker itself is
tested on chapters that break each clause.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from conftest import REPO_ROOT, load_lab_module

from budgets import compute
from budgets.vocabulary import flag
from grpolab.settings import FLAGS, PROFILES, check, lab_settings

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
    notebooks = sorted((repo / "notebooks").glob(f"[0-9][0-9]-{name}.ipynb"))
    if not notebooks:
        problems.append(f"{name}: no notebooks/NN-{name}.ipynb")
    elif not notebooks[0].with_suffix(".py").is_file():
        problems.append(f"{name}: {notebooks[0].name} has no paired .py (jupytext)")
    rows = [
        line
        for line in (repo / "README.md").read_text().splitlines()
        if re.match(r"\| \d+\. ", line) and f"`labs/{name}/train.py`" in line
    ]
    if len(rows) != 1:
        problems.append(f"{name}: {len(rows)} rows in the README's chapter table (one wanted)")
    elif notebooks and f"`notebooks/{notebooks[0].name}`" not in rows[0]:
        problems.append(f"{name}: its README row does not name {notebooks[0].name}")
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
    for suffix in (".ipynb", ".py"):
        (repo / "notebooks" / f"04-grpo-next{suffix}").write_text("")
    row = "| 4. Next | `labs/grpo-next/train.py` | `uv run python labs/grpo-next/train.py` | `notebooks/04-grpo-next.ipynb` |"
    (repo / "README.md").write_text(f"| chapter |\n{row}\n")
    assert contract_problems(lab, repo) == []

    (repo / "notebooks" / "04-grpo-next.ipynb").unlink()
    assert contract_problems(lab, repo) == ["grpo-next: no notebooks/NN-grpo-next.ipynb"]
    (repo / "notebooks" / "04-grpo-next.ipynb").write_text("")
    (repo / "README.md").write_text("| chapter |\n")
    assert contract_problems(lab, repo) == ["grpo-next: 0 rows in the README's chapter table (one wanted)"]
    (repo / "README.md").write_text(f"| chapter |\n{row}\n")
    (lab / "train.py").write_text('"""Chapter 4.\n\nUsage: ..."""\n\ndef main(argv=None): ...\n')
    assert contract_problems(lab, repo) == [
        "grpo-next: train.py has no grpo_config()",
        "grpo-next: train.py has no train()",
    ]
    (lab / "lab.toml").write_text('chapter = "grpo-later"\n')
    assert "grpo-next: lab.toml's chapter is 'grpo-later', not the folder's name" in contract_problems(
        lab, repo
    )
