"""Processes that miss torch's compile cache together compile a graph once (grpolab.model.compile_once).

Children forked from the suite's server (as every CPU lab of a sweep, a matrix or the suite is) start
together on an empty inductor cache of their own and compile the same function: one of them compiles
it, the others load what it saved. Torch writes one file under a graph's key for each process that
compiled it, so the files say how many did.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from suite import HAS_CUDA, REPO_ROOT, fork_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(HAS_CUDA, reason="no fork server on a GPU machine: lab processes start fresh there"),
]

CHILDREN = 3

# Each child says it is ready, waits for the others, then compiles: they reach the cache together.
COMPILE = """
import os, sys, time
os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[3]  # (a forked child's imports set it: set it again)
import torch
import grpolab.model.unsloth_trainer

grpolab.model.unsloth_trainer.grpo_trainer_class()  # as a lab's trainer does (it calls it)
folder, children = sys.argv[1], int(sys.argv[2])
open(os.path.join(folder, f"ready-{os.getpid()}"), "w").close()
while sum(name.startswith("ready-") for name in os.listdir(folder)) < children:
    time.sleep(0.01)
compiled = torch.compile(lambda x: (x.sin() * 3 + x.cos()).sum(dim=-1))
print(float(compiled(torch.arange(12.0).reshape(3, 4))[1]), flush=True)
"""


def test_children_that_miss_the_cache_together_compile_a_graph_once(tmp_path: Path):
    script, cache, barrier = tmp_path / "compile.py", tmp_path / "inductor", tmp_path / "barrier"
    script.write_text(COMPILE)
    barrier.mkdir()
    server = fork_server()
    children = []
    for i in range(CHILDREN):  # files, not pipes: a child that fills a pipe no one reads would stall
        with open(tmp_path / f"{i}.out", "w") as out, open(tmp_path / f"{i}.err", "w") as err:
            children.append(
                server.run(
                    script, [str(barrier), str(CHILDREN), str(cache)], cwd=REPO_ROOT, stdout=out, stderr=err
                )
            )
    try:
        for i, child in enumerate(children):
            assert child.wait(timeout=300) == 0, (tmp_path / f"{i}.err").read_text()[-3000:]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    values = {(tmp_path / f"{i}.out").read_text() for i in range(CHILDREN)}
    assert len(values) == 1, f"the children computed different values: {values}"

    keys = [key for key in (cache / "fxgraph").glob("*/*") if key.is_dir()]
    assert keys, f"nothing went through inductor's FX graph cache under {cache}"
    compiled = {key.name: sum(1 for f in key.iterdir() if f.is_file()) for key in keys}
    assert all(count == 1 for count in compiled.values()), (
        f"{CHILDREN} children compiled a graph more than once (files per key): {compiled}"
    )


# A compile that fails under the lock, and Dynamo runs the function eagerly and goes on (as it does
# with `suppress_errors`): the child says so, then stays alive while the test looks at its locks.
FAILING = """
import os, sys, time
os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
import torch
import torch._dynamo
from torch._inductor.compile_fx import _InProcessFxCompile
import grpolab.model.unsloth_trainer

grpolab.model.unsloth_trainer.grpo_trainer_class()


def fails(*args, **kwargs):
    raise RuntimeError("a compile that fails")


_InProcessFxCompile.codegen_and_compile = fails
torch._dynamo.config.suppress_errors = True
print(float(torch.compile(lambda x: x.cos() * 5 + 1)(torch.zeros(3))[0]), flush=True)
time.sleep(120)
"""


def test_a_compile_that_fails_lets_the_others_go_at_once(tmp_path: Path):
    from filelock import FileLock, Timeout

    script, cache = tmp_path / "fails.py", tmp_path / "inductor"
    script.write_text(FAILING)
    with open(tmp_path / "err", "w") as err:
        child = fork_server().run(script, [str(cache)], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=err)
    try:
        said = child.stdout.readline()
        assert said.strip() == "6.0", (tmp_path / "err").read_text()[-3000:]  # eager: cos(0) * 5 + 1
        locks = sorted((cache / "locks").glob("fxgraph-*.lock"))
        assert locks, "the failing compile took no lock: nothing went through compile_once"
        for path in locks:  # another process would wait on a lock still held
            lock = FileLock(path)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                pytest.fail(f"the child still holds {path.name} after its compile failed")
            lock.release()
    finally:
        child.kill()
        child.wait(timeout=60)
