"""The default engine: vLLM embedded in this process, with automatic prefix caching.

vLLM's ``AsyncLLM`` always runs its core in another process, so in-process use means the
synchronous ``LLMEngine``. One driver thread owns it: between ``step()`` calls it takes new
requests and aborts from an inbox, and fans each step's outputs out to per-request queues. Any
number of caller threads (sessions) stream at once and are batched by vLLM's scheduler.

Each session's prompts carry ``cache_salt = session_key`` (isolation scope ``session``, the
default), so sessions never share KV blocks (vLLM mixes the salt into the first block's hash);
scope ``app`` gives every session of the tenant one salt (``suffixmem/engine/isolation.py``).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from suffixmem.config import EngineConfig, cuda_available
from suffixmem.engine.base import BaseEngine
from suffixmem.engine.isolation import IsolationPolicy
from suffixmem.engine.protocol import Request, Result, TokenEvent
from suffixmem.errors import ConfigError
from suffixmem.models import check_context, resolve_model

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


class _NotOmpThreads(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("OMP_NUM_THREADS=")


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


def _warm_up(engine: Any) -> None:
    """One 1-token request through ``engine``, so that no caller's request pays vLLM's lazy
    first-request work on the driver thread: its first ``add_request`` scans every installed
    package's entry points for logits-processor plugins (~20 ms here), and a burst of sessions'
    first turns waited for it (issue 19's concurrent ``manager_overhead_ms`` p99). Shorter than
    a block, so it leaves nothing in the prefix cache."""
    from vllm import SamplingParams as VSamplingParams

    engine.add_request("suffixmem-warm-up", {"type": "token", "prompt_token_ids": [0]},
                       VSamplingParams(max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()


class VLLMEngine(BaseEngine):
    """vLLM ``LLMEngine`` in-process, driven by one thread, streaming to many callers."""

    name = "vllm"
    supports_json_schema = True

    # vLLM keeps its distributed state (parallel groups) per process: shutting one in-process
    # engine core down tears it down under every other engine still alive in the process
    # ("pipeline model parallel group is not initialized"), so only the last one shuts down.
    _live = 0
    _live_lock = threading.Lock()

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or EngineConfig()
        on_cuda = cuda_available()
        self.block_size = choose_block_size(config.block_size, on_cuda)
        if config.dtype == "float16" and not on_cuda:
            raise ConfigError("dtype float16 is not supported on CPU; use bfloat16 or float32")
        self.model_path: Path = resolve_model(config.model)
        if not os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):  # vLLM's own opt-out
            check_context(self.model_path, config.max_model_len)  # vLLM's: a long traceback
        self.model_name = config.model
        self.max_model_len = config.max_model_len
        # vLLM's salt covers the whole block chain: no public prefix under private blocks
        self.isolation = IsolationPolicy.from_config(config)
        self.isolation.require(self.name)
        _prepare_environment(config, on_cuda)

        from vllm import EngineArgs
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.llm_engine import LLMEngine

        self._bad_request = (*self._bad_request, VLLMClientError)

        # our own OMP_NUM_THREADS (see _prepare_environment) draws a warning a user cannot act on
        logging.getLogger("vllm.utils.torch_utils").addFilter(_NotOmpThreads())

        self._load_tokenizer(self.model_path)
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
            use_tqdm_on_load=False,  # a bar for a load of a fraction of a second is noise
        )
        if config.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = config.max_num_batched_tokens
        if on_cuda:
            args["kv_cache_memory_bytes"] = int(config.kv_cache_gib * (1 << 30))
        self._tier_extra: dict[str, Any] | None = None
        if config.kv_tier:
            args["kv_transfer_config"] = self._tier_transfer_config(config)
        args.update(config.extra)

        def setup() -> None:
            # vLLM is built in the driver thread that steps it: its CPU worker binds the OpenMP
            # threads of the thread that initialises it, and libgomp keeps one pool per thread
            # that runs parallel work, so stepping from another thread ran unbound and with
            # two pools (spin waits throttled): decode measured 52-58 ms per token there
            # against 27-28 ms for stock ``vllm.LLM`` in its own thread.
            self._engine = LLMEngine.from_engine_args(EngineArgs(**args))
            _warm_up(self._engine)

        self._start_driver("suffixmem-vllm", setup)
        # vLLM registered its exit handlers while it started; this one, registered after, runs
        # before them: the driver stops stepping before vLLM frees the KV cache under it (a
        # request still in flight at exit, a stream left unread, printed a screen of traceback)
        atexit.register(_stop_at_exit, weakref.ref(self))
        with VLLMEngine._live_lock:
            VLLMEngine._live += 1
            others = VLLMEngine._live - 1
        if self._tier_extra is not None and others:
            log.warning("vLLM keeps one KV connector per process: the other %d vLLM engine(s) "
                        "of this process cannot run until this KV-tier engine is closed", others)
        cache = self._engine.vllm_config.cache_config
        hf = self._engine.vllm_config.model_config.hf_config
        from suffixmem.engine.torch.kv_pool import torch_dtype

        per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * (
            hf.hidden_size // hf.num_attention_heads) * torch_dtype(config.dtype).itemsize
        self._stats.kv_capacity_bytes = int((cache.num_gpu_blocks or 0) * self.block_size
                                            * per_token)

    def _tier_transfer_config(self, config: EngineConfig) -> Any:
        """vLLM's ``kv_transfer_config`` for our tier connector (vllm_tier_connector.py)."""
        from vllm.config import KVTransferConfig

        from suffixmem.config import kv_tier_dir
        from suffixmem.engine.kv_tier import model_fingerprint

        self._tier_extra = {
            "tier_dir": str(kv_tier_dir(config.kv_tier_dir)),
            "fingerprint": model_fingerprint(self.model_path, "vllm", config.dtype,
                                             self.block_size),
            "budget_bytes": int(config.kv_tier_gib * (1 << 30)),
            "policy": config.kv_tier_policy,
        }
        return KVTransferConfig(kv_connector="SuffixmemTierConnector",
                                kv_connector_module_path="suffixmem.engine.vllm_tier_connector",
                                kv_role="kv_both", kv_connector_extra_config=self._tier_extra)

    @property
    def kv_tier(self) -> Any:
        """The process's ``KVTier`` of this engine (None without ``kv_tier``)."""
        if self._tier_extra is None:
            return None
        from suffixmem.engine.vllm_tier_connector import shared_tier

        return shared_tier(self._tier_extra).tier

    def stats(self) -> Any:
        s = super().stats()
        s.extra["dtype"] = self.config.dtype  # what dtype "auto" resolved to on this device
        if self._tier_extra is not None:
            from suffixmem.engine.vllm_tier_connector import shared_tier

            shared = shared_tier(self._tier_extra)
            s.extra.update(shared.tier.summary(), tier_loaded_tokens=shared.loaded_tokens)
        return s

    def delete_session_kv(self, session_key: str) -> int:
        """Delete the session's KV tier files; returns how many. (vLLM's own prefix cache
        keeps its salted blocks until they age out: they are never shared.)"""
        tier = self.kv_tier
        if tier is None:
            return 0
        return int(self.run_in_driver(lambda e: tier.delete_session(session_key)))

    # -- the driver thread (see engine/base.py) -------------------------------------------------
    def _add(self, rid: str, payload: Any) -> None:
        prompt, params = payload
        self._engine.add_request(rid, prompt, params)

    def _abort(self, rid: str) -> None:
        self._engine.abort_request([rid])

    def _has_work(self) -> bool:
        return bool(self._engine.has_unfinished_requests())

    def _step(self) -> None:
        for out in self._engine.step():
            self._deliver(out.request_id, out)

    def _step_failed(self, error: Exception) -> None:
        # vLLM batches every running request into one step and does not say which one broke
        # it; those requests cannot continue. Up-front checks keep bad input out of the batch.
        with self._lock:
            rids = list(self._outboxes)
        for rid in rids:
            self._deliver(rid, error)
            try:
                self._engine.abort_request([rid])
            except Exception:  # already gone
                log.debug("abort of %s after a failed step ignored", rid, exc_info=True)

    # -- generation -----------------------------------------------------------------------------
    def _prepare(self, request: Request, prompt_ids: list[int]) -> Any:
        """vLLM's own checks run here, in the caller's thread: nothing is queued if they fail."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.renderers.inputs.preprocess import parse_model_prompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        s = request.sampling
        extra: dict[str, Any] = {}
        if s.json_schema is not None:
            extra["structured_outputs"] = StructuredOutputsParams(json=s.json_schema)
        params = VSamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else 0,
            max_tokens=s.max_tokens,
            stop=list(s.stop) or None,
            seed=s.seed,
            ignore_eos=s.ignore_eos,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            output_kind=RequestOutputKind.DELTA,
            **extra,
        )
        salt = self.isolation.salt(request.session_key)
        # rendered here, as stock vLLM's ``LLM`` does before ``add_request``: a raw prompt is
        # rendered inside ``add_request`` (a path vLLM deprecates), i.e. on the driver thread,
        # where every other caller waits for the GIL
        renderer = self._engine.renderer
        (prompt,) = renderer.render_cmpl(
            [parse_model_prompt(self._engine.model_config,
                                {"prompt_token_ids": prompt_ids, "cache_salt": salt})],
            renderer.default_cmpl_tok_params)
        return prompt, params

    def _stream(self, request: Request, prompt_ids: list[int],
                payload: Any) -> Iterator[TokenEvent | Result]:
        rid = request.request_id
        t0 = time.perf_counter()
        ttft = 0.0
        ids: list[int] = []
        text: list[str] = []
        with self._exchange(rid, payload) as flight:
            while not flight.done:
                out = flight.get()
                comp = out.outputs[0]
                new_ids = list(comp.token_ids)
                if new_ids and not ids:
                    ttft = time.perf_counter() - t0
                finished = bool(out.finished)
                if finished:
                    flight.finish()
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

    def reset_prefix_cache(self) -> int:
        """Drop every cached block; 1 when vLLM did, 0 when it refused (requests running).
        Runs in the driver thread: vLLM's engine is not thread-safe."""
        return int(bool(self.run_in_driver(lambda e: e._engine.reset_prefix_cache())))

    def _shutdown(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is None:
            return
        with VLLMEngine._live_lock:
            VLLMEngine._live -= 1
            last = VLLMEngine._live == 0
        if last:
            shutdown = getattr(engine, "shutdown", None) or getattr(
                getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                try:
                    shutdown()
                except Exception:  # best effort at teardown
                    log.debug("vLLM shutdown failed", exc_info=True)
        else:
            # vLLM's in-process client shuts its core down from a finalizer when collected:
            # detach it, or collecting this engine would tear the shared state down later.
            finalizer = getattr(getattr(engine, "engine_core", None), "_finalizer", None)
            if finalizer is not None:
                finalizer.detach()
            gc.unfreeze()  # vLLM froze its start-up objects; let this engine's be collected
        self._engine = None
        if getattr(self, "_tier_extra", None) is not None:
            from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

            from suffixmem.engine.vllm_tier_connector import release_tier

            release_tier(self._tier_extra)
            # vLLM keeps one KV connector per process: drop ours, or every other vLLM engine
            # in the process would keep calling it (and fail) after this one is gone
            ensure_kv_transfer_shutdown()


def _stop_at_exit(ref: weakref.ref[VLLMEngine]) -> None:
    engine = ref()
    if engine is not None and not engine._closed:
        engine._stop_driver()
