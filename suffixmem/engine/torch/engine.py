"""``TorchEngine``: the compact engine whose KV cache we own.

One driver thread owns the model, the KV pool and the block pool. Each step reads as
schedule -> run -> postprocess: the scheduler admits waiting requests (prefix-cache hit, fresh
blocks) or batches every running sequence's next decode; the runner computes; postprocess
samples, streams ``TokenEvent``s and finishes sequences. Callers in any thread submit requests
through an inbox between steps and read their own outbox, so new requests join running ones
(continuous batching) and closing a stream aborts its request.

Sessions are isolated by salting block hashes as ``EngineConfig.isolation`` says (by default the
session key; see ``suffixmem/engine/isolation.py``). Segment reuse plugs in through
``TorchEngine.reuse`` (see ``reuse_hook.py``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

from suffixmem.config import EngineConfig
from suffixmem.detokenizer import Detokenizer
from suffixmem.engine.base import BaseEngine
from suffixmem.engine.isolation import IsolationPolicy
from suffixmem.engine.protocol import (
    EngineStats,
    Request,
    Result,
    TokenEvent,
)
from suffixmem.engine.torch.block_pool import BlockPool
from suffixmem.engine.torch.extension import TorchExtensionAPI
from suffixmem.engine.torch.grammar import Grammars, available, mask_logits
from suffixmem.engine.torch.kv_pool import KVPool, torch_dtype
from suffixmem.engine.torch.llama import Llama
from suffixmem.engine.torch.model_config import read_config, stop_token_ids
from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput
from suffixmem.engine.torch.prefill import chunk_prefill
from suffixmem.engine.torch.reuse_hook import ReuseHook, ReuseOutcome
from suffixmem.engine.torch.sampling import penalise, sample_token
from suffixmem.engine.torch.scheduler import Scheduler
from suffixmem.engine.torch.sequence import SeqStatus, Sequence
from suffixmem.engine.torch.tier_hook import TorchTier
from suffixmem.errors import ConfigError
from suffixmem.models import resolve_model

log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_BLOCK_SIZE = 16
DEFAULT_PREFILL_CHUNK = 4096
ATTENTION = ("vllm", "sdpa")  # extra.attention: vLLM's CPU kernel where it is installed


class TorchEngine(TorchExtensionAPI, BaseEngine):
    """Paged-KV Llama engine in plain torch (see the module docstring).

    Public attributes for extensions (segment reuse), all owned by the driver thread:
    ``model`` (``Llama``), ``runner`` (``ModelRunner``), ``kv_pool`` (``KVPool``),
    ``block_pool`` (``BlockPool``), ``block_size``, ``scheduler``, ``reuse``; the methods of
    ``extension.TorchExtensionAPI``.
    """

    name = "torch"
    supports_json_schema = available()  # constrained decoding by xgrammar (grammar.py)
    close_at_exit = True  # a script that never closes it exits quietly (base._OPEN)

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or EngineConfig()
        self.dtype = torch_dtype(config.dtype)
        self.block_size = config.block_size or DEFAULT_BLOCK_SIZE
        threads = max(1, int(config.extra.get("num_threads", os.cpu_count() or 1)))
        torch.set_num_threads(threads)
        self.model_path: Path = resolve_model(config.model)
        self.model_name = config.model
        self.max_model_len = config.max_model_len
        self.isolation = IsolationPolicy.from_config(config)
        self.isolation.require(self.name)

        # check the budget against the model's shape before loading anything heavy
        mc = read_config(self.model_path)
        if config.max_model_len > mc.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {config.max_model_len} exceeds the model's context of "
                f"{mc.max_position_embeddings} tokens"
            )
        per_block = KVPool.check_budget(config.kv_cache_gib, mc.num_layers, mc.num_kv_heads,
                                        mc.head_dim, self.block_size, self.dtype,
                                        config.max_model_len)
        budget = int(config.kv_cache_gib * (1 << 30))
        self._load_tokenizer(self.model_path)
        self.stop_token_ids = stop_token_ids(self.model_path, self.template.eos_token_id)
        self.grammars = Grammars(self.tokenizer, mc.vocab_size, self.stop_token_ids)
        mirror_gib = config.extra.get("decode_mirror_gib")
        if mirror_gib is not None and (isinstance(mirror_gib, bool) or not isinstance(
                mirror_gib, int | float) or not mirror_gib >= 0):
            raise ConfigError(f"extra.decode_mirror_gib must be a number >= 0 (GiB), got "
                              f"{mirror_gib!r}")
        attention = config.extra.get("attention", "vllm")
        if attention not in ATTENTION:
            raise ConfigError(f"extra.attention must be one of {list(ATTENTION)}, got "
                              f"{attention!r}")
        self._seqs: dict[str, Sequence] = {}  # driver-thread only
        self._in_step: list[Sequence] = []  # the sequences the current step works on
        self.max_decode_batch = 0  # the largest decode batch so far (continuous batching)

        def setup() -> None:
            # The model is loaded, packed and run by the driver thread alone. libgomp keeps one
            # OpenMP thread pool per thread that runs parallel work; with a second pool (the
            # loading thread's) it manages more threads than cores and throttles its spin
            # waits, and every decode step's ~150 parallel regions then pay a futex wake-up:
            # batch-1 decode measured 37 ms per token instead of 21 ms on 2 cores.
            torch.set_num_threads(threads)
            self.model = Llama.from_pretrained(self.model_path, self.dtype)
            self.kv_pool = KVPool.from_budget(budget, mc.num_layers, mc.num_kv_heads,
                                              mc.head_dim, self.block_size, self.dtype)
            self.block_pool = BlockPool(self.kv_pool.num_blocks, self.block_size)
            self.runner = ModelRunner(
                self.model, self.kv_pool, config.max_model_len,
                exact_decode=bool(config.extra.get("exact_decode", False)),
                mirror_bytes=None if mirror_gib is None else int(mirror_gib * (1 << 30)),
                vllm_attention=attention == "vllm")
            self.prefill_chunk = config.max_num_batched_tokens or DEFAULT_PREFILL_CHUNK
            self.scheduler = Scheduler(self.block_pool, config.max_num_seqs, self.prefill_chunk,
                                       config.enable_prefix_caching)
            self.reuse: ReuseHook | None = None
            if config.segment_reuse or config.context_shift:
                from suffixmem.engine.reuse.blend import BlendConfig, default_blend
                from suffixmem.engine.reuse.context_shift import SHIFT_BLEND, ContextShift
                from suffixmem.engine.reuse.hook import SegmentReuseHook

                method = config.segment_method
                hook = SegmentReuseHook.install(
                    # the method chosen, else the one whose gate passed in this dtype
                    self, blend=BlendConfig.parse(method) if method
                    else default_blend(config.dtype),
                    # the document method leaves context shift its own (measured) one
                    shift=ContextShift(blend=SHIFT_BLEND),
                    documents=config.segment_reuse, context_shift=config.context_shift)
                if config.segment_reuse:  # its cached segments give way to live requests
                    self.scheduler.reclaim = hook.cache.evict
            self.tier: TorchTier | None = TorchTier.open(
                config, self.model_path, mc, self.block_pool, self.kv_pool,
            ) if config.kv_tier else None
            self._generator = torch.Generator().manual_seed(config.seed)
            self._stats.kv_capacity_bytes = self.kv_pool.capacity_bytes
            self._per_block_bytes = per_block

        self._start_driver("suffixmem-torch", setup)

    # -- requests -------------------------------------------------------------------------------
    def _prepare(self, request: Request, prompt_ids: list[int]) -> Sequence:
        """Everything that can fail for this request alone happens here, in the caller's
        thread: the sequence, its detokenizer and its seeded generator."""
        iso = self.isolation
        seq = Sequence(request=request, token_ids=list(prompt_ids),
                       num_prompt_tokens=len(prompt_ids), salt=iso.salt(request.session_key),
                       t_submit=time.perf_counter(),
                       public_len=iso.public_tokens(request.segments, len(prompt_ids)),
                       public_salt=iso.public_salt if iso.scope == "public-prefix" else None)
        seq.detok = Detokenizer(self.tokenizer, request.sampling.stop)
        seq.guide = self.grammars.guide(request.sampling)  # json_schema: compiled (cached)
        seed = request.sampling.seed
        if seed is not None:
            seq.generator = torch.Generator().manual_seed(seed)
        return seq

    def _stream(self, request: Request, prompt_ids: list[int],
                payload: Any) -> Iterator[TokenEvent | Result]:
        with self._exchange(request.request_id, payload) as flight:
            while not flight.done:
                item = flight.get()
                if isinstance(item, Result):
                    flight.finish()
                yield item

    def stats(self) -> EngineStats:
        s = super().stats()
        s.kv_used_bytes = self.block_pool.num_used * self._per_block_bytes
        s.extra.update(
            kv_blocks=self.block_pool.num_blocks,
            kv_blocks_used=self.block_pool.num_used,
            kv_blocks_cached=self.block_pool.num_cached_blocks,
            kv_blocks_evicted=self.block_pool.num_evicted,
            preemptions=self.scheduler.num_preemptions,
            max_decode_batch=self.max_decode_batch,
            attention="vllm" if self.runner.vllm_attention else "sdpa",
            dtype=self.config.dtype,  # what dtype "auto" resolved to on this device
        )
        if self.tier is not None:
            s.extra.update(self.tier.tier.summary(), tier_loaded_tokens=self.tier.loaded_tokens)
        return s

    # -- the driver thread (see engine/base.py) -------------------------------------------------
    def _driver_context(self) -> Any:
        return torch.inference_mode()

    def _add(self, rid: str, payload: Any) -> None:
        seq: Sequence = payload
        seq.t_submit = time.perf_counter()
        self._seqs[rid] = seq
        self.scheduler.add(seq)

    def _abort(self, rid: str) -> None:
        seq = self._seqs.pop(rid, None)
        if seq is not None:
            self.scheduler.finish(seq)

    def _has_work(self) -> bool:
        return self.scheduler.has_work

    def _step_failed(self, error: Exception) -> None:
        # the batch that broke cannot go on; sequences waiting outside it are untouched
        for seq in self._in_step:
            if seq.seq_id in self._seqs:
                self._fail(seq, error)
        self._in_step = []

    def _step(self) -> None:
        plan = self.scheduler.schedule()  # schedule
        for seq, err in plan.failed:
            self._fail(seq, err)
        self._in_step = plan.prefill or plan.decode
        if plan.prefill:  # run + postprocess
            self._prefill(plan.prefill)
        elif plan.decode:
            self._decode(plan.decode)
        self._in_step = []

    def _prefill(self, seqs: list[Sequence]) -> None:
        ok = []
        for seq in seqs:
            try:
                if self.tier is not None:
                    self.tier.extend(seq)
                self._apply_reuse(seq)
            except Exception as e:  # a failing hook fails its own request only
                log.exception("segment reuse failed for %s", seq.seq_id)
                self._fail(seq, e)
                continue
            ok.append(seq)
        if ok:
            self._isolated(ok, self._run_prefill)

    def _isolated(self, seqs: list[Sequence], run: Callable[[list[Sequence]], None]) -> None:
        """``run(seqs)``; when a batch fails, run each sequence alone so that the failure
        stays with the request that causes it (forwards only write that request's KV slots,
        so a rerun is harmless)."""
        try:
            run(seqs)
        except Exception:
            if len(seqs) <= 1:
                raise
            log.warning("a batch of %d failed; retrying its requests one by one", len(seqs))
            for seq in seqs:
                if seq.seq_id not in self._seqs:
                    continue
                try:
                    run([seq])
                except Exception as e:  # blast radius of one
                    log.exception("request %s failed", seq.seq_id)
                    self._fail(seq, e)

    def _run_prefill(self, seqs: list[Sequence]) -> None:
        rows: list[Sequence] = []  # the sequences whose logits come back, in order
        logits: list[torch.Tensor] = []
        for call in chunk_prefill(seqs, self.prefill_chunk):
            logits.append(self.runner.forward([inp for _, inp in call]).logits)
            rows.extend(seq for seq, inp in call if inp.want_logits)
        all_logits = torch.cat(logits) if len(logits) > 1 else logits[0]
        failed: set[str] = set()
        for seq in seqs:
            try:
                seq.num_computed = seq.num_tokens
                seq.pending = []
                self.scheduler.cache_full_blocks(seq)
                after = getattr(self.reuse, "after_prefill", None)
                if after is not None and seq.request.segments and not seq.request.exact:
                    after(self, seq, seq.request)
            except Exception as e:  # blast radius of one
                log.exception("after prefill of %s", seq.seq_id)
                self._fail(seq, e)
                failed.add(seq.seq_id)
        keep = [i for i, seq in enumerate(rows) if seq.seq_id not in failed]
        if keep:
            kept_logits = all_logits if len(keep) == len(rows) else all_logits[keep]
            rows = [rows[i] for i in keep]
            self._postprocess(rows, self._sample(rows, kept_logits))

    def _apply_reuse(self, seq: Sequence) -> None:
        req = seq.request
        if self.reuse is None or req.exact or seq.num_output_tokens:
            return  # (a preempted sequence recomputes exactly; no segments: context shift)
        outcome: ReuseOutcome = self.reuse.apply(self, seq, req)
        pending = list(outcome.pending)
        allowed = set(seq.pending)
        if (not pending or pending[-1] != seq.num_tokens - 1 or any(
                p not in allowed for p in pending) or pending != sorted(set(pending))):
            raise RuntimeError(
                "reuse hook returned invalid pending positions: they must be ascending, a "
                "subset of seq.pending and end at the last prompt position"
            )
        if len(pending) < len(seq.pending):
            kept = set(pending)
            first_reused = next(p for p in seq.pending if p not in kept)
            if seq.approx_from is None or first_reused < seq.approx_from:
                seq.approx_from = first_reused
        seq.pending = pending
        seq.reused_segment_tokens = outcome.reused_tokens
        seq.recomputed_tokens = outcome.recomputed_tokens
        seq.reused_segments = tuple(outcome.reused_spans)

    def _decode(self, seqs: list[Sequence]) -> None:
        self.max_decode_batch = max(self.max_decode_batch, len(seqs))
        self._isolated(seqs, self._run_decode)

    def _run_decode(self, seqs: list[Sequence]) -> None:
        inputs = [SeqInput([s.token_ids[-1]], [s.num_tokens - 1], s.block_table, s.num_tokens)
                  for s in seqs]
        out = self.runner.forward(inputs)
        for seq in seqs:
            seq.num_computed = seq.num_tokens
            self.scheduler.cache_full_blocks(seq)
        self._postprocess(seqs, self._sample(seqs, out.logits))

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int | None]:
        """One token per sequence from ``logits [B, V]`` (fp32); ``None`` where sampling that
        sequence failed (it is failed alone)."""
        for i, seq in enumerate(seqs):
            if seq.request.sampling.penalised:
                penalise(logits[i], seq.output_ids, seq.request.sampling)
        mask_logits([seq.guide for seq in seqs], logits)  # json_schema rows: grammar.py
        tokens: list[int | None] = list(logits.argmax(dim=-1).tolist())
        for i, seq in enumerate(seqs):
            s = seq.request.sampling
            try:
                if not s.greedy:
                    tokens[i] = sample_token(logits[i], s, seq.generator or self._generator)
                if seq.guide is not None:
                    seq.guide.accept(tokens[i])
            except Exception as e:  # blast radius of one
                log.exception("sampling failed for %s", seq.seq_id)
                self._fail(seq, e)
                tokens[i] = None
        return tokens

    def _postprocess(self, seqs: list[Sequence], tokens: list[int | None]) -> None:
        now = time.perf_counter()
        for seq, tok in zip(seqs, tokens, strict=True):
            if tok is not None:
                try:
                    self._advance(seq, tok, now)
                except Exception as e:  # blast radius of one
                    log.exception("postprocess of %s failed", seq.seq_id)
                    self._fail(seq, e)

    def _advance(self, seq: Sequence, tok: int, now: float) -> None:
        """Append ``tok`` to ``seq``, stream it, finish the sequence when it is done."""
        s = seq.request.sampling
        if not seq.t_first_token:
            seq.t_first_token = now
        if tok in self.stop_token_ids and not s.ignore_eos:
            self._finish(seq, "stop")
            return
        seq.token_ids.append(tok)
        delta = seq.detok.push(tok)
        self._deliver(seq.seq_id, TokenEvent(tok, delta, seq.num_output_tokens - 1))
        if seq.detok.stopped:
            self._finish(seq, "stop")
        elif seq.num_output_tokens >= s.max_tokens or seq.num_tokens >= self.max_model_len:
            self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq)
        self._seqs.pop(seq.seq_id, None)
        rest = seq.detok.flush()
        if rest:
            self._deliver(seq.seq_id, TokenEvent(-1, rest, seq.num_output_tokens))
        self._deliver(seq.seq_id, seq.result(reason, time.perf_counter()))

    def _fail(self, seq: Sequence, error: Exception) -> None:
        if seq.status is not SeqStatus.FINISHED or seq.block_table:
            self.scheduler.finish(seq)
        self._seqs.pop(seq.seq_id, None)
        self._deliver(seq.seq_id, error)

    # -- closing --------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        # the driver has stopped: this thread owns the pools now
        if self.tier is not None:
            try:
                self.tier.flush()
            except OSError:
                log.warning("KV tier flush at close failed", exc_info=True)
