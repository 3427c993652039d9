"""The default engine: vLLM embedded in this process, with automatic prefix caching.

vLLM's ``AsyncLLM`` always runs its core in another process, so in-process use means the
synchronous ``LLMEngine``. One driver thread owns it: between ``step()`` calls it takes new
requests and aborts from an inbox, and fans each step's outputs out to per-request queues. Any
number of caller threads (sessions) stream at once and are batched by vLLM's scheduler.

Each session's prompts carry ``cache_salt = session_key``, so sessions never share KV blocks
(vLLM mixes the salt into the first block's hash).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from suffixmem.chat_template import ChatTemplate
from suffixmem.config import EngineConfig, cuda_available
from suffixmem.engine.protocol import BaseEngine, Message, Request, Result, TokenEvent
from suffixmem.errors import ConfigError, EngineClosedError, InvalidRequestError
from suffixmem.models import resolve_model

log = logging.getLogger(__name__)

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def _prepare_environment(config: EngineConfig, on_cuda: bool) -> None:
    # In-process engine core; must be set before vLLM reads its environment.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    # vLLM logs to stdout by default, which would mix its lines into chat output and JSON
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if not on_cuda:
        # vLLM drops torch to one thread unless OMP_NUM_THREADS is set.
        os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(config.kv_cache_gib)))


def choose_block_size(requested: int | None, on_cuda: bool) -> int:
    """vLLM's CPU attention needs a multiple of 32; CUDA's usual choice is 16."""
    if requested is None:
        return 16 if on_cuda else 32
    if on_cuda:
        if requested % 16 or requested > 128:
            raise ConfigError(f"block_size {requested} is invalid on CUDA: use 16, 32, 64 or 128")
    elif requested % 32:
        raise ConfigError(
            f"block_size {requested} is invalid for vLLM on CPU: it must be a multiple of 32"
        )
    return requested


class VLLMEngine(BaseEngine):
    """vLLM ``LLMEngine`` in-process, driven by one thread, streaming to many callers."""

    name = "vllm"
    supports_json_schema = True

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or EngineConfig()
        on_cuda = cuda_available()
        self.block_size = choose_block_size(config.block_size, on_cuda)
        if config.dtype == "float16" and not on_cuda:
            raise ConfigError("dtype float16 is not supported on CPU; use bfloat16 or float32")
        self.model_path: Path = resolve_model(config.model)
        self.model_name = config.model
        self.max_model_len = config.max_model_len
        _prepare_environment(config, on_cuda)

        from transformers import AutoTokenizer
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        self.template = ChatTemplate(self.tokenizer)
        args: dict[str, Any] = dict(
            model=str(self.model_path),
            tokenizer=str(self.model_path),
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            block_size=self.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_chunked_prefill=config.enable_chunked_prefill,
            enforce_eager=(not on_cuda) if config.enforce_eager is None else config.enforce_eager,
            seed=config.seed,
            disable_log_stats=True,
        )
        if config.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = config.max_num_batched_tokens
        if on_cuda:
            args["kv_cache_memory_bytes"] = int(config.kv_cache_gib * (1 << 30))
        args.update(config.extra)
        self._engine = LLMEngine.from_engine_args(EngineArgs(**args))
        cache = self._engine.vllm_config.cache_config
        hf = self._engine.vllm_config.model_config.hf_config
        per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * (
            hf.hidden_size // hf.num_attention_heads) * (4 if config.dtype == "float32" else 2)
        self._stats.kv_capacity_bytes = int((cache.num_gpu_blocks or 0) * self.block_size
                                            * per_token)

        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._outboxes: dict[str, queue.SimpleQueue[Any]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._driver = threading.Thread(target=self._drive, name="suffixmem-vllm", daemon=True)
        self._driver.start()

    # -- tokenizer ------------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        return self.template.render(messages, add_generation_prompt)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    # -- the driver thread ----------------------------------------------------------------------
    def _drive(self) -> None:
        engine = self._engine
        while not self._stop:
            busy = engine.has_unfinished_requests()
            if not busy:
                self._wake.wait()
            self._wake.clear()
            while True:
                try:
                    op, arg = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if op == "add":
                    rid, prompt, params = arg
                    try:
                        engine.add_request(rid, prompt, params)
                    except Exception as e:  # vLLM rejected it: hand the error to the caller
                        self._deliver(rid, e)
                elif op == "abort":
                    try:
                        engine.abort_request([arg])
                    except Exception:  # already finished: nothing to abort
                        log.debug("abort of %s ignored", arg, exc_info=True)
            if self._stop or not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step()
            except Exception as e:  # a broken step fails every request in flight
                log.exception("vLLM step failed")
                with self._lock:
                    rids = list(self._outboxes)
                for rid in rids:
                    self._deliver(rid, e)
                    engine.abort_request([rid])
                continue
            for out in outputs:
                self._deliver(out.request_id, out)

    def _deliver(self, rid: str, item: Any) -> None:
        with self._lock:
            box = self._outboxes.get(rid)
        if box is not None:
            box.put(item)

    def _submit(self, op: str, arg: Any) -> None:
        self._inbox.put((op, arg))
        self._wake.set()

    # -- generation -----------------------------------------------------------------------------
    def _sampling(self, request: Request) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        s = request.sampling
        extra: dict[str, Any] = {}
        if s.json_schema is not None:
            extra["structured_outputs"] = StructuredOutputsParams(json=s.json_schema)
        return VSamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else 0,
            max_tokens=s.max_tokens,
            stop=list(s.stop) or None,
            seed=s.seed,
            ignore_eos=s.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            **extra,
        )

    def prompt_ids(self, request: Request) -> list[int]:
        ids = super().prompt_ids(request)
        if len(ids) + request.sampling.max_tokens > self.max_model_len:
            # vLLM would reject it anyway; say so with our own error before queueing.
            from suffixmem.errors import ContextWindowError

            raise ContextWindowError(
                len(ids), self.max_model_len,
                f"with max_tokens={request.sampling.max_tokens} the reply would not fit",
            )
        return ids

    def _stream(self, request: Request, prompt_ids: list[int]) -> Iterator[TokenEvent | Result]:
        if self._stop:
            raise EngineClosedError("vLLM engine is closed")
        rid = request.request_id
        box: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._lock:
            if rid in self._outboxes:
                raise InvalidRequestError(f"request id {rid!r} is already in flight")
            self._outboxes[rid] = box
        prompt = {"prompt_token_ids": prompt_ids, "cache_salt": request.session_key}
        t0 = time.perf_counter()
        ttft = 0.0
        ids: list[int] = []
        text: list[str] = []
        finished = False
        self._submit("add", (rid, prompt, self._sampling(request)))
        try:
            while not finished:
                out = box.get()
                if isinstance(out, BaseException):
                    if isinstance(out, ValueError):
                        raise InvalidRequestError(f"vLLM rejected the request: {out}") from out
                    raise out
                comp = out.outputs[0]
                new_ids = list(comp.token_ids)
                if new_ids and not ids:
                    ttft = time.perf_counter() - t0
                finished = out.finished
                if finished and comp.finish_reason == "stop" and new_ids and \
                        new_ids[-1] == self.template.eos_token_id and comp.stop_reason is None:
                    new_ids = new_ids[:-1]  # keep the end-of-turn token out of the reply's ids
                for j, tid in enumerate(new_ids):
                    delta = comp.text if j == len(new_ids) - 1 else ""
                    yield TokenEvent(tid, delta, len(ids))
                    ids.append(tid)
                if not new_ids and comp.text:
                    yield TokenEvent(-1, comp.text, len(ids))
                text.append(comp.text)
                if finished:
                    yield Result(
                        text="".join(text),
                        token_ids=tuple(ids),
                        finish_reason=_FINISH.get(comp.finish_reason or "stop", "stop"),
                        prompt_tokens=len(prompt_ids),
                        cached_tokens=int(out.num_cached_tokens or 0),
                        ttft_s=ttft or time.perf_counter() - t0,
                        latency_s=time.perf_counter() - t0,
                        request_id=rid,
                        session_key=request.session_key,
                    )
        finally:
            if not finished:
                self._submit("abort", rid)
            with self._lock:
                self._outboxes.pop(rid, None)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block (only when no request is running)."""
        return bool(self._engine.reset_prefix_cache())

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        self._stop = True
        self._wake.set()
        self._driver.join(timeout=30)
        engine = getattr(self, "_engine", None)
        if engine is not None:
            shutdown = getattr(engine, "shutdown", None) or getattr(
                getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                try:
                    shutdown()
                except Exception:  # best effort at teardown
                    log.debug("vLLM shutdown failed", exc_info=True)
            self._engine = None
