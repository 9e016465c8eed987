"""Named plug-ins: backends, scenario families, condition mechanisms, figures.

An entry is an object, or a lazy reference `"module:object"` that is imported on first use and
checked against the registry's base class (as lm-evaluation-harness's registry does): looking up the
hf backend imports harness.backends.hf only, never vllm's module. The built-in backends and families
are declared below by reference, so this module, at the bottom of the house, names them without
importing any of them; a plug-in adds its own with `add` or `lazy`.

A registry refuses a second entry under a name it already holds (two modules defining the same
backend would otherwise overwrite each other silently, and which one won would depend on import
order).
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

from harness.errors import ConfigError

T = TypeVar("T")


def resolve(reference: str) -> Any:
    """The object a `"module:object"` reference names."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


class Registry(Generic[T]):
    def __init__(self, kind: str, base: str | None = None):
        """`base`: a `"module:Class"` reference every entry must be (a class: a subclass of it)."""
        self.kind, self.base = kind, base
        self._entries: dict[str, T | str] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice ({self._entries[name]!r} and {entry!r})")
        self._entries[name] = entry
        return entry

    def lazy(self, name: str, reference: str) -> None:
        """An entry imported from `"module:object"` on first use."""
        if ":" not in reference:
            raise ValueError(f"{self.kind} {name!r}: a lazy entry is 'module:object', got {reference!r}")
        self.add(name, reference)  # type: ignore[arg-type]

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""
        return lambda entry: self.add(name, entry)

    def _resolved(self, name: str) -> T:
        entry = self._entries[name]
        if isinstance(entry, str):
            obj = resolve(entry)
            if self.base is not None:
                base = resolve(self.base)
                ok = issubclass(obj, base) if isinstance(obj, type) else isinstance(obj, base)
                if not ok:
                    raise TypeError(f"{self.kind} {name!r}: {entry} is not a {self.base}")
            self._entries[name] = entry = obj
        return entry

    def get(self, name: str, key: str | None = None) -> T:
        """The entry, or a ConfigError naming `key` (the config key that chose it), the names known
        and the closest one."""
        if name not in self._entries:
            close = difflib.get_close_matches(str(name), self._entries, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key or self.kind}: unknown {self.kind} {name!r}{hint} (known: {', '.join(sorted(self._entries))})")
        return self._resolved(name)

    def names(self) -> list[str]:
        """Every name, without importing any lazy entry."""
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        """Every entry, each lazy one imported."""
        return iter([(name, self._resolved(name)) for name in list(self._entries)])

    def __contains__(self, name: object) -> bool:
        return name in self._entries


BACKENDS: Registry = Registry("backend", base="harness.backends:Backend")
for _name, _ref in {"hf": "harness.backends.hf:HFBackend", "vllm": "harness.backends.vllm:VLLMBackend",
                    "openai": "harness.backends.openai_api:OpenAIBackend",
                    "scripted": "harness.backends.scripted:ScriptedBackend",
                    "anthropic": "harness.backends.anthropic_api:AnthropicBackend"}.items():
    BACKENDS.lazy(_name, _ref)

FAMILIES: Registry = Registry("scenario family", base="scenarios.family:Family")
for _name in ("xfinity", "traces", "diagnostics", "ledger", "loop_guard", "failure_streak", "todo_state", "truncation"):
    FAMILIES.lazy(_name, f"scenarios.{_name}:FAMILY")
