"""suffixmem's benchmarks, a distribution of their own (``suffixmem-bench``).

Each module contributes one ``suffixmem bench NAME`` command through a ``register(bench)``
function, listed in this distribution's ``suffixmem.bench`` entry points; the ``suffixmem``
library finds them there and never imports this package by name. Targets are reported as
measured ratios, never asserted by timed tests.
"""
