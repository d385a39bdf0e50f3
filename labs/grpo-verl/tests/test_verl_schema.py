"""Every configuration composes against verl's installed Hydra schema, and passes verl's own checks."""

from __future__ import annotations

import ast

import pytest
from grpo_verl import launch, schema
from grpo_verl.settings import load_lab
from omegaconf import OmegaConf

LAB = load_lab()
CONFIGS = sorted(LAB.configs)


def all_overrides(name: str) -> dict:
    return launch.overrides(LAB.config(name), LAB.task, LAB.data.dir)


def test_lab_toml_names_the_chapter_its_task_and_its_environment():
    assert LAB.chapter == "grpo-verl"
    assert LAB.environment == "labs/grpo-verl"
    from task import TASKS

    assert LAB.task in TASKS
    cards = {name: LAB.config(name).cards for name in CONFIGS}
    assert cards["one-card"] == 1 and cards["one-node"] == 8 and LAB.config("multi-node").nnodes > 1
    assert LAB.config("multi-node").submit == "ray-job"


@pytest.mark.parametrize("name", CONFIGS)
def test_every_override_lands_in_verls_config_with_its_value(name):
    values = all_overrides(name)
    config = schema.compose(launch.hydra_args(values))
    for key, value in values.items():
        got = OmegaConf.select(config, key, throw_on_missing=True)
        got = OmegaConf.to_object(got) if OmegaConf.is_config(got) else got
        assert got == value, f"{key}: verl's config holds {got!r}, lab.toml says {value!r}"


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.rollout.nn=8",  # a misspelt leaf
        "actor_rollout_ref.rolout.n=8",  # a misspelt section
        "algorithm.norm_adv_by_std=false",  # a key of an older verl
    ],
)
def test_a_key_verl_does_not_have_fails(override):
    with pytest.raises(schema.SchemaError, match="Could not override"):
        schema.compose([*launch.hydra_args(all_overrides("one-card")), override])


@pytest.mark.parametrize("name", CONFIGS)
def test_verls_own_validation_passes(name):
    schema.validate(schema.compose(launch.hydra_args(all_overrides(name))))


def test_verls_validation_is_live_on_these_configs():
    # 1 prompt x 1 completion cannot be split over 8 cards: verl's check must refuse it.
    values = {**all_overrides("one-node"), "data.train_batch_size": 1, "actor_rollout_ref.rollout.n": 1}
    with pytest.raises(AssertionError, match="real_train_batch_size"):
        schema.validate(schema.compose(launch.hydra_args(values)))


@pytest.mark.parametrize("name", CONFIGS)
def test_the_recipe_is_consistent(name):
    v = LAB.config(name).verl
    # Dr. GRPO divides each completion's token sum by the longest completion, as TRL does.
    assert v["actor_rollout_ref.actor.loss_scale_factor"] == v["data.max_response_length"]
    # One optimizer step per generated batch (the budget counts a step so).
    assert v["actor_rollout_ref.actor.ppo_mini_batch_size"] == v["data.train_batch_size"]


def test_the_launch_uses_verls_real_entry_point_and_config_name():
    path = schema.verl_config_dir().parent / "main_ppo.py"
    tree = ast.parse(path.read_text())
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    (decorator,) = [d for d in main.decorator_list if isinstance(d, ast.Call)]
    assert ast.unparse(decorator.func) == "hydra.main"
    kwargs = {k.arg: ast.literal_eval(k.value) for k in decorator.keywords}
    assert kwargs["config_path"] == "config" and kwargs["config_name"] == launch.CONFIG_NAME
    assert any(ast.unparse(n.test) == "__name__ == '__main__'" for n in tree.body if isinstance(n, ast.If))
    command = launch.command(LAB.config("one-card"), all_overrides("one-card"), python="python")
    assert command[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    assert (
        path.relative_to(path.parents[2]).with_suffix("").as_posix().replace("/", ".") == launch.ENTRY_POINT
    )


def test_hydra_values_round_trip_through_hydra():
    tricky = {
        "trainer.project_name": "has space",
        "trainer.experiment_name": "1e-6",  # a string that looks like a float
        "actor_rollout_ref.model.path": "/tmp/it's here",
        "trainer.logger": ["console", "wandb"],
        "actor_rollout_ref.actor.optim.lr": 5e-6,
        "actor_rollout_ref.model.external_lib": None,
    }
    config = schema.compose(launch.hydra_args(tricky))
    for key, value in tricky.items():
        got = OmegaConf.select(config, key)
        assert (OmegaConf.to_object(got) if OmegaConf.is_config(got) else got) == value
