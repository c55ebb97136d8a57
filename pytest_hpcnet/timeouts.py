"""One place for how much longer than usual a machine may take: ``$HPCNET_TIMEOUT_SCALE``.

The budgets in the code and the suites (connect in 10 s, answer in 30 s, ...) are set for a real
machine. Under emulation every step is one to two orders of magnitude slower -- in the Soft-RoCE guest
(QEMU TCG) one rdma_cm connection costs ~0.2-1.5 s, more when the host's other core is busy -- so the
guest exports ``HPCNET_TIMEOUT_SCALE`` (``vm.guest.TIMEOUT_SCALE``) and every such budget is written
``scaled(seconds)``. Budgets that test a timeout itself (a call that must give up after 0.2 s) are not
scaled: what they check does not get slower. Unset, the scale is 1.
"""

from __future__ import annotations

import os

from .errors import ConfigError

ENV = "HPCNET_TIMEOUT_SCALE"


def scale(environ=None) -> float:
    """The factor from ``$HPCNET_TIMEOUT_SCALE`` (1 when unset); a value below 1 or not a number is a
    ConfigError naming the variable."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"expected a number >= 1, got {text!r}", f"${ENV}") from None
    if not value >= 1:   # also rejects nan
        raise ConfigError(f"expected a number >= 1, got {text!r}", f"${ENV}")
    return value


def scaled(seconds: float) -> float:
    """``seconds`` times this machine's timeout scale."""
    return seconds * scale()
