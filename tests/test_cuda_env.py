"""The process is set up for CUDA before anything touches CUDA: the standby switch, then Unsloth (which
configures torch's allocator), and only then the first CUDA call. Stand-ins record the order of
torch.cuda's initialising calls, NVML's reads and the import; the real path is checked beside them
(the README's CPU run carries the allocator configuration Unsloth really set, tests/test_lab_end_to_end.py)."""

from __future__ import annotations

import inspect
import os
import sys
from types import SimpleNamespace

import pytest

from grpolab.config.settings import LabSettingsError, lab_settings
from grpolab.model import cuda_env

from fake_gpu import CUDA_INITIALISING
from suite import LAB_DIR


@pytest.fixture(autouse=True)
def standby_switch_left_as_found():
    """No test here may leave UNSLOTH_VLLM_STANDBY changed for what runs after it (a notebook's kernel,
    the Unsloth a later test imports): checked after each one."""
    before = os.environ.get(cuda_env.STANDBY_ENV)
    yield
    assert os.environ.get(cuda_env.STANDBY_ENV) == before, "the test left the standby switch changed"


@pytest.fixture
def fresh_import(monkeypatch):
    """This process as a lab starts it: Unsloth not yet imported; `import unsloth` recorded with the
    standby variable it would read."""
    events: list[str] = []
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    # Recorded first, so that what configure() sets is undone after the test: a variable left behind
    # would reach every process this one starts (a notebook's kernel) and the Unsloth it imports.
    monkeypatch.setenv(cuda_env.STANDBY_ENV, "0")
    monkeypatch.delenv(cuda_env.STANDBY_ENV)
    monkeypatch.setattr(
        cuda_env,
        "_import_unsloth",
        lambda: events.append(
            f"import unsloth {cuda_env.STANDBY_ENV}={os.environ.get(cuda_env.STANDBY_ENV)}"
        ),
    )
    return events


@pytest.mark.parametrize("standby", [True, False])
def test_standby_is_set_before_unsloth_is_imported(fresh_import, standby):
    env = cuda_env.configure(standby)
    assert fresh_import == [f"import unsloth UNSLOTH_VLLM_STANDBY={'1' if standby else '0'}"]
    assert env.tags()["unsloth_vllm_standby_env"] == ("1" if standby else "0")
    assert env.tags()["cuda_alloc_conf_applied"].startswith("yes")


def test_a_users_standby_variable_is_replaced_by_the_setting_and_said(fresh_import, monkeypatch):
    monkeypatch.setenv(cuda_env.STANDBY_ENV, "1")
    env = cuda_env.configure(False)
    assert "UNSLOTH_VLLM_STANDBY=1 in the environment is replaced" in env.note
    assert fresh_import == ["import unsloth UNSLOTH_VLLM_STANDBY=0"]


def test_standby_cannot_change_once_unsloth_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "unsloth", SimpleNamespace())
    monkeypatch.setattr(cuda_env, "_import_unsloth", lambda: None)
    monkeypatch.setenv(cuda_env.STANDBY_ENV, "0")
    with pytest.raises(LabSettingsError) as err:
        cuda_env.configure(True)
    assert "restart the Python process" in str(err.value) and "\n" not in str(err.value)
    assert cuda_env.configure(False).standby is False  # the same value is fine


def test_a_run_that_initialised_cuda_earlier_says_its_allocator_is_not_unsloths(fresh_import, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert cuda_env.configure(False).tags()["cuda_alloc_conf_applied"].startswith("no: CUDA was initialised")


def test_the_lab_imports_unsloth_before_anything_touches_cuda(
    gpu_machine, fresh_import, monkeypatch, tmp_path
):
    """run_lab's own order on a GPU machine (stand-ins): NVML reads the card, the standby variable is
    set, Unsloth is imported, and only then may CUDA initialise (the prompts' tokenizer, the policy)."""
    from grpolab.lab import session

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(cuda_env, "_import_unsloth", lambda: gpu_machine.calls.append("import unsloth"))

    class Stop(Exception):
        pass

    def prompts(settings):
        gpu_machine.calls.append("prompts")
        raise Stop

    monkeypatch.setattr(session, "prompts", prompts)
    with pytest.raises(Stop):
        session.run_lab(
            LAB_DIR,
            lambda run: None,
            ["--profile", "gpu", "--ignore-budget", "--unsloth-vllm-standby", "true"],
        )
    calls = gpu_machine.calls
    assert "import unsloth" in calls and calls.index("import unsloth") < calls.index("prompts")
    before_unsloth = calls[: calls.index("import unsloth")]
    assert any(c.startswith("nvml.") for c in before_unsloth)
    assert not [c for c in before_unsloth if c.startswith("cuda.")], before_unsloth
    assert os.environ[cuda_env.STANDBY_ENV] == "1"


def test_the_loader_gets_the_standby_keyword_it_checks_against_the_variable(monkeypatch):
    """Unsloth's loader refuses `unsloth_vllm_standby=True` unless UNSLOTH_VLLM_STANDBY=1 was set before
    its import; the policy passes the keyword exactly when the setting asks for standby."""
    from unsloth.models.llama import FastLlamaModel

    from grpolab.model import policy

    # The keyword is the real (GPU) loader's; FastLanguageModel passes it on through **kwargs (checked
    # from its source by tests/test_lab_gpu_path.py: on a CPU Unsloth swaps in its CPU loader).
    assert "unsloth_vllm_standby" in inspect.signature(FastLlamaModel.from_pretrained).parameters

    seen: dict = {}

    class Loaded(Exception):
        pass

    def from_pretrained(**kwargs):
        seen.update(kwargs)
        raise Loaded

    monkeypatch.setattr(policy.FastLanguageModel, "from_pretrained", from_pretrained)
    gpu = lab_settings(LAB_DIR, "gpu")
    for standby in (True, False):
        seen.clear()
        with pytest.raises(Loaded):
            policy.load_policy(gpu.replace(unsloth_vllm_standby=standby))
        assert seen.get("unsloth_vllm_standby", False) is standby
        assert seen["fast_inference"] is True


def test_the_allocator_is_read_from_torch(monkeypatch):
    """The tag `cuda_allocator_settings` is what torch answers, through the query this torch has (a
    renamed query would tag every GPU run "unknown")."""
    import torch

    real = torch._C._accelerator_getAllocatorSettings  # the query exists in the installed torch
    assert isinstance(real(), str) or real() is not None  # and answers on a CPU too
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: "expandable_segments:True")
    assert cuda_env.allocator_settings() == "expandable_segments:True"
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings")
    assert cuda_env.allocator_settings() == "unknown"


def test_the_cuda_initialising_calls_are_real_torch_functions():
    """The stand-ins record calls torch really has (a renamed one would make the order tests vacuous)."""
    import torch

    real = [name for name in CUDA_INITIALISING if name != "init" or hasattr(torch.cuda, "init")]
    assert all(callable(getattr(torch.cuda, name, None)) for name in real)
