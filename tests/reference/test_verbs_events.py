"""Finding the descriptor pyverbs hides (``verbs.events.with_new_fd``), with eventfds standing in for
rdma_cm's and a completion channel's: no RDMA device needed."""

from __future__ import annotations

import os

import pytest

from pytest_hpcnet.reference.transport.base import TransportError
from pytest_hpcnet.reference.transport.verbs.events import with_new_fd


class Channel:
    def __init__(self, fd: int | None = None):
        self.fd = os.eventfd(0) if fd is None else fd
        self.closed = False

    def close(self):
        os.close(self.fd)
        self.closed = True


def test_a_number_reused_across_the_discovery_is_made_again_and_found():
    """Another descriptor of the kind closes while ours is made, and ours takes its number: none
    appears, so the first object is closed and a second one made."""
    other = os.eventfd(0)
    made = []

    def create():
        if not made:
            os.close(other)                 # someone else's, closed outside fd_lock ...
            fd = os.eventfd(0)
            if fd != other:                 # ... and ours gets its number
                os.dup2(fd, other)
                os.close(fd)
            made.append(Channel(other))
        else:
            made.append(Channel())
        return made[-1]

    channel, fd = with_new_fd(create, "eventfd")
    try:
        assert len(made) == 2 and made[0].closed and channel is made[1] and fd == channel.fd
        assert os.get_blocking(fd) is False
    finally:
        channel.close()


def test_two_new_descriptors_every_time_is_one_line_naming_them():
    extra = []

    def create():
        extra.append(os.eventfd(0))         # someone else's, opened beside ours every time
        return Channel()

    try:
        with pytest.raises(TransportError, match=r"cannot find the descriptor of a new eventfd \(found \[.*\], 3 tries\)"):
            with_new_fd(create, "eventfd")
    finally:
        for fd in extra:
            os.close(fd)
