"""The user-mistake exception, dependency-free so that schemas, conditions and backends can all raise it
without importing each other."""
from __future__ import annotations


class ConfigError(ValueError):
    """A user mistake in the configuration or in a file the user handed us; the message names the key."""


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")
