"""systemd: the notify protocol over real unix datagram sockets (path and abstract), and the unit
file (the real `pgdispatch listen` process notifying: test_listener_process.py)."""

from __future__ import annotations

import asyncio
import configparser
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.systemd import Notifier
from tests.listener.kit import until

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "pgdispatch.service"
DOCS = "/usr/share/doc/pgdispatch"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket at a path, as systemd's $NOTIFY_SOCKET."""
    path = tmp_path / "notify"
    if len(str(path)) > 100:  # sun_path is 108 bytes
        pytest.skip(f"temporary path too long for a unix socket: {path}")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.settimeout(5)
    yield str(path), server
    server.close()


def test_messages_to_a_path_socket(notify_socket: tuple[str, socket.socket]) -> None:
    address, server = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.enabled and notifier.watchdog_interval_s is None
    assert notifier.ready("listening\nas w1")
    assert server.recv(4096).decode().split("\n") == [
        "READY=1", "STATUS=listening as w1", f"MAINPID={os.getpid()}"]
    assert notifier.status("draining 3 invocations")
    assert server.recv(4096) == b"STATUS=draining 3 invocations"
    assert notifier.stopping("stopping: SIGTERM")
    assert server.recv(4096) == b"STOPPING=1\nSTATUS=stopping: SIGTERM"
    notifier.close()


def test_abstract_socket(abstract_socket: tuple[str, socket.socket]) -> None:
    address, server = abstract_socket
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.status("hello")
    assert server.recv(4096) == b"STATUS=hello"
    notifier.close()


def test_outside_systemd_nothing_happens(caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert not notifier.ready("x") and not notifier.status("x") and not notifier.stopping()
    # A socket that went away is reported once, never raised.
    gone = Notifier({"NOTIFY_SOCKET": "/nonexistent/notify"})
    assert not gone.status("x") and not gone.status("y")
    gone.close()
    assert [record.event for record in caplog.records] == ["systemd_notify_failed"]  # type: ignore[attr-defined]


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000"}).watchdog_interval_s == 15
    mine = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_interval_s == 1
    # WATCHDOG_PID names another process (the variables were inherited): not ours to ping.
    assert Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}
                    ).watchdog_interval_s is None


async def test_watchdog_pings_only_while_healthy(abstract_socket: tuple[str, socket.socket]) -> None:
    address, server = abstract_socket
    notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"})  # a ping every 0.5 s
    healthy = True
    task = asyncio.create_task(notifier.watchdog(lambda: healthy))

    def received() -> list[bytes]:
        messages = []
        while True:
            try:
                messages.append(server.recv(4096))
            except BlockingIOError:
                return messages

    await asyncio.sleep(2.2)
    pings = received()
    assert 2 <= len(pings) <= 5 and set(pings) == {b"WATCHDOG=1"}
    healthy = False
    await asyncio.sleep(1.2)
    assert received() == []
    healthy = True
    await asyncio.sleep(0.1)
    received()
    # The loop is blocked on purpose: the ping due meanwhile comes late and is skipped.
    time.sleep(1.0)  # noqa: ASYNC251
    await asyncio.sleep(0.05)
    assert received() == []
    await until(received, within=5, what="pings again")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    notifier.close()


def _unit() -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_unit_file_properties() -> None:
    service = _unit()["Service"]
    assert service["Type"] == "notify"
    assert int(service["WatchdogSec"]) > 0
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # a configuration error is said once, not every 2 s
    assert service["DynamicUser"] == "yes"
    for option in ("NoNewPrivileges", "PrivateTmp", "ProtectHome", "PrivateDevices"):
        assert service[option] == "yes", option
    assert service["ProtectSystem"] == "strict"
    text = UNIT.read_text()
    assert "LoadCredential=database-url:" in text and "LoadCredential=signing-secret:" in text
    # The example URL names a role that may log in: one docs/install.md creates, not the group
    # role dispatch_listener (NOLOGIN), with which the listener exits 2.
    example = re.search(r"postgresql://([^@/]+)@", text)
    assert example is not None
    assert f"CREATE ROLE {example[1]} LOGIN" in (ROOT / "docs" / "install.md").read_text()
    # The listener drains within its grace period (25 s by default) before systemd kills it.
    assert int(service["TimeoutStopSec"]) > 25
    # `systemctl status` shows the project's manual, which the install steps above put there.
    unit = _unit()["Unit"]
    assert unit["Documentation"] == f"file:{DOCS}/operations.md"
    assert f"install -D -m 0644 -t {DOCS} docs/*.md" in text
    assert f"install -D -m 0644 -t {DOCS} docs/*.md" in (ROOT / "docs" / "operations.md").read_text()


def _unit_for_this_checkout(tmp_path: Path) -> Path:
    """The unit with only ExecStart pointed at this checkout's pgdispatch (verify checks that the
    binary exists)."""
    text = UNIT.read_text()
    changed = text.replace("ExecStart=/opt/pgdispatch/bin/pgdispatch ",
                           f"ExecStart={Path(os.sys.executable).parent / 'pgdispatch'} ")
    assert changed.count("\n") == text.count("\n") and changed != text
    unit = tmp_path / "pgdispatch.service"
    unit.write_text(changed)
    return unit


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    done = subprocess.run([tool, "verify", str(_unit_for_this_checkout(tmp_path))], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "pgdispatch.service" not in done.stderr, done.stderr  # no warning about the unit


def test_systemd_analyze_security(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # Exposure 0.0 (locked down) to 10.0 (unsafe); the threshold is in tenths.
    done = subprocess.run([tool, "security", "--offline=yes", "--threshold=20", "--no-pager",
                           str(_unit_for_this_checkout(tmp_path))],
                          capture_output=True, text=True, timeout=60, check=False)
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        pytest.skip("this systemd-analyze cannot assess a unit file offline (systemd < 252)")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert "Overall exposure level for pgdispatch.service: 1." in done.stdout
