"""Lab processes forked from a server that has imported the stack once (on a machine without a GPU).

Before its first step a lab process spends most of a minute of CPU on 2 cores importing torch,
transformers, TRL, MLflow and Unsloth, and letting Unsloth generate its trainers. Where many lab
processes start one after another (chapter 2's cells, the test suite's labs), a fork server pays
that once: it imports the stack, then forks one child per run. Each child is a real process, with
its own pid, signals, exit status and resident set, and runs a chapter's `train.py` as
`python train.py ARGS` would: as `__main__`, with that `sys.argv`, in the working folder and
environment asked for, stdin from /dev/null, stdout and stderr where the caller says (pipes, as
`subprocess.PIPE` gives them), and it ends as the interpreter ends (non-daemon threads joined,
atexit handlers run; `wait()` returns -N for a signal that killed it, as subprocess does).

    with ForkServer.start() as server:
        child = server.run("labs/grpo-sizing/train.py", ["cell", "--num-generations", "8"], stdout=PIPE)
        for line in child.stdout: ...
        code = child.wait()

Why forking is safe here:
- **CUDA is never initialised in the server.** It starts only where torch sees no GPU
  (`available()`): on a GPU `import unsloth` initialises CUDA, and a CUDA context does not survive a
  fork. Lab processes on a GPU start fresh (the callers use `subprocess`), as they always did.
- **Each child re-seeds.** Python's `random` reseeds itself after a fork; the child seeds numpy's
  and torch's global generators from the OS, as a fresh process starts. (A lab then seeds them from
  its settings, so its runs stay reproducible.)
- **The server forks from its only Python thread**, between requests, holding no lock, and has
  opened nothing a child could share (no MLflow store; the model it compiles the masks on is freed,
  its folder removed, before the first fork: `compile_masks`). Threads a library
  started while importing (pyarrow's jemalloc) are not copied into a child; the library
  reinitialises after a fork. torch's thread count is set in each child from `OMP_NUM_THREADS`
  (OpenMP reads the variable once, when it loads).

A child's environment is its caller's, with the changes `env=` asks for, and then what the imports
set in the server's (Unsloth's `PYTORCH_ALLOC_CONF`): what a fresh process that imported the stack
would hold. Its nice level is its caller's, as a subprocess inherits it (a chapter the test suite
niced has its arms' and cells' processes niced alike). What it does not get as a fresh process
would: what the imports print (Unsloth's banner) is not printed (the server's own output is
discarded), and variables the stack reads only when it is imported keep the server's values
(`UNSLOTH_VLLM_STANDBY` is "0", as on every CPU lab).

The server listens on a Unix socket. The process that starts it owns it: when that process closes
it or dies, the server stops every child still running (SIGTERM, SIGKILL after `GRACE_S`) and
exits. Other processes may connect to the same server (`ForkServer.connect`, by the path the
owner exports as `GRPOLAB_FORKSERVER`): a sweep started from the test suite forks its cells from
the suite's server instead of importing the stack again. A connection that closes stops its own
children.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

PIPE, STDOUT = subprocess.PIPE, subprocess.STDOUT
ENV = "GRPOLAB_FORKSERVER"  # the socket path of a server this process may fork its labs from
# What every lab imports before its first step, in the order a lab imports it (Unsloth first), and
# what MLflow imports only when a run opens its store: its SQL store, and alembic, which creates a new
# store's tables (1.3 to 1.7 s of CPU a forked lab paid on its own, measured 2026-12-03). Then what a
# lab imports later, as it runs: MLflow's tracer, model flavours and system metrics, the grpolab
# modules a run or a chapter's arms load on the way, the charts' backend (py-spy over a whole suite,
# 2026-12-07: about 1 s of CPU a forked lab).
STACK = (
    "grpolab.model.policy",
    "grpolab.lab.session",
    "grpolab.judging.evaluate",
    "trl",
    "peft",
    "datasets",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "alembic.command",
    "alembic.config",
    "sqlalchemy.dialects.sqlite",
    "mlflow.pyfunc",
    "mlflow.tracing.processor.base_mlflow",
    "mlflow.tracing.export.mlflow_v3",
    "mlflow.system_metrics.system_metrics_monitor",
    "tabulate",
    "matplotlib.backends.backend_agg",
    "grpolab.lab.meter",
    "grpolab.judging.overview",
    "grpolab.lifecycle.step_boundary",
    "grpolab.chapters.arms",
    "grpolab.chapters.sweep",
    "task.check",
)
# Imported if they can be: MLflow tags a run with its git commit through GitPython, which asks the
# git program its version as it is imported (a process each time), and does without it.
OPTIONAL = ("git",)
GRACE_S = 30  # how long children get to end after SIGTERM when their caller goes
START_TIMEOUT_S = 600  # importing the stack: most of a minute on 2 idle cores, minutes under load
_MESSAGE = 1 << 16


class ForkServerUnavailable(RuntimeError):
    """No fork server here: torch sees a GPU (its CUDA would not survive a fork)."""


def available() -> bool:
    """Whether lab processes can be forked from a server on this machine: only without a GPU."""
    import torch

    return not torch.cuda.is_available()


def preload() -> None:
    """Import what every lab imports, as a CPU lab does: the CPU's arithmetic pinned, the standby
    switch, then Unsloth, then the rest; let Unsloth generate its trainers (what every lab's policy
    load does first), ask inductor what the CPU's vector instructions are (its first compile does),
    and compile the attention masks every lab's forward compiles."""
    import importlib

    from grpolab.config import numerics
    from grpolab.lab import console
    from grpolab.model import cuda_env

    console.quiet_library_noise()
    numerics.pin()  # before Unsloth computes anything: every child computes as a CPU lab does
    cuda_env.configure(False)  # a CPU lab's: standby needs vLLM
    for name in STACK:
        importlib.import_module(name)
    for name in OPTIONAL:
        with suppress(ImportError):
            importlib.import_module(name)
    import matplotlib

    matplotlib.use("Agg")  # the charts a run logs; no screen
    import matplotlib.pyplot

    from grpolab.model.unsloth_trainer import grpo_trainer_class

    grpo_trainer_class()
    # A process's first compile also asks what does not change from one run to the next: which vector
    # instructions inductor may generate (it builds a small library per candidate and loads each in a
    # Python of its own), and the keys of its caches (hashes of torch's and Triton's installed
    # sources). About 2 s of CPU per lab, measured 2026-12-04. The answers are the machine's and the
    # installation's, not a run's (which instructions a run uses follows ATEN_CPU_CAPABILITY, read at
    # each compile): asked once here, every child inherits them.
    from torch._inductor.codecache import CacheBase, torch_key
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    valid_vec_isa_list()
    torch_key()
    CacheBase.get_system()
    compile_masks()
    _forget_compile_pool()  # whichever step above built a kernel


def compile_masks() -> None:
    """Compile, once for every child, what each lab's first forward compiles: the attention masks.

    Unsloth's loader replaces transformers' `create_causal_mask` with a `torch.compile` of it
    (unsloth_zoo/temporary_patches/misc.py, `dynamic=True`), and each process traced it anew: a
    graph for each kind of call below, about 3 s of CPU of a two-step lab's 15 (py-spy, 2026-12-07,
    this repository's 2-core machine). Traced here, on the book's stand-in loaded as a CPU lab loads
    it, a child finds the graphs in its cache: its guards hold on another load of the model and other
    shapes (tests/test_forkserver.py counts the graphs a forked lab adds: none).
    A mask holds which positions attend to which, booleans built from integer indices, so no float
    a run computes depends on whether its graph was traced here or in the run's own process.
    The stand-in is written to a folder of its own, not to the cache the children build theirs in
    (the matrix checks each context's build), and everything the warm-up held is freed before the
    first fork: no model, no open file, no thread, no lock a child could inherit held."""
    import gc
    import shutil

    import torch
    from tqdm import tqdm

    from grpolab.config.paths import LABS
    from grpolab.config.settings import lab_settings
    from grpolab.model.policy import load_policy
    from grpolab.tiny_model import ensure_tiny_model

    folder = tempfile.mkdtemp(prefix="grpolab-forkserver-standin-")
    interval, tqdm.monitor_interval = tqdm.monitor_interval, 0  # no monitor thread in the server
    try:
        standin = ensure_tiny_model(Path(folder) / "tiny-qwen3")
        settings = lab_settings(LABS / "grpo-first", "cpu", {"model": str(standin)})
        model, tokenizer = load_policy(settings)

        # The calls a CPU lab makes, each a graph of its own (dynamo guards on grad mode, on inference
        # tensors, on a cache or none, on a dimension of 1): the trainer packs a batch's sequences
        # into one row, positions restarting at each (a row with plain positions needs no mask and
        # is not compiled), and runs it with grad, without (old and reference log-probs) and under
        # inference mode, with positions made before it or inside it; generation runs a padded
        # batch, its prefill and its cached steps.
        def packed() -> torch.Tensor:
            return torch.cat([torch.arange(10), torch.arange(14)]).unsqueeze(0)

        row = torch.randint(3, 60, (1, 24))
        model(input_ids=row, position_ids=packed(), use_cache=False).logits.sum().backward()
        with torch.no_grad():
            model(input_ids=row, position_ids=packed(), use_cache=False)
        positions = packed()
        with torch.inference_mode():
            model(input_ids=row, position_ids=positions, use_cache=False)
            model(input_ids=row, position_ids=packed(), use_cache=False)
        prompts = torch.randint(3, 60, (3, 24))
        mask = torch.ones_like(prompts)
        mask[0, :5] = 0  # left padding, as a batch of prompts has
        with torch.no_grad():
            model.generate(
                input_ids=prompts,
                attention_mask=mask,
                max_new_tokens=3,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        del model, tokenizer
    finally:
        tqdm.monitor_interval = interval
        _forget_tqdm_lock()
        gc.collect()
        shutil.rmtree(folder, ignore_errors=True)


def _freeze() -> None:
    """Take what the server holds out of the garbage collector's sight, as the last thing before the
    first fork. The stack is about a million objects, all alive as long as the server: a full
    collection in a child walked them all (0.5 to 0.7 s of CPU, 2026-12-07, this repository's 2-core
    machine), and, by marking each, copied the pages they lie on from the server into the child.
    Trainers collect fully each time they start and Python every so often: a two-arm chapter 8 lab
    spent 1.85 s in its full collections; frozen, 0.56 s. Nothing frozen is ever freed, and nothing
    a run computes depends on when its garbage is collected."""
    import gc

    gc.collect()
    gc.freeze()


def _forget_compile_pool() -> None:
    """Inductor as a fresh process has it: no pool of compile threads yet. Where the server's warm-up
    builds a kernel (the first server of a new environment finds none built for its paths), inductor
    submits the build to a thread pool it keeps for the process (`AsyncCompile.pool`, with more than
    one compile thread). A fork copies the pool but not its threads, and torch's own after-fork reset
    (`after_fork`, torch/_inductor/async_compile.py) clears its process pool, not this one: a child
    that built a kernel of its own waited on the copy for good (seen here: three forked children
    compiling one new graph, 2026-12-07). Shut down here, each child makes its own when it needs it."""
    from torch._inductor.async_compile import AsyncCompile

    if AsyncCompile.pool.cache_info().currsize:
        AsyncCompile.pool().shutdown(wait=True)
    AsyncCompile.pool.cache_clear()


def _forget_tqdm_lock() -> None:
    """tqdm as a fresh process has it: no write lock yet. The first progress bar (inductor opens one,
    disabled, to wait on its compiles) creates tqdm's class-wide lock, a multiprocessing lock: made in
    the server, every child would share one semaphore, and a child stopped while it held the lock
    (the suite stops labs mid-step) would block the others' next bar for good (seen in a CI: ten labs
    asleep in `TqdmDefaultWriteLock.acquire`). Forgotten here, each child makes its own."""
    from tqdm.std import TqdmDefaultWriteLock, tqdm

    classes, seen = [tqdm], []
    while classes:
        cls = classes.pop()
        seen.append(cls)
        classes.extend(cls.__subclasses__())
    for cls in seen:
        if "_lock" in vars(cls):
            delattr(cls, "_lock")
    if "mp_lock" in vars(TqdmDefaultWriteLock):
        del TqdmDefaultWriteLock.mp_lock


# --- the caller's side --------------------------------------------------------------------------
class ForkServer:
    """A connection to a running fork server, and the children it forked for this caller."""

    def __init__(self, sock: socket.socket, path: str, popen: subprocess.Popen | None = None) -> None:
        self._sock, self.path, self._popen = sock, path, popen
        self._lock = threading.Lock()  # one request at a time on this connection
        self._changed = threading.Condition()
        self._started: dict[int, int | str] = {}  # request id -> child pid, or why it was not forked
        self._exits: dict[int, int] = {}  # child pid -> exit code (subprocess's convention)
        self._closed = False
        self._next = 0
        self._reader = threading.Thread(target=self._read, name="forkserver-replies", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, timeout: float = START_TIMEOUT_S, stack: bool = True) -> ForkServer:
        """Spawn a server (`python -m grpolab.lab.forkserver PATH`, which imports the stack) and connect
        to it as its owner. `stack=False` imports nothing first: a server to test the serving with."""
        if not available():
            raise ForkServerUnavailable("torch sees a GPU: lab processes start fresh there")
        folder = tempfile.mkdtemp(prefix="grpolab-forkserver-")
        path = os.path.join(folder, "socket")
        ready_read, ready_write = os.pipe()
        popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "grpolab.lab.forkserver",
                path,
                str(ready_write),
                *([] if stack else ["--bare"]),
            ],
            pass_fds=[ready_write],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # what the imports print; a child writes where its caller says
            stderr=subprocess.DEVNULL,
        )
        os.close(ready_write)
        with os.fdopen(ready_read) as ready:
            chosen, _, _ = select.select([ready], [], [], timeout)
            line = ready.readline().strip() if chosen else ""
        if line != "ready":
            popen.kill()
            popen.wait()
            raise RuntimeError(
                f"the fork server did not start: {line or f'no answer within {timeout:.0f} s'}"
            )
        return cls(_connect(path), path, popen)

    @classmethod
    def connect(cls, path: str | None = None) -> ForkServer | None:
        """A connection to the server at `path` (default: $GRPOLAB_FORKSERVER), or None without one."""
        path = path or os.environ.get(ENV)
        if not path or not os.path.exists(path):
            return None
        try:
            return cls(_connect(path), path)
        except OSError:
            return None

    def run(
        self,
        script: str | Path,
        argv: Sequence[str] = (),
        *,
        env: Mapping[str, str | None] | None = None,
        cwd: str | Path | None = None,
        stdout: int | IO | None = None,
        stderr: int | IO | None = None,
        text: bool = True,
    ) -> Child:
        """Fork a child that runs `script` as `python script ARGV` would. `env` changes this process's
        environment for it (None removes a variable); stdout and stderr as subprocess takes them: None
        (this process's), PIPE, STDOUT (stderr only), a file object or a descriptor."""
        ours: dict[str, int] = {}  # the read ends of PIPEs, kept
        send: list[int] = []  # the child's ends, sent with the request, closed here after
        fds: dict[str, int] = {}
        for name, target in (("stdout", stdout), ("stderr", stderr)):
            if target is None:  # this process's own, as a subprocess inherits it
                target = 1 if name == "stdout" else 2
            if target == STDOUT:
                fds[name] = fds.get("stdout", -1)
                continue
            if target == PIPE:
                read, write = os.pipe()
                ours[name] = read
                target = write
            else:
                target = os.dup(target if isinstance(target, int) else target.fileno())
            fds[name] = len(send)
            send.append(target)
        try:
            with self._lock:
                self._next += 1
                request = {
                    "id": self._next,
                    "script": str(Path(script).resolve()),
                    "argv": [str(a) for a in argv],
                    "env": {
                        **os.environ,
                        **{k: v for k, v in (env or {}).items() if v is not None},
                        **{k: None for k, v in (env or {}).items() if v is None},
                    },
                    "cwd": str(cwd or os.getcwd()),
                    "fds": fds,
                    # A subprocess inherits its parent's priority: a chapter niced to leave the CPU
                    # to other work has its cells' and arms' processes niced alike.
                    "nice": os.getpriority(os.PRIO_PROCESS, 0),
                }
                socket.send_fds(self._sock, [json.dumps(request).encode()], send)
                with self._changed:
                    self._changed.wait_for(lambda: request["id"] in self._started or self._closed, 120)
                    started = self._started.pop(request["id"], "the fork server did not answer")
        finally:
            for fd in send:
                os.close(fd)
        if isinstance(started, str):
            for fd in ours.values():
                os.close(fd)
            raise RuntimeError(started)
        mode = "r" if text else "rb"
        pipes = {name: os.fdopen(fd, mode) for name, fd in ours.items()}
        return Child(self, started, pipes.get("stdout"), pipes.get("stderr"))

    def close(self) -> None:
        """Close this connection: its children still running get SIGTERM (then SIGKILL after a
        grace period); the owner's close also ends the server."""
        if self._closed and self._sock.fileno() == -1:
            return
        with suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        self._reader.join(timeout=GRACE_S + 30)  # the server reports the last exits, then closes
        self._sock.close()
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._popen is not None:
            self._popen.wait(timeout=GRACE_S + 30)
            with suppress(OSError):
                os.unlink(self.path)
                os.rmdir(os.path.dirname(self.path))

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MESSAGE)
            except OSError:
                data = b""
            message = json.loads(data) if data else {}
            with self._changed:
                if not message:
                    self._closed = True
                elif "started" in message:
                    self._started[message["started"]] = message.get("pid", message.get("error"))
                elif "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                self._changed.notify_all()
            if not message:
                return

    def _wait(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._closed, timeout)
            return self._exits.get(pid)


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    return sock


class Child:
    """A process the server forked, used as `subprocess.Popen` is: `pid`, `stdout`, `stderr`,
    `poll`, `wait`, `communicate`, `send_signal`, `terminate`, `kill`, `returncode`."""

    def __init__(self, server: ForkServer, pid: int, stdout: IO | None, stderr: IO | None) -> None:
        self._server, self.pid, self.stdout, self.stderr = server, pid, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server._wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server._wait(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Read the pipes to their end and wait for the exit, as Popen.communicate does."""
        read: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda n=name, p=pipe: read.setdefault(n, p.read()), daemon=True)
            for name, pipe in (("out", self.stdout), ("err", self.stderr))
            if pipe is not None
        ]
        for reader in readers:
            reader.start()
        self.wait(timeout)
        for reader in readers:
            reader.join(timeout=30)
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        return read.get("out"), read.get("err")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# --- the server's side --------------------------------------------------------------------------
def serve(path: str, ready: int | None = None, stack: bool = True) -> int:
    """The server: import the stack, listen at `path`, say "ready" on the descriptor `ready`, then
    fork a child per request and report its pid and, when it ends, its exit code to the connection
    that asked. Ends when its owner (the first connection) closes, after stopping every child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the caller and its children to act on
    before = dict(os.environ)
    try:
        if stack:
            preload()
        _freeze()
        imported = {k: v for k, v in os.environ.items() if before.get(k) != v}  # what the imports set
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen()
    except BaseException as error:  # the caller gets one line, not a silence
        if ready is not None:
            os.write(ready, f"{type(error).__name__}: {error}\n".encode())
        return 1
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's end wakes the loop, through the fd
    os.environ[ENV] = path  # a child that starts labs of its own (a sweep) forks them from here too
    if ready is not None:
        os.write(ready, b"ready\n")
        os.close(ready)
    owner: socket.socket | None = None
    children: dict[int, socket.socket] = {}  # pid -> the connection that asked for it
    connections: list[socket.socket] = []
    try:
        while True:
            readable, _, _ = select.select([listener, wake_read, *connections], [], [])
            if wake_read in readable:
                _drain(wake_read)
                _reap(children)
            if listener in readable:
                connection, _ = listener.accept()
                connections.append(connection)
                owner = owner or connection
            for connection in [c for c in connections if c in readable]:
                try:
                    data, fds, _, _ = socket.recv_fds(connection, _MESSAGE, 4)
                except OSError:
                    data, fds = b"", []
                if data:
                    inherited = [listener, *connections]  # closed in the child, with the wake-up pipe
                    request = json.loads(data)
                    request["env"].update(imported)
                    _fork(request, fds, connection, children, inherited, (wake_read, wake_write))
                    continue
                connections.remove(connection)  # its caller closed it or died: its children end
                _stop([pid for pid, asked in children.items() if asked is connection], children)
                connection.close()
                if connection is owner:
                    return 0
    finally:
        _stop(list(children), children)
        listener.close()


def _fork(request: dict[str, Any], fds: list[int], connection, children, sockets, pipe) -> None:
    """Fork the child a request asks for; tell the connection its pid (or why there is none)."""
    try:
        pid = os.fork()
    except OSError as error:
        connection.send(json.dumps({"started": request["id"], "error": f"fork failed: {error}"}).encode())
        for fd in fds:
            os.close(fd)
        return
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sock in sockets:
                sock.close()
            for fd in pipe:
                os.close(fd)
            code = _child(request, fds)
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    children[pid] = connection
    connection.send(json.dumps({"started": request["id"], "pid": pid}).encode())


def _drain(fd: int) -> None:
    with suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def _reap(children: dict[int, socket.socket]) -> None:
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            connection = children.pop(pid)
            with suppress(OSError):  # its caller may be gone
                connection.send(
                    json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode()
                )


def _stop(pids: list[int], children: dict[int, socket.socket]) -> None:
    """SIGTERM to each child still running, SIGKILL to those that outlive the grace period; each
    exit reported to the connection that asked, while it still listens."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(pid in children for pid in pids) and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.05)
    for pid in [p for p in pids if p in children]:
        _signal(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        children.pop(pid, None)


def _signal(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signum)


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: become `python script argv...` in the asked folder and environment, run
    the script as __main__, end as the interpreter ends. Returns the exit code."""
    import atexit
    import runpy
    import traceback

    # Python's own handlers, as a fresh interpreter starts: Ctrl-C raises KeyboardInterrupt, SIGTERM
    # and SIGHUP end the process, SIGCHLD is left alone.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    os.chdir(request["cwd"])
    if request.get("nice", 0) > os.getpriority(os.PRIO_PROCESS, 0):  # (raising a priority needs privilege)
        os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    os.environ.clear()
    os.environ.update({name: value for name, value in request["env"].items() if value is not None})
    _redirect(request["fds"], fds)
    if os.environ.get("PYTHONFAULTHANDLER"):  # what a fresh interpreter reads at its start
        import faulthandler

        faulthandler.enable()
    _reseed()
    script = request["script"]
    sys.argv = [script, *request["argv"]]
    sys.path[0] = os.path.dirname(script)  # as `python script` puts the script's folder first
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        code = _exit_code(done.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _flush()
        # Python ends on an uncaught Ctrl-C by dying of SIGINT, so that its parent sees the signal.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        code = 1
    # The interpreter's own end: non-daemon threads joined, then the atexit handlers.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    _flush()
    return code


def _redirect(wanted: dict[str, int], fds: list[int]) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for name, target in (("stdout", 1), ("stderr", 2)):
        index = wanted.get(name)
        if index is not None:
            os.dup2(1 if index == -1 else fds[index], target)
    for fd in fds:
        os.close(fd)
    # A pipe or a file is written by blocks, unless PYTHONUNBUFFERED asks for every write.
    sys.stdout.reconfigure(write_through=bool(os.environ.get("PYTHONUNBUFFERED")))


def _reseed() -> None:
    import numpy as np
    import torch

    np.random.seed(int.from_bytes(os.urandom(4), "little"))
    torch.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()


if __name__ == "__main__":  # `python -m grpolab.lab.forkserver PATH READY_FD`: what ForkServer.start runs
    sys.exit(serve(sys.argv[1], int(sys.argv[2]), stack="--bare" not in sys.argv[3:]))
