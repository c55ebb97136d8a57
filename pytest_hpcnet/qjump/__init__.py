"""QJump-style latency isolation on stock Linux: priority levels, the tc layout that enforces them, the
barrier-sync latency application, bulk interference, and the three scenarios of the Naiad experiment.

Modules: ``levels`` (level -> SO_PRIORITY value, per-level rates, tc commands), ``bsfile`` (the ``.bs``
format), ``barrier`` (the latency app), ``bulk`` (interference flows), ``scenarios`` (alone /
interference / priority, as Measurements), ``hook`` (the env-driven socket hook behind
``hpcnet qjump run``), ``commands`` (the CLI).
"""
