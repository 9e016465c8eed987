"""One decoder for a tool call's arguments (OpenAI chat format: a JSON string or an object).

Error policy, everywhere: arguments that are not a JSON object are the trajectory's fault (a
user's trace or a dataset row), so they raise `harness.errors.ConfigError` naming the call (and
`where`, e.g. the trace), never a raw JSONDecodeError. `scenarios/traces.py` decodes every
call once at load time, so a bad trace fails there, naming the trace and the message.
"""
from __future__ import annotations

import json
import re
from typing import Any

from harness.errors import ConfigError


def call_arguments(call: dict[str, Any], where: str = "") -> dict[str, Any]:
    """The decoded arguments of one tool call: {} when absent or empty, else a dict or ConfigError."""
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise _error(call, where, f"arguments are not valid JSON ({e.msg} at char {e.pos}): {args[:80]!r}") from None
        except (ValueError, RecursionError) as e:  # an integer past the digit limit, nesting past the stack
            raise _error(call, where, f"arguments are not readable JSON ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(args, dict):
        raise _error(call, where, f"arguments must be a JSON object, got {type(args).__name__}")
    return args


def names_target(value: Any, target: str) -> bool:
    """Whether an argument value names the target: any case, on word boundaries ("XFINITY support"
    yes, "Xfinityville" no). The grader, the status bar and the trace loader all count with this."""
    return isinstance(value, str) and re.search(rf"(?<!\w){re.escape(target)}(?!\w)", value, re.IGNORECASE) is not None


def same_tool(name: Any, tool: str) -> bool:
    """A call's tool name is the rule's tool: any case, surrounding spaces ignored."""
    return isinstance(name, str) and name.strip().lower() == tool.lower()


def calls_target(name: Any, args: dict[str, Any], tool: str, arg: str, target: str) -> bool:
    """The one matcher of "this call is a call to the rule's target", for the grader (a new call),
    the status bar (the calls it counts) and the trace loader (the expectation): the rule's tool, and
    the target named in the rule's argument, or in any argument when the call lacks it."""
    if not same_tool(name, tool):
        return False
    values = [args[arg]] if arg in args else list(args.values())
    return any(names_target(v, target) for v in values)


def _error(call: dict[str, Any], where: str, what: str) -> Exception:
    name = (call.get("function") or {}).get("name", "?")
    prefix = f"{where}: " if where else ""
    return ConfigError(f"{prefix}tool call {call.get('id', '(no id)')} ({name}): {what}")
