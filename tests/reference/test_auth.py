"""The run-credentials handshake and the growing receive buffer, without services."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from pytest_hpcnet.reference import auth
from pytest_hpcnet.reference.transport import connect_pair, get_transport


def test_same_secret_authenticates_both_ways_and_another_is_refused(monkeypatch):
    monkeypatch.setenv(auth.ENV, os.urandom(16).hex())
    a, b = socket.socketpair()
    t = threading.Thread(target=lambda: auth.client_handshake_socket(a, 5))
    t.start()
    assert auth.serve_handshake_socket(b, "test", 5)
    t.join(5)
    a.close()
    b.close()
    hs = auth.ServerHandshake()
    monkeypatch.setenv(auth.ENV, "another run's secret")                    # the client's key ...
    response, _, _ = auth._client_response(hs.greeting())
    monkeypatch.setenv(auth.ENV, "this run's secret")                       # ... is not the server's
    hs.feed(response)
    assert hs.done and not hs.ok and hs.reason == "wrong run credentials"


def test_a_wrong_mac_a_bad_magic_and_early_data_are_refused():
    hs = auth.ServerHandshake()
    hs.feed(auth.MAGIC + bytes(auth.NONCE) + bytes(auth.MAC))            # a MAC under no key
    assert hs.done and not hs.ok and hs.reply[:1] == b"\x01"
    hs = auth.ServerHandshake()
    hs.feed(b"GET / HTTP/1.1\r\n")
    assert hs.done and not hs.ok and "magic" in hs.reason
    hs = auth.ServerHandshake()
    hs.feed(auth.MAGIC + bytes(auth.NONCE + auth.MAC) + b"more")            # data before the proof
    assert hs.done and not hs.ok


def test_a_recorded_response_does_not_open_another_connection():
    a, b = socket.socketpair()
    hs1 = auth.ServerHandshake()
    response, _, _ = auth._client_response(hs1.greeting())
    hs1.feed(response)
    assert hs1.ok
    hs2 = auth.ServerHandshake()                                             # a fresh nonce
    hs2.feed(response)
    assert hs2.done and not hs2.ok
    a.close()
    b.close()


def test_the_client_refuses_a_server_that_cannot_prove_the_secret():
    a, b = socket.socketpair()

    def impostor():
        b.sendall(auth.MAGIC + os.urandom(auth.NONCE))
        b.recv(4096)
        b.sendall(b"\x00" + os.urandom(auth.MAC))                            # a made-up proof
    t = threading.Thread(target=impostor)
    t.start()
    with pytest.raises(auth.AuthError, match="could not prove"):
        auth.client_handshake_socket(a, 5)
    t.join(5)
    b.close()


@pytest.mark.parametrize("buffers", ["pooled", "naive"])
def test_a_large_message_arrives_whole_through_a_growing_buffer(buffers):
    tcp = get_transport("tcp")
    listener = tcp.listen("127.0.0.1", 0, buffers=buffers)
    client, server = connect_pair(tcp, listener, buffers=buffers)
    try:
        server.eager_limit = 64 * 1024
        big = os.urandom(3 * 1024 * 1024 + 17)
        small = b"after"
        sender = threading.Thread(target=lambda: (client.send([big]), client.send([small])))
        sender.start()
        got = server.recv(timeout=20)
        assert got.tobytes() == big
        got.release()
        assert server.recv(timeout=20).tobytes() == small                   # the stream stays in step
        sender.join(10)
    finally:
        client.close()
        server.close()
        listener.close()


def test_a_growing_receive_resumes_after_a_timeout():
    tcp = get_transport("tcp")
    listener = tcp.listen("127.0.0.1", 0)
    client, server = connect_pair(tcp, listener)
    try:
        server.eager_limit = 4096
        data = os.urandom(200_000)
        frame = len(data).to_bytes(4, "big") + data
        client.send_raw(frame[:50_000])
        with pytest.raises(Exception):
            server.recv(timeout=0.3)                                         # half a message, then quiet
        client.send_raw(frame[50_000:])
        assert server.recv(timeout=10).tobytes() == data
    finally:
        client.close()
        server.close()
        listener.close()
