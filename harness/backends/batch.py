"""Batch mode (backend.batch=true): frozen episodes through a provider's batch API, billed at its batch
prices (OpenAI's Batch API: a JSONL file and a batch; Anthropic's Message Batches).

Each backend call is one provider batch. Before anything is sent, `<job dir>/batches/<key>.json` is
written, the key a hash of the sample ids the batch holds, with a random submission id; once the
provider has answered, it holds the batch's id. A run killed at any point and run again plans the same
pending samples, finds the file and polls the stored batch: a batch is never submitted twice for the
same samples. (OpenAI: the submission id is also the batch's metadata, so even a kill between the
provider's answer and the write of the batch id is found again by listing the batches; Anthropic's
batches carry no metadata, so that instant is refused in one line, naming the file to delete once the
console shows no such batch.)

The batch is polled every backend.poll_s seconds, the run's bar moving as the provider counts requests
done; its results become records when it has ended. A request that failed, expired or was cancelled
is an error record carrying the provider's reason (run.retry_errors=true sends those again, in a new
batch); the others are kept. Every text of a result is redacted as a direct answer's is.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness import progress
from harness.backends.sdk_errors import describe_error
from harness.errors import ConfigError
from harness.io.files import write_file
from harness.types import Completion, Request, short_hash

log = logging.getLogger(__name__)

BATCHES_DIR = "batches"


class BatchError(ConfigError):
    """A batch that cannot go on here (its id lost, the provider unreachable while polling): one line,
    saying what to run; the stored batch stays for the next run."""


@dataclass
class Status:
    ended: bool
    finished: int  # requests the provider has answered (well or not)
    total: int
    state: str  # the provider's word for it
    detail: str = ""  # why requests without a result have none (a failed batch's errors)
    batch: Any = None  # the provider's batch object


class BatchApi:
    """One provider's batch API; every method takes the SDK's async client."""

    provider: str
    searchable = False  # whether `find` can look a batch up by its key

    def client(self) -> Any:
        raise NotImplementedError

    async def find(self, client: Any, submission: str) -> str | None:
        """The id of the batch this run submitted as `submission` (the nonce its file holds) but did not
        store; None where the provider cannot tell (then a submission with a lost id is refused)."""
        return None

    async def submit(self, client: Any, requests: list[Request], submission: str) -> str:
        raise NotImplementedError

    async def poll(self, client: Any, batch_id: str) -> Status:
        raise NotImplementedError

    async def results(self, client: Any, status: Status, requests: list[Request]) -> dict[str, Completion]:
        """The completions of the requests the provider answered, keyed by sample id."""
        raise NotImplementedError


def batch_key(sample_ids: list[str]) -> str:
    return short_hash(sorted(sample_ids))


def stored_path(job_dir: Path, key: str) -> Path:
    return Path(job_dir) / BATCHES_DIR / f"{key}.json"


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():  # a FIFO or a folder in its place is no record of a batch
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BatchError(f"{path} is unreadable ({exc}): it records a submitted batch; restore it, or delete it once "
                         "the provider's console shows no batch of these samples") from None


def _write(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(entry, indent=1, sort_keys=True))


def run_batch(api: BatchApi, requests: list[Request], job_dir: Path | None, poll_s: float,
              clean: Callable[[Completion], Completion]) -> list[Completion]:
    """The completions of `requests` (in order) from one provider batch, submitted once."""
    if job_dir is None:
        raise BatchError("backend.batch: batch mode keeps its submitted batches in the run directory, and this "
                         "backend was given none (Backend.attach)")
    return asyncio.run(_run(api, requests, Path(job_dir), poll_s, clean))


async def _run(api: BatchApi, requests: list[Request], job_dir: Path, poll_s: float,
               clean: Callable[[Completion], Completion]) -> list[Completion]:
    ids = [r.sample_id for r in requests]
    key = batch_key(ids)
    path = stored_path(job_dir, key)
    t0 = time.perf_counter()
    async with api.client() as client:
        batch_id = await _submitted(api, client, requests, key, path)
        status = await _wait(api, client, batch_id, poll_s, path)
        try:
            answered = await api.results(client, status, requests)
        except Exception as exc:
            raise BatchError(f"backend.batch: reading the results of {api.provider} batch {batch_id} failed "
                             f"({_line(describe_error(exc))}); it stays recorded in {path}: run the same command to "
                             "read them again") from None
    wall = time.perf_counter() - t0
    out = []
    for sid in ids:
        c = answered.get(sid) or Completion(error=f"{api.provider} batch {batch_id} ({status.state}) holds no result "
                                                  f"for this request{': ' + status.detail if status.detail else ''}")
        c.batched, c.batch_latency_s, c.latency_s = True, wall, None  # no request has a latency of its own here
        out.append(clean(c))
    return out


async def _submitted(api: BatchApi, client: Any, requests: list[Request], key: str, path: Path) -> str:
    """The id of the batch holding these requests: the stored one, else one found at the provider
    under the key, else a new one (submitted now, its id stored)."""
    entry = _read(path)
    if entry and entry.get("batch_id"):
        log.warning("resuming %s batch %s (%d requests, submitted %s), recorded in %s", api.provider,
                    entry["batch_id"], len(requests), entry.get("submitted_at"), path)
        return entry["batch_id"]
    found = None
    if entry is not None:  # this run began submitting these samples and stopped before storing the id
        found = await api.find(client, str(entry.get("submission"))) if api.searchable else None
        if found is None and not api.searchable:
            raise BatchError(f"backend.batch: a {api.provider} batch of these {len(requests)} samples was being submitted "
                             f"at {entry.get('started_at')} when the run stopped, and its id was not stored; the provider's "
                             f"batches carry no key to find it by. Check its console: cancel or wait for that batch, then "
                             f"delete {path} to submit again")
    base = {"provider": api.provider, "key": key, "sample_ids": sorted(r.sample_id for r in requests),
            "started_at": _now(), "submission": uuid.uuid4().hex}
    if found is None:
        _write(path, base)  # before sending: a kill from here on is never a silent second submission
        try:
            found = await api.submit(client, requests, base["submission"])
        except Exception as exc:
            path.unlink(missing_ok=True)  # refused by the provider: nothing was submitted
            raise BatchError(f"backend.batch: the {api.provider} batch API refused the batch: "
                             f"{_line(describe_error(exc))}") from None
    _write(path, {**base, **(entry or {}), "batch_id": found, "submitted_at": _now()})
    log.warning("submitted %s batch %s (%d requests), recorded in %s; a killed run resumes it", api.provider, found,
                len(requests), path)
    return found


async def _wait(api: BatchApi, client: Any, batch_id: str, poll_s: float, path: Path) -> Status:
    """Poll until the batch has ended, moving the run's bar as the provider answers requests."""
    shown = 0
    while True:
        try:
            status = await api.poll(client, batch_id)
        except Exception as exc:
            raise BatchError(f"backend.batch: polling {api.provider} batch {batch_id} failed ({_line(describe_error(exc))}); "
                             f"it stays recorded in {path}: run the same command to resume it") from None
        if status.finished > shown:
            progress.advance(status.finished - shown)
            shown = status.finished
        if status.ended:
            return status
        await asyncio.sleep(poll_s)


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _line(text: str) -> str:
    return " ".join(text.split())[:500]


def _jsonl(text: str) -> list[dict[str, Any]]:
    """A results file's lines; a line that is not a JSON object is skipped (its request then has no result)."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("custom_id"), str):
            rows.append(row)
    return rows


class OpenAIBatches(BatchApi):
    """OpenAI's Batch API: the requests as a JSONL file (purpose batch), a batch over it (24 h window);
    results in an output file and failed requests in an error file."""

    provider = "openai"
    searchable = True
    SEARCHED = 1000  # the newest batches looked through for a key (the list is newest first)
    ENDED = ("completed", "failed", "expired", "cancelled")

    def __init__(self, client: Callable[[], Any], path: str, body: Callable[[Request], dict[str, Any]],
                 parse: Callable[[Any], Completion], prompt: Callable[[Request], str] | None):
        self.client, self.path, self.body, self.parse, self.prompt = client, path, body, parse, prompt

    def line(self, req: Request) -> dict[str, Any]:
        body = self.body(req)
        body.update(body.pop("extra_body", {}))  # the SDK's extra_body is part of the JSON body
        return {"custom_id": req.sample_id, "method": "POST", "url": self.path, "body": body}

    async def find(self, client: Any, submission: str) -> str | None:
        seen = 0
        async for batch in client.batches.list(limit=100):
            if (batch.metadata or {}).get("statusbench_submission") == submission:
                return batch.id
            seen += 1
            if seen >= self.SEARCHED:
                break
        return None

    async def submit(self, client: Any, requests: list[Request], submission: str) -> str:
        data = "".join(json.dumps(self.line(r), ensure_ascii=False) + "\n" for r in requests).encode("utf-8")
        upload = await client.files.create(file=(f"statusbench-{submission}.jsonl", data), purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id, endpoint=self.path, completion_window="24h",
                                            metadata={"statusbench_submission": submission})
        return batch.id

    async def poll(self, client: Any, batch_id: str) -> Status:
        b = await client.batches.retrieve(batch_id)
        counts = b.request_counts
        detail = ""
        if b.status == "failed":  # the whole batch refused (e.g. a malformed line)
            detail = "; ".join(f"line {e.line}: {e.message}" for e in (b.errors.data or [])) if b.errors else "no reason given"
        elif b.status in ("expired", "cancelled"):
            detail = f"the batch {b.status} before this request ran"
        return Status(b.status in self.ENDED, (counts.completed + counts.failed) if counts else 0,
                      counts.total if counts else 0, b.status, detail, b)

    async def results(self, client: Any, status: Status, requests: list[Request]) -> dict[str, Completion]:
        out: dict[str, Completion] = {}
        for file_id in (status.batch.output_file_id, status.batch.error_file_id):
            if file_id:
                content = await client.files.content(file_id)
                for row in _jsonl(content.text):
                    out[row["custom_id"]] = self.result(row)
        if self.prompt:  # the prompt each request sent, as a direct answer's record holds it
            for req in requests:
                if req.sample_id in out:
                    out[req.sample_id].prompt_text = self.prompt(req)
        return out

    def result(self, row: dict[str, Any]) -> Completion:
        response, error = row.get("response") or {}, row.get("error")
        status = response.get("status_code")
        if status == 200 and isinstance(response.get("body"), dict):
            try:
                c = self.parse(response["body"])
            except ValueError as exc:
                return Completion(error=f"openai batch: {exc}")
            c.request_id = response.get("request_id") or c.request_id
            return c
        detail = json.dumps(error or response.get("body"), ensure_ascii=False)
        return Completion(error=f"openai batch: http {status}: {detail}" if status else f"openai batch: {detail}",
                          request_id=response.get("request_id"))
