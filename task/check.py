"""The pre-flight of a task: would its rewards break a run, or fool it? Checked before a GPU minute is spent.

    uv run python -m task check lastdigit
    uv run python -m task check my_task.py
    uv run python -m task check questions.jsonl --task-config '{"checker": "number"}'
    uv run python -m task check reasoning-gym:basic_arithmetic

One line per check, with the worst example it found (`Report.lines`):

- `reference`: the reference answer is paid the most a completion can earn (every reward its maximum);
- `wrong answers`: answers that are not the reference (it mutated: one digit more, its first half;
  another row's) are paid less, never in full by an answer reward;
- `hostile`: completions with no answer (no tag, two tags, the answer outside the tag, the prompt
  echoed, every digit) and odd answers inside the tag (empty, huge, non-ASCII digits, NaN-like and
  infinite numbers, text that is not a string) are never paid as right, never make a reward raise,
  always get one finite float each, each within `MAX_SECONDS`;
- `code`: no reward runs the completion as code: completions that would create a file if executed
  leave none, and no reward compiles the completion's text as Python (an audit hook sees `eval`,
  `exec` and `compile`; SymPy's `parse_expr` compiles too);
- `partial credit`: what a reward pays wrong answers short of its maximum, with its share (a note);
- `deterministic`: the same completions score the same twice;
- `held out`: no held-out prompt is a training prompt, for two seeds;
- `lengths`: no prompt is longer than the task's longest (the budget's prompt length, in characters,
  which bound any tokenizer's tokens) and, given a tokenizer and the run's lengths, the longest prompt
  and the reference completion fit them in that tokenizer's tokens;
- `speed`: the time per thousand completions; too slow when a completion takes over `SLOW_SECONDS`.

`check(task)` exits nothing and prints nothing: it returns a `Report`; `Report.ok` is False when
anything would break or fool a run. `fast=True` runs only what a lab runs before anything loads
(`FAST`: hostile, code, reference), refusing a reward that raises, runs the completion as code or pays
a non-answer as right.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from task.dataset import chatml_chars, prompt_chars
from task.rewards import RewardRole, _safe, reward_info

MAX_SECONDS = 2.0  # one completion scored slower than this is not bounded: a group would wait on it
# A completion scored slower than this, typically (the median), makes a reward too slow for a group of
# 16 every step: 50 ms a completion is most of a second a step on a CPU, more than the step itself.
# The book's rewards take microseconds, math-verify about a millisecond: far from it on any machine.
SLOW_SECONDS = 0.025
FAST = ("reference", "hostile", "code")
CHECKS = (
    "reference",
    "wrong answers",
    "hostile",
    "code",
    "partial credit",
    "deterministic",
    "held out",
    "lengths",
    "speed",
)


@dataclass(frozen=True)
class Finding:
    """One check's verdict: `ok` True (passed), False (would break or fool a run) or None (a note)."""

    check: str
    ok: bool | None
    text: str

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "FAIL", None: "note"}[self.ok]

    def line(self) -> str:
        return f"{self.verdict:<5} {self.check:<15} {self.text}"


@dataclass
class Report:
    """What `check` found in one task."""

    task: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok is not False for f in self.findings)

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.ok is False]

    def verdict(self) -> str:
        """One line: passed, or what failed, first failure first."""
        if self.ok:
            return f"task check: {self.task} passed {len(self.findings)} checks"
        first = self.failed[0]
        return f"task check: {self.task} failed {', '.join(f.check for f in self.failed)}: {first.text}"

    def lines(self) -> list[str]:
        return [f"task check of {self.task}", *(f.line() for f in self.findings), self.verdict()]

    def markdown(self) -> str:
        rows = "\n".join(f"| {f.check} | {f.verdict} | {f.text.replace('|', '¦')} |" for f in self.findings)
        return f"{self.verdict()}\n\n| check | verdict | what it found |\n|---|---|---|\n{rows}\n"


# --- calling a reward as TRL does, one completion at a time -----------------------------------------
@dataclass
class Score:
    """What one reward did with one completion: the value it returned, or what it raised, and how long."""

    value: Any
    error: str | None
    seconds: float

    @property
    def finite_float(self) -> bool:
        return self.error is None and type(self.value) is float and math.isfinite(self.value)

    def said(self) -> str:
        if self.error is not None:
            return f"raised {self.error}"
        if not self.finite_float:
            return f"returned {self.value!r}"
        return f"paid {self.value:g}"


def _assistant(text: Any) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": text}]


def score(func: Callable[..., Any], completion: Any, row: dict[str, Any], columns: Sequence[str]) -> Score:
    """`func` on one completion of `row`, called with TRL's keywords (grpo_trainer.py: prompts,
    completions, completion_ids, the dataset's columns, trainer_state, log_extra, log_metric)."""
    kwargs = {name: [value] for name, value in row.items() if name != "prompt"}
    for name in columns:
        kwargs.setdefault(name, [None])
    kwargs |= {"trainer_state": None, "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}
    started = time.perf_counter()
    try:
        out = func(prompts=[row.get("prompt")], completions=[completion], completion_ids=[[]], **kwargs)
    except Exception as error:
        return Score(None, f"{type(error).__name__}: {error}"[:120], time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if not isinstance(out, list) or len(out) != 1:
        return Score(out, None, seconds)  # not one value per completion: `finite_float` is False
    return Score(out[0], None, seconds)


# --- completions that must not be paid ---------------------------------------------------------------
def _digits_of(text: str, zero: int) -> str:
    return "".join(chr(zero + int(c)) if c.isascii() and c.isdigit() else c for c in text)


def non_answers(reference: str, prompt_text: str) -> list[tuple[str, Any]]:
    """(what it is, completion) for completions that hold no answer, or an odd one: none may be paid as right."""
    r = reference
    odd = [
        ("an empty completion", ""),
        ("no tag", f"The answer is {r}."),
        ("an empty tag", "<ans></ans>"),
        ("a blank tag", "<ans>   </ans>"),
        ("the answer twice in two tags", f"<ans>{r}</ans><ans>{r}</ans>"),
        ("the answer beside a wrong one in two tags", f"<ans>{r}</ans> or <ans>0</ans>"),
        ("nested tags", f"<ans><ans>{r}</ans></ans>"),
        ("an unclosed tag", f"<ans>{r}"),
        ("a tag in capitals", f"<ANS>{r}</ANS>"),
        ("the prompt echoed in the tag", f"<ans>{prompt_text}</ans>"),
        ("every digit in the tag", "<ans>0123456789</ans>"),
        ("every digit, then the answer outside", f"<ans>0123456789</ans> {r}"),
        ("the answer with a digit more", f"<ans>{r}7</ans>"),
        ("the answer repeated", f"<ans>{r} {r}</ans>"),
        ("the answer in Arabic-Indic digits", f"<ans>{_digits_of(r, 0x0660)}</ans>"),
        ("the answer in full-width digits", f"<ans>{_digits_of(r, 0xFF10)}</ans>"),
        ("a huge tag", "<ans>" + "9" * 100_000 + "</ans>"),
        ("a huge completion", "x" * 1_000_000),
        ("ten thousand tags", "<ans>" * 10_000 + "</ans>" * 10_000),
        ("NaN", "<ans>NaN</ans>"),
        ("nan", "<ans>nan</ans>"),
        ("infinity", "<ans>inf</ans>"),
        ("minus infinity", "<ans>-Infinity</ans>"),
        ("an overflowing number", "<ans>1e999</ans>"),
        ("a null byte", "<ans>\x00</ans>"),
        ("None", None),
        ("a number, not text", 42),
        ("bytes", f"<ans>{r}</ans>".encode()),
        ("a dict", {"content": {"nested": True}}),
        ("a message whose content is None", _assistant(None)),
        (
            "a message whose content is a list of odd parts",
            _assistant([None, 3, {"type": "text", "text": None}]),
        ),
    ]
    # A mutation that leaves the answer as it is (no digits to translate in a letter) is the answer itself.
    return [(what, c) for what, c in odd if c != f"<ans>{r}</ans>"]


def wrong_answers(
    reference: str, others: Sequence[str], parse: Callable[[str], Any]
) -> list[tuple[str, str]]:
    """(what it is, answer) for answers that are not the reference's: mutated so the value changes, and
    other rows' answers; each kept only where the task's own parse reads it as another answer."""
    right = _safe(parse, f"<ans>{reference}</ans>")
    candidates = [
        ("the answer with a digit more", f"{reference}7"),
        ("a 9 before the answer", f"9{reference}"),
    ]
    if len(reference) >= 2:
        candidates.append(("the answer's first half", reference[: len(reference) // 2]))
    candidates += [("another row's answer", other) for other in others if other != reference]
    out = []
    for what, answer in candidates:
        parsed = _safe(parse, f"<ans>{answer}</ans>")
        if parsed is not None and parsed != right:
            out.append((what, answer))
    return out


def _short(text: str, limit: int = 40) -> str:
    """A quoted answer for a one-line report: its first `limit` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


# --- code a reward must not run -------------------------------------------------------------------------
class _Watch:
    """An audit hook (installed once per process) that, while watching, records every Python source
    compiled (`compile`, `eval`, `exec`, SymPy's `parse_expr`) that holds the marker."""

    installed: ClassVar[bool] = False
    marker: ClassVar[str | None] = None
    seen: ClassVar[list[str]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if cls.marker is not None and event == "compile" and args:
            source = args[0]
            text = source.decode(errors="replace") if isinstance(source, bytes) else str(source)
            if cls.marker in text:
                cls.seen.append(text[:200])

    @classmethod
    @contextmanager
    def watching(cls, marker: str) -> Iterator[list[str]]:
        with cls.lock:
            if not cls.installed:
                sys.addaudithook(cls.hook)
                cls.installed = True
            cls.marker, cls.seen = marker, []
            try:
                yield cls.seen
            finally:
                cls.marker = None


def code_payloads(trace: Path) -> list[tuple[str, str]]:
    """(what it is, completion) whose answer, if run as Python (or parsed by SymPy), creates `trace`."""
    touch = f"__import__('pathlib').Path({str(trace)!r}).touch()"
    return [
        ("a Python call in the tag", f"<ans>{touch}</ans>"),
        ("a Python call as a number", f"<ans>1 if {touch} else 1</ans>"),
        ("a Python call in a list", f"<ans>[{touch}, 1]</ans>"),
        ("a file opened for writing", f"<ans>open({str(trace)!r}, 'w').close()</ans>"),
        ("exec of a string", f"<ans>exec({touch!r})</ans>"),
        ("a Python call in LaTeX", f"<ans>${touch}$</ans>"),
        ("a Python call, no tag", touch),
    ]


# --- the check -------------------------------------------------------------------------------------------
def _rows(t: Any, n: int, seed: int) -> list[dict[str, Any]]:
    return t.build_dataset(n, seed).to_list()


def _user_text(row: dict[str, Any]) -> str:
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        return " ".join(
            m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"
        )
    return str(prompt)


def check(
    t: Any,
    *,
    fast: bool = False,
    seed: int = 0,
    rows: int = 8,
    held_out: int = 32,
    builders: bool = True,
    tokenizer: Any = None,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
) -> Report:
    """The checks of `task.check` on task `t` (a task.Task), on `rows` of its training rows.
    `builders=False` leaves out the two checks that build hundreds of rows (held out, lengths): what a
    survey of a whole library of tasks asks is what their rewards do."""
    report = Report(t.name)
    names = [f.__name__ for f in t.reward_funcs]
    infos = [reward_info(f) for f in t.reward_funcs]
    answer = [i for i, info in enumerate(infos) if info.role is RewardRole.ANSWER]
    sample = _rows(t, rows, seed)
    references = [str(t.reference_answer(r)) for r in sample]
    timings: list[float] = []
    seen_scores: dict[tuple[int, int, str], Any] = {}

    def run(func_i: int, completion: Any, row_i: int, key: str) -> Score:
        s = score(t.reward_funcs[func_i], completion, sample[row_i], t.reward_columns)
        timings.append(s.seconds)
        seen_scores[(func_i, row_i, key)] = s.value if s.error is None else s.error
        return s

    # reference: every reward pays its maximum to the reference answer
    short = []
    for i, row_ref in enumerate(references):
        for f, info in enumerate(infos):
            s = run(f, _assistant(f"<ans>{row_ref}</ans>"), i, "reference")
            if not s.finite_float or s.value < info.max_reward - 1e-9:
                short.append(
                    f"{names[f]} {s.said()} (of {info.max_reward:g}) to the reference {_short(row_ref)}"
                )
    report.findings.append(
        Finding(
            "reference",
            not short,
            short[0]
            if short
            else f"every reward pays its maximum to the reference answer of {len(sample)} rows",
        )
    )

    # hostile: no answer, odd answers; never paid as right, never raising, finite floats, bounded time
    problems: list[str] = []
    partial: dict[str, list[float]] = {}
    for i, row in enumerate(sample):
        for what, completion in non_answers(references[i], _user_text(row)):
            for f, info in enumerate(infos):
                s = run(
                    f,
                    completion if not isinstance(completion, str) else _assistant(completion),
                    i,
                    f"hostile/{what}",
                )
                if s.error is not None or not s.finite_float:
                    problems.append(f"{names[f]} {s.said()} on {what}")
                elif s.seconds > MAX_SECONDS:
                    problems.append(f"{names[f]} took {s.seconds:.1f} s on {what}")
                elif f in answer and s.value >= info.max_reward - 1e-9:
                    problems.append(f"{names[f]} paid {s.value:g} (in full) to {what}")
                elif f in answer and s.value > 0:
                    partial.setdefault(names[f], []).append(s.value)
    report.findings.append(
        Finding(
            "hostile",
            not problems,
            (f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
            if problems
            else f"{len(non_answers('0', ''))} hostile and odd completions a row: none paid as right, raised or "
            "returned a non-float",
        )
    )

    # code: nothing the completion says is run
    with tempfile.TemporaryDirectory(prefix="task-check-") as folder:
        marker = f"grpolab_trace_{uuid.uuid4().hex}"
        trace = Path(folder) / marker
        ran: list[str] = []
        with _Watch.watching(marker) as compiled:
            for what, completion in code_payloads(trace):
                for f in range(len(infos)):
                    compiled_before, existed = len(compiled), trace.exists()
                    run(f, _assistant(completion), 0, f"code/{what}")
                    if trace.exists() and not existed:
                        ran.append(f"{names[f]} ran the completion as code ({what}: it created a file)")
                        trace.unlink()
                    elif len(compiled) > compiled_before:
                        ran.append(
                            f"{names[f]} compiled the completion as Python ({what}: eval, exec or SymPy)"
                        )
    report.findings.append(
        Finding(
            "code",
            not ran,
            ran[0]
            if ran
            else f"{len(code_payloads(Path('x')))} completions that would create a file if run: none ran or was compiled",
        )
    )
    if fast:
        return report

    # wrong answers: paid less than the reference, never in full by an answer reward
    paid_in_full, others_in_full, others = [], 0, 0
    for i, reference in enumerate(references):
        for what, wrong in wrong_answers(reference, references, t.parse_answer):
            others += what == "another row's answer"
            for f in answer:
                s = run(f, _assistant(f"<ans>{wrong}</ans>"), i, f"wrong/{what}/{wrong}")
                if not s.finite_float:
                    continue  # the hostile check names it
                if s.value >= infos[f].max_reward - 1e-9:
                    if what == "another row's answer":
                        others_in_full += 1
                    else:
                        paid_in_full.append(
                            f"{names[f]} paid {s.value:g} to {what} ({_short(wrong)} for {_short(reference)})"
                        )
                elif s.value > 0:
                    partial.setdefault(names[f], []).append(s.value)
    # Another row's answer is right by chance now and then (two rows share an answer): a share, not one.
    if others and others_in_full > 0.2 * others:
        paid_in_full.append(f"{others_in_full} of {others} other rows' answers were paid in full")
    report.findings.append(
        Finding(
            "wrong answers",
            not paid_in_full,
            paid_in_full[0]
            if paid_in_full
            else "mutated answers and other rows' answers are paid less than the reference",
        )
    )

    # partial credit: reported with its share
    scored_wrong = sum(1 for k in seen_scores if k[2].startswith(("wrong/", "hostile/")) and k[0] in answer)
    if partial:
        name, values = max(partial.items(), key=lambda kv: len(kv[1]))
        text = (
            f"{name} pays partial credit to {len(values)} of {scored_wrong} wrong or odd answers "
            f"({len(values) / max(scored_wrong, 1):.0%}), {min(values):g} to {max(values):g}"
        )
    else:
        text = "no answer reward pays part of its maximum to a wrong answer"
    report.findings.append(Finding("partial credit", None, text))

    # deterministic: the same completions again
    differ = []
    for (f, i, key), before in list(seen_scores.items())[:400]:
        if key.startswith("code/"):
            continue
        completion = _again(key, references[i], _user_text(sample[i]))
        if completion is None:
            continue
        s = score(t.reward_funcs[f], completion, sample[i], t.reward_columns)
        after = s.value if s.error is None else s.error
        if not _same(before, after):
            differ.append(f"{names[f]} paid {before!r}, then {after!r}, for {key.split('/', 1)[-1]}")
    report.findings.append(
        Finding(
            "deterministic", not differ, differ[0] if differ else "every completion scored the same twice"
        )
    )

    if builders:
        # held out: no training prompt among the held-out ones, for two seeds
        report.findings.append(_held_out(t, held_out))
        # lengths: no prompt longer than the task's longest; the run's lengths, given a tokenizer
        report.findings.append(
            _lengths(t, sample, references, tokenizer, max_prompt_length, max_completion_length)
        )

    # speed
    per = statistics.median(timings)
    report.findings.append(
        Finding(
            "speed",
            per <= SLOW_SECONDS,
            f"{1000 * per * 1000:.1f} ms per thousand completions (median {per * 1000:.3f} ms a completion, "
            f"slowest {max(timings) * 1000:.1f} ms)"
            + (
                ""
                if per <= SLOW_SECONDS
                else f": over {SLOW_SECONDS * 1000:.0f} ms a completion, a group waits on it"
            ),
        )
    )
    return report


def _again(key: str, reference: str, prompt_text: str) -> Any:
    """The completion a key of `check` scored, made again."""
    kind, _, rest = key.partition("/")
    if kind == "reference":
        return _assistant(f"<ans>{reference}</ans>")
    if kind == "hostile":
        completion = dict(non_answers(reference, prompt_text)).get(rest)
        return completion if not isinstance(completion, str) else _assistant(completion)
    if kind == "wrong":
        return _assistant(f"<ans>{rest.split('/', 1)[1]}</ans>")
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _held_out(t: Any, n: int) -> Finding:
    try:
        shared = []
        for seed in (0, 1):
            train = {_user_text(r) for r in _rows(t, 512, seed)}
            held = [_user_text(r) for r in t.build_eval_dataset(n, seed).to_list()]
            shared += [p for p in held if p in train]
    except Exception as error:
        return Finding("held out", False, f"building the rows raised {type(error).__name__}: {error}"[:200])
    if shared:
        return Finding(
            "held out",
            False,
            f"{len(shared)} held-out prompts are training prompts too, such as {shared[0][:80]!r}",
        )
    return Finding(
        "held out", True, f"none of {n} held-out prompts is among 512 training prompts, seeds 0 and 1"
    )


def _lengths(t, sample, references, tokenizer, max_prompt_length, max_completion_length) -> Finding:
    rows = _rows(t, 256, 0) + sample
    longest = max(rows, key=lambda r: prompt_chars(r["prompt"]))
    bound = prompt_chars(t.worst_case_prompt())
    if prompt_chars(longest["prompt"]) > bound:
        return Finding(
            "lengths",
            False,
            f"a prompt of {prompt_chars(longest['prompt'])} characters is longer than worst_case_prompt's {bound}: "
            "the budget's prompt length would be short",
        )
    completion = max((f"<ans>{r}</ans>" for r in references), key=len)
    if tokenizer is None:
        text = (
            f"the longest prompt is {chatml_chars(t.worst_case_prompt())} characters in Qwen3's chat format, the "
            f"longest reference completion {len(completion)}: at most that many tokens in any tokenizer"
        )
        over = max_completion_length is not None and len(completion) > max_completion_length
        return Finding(
            "lengths",
            None if over else True,
            text + (f" (over {max_completion_length}: check with the run's tokenizer)" if over else ""),
        )
    prompt_tokens = len(
        tokenizer.apply_chat_template(t.worst_case_prompt(), tokenize=True, add_generation_prompt=True)
    )
    completion_tokens = len(
        tokenizer(completion + (tokenizer.eos_token or ""), add_special_tokens=False)["input_ids"]
    )
    misses = []
    if max_prompt_length is not None and prompt_tokens > max_prompt_length:
        misses.append(f"the longest prompt is {prompt_tokens} tokens, over the sheet's {max_prompt_length}")
    if max_completion_length is not None and completion_tokens > max_completion_length:
        misses.append(
            f"the reference completion is {completion_tokens} tokens, over max_completion_length {max_completion_length}"
        )
    text = (
        f"the longest prompt is {prompt_tokens} tokens (sheet: {max_prompt_length}), the longest reference "
        f"completion {completion_tokens} (max_completion_length: {max_completion_length})"
    )
    return Finding("lengths", not misses, misses[0] if misses else text)
