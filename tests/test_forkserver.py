"""The fork server (grpolab.lab.forkserver): a child is a process as `python script ARGS` would start it.

Each test forks small scripts from the suite's server (the one every lab process of the suite comes
from): exit codes and signals as a shell reports them, the environment, folder and pipes asked for,
fresh random streams, the interpreter's own end, a second caller, and what happens to children when
their caller goes away.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from grpolab.config.paths import REPO_ROOT
from grpolab.lab import forkserver

from suite import HAS_CUDA, LAB_DIR, fork_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(HAS_CUDA, reason="no fork server on a GPU machine: lab processes start fresh there"),
]

SCRIPT = """
import atexit, gc, json, os, random, sys, time
import numpy, torch
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.cpu_vec_isa import valid_vec_isa_list
from tqdm.std import TqdmDefaultWriteLock, tqdm
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({
    "argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
    "x": os.environ.get("X"), "gone": os.environ.get("GONE"), "kept": os.environ.get("KEPT"),
    "alloc": os.environ.get("PYTORCH_ALLOC_CONF"), "stdin": sys.stdin.read(),
    "random": [random.random(), float(numpy.random.rand()), float(torch.rand(1))],
    "threads": torch.get_num_threads(), "unsloth": "unsloth" in sys.modules,
    "isa_known": valid_vec_isa_list.cache_info().currsize == 1,
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "tqdm_lock": "mp_lock" in vars(TqdmDefaultWriteLock) or "_lock" in vars(tqdm),
    "frozen": gc.get_freeze_count(),
    "compile_pool": AsyncCompile.pool.cache_info().currsize,
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
action = sys.argv[1] if len(sys.argv) > 1 else ""
if action == "sleep":
    print("sleeping", flush=True)
    time.sleep(60)
if action == "raise":
    raise ValueError("a crash")
if action == "text":
    sys.exit("a message")
sys.exit(int(action) if action.isdigit() else 0)
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("scripts") / "child.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(scope="module")
def server():
    return fork_server()


def run(server, script, *argv, **kwargs):
    child = server.run(script, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    out, err = child.communicate(timeout=120)
    return child.returncode, out, err


def facts(out: str) -> dict:
    import json

    return json.loads(out.splitlines()[0])


def test_a_child_runs_the_script_as_python_would(server, script, tmp_path, monkeypatch):
    # The caller's environment with the changes asked for, and what importing the stack sets.
    monkeypatch.setenv("KEPT", "from the caller")
    monkeypatch.setenv("GONE", "removed for the child")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    code, out, err = run(server, script, "0", "b", env={"X": "1", "GONE": None}, cwd=tmp_path)
    assert code == 0, err
    seen = facts(out)
    assert seen["argv"] == ["0", "b"] and seen["name"] == "__main__" and seen["path0"] == str(script.parent)
    assert seen["cwd"] == str(tmp_path) and seen["x"] == "1" and seen["gone"] is None
    assert seen["kept"] == "from the caller" and seen["alloc"] == "expandable_segments:True"
    assert seen["stdin"] == ""  # /dev/null
    assert seen["unsloth"], "the stack was imported before the fork: the child pays nothing for it"
    assert seen["isa_known"], "inductor's check of the CPU's vector instructions was made before the fork"
    # tqdm's write lock is a multiprocessing lock: one made in the server would be every child's, and
    # a child stopped while holding it would block the others' progress bars for good.
    assert not seen["tqdm_lock"], "the child inherited tqdm's lock from the server"
    # Inductor's pool of compile threads, where the server's warm-up built a kernel (a new environment's
    # first server does): copied without its threads, a child's own builds would wait on it for good.
    assert not seen["compile_pool"], "the child inherited inductor's compile thread pool from the server"
    # What the server imported is frozen: a child's full collections walk only the child's objects.
    assert seen["frozen"] > 100_000, f"{seen['frozen']} objects frozen: the server froze nothing"
    assert err == "to stderr\n" and out.rstrip().endswith("atexit ran")  # the interpreter's own end


def test_exit_codes_are_a_shells(server, script):
    assert run(server, script, "3")[0] == 3
    code, _, err = run(server, script, "raise")
    assert code == 1 and "ValueError: a crash" in err
    code, _, err = run(server, script, "text")
    assert code == 1 and "a message" in err


@pytest.mark.parametrize(
    ("signum", "expected"),
    [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGHUP, -signal.SIGHUP), (signal.SIGINT, -signal.SIGINT)],
)
def test_signals_act_as_on_a_fresh_interpreter(server, script, signum, expected):
    """SIGTERM and SIGHUP end it; Ctrl-C raises KeyboardInterrupt, which ends Python by SIGINT."""
    child = server.run(script, ["sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in child.stdout:
        if line.startswith("sleeping"):
            break
    child.send_signal(signum)
    _, err = child.communicate(timeout=60)
    assert child.returncode == expected, err
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in err


def test_each_child_draws_its_own_random_numbers_and_threads_follow_omp(server, script):
    first, second = (facts(run(server, script, env={"OMP_NUM_THREADS": "1"})[1]) for _ in range(2))
    assert all(a != b for a, b in zip(first["random"], second["random"], strict=True)), (first, second)
    assert first["threads"] == 1


def test_stderr_can_join_stdout_and_a_file_can_take_either(server, script, tmp_path):
    child = server.run(script, [], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = child.communicate(timeout=60)
    assert "to stderr" in out and child.returncode == 0
    with open(tmp_path / "out.txt", "w") as handle:
        child = server.run(script, [], stdout=handle, stderr=handle)
        child.wait(timeout=60)
    assert "to stderr" in (tmp_path / "out.txt").read_text()


def test_a_child_with_no_pipes_writes_where_its_caller_does(server, script, capfd):
    child = server.run(script, ["0"])
    assert child.wait(timeout=60) == 0
    out, err = capfd.readouterr()
    assert '"argv": ["0"]' in out and "to stderr" in err


def test_a_second_caller_forks_from_the_same_server_and_its_children_end_with_it(server, script):
    other = forkserver.ForkServer.connect(server.path)
    assert other is not None
    child = other.run(script, ["sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout.readline() and child.poll() is None
    started = time.monotonic()
    other.close()  # its caller is gone: its children get SIGTERM
    assert child.wait(timeout=forkserver.GRACE_S + 30) == -signal.SIGTERM
    assert time.monotonic() - started < forkserver.GRACE_S
    assert run(server, script, "0")[0] == 0  # the owner's server goes on


def test_a_child_has_its_callers_nice_level_as_a_subprocess_would(server, script):
    """A caller niced to leave the CPU to other work (the suite's chapter runs) forks its children
    niced alike, as the subprocesses it replaces would be; a caller at the server's level, not."""
    caller = (
        "import json, os, subprocess, sys\n"
        "from grpolab.lab.forkserver import ForkServer\n"
        "os.nice(int(sys.argv[3]))\n"
        "child = ForkServer.connect(sys.argv[1]).run(sys.argv[2], ['0'], stdout=subprocess.PIPE)\n"
        "print(child.stdout.readline(), end='')\n"
        "sys.exit(child.wait(timeout=120))\n"
    )
    for nice in (7, 0):
        done = subprocess.run(
            [sys.executable, "-c", caller, server.path, str(script), str(nice)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert facts(done.stdout)["nice"] == nice
    assert facts(run(server, script, "0")[1])["nice"] == os.getpriority(os.PRIO_PROCESS, 0)


# A lab run through this script reports how many graphs of the attention mask's compile its process
# held when it started and when it ended, what its own compiles did with AOTAutograd's cache (counts
# less what the process inherited from the server), and why torch bypassed that cache, if it did.
MASK_WATCH = """
import atexit, logging, runpy, sys
import transformers.masking_utils as masks
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters
def graphs():
    original = getattr(masks, "_unsloth_original_create_causal_mask", masks.create_causal_mask)
    return len(_debug_get_cache_entry_list(original))
def said():
    print(f"mask graphs: {started} at the start, {graphs()} at the end", flush=True)
    now = counters["aot_autograd"]
    print(f"aot_autograd: { {k: now[k] - before.get(k, 0) for k in now if now[k] != before.get(k, 0)} }", flush=True)
class Bypass(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("Bypassing"):
            print(record.getMessage().replace("\\n", " "), flush=True)
cache_log = logging.getLogger("torch._functorch._aot_autograd.autograd_cache")
cache_log.addHandler(Bypass())
cache_log.setLevel(logging.INFO)
cache_log.propagate = False
started, before = graphs(), dict(counters["aot_autograd"])
atexit.register(said)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def watched_lab(server, tmp_path_factory) -> str:
    """A forked lab of one step with a held-out evaluation (every kind of mask call, each at least once),
    through a script that says at its end what it compiled: its printed output."""
    tmp_path = tmp_path_factory.mktemp("watched")
    watch = tmp_path / "watch.py"
    watch.write_text(MASK_WATCH)
    lab = ["--output-dir", str(tmp_path / "out"), "--max-steps", "1", "--eval-prompts", "2"]
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    child = server.run(
        watch,
        [str(LAB_DIR / "train.py"), *lab],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = child.communicate(timeout=600)
    assert child.returncode == 0, out[-3000:]
    return out


def test_a_forked_lab_compiles_no_attention_mask_of_its_own(watched_lab):
    """The server compiled the masks a CPU lab asks for (training, reference log-probs, evaluation,
    generation): the forked lab finds every graph it needs and traces none, so none of its CPU goes to
    it. A lab that makes a call the server did not (a library upgrade that changes how transformers or
    Unsloth call the mask) fails here."""
    found = re.search(r"mask graphs: (\d+) at the start, (\d+) at the end", watched_lab)
    started, ended = map(int, found.groups())
    assert started > 0, "the server compiled no mask before the fork"
    assert ended == started, f"the lab traced {ended - started} mask graph(s) of its own"


def test_a_labs_compiled_loss_goes_through_the_autograd_cache(watched_lab):
    """Unsloth's GRPO loss is compiled in every lab (its graph holds an inference-mode region):
    `cache_compiled_loss` lets AOTAutograd's cache keep it, so the lab saved it or found it there
    instead of bypassing the cache and tracing it again. A torch or Unsloth release that puts another
    uncacheable call in the loss fails here, with the reason torch gave."""
    counts = ast.literal_eval(re.search(r"aot_autograd: (\{.*\})", watched_lab).group(1))
    assert counts.get("total", 0) >= 1, f"the lab compiled nothing through AOTAutograd: {counts}"
    reason = re.search(r"Bypassing autograd cache due to: (.*)", watched_lab)
    assert not counts.get("autograd_cache_bypass"), (
        f"the loss bypassed the cache: {reason and reason.group(1)}"
    )
    assert counts.get("autograd_cache_hit", 0) + counts.get("autograd_cache_saved", 0) >= 1, counts


def test_a_server_of_its_own_ends_its_children_when_closed(tmp_path):
    """What a sweep started by a user does (no server given): it starts one (here one that imports
    nothing first, and a child that imports nothing either: the serving is the same); closing it ends
    the server and the children still running."""
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n")
    own = forkserver.ForkServer.start(stack=False)
    child = own.run(sleeper, [], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout.readline()
    own.close()
    assert child.wait(timeout=5) == -signal.SIGTERM
    assert not os.path.exists(own.path)


def test_no_server_where_torch_sees_a_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not forkserver.available()
    with pytest.raises(forkserver.ForkServerUnavailable):
        forkserver.ForkServer.start()


def test_without_a_server_a_sweep_forks_nothing():
    """No GPU, no server given, one cell: no server of its own either (it would cost what it saves)."""
    from grpolab.chapters.sweep.loop import cell_processes

    saved = os.environ.pop(forkserver.ENV, None)
    try:
        with cell_processes(1) as server:
            assert server is None
    finally:
        if saved is not None:
            os.environ[forkserver.ENV] = saved
    assert sys.executable
