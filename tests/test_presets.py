"""Every shipped preset composes into a checked config: each model, each launcher."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from harness.config.compose import CONF_DIR, compose_config, register

MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
LAUNCHERS = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))


@pytest.mark.parametrize("model", MODELS)
def test_every_model_preset_composes(model):
    cfg = compose_config([f"model={model}"], check_machine=False)  # hub ids need no local folder to compose
    assert cfg.model.name == model and cfg.model.tensor_parallel_size >= 1
    assert (cfg.model.price_input_per_mtok is None) == (cfg.model.price_output_per_mtok is None)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_composes(launcher):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs hydra-submitit-launcher (pip install -e .)")
    from hydra import compose, initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    launcher_cfg = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher_cfg["_target_"].startswith("hydra_plugins.hydra_submitit_launcher")
    assert launcher_cfg["timeout_min"] > 0


def test_laptop_evidence_has_enough_paired_episodes_in_both_kinds_of_cell():
    import scenarios

    cfg = compose_config(["experiment=laptop_evidence"], check_machine=False)
    episodes = scenarios.build_episodes(cfg.scenario)
    expected = [e.expected for e in episodes]
    assert cfg.model.name == "qwen2.5-coder-0.5b" and list(cfg.conditions) == ["none", "status_tail"]
    assert len(episodes) >= 60 and expected.count("complied") == expected.count("refused")  # control = limit cells
    assert {e.params["calls_made"] for e in episodes} >= {2, 3, 4}  # below, at and over the limit of 3
    assert cfg.experiment.replicates >= 2 and not cfg.model.generation.greedy  # sampled replicates
