"""Every command on every page is exercised (by a test, by the suite's run of its chapter, or by
.ci/run), and every relative link on every page resolves.

The pages are what a reader opens: the front page (README.md), the harness's reference (docs/*.md),
each chapter's page (labs/<chapter>/README.md) and the budget's (budgets/README.md). Nothing here
lists the chapters, the pages or their commands. A command on a page is exercised where:
- it is a chapter's command in the README's table: the suite runs it once for a chapter here
  (conftest.py: `chapter_run`; its tests may name a longer README form of it, `chapter_command`), and
  the chapter's own tests read that run; a chapter with an environment of its own runs it in its tests;
- or its exact text is a string constant in the suite's code (a test file, conftest.py, a chapter's
  tests) that a test or fixture that is not always skipped passes to a runner (`run_command`,
  `command_words`, `script_and_args`, `shlex.split`), with `<run>`-style placeholders filled in there;
- or it is a line of .ci/run (which may add `--frozen` and send its output away).

A command added to a page with none of these fails `test_every_command_on_every_page_is_exercised`;
a link to a file that is not there, or to a heading its page does not have, fails
`test_every_relative_link_on_every_page_resolves`.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite import REPO_ROOT, chapters, command_words, run_command

RUNNERS = {"run_command", "command_words", "script_and_args", "shlex.split"}
CI = REPO_ROOT / ".ci" / "run"
# The budget's commands, as chapter 1's page, docs/flags-and-recipe.md and budgets/README.md write them.
BUDGET_COMMANDS = (
    "uv run python labs/grpo-first/train.py --budget-only",
    "uv run python labs/grpo-first/train.py --budget-only --profile cpu",
    "uv run python labs/grpo-first/train.py --budget-only --num-generations 16 --suggest-util",
    "uv run python labs/grpo-first/train.py --budget-only --unsloth-vllm-standby true",
    "uv run python labs/grpo-first/train.py --budget-only --profile cpu --json",
    "uv run python labs/grpo-first/train.py --budget-only --gpu t4 --suggest-util --headroom",
    "uv run python -m budgets --model qwen3-8b --gpu rtx-4090 --num-generations 16 --per-device-train-batch-size 16 --headroom",
    "uv run python -m budgets --model qwen3-32b --load-in-4bit false --gpu h100-sxm --gpus 4 --layout server --vllm-gpus 2 --json",
    "uv run python -m budgets --model qwen3-8b --gpu rtx-4090 --num-generations 16 --json",
    "uv run python -m budgets --model Qwen3-8B --gpu-memory-gb 24 --gpu-bandwidth-gbs 1008",
    "uv run python -m budgets --model qwen3-32b --load-in-4bit false --gpu h100-sxm --gpus 4 --layout server "
    "--vllm-gpus 2 --gpu-memory-utilization 0.9 --link-gbps 400",
)
README_JUPYTEXT_SYNC = "uv run jupytext --sync notebooks/*.py"


# --- the pages and their commands ------------------------------------------------------------------
def pages(root: Path = REPO_ROOT) -> list[Path]:
    """Every page a reader opens: the front page, the reference in docs/, each chapter's page in its
    folder, and the budget's."""
    found = [
        root / "README.md",
        *sorted((root / "docs").glob("*.md")),
        *sorted((root / "labs").glob("*/README.md")),
        root / "budgets" / "README.md",
    ]
    return [p for p in found if p.is_file()]


def page_commands(page: Path) -> set[str]:
    return commands_in(page.read_text())


def commands_in(text: str) -> set[str]:
    """The commands of a page's bash blocks (a `\\` continues a line; a `  #` comment is not one)."""
    commands = set()
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("uv "):
                commands.add(" ".join(line.split()))
    return commands


def commands_on_pages(root: Path = REPO_ROOT) -> dict[str, list[str]]:
    """Every command on every page, and the pages it is on."""
    found: dict[str, list[str]] = {}
    for page in pages(root):
        for command in page_commands(page):
            found.setdefault(command, []).append(str(page.relative_to(root)))
    return found


# --- where a command is run -----------------------------------------------------------------------
def suite_files(root: Path = REPO_ROOT) -> list[Path]:
    """Every file of the suite's code: the shared tests and helpers, and each chapter's tests."""
    return sorted(
        [
            root / "conftest.py",
            *(root / "tests").glob("*.py"),
            *(root / "labs").glob("*/test_*.py"),
            *(root / "labs").glob("*/tests/*.py"),
        ]
    )


def unconditionally_skipped(function: ast.FunctionDef) -> bool:
    """Decorated @pytest.mark.skip (not skipif): it never runs, whatever the machine."""
    return any(
        ast.unparse(d.func if isinstance(d, ast.Call) else d) == "pytest.mark.skip"
        for d in function.decorator_list
    )


def constants_of(source: str) -> dict[str, tuple[str, ...]]:
    """The module-level string constants of `source`, and tuples or lists of them, by name."""
    found = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        items = value.elts if isinstance(value, ast.Tuple | ast.List) else [value]
        if items and all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = tuple(i.value for i in items)
    return found


def runs_of(source: str, known: dict[str, tuple[str, ...]] | None = None) -> set[str]:
    """The commands `source` runs: the string constants (its own, or `known` ones it imports) that a
    function that is not always skipped passes to a runner, by name, as a literal, with placeholders
    filled in (`X.replace(...)`), or as the parameter its parametrize decorator draws from a tuple of
    them; and the command a module's `pytest.mark.chapter_command` names for its chapter's run."""
    tree = ast.parse(source)
    constants = {**(known or {}), **constants_of(source)}

    def commands(argument: ast.expr, parameters: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
        while isinstance(argument, ast.Call) and isinstance(argument.func, ast.Attribute):
            argument = argument.func.value  # COMMAND.replace("<run>", ...)
        if isinstance(argument, ast.Name):
            return parameters.get(argument.id) or constants.get(argument.id, ())
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            return (argument.value,)
        return ()

    found: set[str] = set()
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "pytest.mark.chapter_command":
            found.update(commands(call.args[0], {}))
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef) or unconditionally_skipped(function):
            continue
        parameters = {}  # @pytest.mark.parametrize("command", COMMANDS)
        for decorator in function.decorator_list:
            if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pytest.mark.parametrize":
                name, values = decorator.args[:2]
                if isinstance(name, ast.Constant) and isinstance(values, ast.Name):
                    parameters[name.value] = constants.get(values.id, ())
        for call in ast.walk(function):
            if isinstance(call, ast.Call) and ast.unparse(call.func) in RUNNERS and call.args:
                found.update(commands(call.args[0], parameters))
    return found


def ci_commands(script: Path = CI) -> set[str]:
    """The commands .ci/run runs, as the README would write them."""
    found = set()
    for line in script.read_text().splitlines():
        line = line.split(" #")[0].split(">")[0].strip()
        if line.startswith("uv run"):
            found.add(" ".join(w for w in line.split() if w != "--frozen"))
    return found


def chapter_commands(root: Path = REPO_ROOT) -> dict[str, str]:
    """Each chapter table command and where it runs: the suite's chapter run (for a chapter here that
    has tests reading it) or its own environment's tests (for one that has its own)."""
    found = {}
    for c in chapters(root / "README.md"):
        if not c.here:
            found[c.command] = f"{c.name}'s own tests" if c.command in runs_in(c.folder / "tests") else ""
            continue
        reads = [p for p in (root / "labs" / c.name).glob("test_*.py") if "chapter_run" in p.read_text()]
        found[c.command] = (
            f"the suite's run of {c.name}, read by {', '.join(p.name for p in reads)}" if reads else ""
        )
    return found


def runs_in(folder: Path) -> set[str]:
    return {command for path in sorted(folder.glob("*.py")) for command in runs_of(path.read_text())}


def exercised(root: Path = REPO_ROOT) -> dict[str, str]:
    """Every command the suite or CI runs, and where."""
    where = {}
    files = suite_files(root)
    known = {name: value for path in files for name, value in constants_of(path.read_text()).items()}
    for path in files:
        for command in runs_of(path.read_text(), known):
            where.setdefault(" ".join(command.split()), str(path.relative_to(root)))
    for command in ci_commands(root / ".ci" / "run"):
        where.setdefault(command, ".ci/run")
    for command, runner in chapter_commands(root).items():
        if runner:
            where.setdefault(command, runner)
    return where


def unexercised(root: Path = REPO_ROOT) -> dict[str, list[str]]:
    """The commands on the pages that nothing runs, and the pages they are on."""
    where = exercised(root)
    return {c: on for c, on in sorted(commands_on_pages(root).items()) if c not in where}


def test_every_command_on_every_page_is_exercised():
    assert unexercised() == {}, "commands on the pages that nothing runs"


def test_the_front_page_is_short_and_opens_with_the_two_commands():
    """README.md is a front page a newcomer reads in minutes: at most 200 lines, with both commands in
    its first 80; each chapter's detail is on its page, the harness's reference in docs/."""
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    first = commands_in("\n".join(lines[:80]))
    assert {"uv run python labs/grpo-first/train.py", "uv run pytest"} <= first, first
    found = {str(p.relative_to(REPO_ROOT)) for p in pages()}
    assert {"budgets/README.md", *(f"labs/{c.name}/README.md" for c in chapters())} <= found


def test_the_check_sees_a_command_nothing_runs(tmp_path):
    """The accounting above, on a sketched repository: a command in a comment, in a test that never
    runs, or passed to nothing is not exercised; passed to a runner in a test, it is. Every page counts:
    a command nothing runs is named with the pages it is on, the front page's, a docs page's or a
    chapter's page's alike; a chapter's table command counts on its page once its tests read its run."""
    (tmp_path / "tests").mkdir()
    (tmp_path / ".ci").mkdir()
    (tmp_path / "docs").mkdir()
    lab = tmp_path / "labs" / "grpo-next"
    lab.mkdir(parents=True)
    (tmp_path / ".ci" / "run").write_text("uv run --frozen pytest\n# uv run mlflow ui\n")
    (tmp_path / "conftest.py").write_text("")
    row = (
        "| 1. [Next](labs/grpo-next/README.md) | `uv run python labs/grpo-next/train.py` | "
        "`notebooks/01-grpo-next.ipynb` | CPU: it learns |"
    )
    (tmp_path / "README.md").write_text(
        f"| chapter |\n{row}\n"
        "```bash\nuv run python a.py --x  # a comment\nuv run python b.py\nuv run python c.py\n"
        "uv run python d.py <run>\nuv run pytest\nuv run mlflow ui\n```\n"
    )
    (tmp_path / "docs" / "reference.md").write_text(
        "# Reference\n\n```bash\nuv run python a.py --x\nuv run python e.py    # on a page of docs/ only\n```\n"
    )
    (lab / "lab.toml").write_text('chapter = "grpo-next"\n')
    (lab / "test_chapter.py").write_text("def test_it(chapter_run):\n    assert chapter_run.code == 0\n")
    (lab / "README.md").write_text(
        "# Next\n\n```bash\nuv run python labs/grpo-next/train.py\n"
        "uv run python labs/grpo-next/train.py --fast    # on the chapter's page only\nuv run python b.py\n```\n"
    )
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pytest\nA = 'uv run python a.py --x'\nB = 'uv run python b.py'\nD = 'uv run python d.py <run>'\n"
        "# run_command('uv run python c.py')\n"
        "def test_a():\n    run_command(A)\n"
        "@pytest.mark.skip\ndef test_b():\n    run_command(B)\n"
        "def test_c():\n    print(B)\n"
        "def test_d():\n    script_and_args(D.replace('<run>', 'r1'))\n"
    )
    assert [str(p.relative_to(tmp_path)) for p in pages(tmp_path)] == [
        "README.md",
        "docs/reference.md",
        "labs/grpo-next/README.md",
    ]
    assert unexercised(tmp_path) == {
        "uv run mlflow ui": ["README.md"],
        "uv run python b.py": ["README.md", "labs/grpo-next/README.md"],
        "uv run python c.py": ["README.md"],
        "uv run python e.py": ["docs/reference.md"],
        "uv run python labs/grpo-next/train.py --fast": ["labs/grpo-next/README.md"],
    }
    where = exercised(tmp_path)
    assert where["uv run python d.py <run>"] == "tests/test_x.py" and where["uv run pytest"] == ".ci/run"
    assert where["uv run python labs/grpo-next/train.py"].startswith("the suite's run of grpo-next")


def test_a_chapter_here_counts_once_its_tests_read_its_run(tmp_path):
    row = (
        "| 5. [Next](labs/grpo-next/README.md) | `uv run python labs/grpo-next/train.py` | "
        "`notebooks/05-grpo-next.ipynb` | CPU: it learns |"
    )
    (tmp_path / "README.md").write_text(f"| chapter |\n{row}\n")
    lab = tmp_path / "labs" / "grpo-next"
    lab.mkdir(parents=True)
    (lab / "lab.toml").write_text('chapter = "grpo-next"\n')
    assert chapter_commands(tmp_path) == {"uv run python labs/grpo-next/train.py": ""}
    (lab / "test_chapter.py").write_text("def test_it(chapter_run):\n    assert chapter_run.code == 0\n")
    assert chapter_commands(tmp_path)["uv run python labs/grpo-next/train.py"].startswith(
        "the suite's run of grpo-next"
    )


# --- every relative link resolves ------------------------------------------------------------------
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), ![alt](target)
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", flags=re.M)


def prose(text: str) -> str:
    """A page without its code: links and headings in a code block or span are not the page's."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped but for hyphens, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (GitHub numbers a repeated one: `x`, `x-1`, `x-2`)."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        name, n = slug(heading), 0
        while (f"{name}-{n}" if n else name) in found:
            n += 1
        found.add(f"{name}-{n}" if n else name)
    return found


def broken_links(root: Path = REPO_ROOT) -> list[str]:
    """Each relative link on every page whose file or folder is not there, or whose `#anchor` is not a
    heading of the page it points to, as `page: target: why`."""
    problems = []
    for page in pages(root):
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file here
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {target}"
            if not linked.exists():
                problems.append(f"{where}: no such file or folder")
            elif anchor and linked.suffix != ".md":
                problems.append(f"{where}: an anchor into a page that is not markdown")
            elif anchor and anchor not in anchors(linked):
                problems.append(f"{where}: no heading with that anchor")
    return problems


def test_every_relative_link_on_every_page_resolves():
    assert broken_links() == []


# A repository path a page names in code (`grpolab/lab/session.py`, `task/`): a folder of the project,
# then a name; placeholders (`labs/<name>/`, `NN-<name>`) and globs are patterns, not paths.
REPO_PATH = re.compile(r"(?<![\w./-])((?:grpolab|task|budgets|labs|docs|tests|notebooks)/[\w./<>*-]*)")


def missing_paths(root: Path = REPO_ROOT) -> list[str]:
    """Each repository path named in a page's code spans or blocks that is not in the repository."""
    problems = []
    for page in pages(root):
        text = page.read_text()
        code = " ".join(CODE_SPAN.findall(text) + FENCE.findall(text))
        for named in REPO_PATH.findall(code):
            path = named.rstrip(".,:;")
            if any(mark in path for mark in ("<", "*", "NN-")):
                continue
            if not (root / path).exists():
                problems.append(f"{page.relative_to(root)}: {path}")
    return sorted(set(problems))


def test_every_path_a_page_names_is_in_the_repository():
    assert missing_paths() == []


def test_the_path_check_sees_a_moved_module(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "grpolab" / "lab").mkdir(parents=True)
    (tmp_path / "grpolab" / "lab" / "session.py").write_text("")
    (tmp_path / "README.md").write_text(
        "The session (`grpolab/lab/session.py`), once `grpolab/session.py`; each chapter's `labs/<name>/`.\n"
        "```bash\nuv run python labs/grpo-gone/train.py\n```\n"
    )
    assert missing_paths(tmp_path) == ["README.md: grpolab/session.py", "README.md: labs/grpo-gone/train.py"]


def test_the_link_check_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    """On sketched pages: a link to a file that is not there and an anchor no heading has are named;
    links that resolve (a file, a folder, a heading of another page or of the page itself, a picture),
    links to the web and links written in code are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "labs" / "grpo-next").mkdir(parents=True)
    (tmp_path / "docs" / "picture.png").write_bytes(b"")
    (tmp_path / "README.md").write_text(
        "# GRPO\n\n## The same results on every machine\n\n## Tests\n\n"
        "![the picture](docs/picture.png) [a chapter](labs/grpo-next/README.md) [docs](docs/)\n"
        "[below](#tests) [the web](https://example.com/x#y) `[in code](nowhere.md)`\n"
        "```bash\n[in a block](nowhere.md)\n```\n"
    )
    (tmp_path / "labs" / "grpo-next" / "README.md").write_text(
        "# Chapter: next, `in code`\n\n"
        "[the matrix](../../README.md#the-same-results-on-every-machine) [top](#chapter-next-in-code)\n"
        "[gone](../../docs/every-machine.md) [moved](../../README.md#the-matrix)\n"
    )
    assert broken_links(tmp_path) == [
        "labs/grpo-next/README.md: ../../docs/every-machine.md: no such file or folder",
        "labs/grpo-next/README.md: ../../README.md#the-matrix: no heading with that anchor",
    ]
    assert slug("Chapter 4: reward hacking, watched") == "chapter-4-reward-hacking-watched"


# --- the commands run here ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("command", BUDGET_COMMANDS)
def test_budget_commands(command):
    """Each budget command as the README writes it (uv run), on the card it names or lab.toml's: it
    prints its sheet and the plan fits."""
    result = run_command(command)
    assert result.returncode == 0, result.stderr
    if "--json" in command:
        assert json.loads(result.stdout)["fits"] is True
    else:
        assert re.search(r"^verdict: fits: peak ", result.stdout, flags=re.M), result.stdout[-2000:]


@pytest.mark.slow
def test_jupytext_sync_leaves_the_pair_unchanged(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for path in (REPO_ROOT / "notebooks").glob("*"):
        if path.suffix in {".py", ".ipynb"}:
            shutil.copy2(path, tmp_path / "notebooks" / path.name)
    before = {p.name: p.read_text() for p in (tmp_path / "notebooks").glob("*.ipynb")}
    words = command_words(README_JUPYTEXT_SYNC)
    files = sorted(str(p) for p in (tmp_path / "notebooks").glob("*.py"))
    command = (
        [*words[:-1], *files] if words[0] == "uv" else [sys.executable, "-m", "jupytext", "--sync", *files]
    )
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    import nbformat

    for name, text in before.items():
        old, new = nbformat.reads(text, 4), nbformat.read(tmp_path / "notebooks" / name, 4)
        assert [c.source for c in old.cells] == [c.source for c in new.cells]
    assert shlex.split(README_JUPYTEXT_SYNC)[-1] == "notebooks/*.py"
