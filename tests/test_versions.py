"""The locked stack stays inside the ranges its own packages declare.

Unsloth and unsloth_zoo pin TRL and transformers; TRL declares which vLLM releases it
supports (in trl/import_utils.py, where it warns outside them); vLLM >= 0.28 needs
vllm-bnb-plugin for bitsandbytes. A lock that drifts out of these fails here, not on a
user's GPU.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
from importlib.util import find_spec
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

STACK = [
    "unsloth",
    "unsloth_zoo",
    "vllm",
    "vllm-bnb-plugin",
    "trl",
    "peft",
    "bitsandbytes",
    "mlflow",
    "datasets",
]


def installed(name: str) -> Version:
    return Version(metadata.version(name))


@pytest.mark.parametrize("package", [*STACK, "jupyter", "transformers", "torch"])
def test_every_runtime_dependency_is_installed(package):
    assert installed(package)


@pytest.mark.parametrize("dependent", ["unsloth", "unsloth_zoo", "trl", "vllm-bnb-plugin"])
def test_declared_requirements_are_met(dependent):
    checked = 0
    for text in metadata.requires(dependent) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name not in {"trl", "transformers", "torch", "peft", "bitsandbytes", "datasets", "vllm"}:
            continue
        version = installed(req.name)
        assert req.specifier.contains(version, prereleases=True), f"{dependent} needs {req}, found {version}"
        checked += 1
    assert checked, f"{dependent} declares none of the stack's packages: the check would be empty"


def test_vllm_is_inside_the_range_trl_supports():
    source = Path(find_spec("trl.import_utils").origin).read_text()
    low, high = re.search(
        r'Version\("([\d.]+)"\) <= _vllm_base_version <= Version\("([\d.]+)"\)', source
    ).groups()
    vllm = Version(installed("vllm").base_version)
    assert Version(low) <= vllm <= Version(high), f"TRL supports vLLM {low}..{high}, found {vllm}"


def test_vllm_bnb_plugin_is_present_where_vllm_moved_bitsandbytes_out():
    if installed("vllm") >= Version("0.28"):
        assert installed("vllm-bnb-plugin")


def test_unsloth_zoo_matches_unsloth():
    assert installed("unsloth") == installed("unsloth_zoo")
