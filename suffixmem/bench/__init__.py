"""Benchmarks that print figures (``suffixmem bench NAME``). Each module registers its command
with ``register(bench)``; targets are reported as measured ratios, never asserted by timed
tests."""
