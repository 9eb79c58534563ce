"""The demo's API port (api/devdb/embedded.py `listening_socket`): the socket that chose the port
keeps it until the server serves on it, so nothing else can take the port in between."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tributary.api.devdb.embedded import listening_socket

pytestmark = pytest.mark.integration


def test_the_chosen_port_is_held_until_the_server_takes_it() -> None:
    listener = listening_socket(0)
    port = int(listener.getsockname()[1])
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))  # what another process would do between choice and serve

    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    runner = threading.Thread(target=server.run, kwargs={"sockets": [listener]})
    runner.start()
    try:
        while not server.started and runner.is_alive():
            runner.join(0.05)
        assert server.started
        assert httpx.get(f"http://127.0.0.1:{port}/ping").json() == {"pong": "yes"}
    finally:
        server.should_exit = True
        runner.join()
        listener.close()


def test_a_busy_preferred_port_gives_another() -> None:
    held = listening_socket(0)
    try:
        taken = int(held.getsockname()[1])
        other = listening_socket(taken)
        try:
            assert int(other.getsockname()[1]) != taken
        finally:
            other.close()
    finally:
        held.close()
