"""Progress bars for the long operations ``hpcnet`` commands run by hand (tqdm).

Library functions take an optional ``progress`` callable (``progress(n)``: n more units done) and know
nothing of bars; a command makes one with ``bar(...)``. A bar draws on stderr only when stderr is a
terminal or the user asked (``--progress``), never with ``--no-progress``, and only once the operation
has run for ``DELAY_S`` seconds, so quick runs and CI logs read as before. Test runs draw none: the
suites call the library without ``progress``.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

DELAY_S = 2.0   # nothing is drawn for an operation shorter than this

Progress = Callable[[int], None]


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (default: a bar only when stderr is a terminal)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", dest="progress", action="store_true", default=None,
                       help="show a progress bar on stderr even when it is not a terminal")
    group.add_argument("--no-progress", dest="progress", action="store_false",
                       help="never show a progress bar (default: only on a terminal, after 2 s)")


@contextmanager
def bar(total: int | None, *, desc: str, unit: str, show: bool | None = None,
        unit_scale: bool = False) -> Iterator[Progress]:
    """A tqdm bar on stderr; yields its ``update``. ``show``: True always, False never, None on a terminal."""
    if show is False or (show is None and not _terminal()):
        yield lambda n: None   # nothing to draw: no tqdm needed (the Soft-RoCE guest installs none)
        return
    from tqdm import tqdm
    with tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, delay=DELAY_S, file=sys.stderr,
              disable=None if show is None else not show, dynamic_ncols=True, leave=False) as t:
        yield t.update


def _terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):   # replaced or closed stderr
        return False


def task_events(update: Progress) -> Callable[..., None]:
    """An engine ``on_event`` hook that advances ``update`` by one per finished map or reduce task."""
    def on_event(event: str, **info) -> None:
        if event in ("map_done", "reduce_done"):
            update(1)
    return on_event
