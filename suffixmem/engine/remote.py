"""The remote engine: the Engine protocol over one or more vLLM OpenAI-compatible servers.

Contract:
- Token in, token out: the prompt goes to ``/v1/completions`` as token ids (rendered here with
  the model's chat template, as every engine does), and ``return_token_ids`` brings back the
  generated ids, so the next turn's prompt repeats this turn's tokens bit for bit and the
  server's prefix cache hits. The servers must serve the same model as ``config.model`` (its
  tokenizer is loaded locally): at start, each replica that answers ``/v1/models`` tokenizes a
  probe text with ``POST /tokenize``, and ids that differ from the local tokenizer's are a
  one-line ``ConfigError`` naming the replica and both models (a replica without ``/tokenize``
  gets a warning and is used unchecked). A replica that is down at start gets the same checks
  (model name, context window, tokenizer) when its health probe first finds it up, and stays
  out of routing with one logged error when it fails them. When no replica answers at start,
  ``UpstreamError`` names each one's cause.
- URLs are ``http(s)://host[:port]`` base URLs, one per replica (``remote_stream.check_url``).
- Isolation (``EngineConfig.isolation``): ``cache_salt`` is ``IsolationPolicy.salt``, the
  session key in ``session`` scope (sessions never share KV on a server, as in the embedded
  engine), one salt per tenant in ``app`` scope; ``public-prefix`` is refused at construction
  (vLLM's salt covers the whole block chain).
- ``Result.cached_tokens`` comes from ``usage.prompt_tokens_details.cached_tokens``: start the
  servers with ``--enable-prompt-tokens-details`` (0 is reported otherwise).
- Routing (``routing.Router``): a session goes to its pinned replica, else by rendezvous hash
  over the healthy ones. A replica that fails (connection refused or reset, 5xx) is marked down
  and the request moves to the session's next replica; when tokens were already streamed the
  new replica continues from prompt + those tokens (a continuation of the same sequence), so
  the caller sees no error and no repeated text. The moved session's next turn is cold there.
  A guided reply (``json_schema``) is not continued: the grammar would start over on the new
  replica and break the JSON, so once a token of it was streamed, a failure is a one-line
  ``UpstreamError`` naming the replica (before the first token it fails over as any request).
- A request in flight on a replica that gets marked down (by the health check or another
  request's failure) fails over once the replica has been silent for 5 s, rather than
  waiting out ``read_timeout_s`` (``remote_stream.sse_chunks``); ``read_timeout_s`` bounds the
  silence of a replica that is not marked down. When every replica fails a request, the
  ``UpstreamError`` names each one's last cause.
- A 4xx answer is the request's own fault: ``InvalidRequestError`` with the server's message,
  and no failover. A malformed event is the replica's fault: failover.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from suffixmem.config import EngineConfig
from suffixmem.engine.base import BaseEngine, one_line
from suffixmem.engine.isolation import IsolationPolicy
from suffixmem.engine.protocol import Request, Result, TokenEvent
from suffixmem.engine.remote_stream import ReplicaFailed, cause, check_url, sse_chunks
from suffixmem.engine.routing import PinStore, Router, UpstreamError
from suffixmem.errors import ConfigError
from suffixmem.models import resolve_model

log = logging.getLogger(__name__)

__all__ = ["RemoteEngine", "UpstreamError"]

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
# varied scripts and digits: two tokenizers that agree on it are, for prompts, the same one
_PROBE = "suffixmem tokenizer probe: Grüße aus Köln, 東京タワー, naïve café 12345 ✓ {\"k\": [1]}"


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
        # vLLM's salt covers the whole block chain: no public prefix under private blocks
        self.isolation = IsolationPolicy.from_config(config)
        self.isolation.require(self.name)
        urls = [check_url(u) for u in urls]
        self.read_timeout_s = read_timeout_s
        timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._client = httpx.Client(timeout=timeout)
        # completions get a fresh connection each (no idle ones kept): its socket is known from
        # the connect, so a request whose replica goes silent can be hung up on (remote_stream)
        self._streams = httpx.Client(timeout=timeout,
                                     limits=httpx.Limits(max_keepalive_connections=0))
        self.served_model: str | None = None
        self._unchecked: set[str] = set()  # down at start: checked when it first comes up
        self._refused: set[str] = set()  # failed that check (its error is logged once)
        self.router = Router(urls, pins, sticky=sticky, probe=self._probe,
                             interval_s=health_interval_s, policy=policy)
        try:
            self._load_tokenizer(resolve_model(config.model))
            self.max_model_len, self.served_model = self._discover(config.max_model_len)
            for url in self.router.healthy():
                self._check_tokenizer(url)
        except BaseException:
            self._shutdown()
            raise
        self._counts_lock = threading.Lock()
        self._stats.extra.update(failovers=0, moved_sessions=0,
                                 replica_requests={u: 0 for u in self.router.urls})

    # -- replicas -------------------------------------------------------------------------------
    def _probe(self, url: str) -> bool:
        try:
            up = self._client.get(f"{url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False
        return up and self._admit(url)

    def _admit(self, url: str) -> bool:
        """Whether a replica that answers its health probe may take requests: one that was
        down at start must first pass the start-up checks (same model, a context window no
        smaller than ours, same tokenizer); until then, or when it fails them, it stays down."""
        if url not in self._unchecked:
            return True
        if self.served_model is None:  # start-up is still discovering the others
            return False
        try:
            card = _model_card(self._client, url)
            if str(card["id"]) != self.served_model:
                raise ConfigError(f"replica {url} serves {card['id']!r}, not "
                                  f"{self.served_model!r} as the other replicas")
            window = int(card.get("max_model_len") or self.max_model_len)
            if window < self.max_model_len:
                raise ConfigError(f"replica {url} has a context window of {window} tokens, "
                                  f"under the engine's {self.max_model_len}")
            self._check_tokenizer(url)
        except ReplicaFailed:  # not ready yet: the next probe tries again
            return False
        except (ConfigError, ValueError, TypeError) as e:
            if url not in self._refused:
                self._refused.add(url)
                log.error("replica %s stays out of routing: %s", url, one_line(e))
            return False
        self._unchecked.discard(url)
        log.info("replica %s is up and passed the start-up checks", url)
        return True

    def _discover(self, wanted_len: int) -> tuple[int, str]:
        """The served model's name and the smallest context window among reachable replicas;
        unreachable ones start marked down (the health thread brings them back)."""
        lens, names, causes = [], [], {}
        for url in self.router.urls:
            try:
                card = _model_card(self._client, url)
            except ReplicaFailed as e:
                causes[url] = str(e)
                log.warning("replica %s is not answering /v1/models (%s); marked down", url, e)
                self._unchecked.add(url)
                self.router.mark_down(url, announce=False)  # it has no sessions to move yet
                continue
            names.append(str(card["id"]))
            if card.get("max_model_len"):
                lens.append(int(card["max_model_len"]))
        if not names:
            raise UpstreamError("no replica answered: " +
                                ", ".join(f"{u} ({c})" for u, c in causes.items()))
        if len(set(names)) > 1:
            raise UpstreamError(f"replicas serve different models: {sorted(set(names))}")
        return min([wanted_len, *lens]), names[0]

    def _check_tokenizer(self, url: str) -> None:
        """``ConfigError`` when the replica tokenizes ``_PROBE`` to other ids than the local
        tokenizer (it serves another model); a warning when it cannot say."""
        try:
            r = self._client.post(f"{url}/tokenize", timeout=10.0, json={
                "model": self.served_model, "prompt": _PROBE, "add_special_tokens": False})
            theirs = [int(t) for t in r.json()["tokens"]] if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("replica %s: its tokenizer could not be checked (%s)", url, one_line(e))
            return
        if theirs is None:
            log.warning("replica %s answers HTTP %d on /tokenize; its tokenizer is not checked "
                        "against model %s", url, r.status_code, self.config.model)
            return
        if theirs != self.tokenizer.encode(_PROBE, add_special_tokens=False):
            raise ConfigError(
                f"replica {url} serves {self.served_model!r}, whose tokenizer differs from that "
                f"of the local model {self.config.model!r} (a probe text gave other token ids); "
                "start the replicas with that model, or name the model they serve as model=")

    # -- generation -----------------------------------------------------------------------------
    def _prepare(self, request: Request, prompt_ids: list[int]) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.served_model, "prompt": prompt_ids, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
            "cache_salt": self.isolation.salt(request.session_key), "ignore_eos": s.ignore_eos,
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
        causes: dict[str, str] = {}  # the last cause per replica tried
        streamed = False  # whether the caller has seen any of the reply
        while True:
            order = [u for u in self.router.route(key) if u not in tried]
            if not order and not tried:
                self.router.check_now()  # every replica was marked down: look again once
                order = self.router.route(key)
            if not order:
                raise UpstreamError(self._none_left(key, causes))
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
                # closed here, not by garbage collection: a caller that drops this stream
                # hangs up on the replica at once
                with contextlib.closing(self._events(url, body)) as events:
                    for chunk in events:
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
                                    new = new[:-1]  # the end-of-turn token stays out
                            if new and not ids:
                                ttft = time.perf_counter() - t0
                            for j, tid in enumerate(new):
                                streamed = True
                                last = j == len(new) - 1
                                yield TokenEvent(tid, text if last else "", len(ids))
                                ids.append(tid)
                            if not new and text:
                                streamed = True
                                yield TokenEvent(-1, text, len(ids))
                            texts.append(text)
                if finish is None:
                    raise ReplicaFailed("stream ended without a finish reason")
            except ReplicaFailed as e:
                causes[url] = str(e)
                if streamed and "structured_outputs" in payload:
                    # the grammar would start over on the next replica, after the half streamed
                    self.router.mark_down(url)
                    raise UpstreamError(
                        f"replica {url} failed after {len(ids)} tokens of a guided (json_schema) "
                        f"reply ({one_line(e)}); a guided reply cannot be continued on another "
                        "replica; send the request again") from None
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
        """The server's SSE chunks as dicts; ``ReplicaFailed`` when the replica is unusable, also
        when it is marked down while the request waits on it (``remote_stream``)."""
        return sse_chunks(self._streams, url, body, read_timeout_s=self.read_timeout_s,
                          is_down=lambda: self.router.is_down(url))

    def _none_left(self, key: str, causes: dict[str, str]) -> str:
        """Why no replica is left for the request: each one tried with its last cause."""
        n = len(self.router.urls)
        if not causes:
            return (f"no healthy replica for session {key!r}: all {n} are down "
                    f"({', '.join(self.router.urls)})")
        tried = ", ".join(f"{u} ({c})" for u, c in causes.items())
        return f"no healthy replica for session {key!r}: tried {tried} of {n}"

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
        self._streams.close()


def _model_card(client: httpx.Client, url: str) -> dict[str, Any]:
    """The first model ``url/v1/models`` lists; ``ReplicaFailed`` saying why there is none."""
    try:
        r = client.get(f"{url}/v1/models", timeout=10.0)
    except httpx.HTTPError as e:
        raise ReplicaFailed(cause(e)) from None
    if r.status_code == 404:
        hint = ("a base URL ending in /v1? give the server's root" if url.endswith("/v1")
                else "not a vLLM OpenAI-compatible server?")
        raise ReplicaFailed(f"HTTP 404 on /v1/models: {hint}")
    if r.status_code != 200:
        raise ReplicaFailed(f"HTTP {r.status_code} on /v1/models")
    try:
        card = r.json()["data"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        card = None
    if not isinstance(card, dict) or "id" not in card:
        raise ReplicaFailed("/v1/models answered without a model list")
    return card
