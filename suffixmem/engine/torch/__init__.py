"""The compact torch engine: paged KV blocks we own, chained-hash prefix reuse, our own Llama
forward. Import ``suffixmem.engine.torch.engine.TorchEngine`` (heavy: loads torch)."""
