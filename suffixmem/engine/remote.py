"""The remote engine: the Engine protocol over one or more vLLM OpenAI-compatible servers.

Contract:
- Token in, token out: the prompt goes to ``/v1/completions`` as token ids (rendered here with
  the model's chat template, as every engine does), and ``return_token_ids`` brings back the
  generated ids, so the next turn's prompt repeats this turn's tokens bit for bit and the
  server's prefix cache hits. The servers must serve the same model as ``config.model`` (its
  tokenizer is loaded locally; ``/v1/models`` is checked at start).
- ``cache_salt = session_key`` isolates sessions' KV on the server, as in the embedded engine.
- ``Result.cached_tokens`` comes from ``usage.prompt_tokens_details.cached_tokens``: start the
  servers with ``--enable-prompt-tokens-details`` (0 is reported otherwise).
- Routing (``routing.Router``): a session goes to its pinned replica, else by rendezvous hash
  over the healthy ones. A replica that fails (connection refused or reset, 5xx) is marked down
  and the request moves to the session's next replica; when tokens were already streamed the
  new replica continues from prompt + those tokens (a continuation of the same sequence), so
  the caller sees no error and no repeated text. The moved session's next turn is cold there.
- A 4xx answer is the request's own fault: ``InvalidRequestError`` with the server's message,
  and no failover.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from suffixmem.config import EngineConfig
from suffixmem.engine.base import BaseEngine, one_line
from suffixmem.engine.protocol import Request, Result, TokenEvent
from suffixmem.engine.routing import PinStore, Router, UpstreamError
from suffixmem.errors import InvalidRequestError
from suffixmem.models import resolve_model

log = logging.getLogger(__name__)

__all__ = ["RemoteEngine", "UpstreamError"]

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class _Failed(Exception):
    """This replica failed mid-request; try the next one."""


class RemoteEngine(BaseEngine):
    """vLLM servers behind session-affine routing (see the module docstring)."""

    name = "remote"
    supports_json_schema = True

    def __init__(self, urls: Sequence[str], config: EngineConfig | None = None, *,
                 pins: PinStore | None = None, sticky: bool = True,
                 health_interval_s: float = 2.0, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 600.0, policy: str = "affinity") -> None:
        super().__init__()
        if isinstance(urls, str):
            urls = [urls]
        self.config = config = config or EngineConfig()
        self.model_name = config.model
        self._client = httpx.Client(timeout=httpx.Timeout(read_timeout_s,
                                                          connect=connect_timeout_s))
        self.router = Router(list(urls), pins, sticky=sticky, probe=self._probe,
                             interval_s=health_interval_s, policy=policy)
        self._load_tokenizer(resolve_model(config.model))
        self.max_model_len, self.served_model = self._discover(config.max_model_len)
        self._counts_lock = threading.Lock()
        self._stats.extra.update(failovers=0, moved_sessions=0,
                                 replica_requests={u: 0 for u in self.router.urls})

    # -- replicas -------------------------------------------------------------------------------
    def _probe(self, url: str) -> bool:
        try:
            return self._client.get(f"{url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _discover(self, wanted_len: int) -> tuple[int, str]:
        """The served model's name and the smallest context window among reachable replicas;
        unreachable ones start marked down (the health thread brings them back)."""
        lens, names = [], []
        for url in self.router.urls:
            try:
                r = self._client.get(f"{url}/v1/models", timeout=10.0)
                r.raise_for_status()
                card = r.json()["data"][0]
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                log.warning("replica %s is not answering /v1/models; marked down", url)
                self.router.mark_down(url)
                continue
            names.append(str(card["id"]))
            if card.get("max_model_len"):
                lens.append(int(card["max_model_len"]))
        if not names:
            self.router.close()
            self._client.close()
            raise UpstreamError(f"no replica answered: {', '.join(self.router.urls)}")
        if len(set(names)) > 1:
            raise UpstreamError(f"replicas serve different models: {sorted(set(names))}")
        return min([wanted_len, *lens]), names[0]

    # -- generation -----------------------------------------------------------------------------
    def _prepare(self, request: Request, prompt_ids: list[int]) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.served_model, "prompt": prompt_ids, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
            "cache_salt": request.session_key, "ignore_eos": s.ignore_eos,
        }
        if s.top_k > 0:
            body["top_k"] = s.top_k
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.json_schema is not None:
            body["structured_outputs"] = {"json": s.json_schema}
        if s.penalised:
            # a continuation on another replica (below) sends the tokens generated so far as
            # prompt, which the penalties do not count: they restart from its first new token
            body["frequency_penalty"] = s.frequency_penalty
            body["presence_penalty"] = s.presence_penalty
        return body

    def _stream(self, request: Request, prompt_ids: list[int],
                payload: dict[str, Any]) -> Iterator[TokenEvent | Result]:
        key = request.session_key
        t0 = time.perf_counter()
        ttft = 0.0
        ids: list[int] = []
        texts: list[str] = []
        tried: list[str] = []
        while True:
            order = [u for u in self.router.route(key) if u not in tried]
            if not order and not tried:
                self.router.check_now()  # every replica was marked down: look again once
                order = self.router.route(key)
            if not order:
                raise UpstreamError(f"no healthy replica for session {key!r} (tried "
                                    f"{', '.join(tried) or 'none'} of {len(self.router.urls)})")
            url = order[0]
            tried.append(url)
            body = dict(payload, prompt=prompt_ids + ids,
                        max_tokens=payload["max_tokens"] - len(ids))
            if ids and "seed" in body:
                body["seed"] = body["seed"] + len(ids)  # a fresh draw for the continuation
            usage: dict[str, Any] = {}
            finish: str | None = None
            stop_reason: Any = None
            try:
                for chunk in self._events(url, body):
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or ():
                        new = [int(t) for t in choice.get("token_ids") or ()]
                        text = choice.get("text") or ""
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
                            stop_reason = choice.get("stop_reason")
                            if finish == "stop" and stop_reason is None and new and \
                                    new[-1] == self.template.eos_token_id:
                                new = new[:-1]  # the end-of-turn token stays out of the reply
                        if new and not ids:
                            ttft = time.perf_counter() - t0
                        for j, tid in enumerate(new):
                            yield TokenEvent(tid, text if j == len(new) - 1 else "", len(ids))
                            ids.append(tid)
                        if not new and text:
                            yield TokenEvent(-1, text, len(ids))
                        texts.append(text)
                if finish is None:
                    raise _Failed("stream ended without a finish reason")
            except _Failed as e:
                self._failover(url, key, e)
                continue
            break
        moved = self.router.served(key, url)
        self._count(url, failovers=len(tried) - 1, moved=moved)
        details = usage.get("prompt_tokens_details") or {}
        cached = min(int(details.get("cached_tokens") or 0), len(prompt_ids))
        return_text = "".join(texts) if len(tried) == 1 else self.detokenize(ids)
        yield Result(
            text=return_text, token_ids=tuple(ids),
            finish_reason=_FINISH.get(finish or "stop", "stop"),  # type: ignore[arg-type]
            prompt_tokens=len(prompt_ids), cached_tokens=cached,
            ttft_s=ttft or time.perf_counter() - t0, latency_s=time.perf_counter() - t0,
            request_id=request.request_id, session_key=key,
        )

    def _events(self, url: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The server's SSE chunks as dicts; ``_Failed`` when the replica is unusable."""
        try:
            with self._client.stream("POST", f"{url}/v1/completions", json=body) as r:
                if r.status_code >= 500:
                    raise _Failed(f"HTTP {r.status_code}")
                if r.status_code >= 400:
                    r.read()
                    raise InvalidRequestError(f"replica {url} refused the request: "
                                              f"{_server_message(r)}")
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk and "choices" not in chunk:
                        raise _Failed(f"stream error: {chunk['error']}")
                    yield chunk
        except httpx.TransportError as e:
            raise _Failed(one_line(e)) from e

    def _failover(self, url: str, key: str, error: Exception) -> None:
        log.warning("replica %s failed for session %s (%s); trying its next replica", url, key,
                    one_line(error))
        self.router.mark_down(url)

    def _count(self, url: str, *, failovers: int, moved: bool) -> None:
        with self._counts_lock:
            extra = self._stats.extra
            extra["failovers"] += failovers
            extra["moved_sessions"] += int(moved)
            extra["replica_requests"][url] = extra["replica_requests"].get(url, 0) + 1

    def unavailable(self) -> str | None:
        """None while some replica is up (the health thread's view); else which are down."""
        if self._closed or self.router.healthy():
            return super().unavailable()
        return f"no replica is up: {', '.join(self.router.urls)}"

    def replica_of(self, session_key: str) -> str | None:
        """The replica the session is pinned to (None: not served yet)."""
        return self.router.pins.get(session_key)

    def reset_prefix_cache(self) -> int:
        """Ask every healthy replica to drop its prefix cache (needs ``VLLM_SERVER_DEV_MODE=1``
        on the servers); returns how many did."""
        done = 0
        for url in self.router.healthy():
            try:
                done += int(self._client.post(f"{url}/reset_prefix_cache").status_code == 200)
            except httpx.HTTPError:
                log.debug("reset_prefix_cache on %s failed", url, exc_info=True)
        return done

    # -- BaseEngine's driver hooks: unused (requests go straight to HTTP, no driver thread) ----
    def _add(self, rid: str, payload: Any) -> None:  # pragma: no cover - no driver
        raise NotImplementedError

    def _abort(self, rid: str) -> None:  # pragma: no cover - no driver
        raise NotImplementedError

    def _has_work(self) -> bool:  # pragma: no cover - no driver
        return False

    def _step(self) -> None:  # pragma: no cover - no driver
        raise NotImplementedError

    def _step_failed(self, error: Exception) -> None:  # pragma: no cover - no driver
        raise NotImplementedError

    def _shutdown(self) -> None:
        self.router.close()
        self._client.close()


def _server_message(response: httpx.Response) -> str:
    try:
        err = response.json().get("error", {})
        message = err.get("message") if isinstance(err, dict) else str(err)
    except ValueError:
        message = response.text
    return " ".join(str(message or f"HTTP {response.status_code}").split())[:500]
