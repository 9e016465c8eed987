"""From Hydra's composed config to a checked, typed `Config`: the schemas registered in the
ConfigStore (the core ones, every backend's and every scenario family's), composition outside
Hydra's main for tools and tests, and one-line errors for command-line entry points."""
from __future__ import annotations

import dataclasses
import difflib
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from harness.config.schemas import ConditionConfig, Config, ModelConfig
from harness.errors import ConfigError
from harness.io.secrets import config_secret_path, secret_message
from harness.registry import BACKENDS, FAMILIES

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="statusbench_schema", node=Config)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="condition", name="condition_schema", node=ConditionConfig)
    for name, backend in BACKENDS.items():
        cs.store(group="backend", name=f"{name}_schema", node=backend.config_class)
    for _, family in FAMILIES.items():
        cs.store(group="scenario", name=f"{family.name}_schema", node=family.config_class)


def to_typed(cfg: DictConfig, check_machine: bool = True) -> Config:
    """Resolve interpolations and run every schema's checks, then (unless told not to) the checks
    that look at this machine; raise ConfigError naming the key."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        typed = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except OmegaConfBaseException as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(str(exc).splitlines()[0] + (f" (key: {exc.full_key})" if getattr(exc, "full_key", None) else "")) from None
    assert isinstance(typed, Config)
    unknown = unknown_keys(OmegaConf.to_container(cfg, resolve=False), typed)
    if unknown:  # named by key only: a value may be a secret
        also = f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        raise ConfigError(f"{unknown[0]}: unknown key (not a field of the schema); check the spelling{also}")
    secret = config_secret_path(OmegaConf.to_container(cfg, resolve=True))
    if secret:  # from a config file or an interpolation: refused before it is written anywhere
        raise ConfigError(secret_message(secret))
    if check_machine:
        typed.check_machine()
    return typed


def unknown_keys(node: Any, typed: Any, prefix: str = "") -> list[str]:
    """Keys of the composed config that no schema field takes. `+key=value` adds a key to a typed
    node, and OmegaConf.to_object then sets it as a stray attribute instead of refusing it."""
    if not isinstance(node, dict):
        return []
    if dataclasses.is_dataclass(typed):
        names = {f.name for f in dataclasses.fields(typed)}
        return [k for key, value in node.items() if key != "hydra"
                for k in ([f"{prefix}{key}"] if key not in names else unknown_keys(value, getattr(typed, key), f"{prefix}{key}."))]
    if isinstance(typed, dict):  # e.g. conditions: name -> ConditionConfig; free-form dicts hold no dataclass
        return [k for key, value in node.items() if key in typed for k in unknown_keys(value, typed[key], f"{prefix}{key}.")]
    return []


def compose_config(overrides: list[str], check_machine: bool = True) -> Config:
    """The typed config `python -m harness.run OVERRIDES...` gets, for tools and tests outside Hydra's main."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            composed = compose("config", overrides=list(overrides))
        except ConfigCompositionException as exc:  # e.g. a value outside an enumeration: name key and choices
            raise ConfigError(composition_error(exc)) from None
        return to_typed(composed, check_machine)


def group_options(group: str) -> list[str]:
    """A config group's options as a user picks them: the schemas stored beside them left out."""
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        names = GlobalHydra.instance().config_loader().get_group_options(group)
    else:
        names = [p.stem for p in (CONF_DIR / group).glob("*.yaml")]
    return sorted(n for n in names if not n.endswith("_schema"))


def _did_you_mean(word: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, options, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(prefix + c for c in close)}?)" if close else ""


def composition_error(exc: Exception) -> str:
    """One line for a config Hydra could not compose: an option of a group that does not exist or a
    key no schema has, with a did-you-mean and the choices; else the error's first line and key."""
    missing = getattr(exc, "missing_cfg_file", None)
    if missing and "/" in missing:  # MissingConfigException: `group=name` with no such option
        group, name = missing.rsplit("/", 1)
        options = group_options(group)
        return f"{group}={name}: no such option{_did_you_mean(name, options)}; {group} options: {', '.join(options)}"
    cause = exc.__cause__
    key = getattr(cause, "full_key", None)
    if key and str(exc).startswith("Could not override"):  # a key that is not in the schema
        parent, _, last = str(key).rpartition(".")
        schema = getattr(cause, "object_type", None)
        names = sorted(f.name for f in dataclasses.fields(schema)) if dataclasses.is_dataclass(schema) else []
        where = f"{parent}." if parent else ""
        return (f"{key}: unknown key{_did_you_mean(last, names, where)}"
                + (f"; {parent or 'top-level'} keys: {', '.join(names)}" if names else ""))
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    detail = f": {str(cause).splitlines()[0]}" if cause and str(cause) else ""
    return f"{first}{detail}" + (f" (key: {key})" if key else "")


@contextmanager
def user_errors() -> Iterator[None]:
    """For command-line entry points: a user mistake is one line naming it and exit status 2, not a traceback."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except ConfigError as exc:
        print(f"statusbench: error: {str(exc).strip()}", file=sys.stderr)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as exc:
        print(f"statusbench: error: {composition_error(exc)}", file=sys.stderr)
        sys.exit(2)
