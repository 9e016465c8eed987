"""Named plug-ins: backends, scenario families, condition mechanisms, figures.

A registry refuses a second entry under a name it already holds (two modules defining the same
backend would otherwise overwrite each other silently, and which one won would depend on import
order). The backends' and families' registries live here, at the bottom of the house, and name
the package whose modules fill them: the first lookup imports those modules (each registers
itself), so composing a config reads every schema without any module of the config layer
importing a backend or a family.
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Callable, Generic, Iterator, TypeVar

from harness.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, discover: str | None = None):
        self.kind, self.discover = kind, discover
        self._entries: dict[str, T] = {}
        self._discovered = discover is None

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice ({self._entries[name]!r} and {entry!r})")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""
        return lambda entry: self.add(name, entry)

    def _load(self) -> dict[str, T]:
        if not self._discovered:
            self._discovered = True  # first: a module that looks itself up while importing sees a partial registry, not a loop
            package = importlib.import_module(self.discover)
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self.discover}.{module.name}")
        return self._entries

    def get(self, name: str, key: str | None = None) -> T:
        """The entry, or a ConfigError naming `key` (the config key that chose it), the names known
        and the closest one."""
        entries = self._load()
        if name not in entries:
            close = difflib.get_close_matches(str(name), entries, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key or self.kind}: unknown {self.kind} {name!r}{hint} (known: {', '.join(sorted(entries))})")
        return entries[name]

    def names(self) -> list[str]:
        return sorted(self._load())

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._load().items()))

    def __contains__(self, name: object) -> bool:
        return name in self._load()


BACKENDS: Registry = Registry("backend", discover="harness.backends")
FAMILIES: Registry = Registry("scenario family", discover="scenarios")
