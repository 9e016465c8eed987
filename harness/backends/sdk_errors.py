"""An API client's error in one line, as records and refusals show it (the API backends and their batch mode)."""
from __future__ import annotations


def describe_error(exc: Exception) -> str:
    """An SDK's error in one line: an HTTP status with the server's body, else the exception."""
    status, response = getattr(exc, "status_code", None), getattr(exc, "response", None)
    if isinstance(status, int) and response is not None:
        body = getattr(exc, "body", None)
        return f"http {status}: {body if body is not None else response.text}"
    return f"{type(exc).__name__}: {exc}"
