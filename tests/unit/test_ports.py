"""The rendezvous port picker stays out of the range outgoing connections draw from."""

import socket
from pathlib import Path

import pytest

from megatron_contract import ports


def test_a_free_port_lies_below_the_ephemeral_range_and_binds() -> None:
    low, _ = ports.ephemeral_range()
    for _ in range(20):
        port = ports.free_port()
        assert ports.LOWEST <= port < min(low, ports.HIGHEST)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", taken)  # every candidate but `taken` is above it
        monkeypatch.setattr(ports, "HIGHEST", 65536)
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (taken + 200, 60999))
        assert {ports.free_port() for _ in range(30)} & {taken} == set()


def test_no_room_below_the_range_falls_back_to_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("1024\t65000\n")
    assert ports.ephemeral_range(str(tmp_path / "range")) == (1024, 65000)
    assert ports.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65000))
    port = ports.free_port()
    assert 1024 <= port <= 65535
