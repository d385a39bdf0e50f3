"""`python -m task`: write a task of your own, and check any task before a run pays for it.

uv run python -m task new my_task                 # my_task.py and test_my_task.py, here
uv run python -m task check my_task.py            # one line a check; exit 0 only when all pass
uv run python -m task check lastdigit --fast      # what every lab checks before anything loads
uv run python -m task check data.jsonl --task-config '{"checker": "number"}'
uv run python -m task check reasoning-gym:all     # every reasoning-gym dataset, and the counts
"""

from __future__ import annotations

import argparse
import keyword
import sys
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"


def new(name: str, folder: Path) -> tuple[Path, Path]:
    """Write `<name>.py` (a working task: which of two numbers is larger) and `test_<name>.py` in `folder`."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"task new: {name!r} is not a Python name: use letters, digits and _, e.g. my_task")
    path, test_path = folder / f"{name}.py", folder / f"test_{name}.py"
    for existing in (path, test_path):
        if existing.exists():
            raise ValueError(f"task new: {existing} exists: pick another name, or remove it")
    folder.mkdir(parents=True, exist_ok=True)
    shown = {"{name}": name, "{path}": _shown(path), "{test_path}": _shown(test_path)}
    for template, target in (("task_file.py.txt", path), ("test_task_file.py.txt", test_path)):
        text = (TEMPLATES / template).read_text()
        for placeholder, value in shown.items():
            text = text.replace(placeholder, value)
        target.write_text(text)
    return path, test_path


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path.resolve())


def check_one(spec: str, config: str | None, fast: bool) -> int:
    from task import get_task
    from task.check import check

    try:
        t = get_task(spec, config)
    except (KeyError, ValueError, OSError) as error:
        print(f"error: {str(error).strip() or type(error).__name__}", file=sys.stderr)
        return 2
    report = check(t, fast=fast)
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def check_gym(config: str | None, names: list[str] | None = None, seconds: int = 30) -> int:
    """reasoning-gym's datasets (every one, or `names`) through the check of their rewards (on 4 rows;
    not the checks that build hundreds of rows), each within `seconds`, one line each, then the counts
    by verdict."""
    import signal
    from collections import Counter

    import reasoning_gym

    from task import get_task
    from task.check import check

    class TooLong(BaseException):  # not an Exception: a reward that catches those must not swallow it
        pass

    def too_long(*_):
        raise TooLong

    verdicts: Counter[str] = Counter()
    previous = signal.signal(signal.SIGALRM, too_long)
    try:
        for name in names or sorted(reasoning_gym.factory.DATASETS):
            signal.alarm(seconds)
            try:
                report = check(get_task(f"reasoning-gym:{name}", config), rows=4, builders=False)
            except TooLong:
                verdict, why = "not checked", f"over {seconds} s (building its rows and scoring them)"
            except Exception as error:  # a dataset that cannot be built here
                text = str(error).strip()
                verdict, why = "not built", text.splitlines()[0][:160] if text else type(error).__name__
            else:
                verdict = "passes" if report.ok else f"refused: {', '.join(f.check for f in report.failed)}"
                why = "" if report.ok else report.failed[0].text
            finally:
                signal.alarm(0)
            verdicts[verdict] += 1
            print(f"{name:<32} {verdict}{': ' + why if why else ''}", flush=True)
    finally:
        signal.signal(signal.SIGALRM, previous)
    print("\n" + "\n".join(f"{count:>4}  {verdict}" for verdict, count in verdicts.most_common()), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m task", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    make = verbs.add_parser("new", help="write a working task file and its tests")
    make.add_argument("name", help="the task's name: the file is NAME.py")
    make.add_argument("--dir", type=Path, default=Path("."), help="where to write them (default: here)")
    examine = verbs.add_parser("check", help="check a task: its rewards, its prompts, its lengths")
    examine.add_argument(
        "task", help="a task of the book's, a task file, a data file, reasoning-gym:<dataset> (or :all)"
    )
    examine.add_argument(
        "--task-config",
        default=None,
        help="the task's config, JSON (a data file's columns and checker; a dataset's arguments)",
    )
    examine.add_argument("--fast", action="store_true", help="only what a lab checks before anything loads")
    args = parser.parse_args(argv)
    if args.verb == "new":
        try:
            path, test_path = new(args.name, args.dir)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"wrote {_shown(path)} and {_shown(test_path)}")
        print(f"  check it:  uv run python -m task check {_shown(path)}")
        print(f"  test it:   uv run pytest {_shown(test_path)}")
        print(f"  train it:  uv run python labs/grpo-first/train.py --task {_shown(path)}")
        return 0
    if args.task == "reasoning-gym:all":
        return check_gym(args.task_config)
    return check_one(args.task, args.task_config, args.fast)


if __name__ == "__main__":
    raise SystemExit(main())
