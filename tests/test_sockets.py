"""``free_port``: a port for a server another process binds later, picked where connects cannot take it."""

from __future__ import annotations

import random
import socket

from pytest_hpcnet.sockets import FIRST_PORT, ephemeral_ports, free_port


def test_free_ports_do_not_follow_the_seeded_random_state():
    # pytest-randomly seeds ``random`` alike in every worker: a port drawn from it would be the
    # same port in both workers
    random.seed(1)
    seeded = {random.randrange(FIRST_PORT, 65536) for _ in range(50)}
    random.seed(1)
    assert free_port() not in seeded


def test_free_ports_lie_outside_the_ephemeral_range_and_never_repeat():
    ephemeral = ephemeral_ports()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(FIRST_PORT <= p < 65536 and p not in ephemeral for p in ports)


def test_a_free_port_binds_on_the_wildcard_and_on_loopback():
    port = free_port("127.0.0.1")
    for address in ("", "127.0.0.1"):
        with socket.socket() as s:
            s.bind((address, port))


def test_a_port_someone_listens_on_is_not_given_out(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        picks = iter([taken, taken])   # drawn twice, then the real draw
        draw = random.SystemRandom()

        class Rigged:
            def randrange(self, a, b):
                return next(picks, None) or draw.randrange(a, b)

        monkeypatch.setattr("pytest_hpcnet.sockets.ephemeral_ports", lambda: range(0))
        monkeypatch.setattr("pytest_hpcnet.sockets._draw", Rigged())
        assert free_port() != taken


def test_a_host_whose_ephemeral_range_covers_every_port_still_gets_one(monkeypatch):
    monkeypatch.setattr("pytest_hpcnet.sockets.ephemeral_ports", lambda: range(1024, 65536))
    assert FIRST_PORT <= free_port() < 65536
