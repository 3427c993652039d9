"""The llama.cpp peer: llama-cpp-python on the model's GGUF with its RAM prompt cache, the
strongest non-vLLM local stack a user would try (``bench chat --configs llamacpp``; the
``llamacpp`` extra of the benchmarks package builds it). Contracts as in ``peers``."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from suffixmem_bench.chat.peers import (
    MIB,
    ChatConfig,
    EngineOptions,
    TextHistory,
    TurnOutcome,
    kv_bytes_per_token,
)


class LlamaCpp(ChatConfig):
    """llama-cpp-python on the model's GGUF with its RAM prompt cache (``LlamaRAMCache``), the
    documented way to keep prompts cached across calls. The prompt is the same ChatML text as
    the others', tokenized by llama.cpp. One ``Llama`` object is not thread-safe, so turns of
    concurrent sessions take turns on it (as a user serving threads would have to).

    ``cached_tokens`` is what llama-cpp-python reuses: the longer of the common prefix with the
    context it last evaluated and with the best state in the RAM cache (which it then loads),
    less the one token it always re-evaluates. Reply ids are the reply text re-tokenized, since
    the streaming API returns text.
    """

    name = "llamacpp"

    def __init__(self, options: EngineOptions) -> None:
        import llama_cpp
        from transformers import AutoTokenizer

        from suffixmem.models import MODELS, gguf_path, resolve_model

        self.options = options
        path = resolve_model(options.model, progress=False)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.chat = TextHistory(self.tokenizer,
                                 budget=options.max_model_len - options.max_tokens)
        self.per_token = kv_bytes_per_token(path, "float16")  # llama.cpp's default KV type
        self.llm = llama_cpp.Llama(
            model_path=str(gguf_path(MODELS[options.model])), n_ctx=options.max_model_len,
            n_threads=options.threads, n_threads_batch=options.threads, seed=0, verbose=False,
        )
        self.cache = llama_cpp.LlamaRAMCache(capacity_bytes=int(options.kv_cache_gib * (1 << 30)))
        self.llm.set_cache(self.cache)
        self._lock = threading.Lock()

    def open(self, session: int, system_prompt: str) -> None:
        self.chat.open(session, system_prompt)

    def _reusable(self, ids: Sequence[int]) -> int:
        from llama_cpp.llama import Llama

        best = Llama.longest_token_prefix(self.llm._input_ids.tolist(), ids)
        key = self.cache._find_longest_prefix_key(tuple(ids))
        if key is not None:
            best = max(best, Llama.longest_token_prefix(key, ids))
        return min(best, len(ids) - 1)

    def turn(self, session: int, text: str) -> TurnOutcome:
        with self._lock:
            t0 = time.perf_counter()
            prompt = self.chat.prompt_text(session, text)
            ids = self.llm.tokenize(prompt.encode(), add_bos=False, special=True)
            # Scanning the cache keys is our bookkeeping, not the user's: keep it off the clock.
            t_scan = time.perf_counter()
            cached = self._reusable(ids)
            t0 += time.perf_counter() - t_scan
            ttft = 0.0
            pieces: list[str] = []
            for chunk in self.llm.create_completion(
                ids, max_tokens=self.options.max_tokens, temperature=0.0, repeat_penalty=1.0,
                stream=True,
            ):
                if not ttft:
                    ttft = time.perf_counter() - t0
                pieces.append(chunk["choices"][0]["text"])
            latency = time.perf_counter() - t0
        reply = "".join(pieces)
        reply_ids = self.llm.tokenize(reply.encode(), add_bos=False, special=False)
        self.chat.append(session, text, reply)
        return TurnOutcome(reply, list(ids), list(reply_ids), cached, ttft or latency, latency,
                           dropped_turns=self.chat.last_dropped.get(session, 0))

    def kv_memory(self) -> dict[str, float]:
        return {
            "kv_pool_mb": self.options.max_model_len * self.per_token / MIB,
            "kv_held_mb": self.cache.cache_size / MIB,
        }

    def close(self) -> None:
        self.llm.close()
