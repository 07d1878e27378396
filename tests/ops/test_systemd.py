"""systemd: the notify protocol over real unix datagram sockets (path and abstract), the unit
file, the template unit for several listeners on one host, and the drop-in that carries a second
signing secret during a rotation (the real `pgdispatch listen` process notifying:
test_listener_process.py)."""

from __future__ import annotations

import asyncio
import configparser
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.config import load_settings
from dispatcher.systemd import Notifier
from tests.listener.kit import until

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "pgdispatch.service"
TEMPLATE = ROOT / "systemd" / "pgdispatch@.service"
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


def _unit(path: Path = UNIT) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def _directives(path: Path) -> list[tuple[str, str, str]]:
    """Every (section, key, value) of a unit file in order, repeated keys included (configparser
    keeps only the last LoadCredential=)."""
    found, section = [], ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key.strip(), value.strip()))
    return found


def _values(path: Path, key: str) -> list[str]:
    return [value for section, name, value in _directives(path) if section == "Service" and name == key]


@pytest.mark.parametrize(("path", "etc"), [(UNIT, "/etc/pgdispatch"), (TEMPLATE, "/etc/pgdispatch/%i")],
                         ids=["pgdispatch.service", "pgdispatch@.service"])
def test_unit_file_properties(path: Path, etc: str) -> None:
    service = _unit(path)["Service"]
    assert service["Type"] == "notify"
    assert int(service["WatchdogSec"]) > 0
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # a configuration error is said once, not every 2 s
    assert service["DynamicUser"] == "yes"
    for option in ("NoNewPrivileges", "PrivateTmp", "ProtectHome", "PrivateDevices"):
        assert service[option] == "yes", option
    assert service["ProtectSystem"] == "strict"
    assert _values(path, "LoadCredential") == [f"database-url:{etc}/database-url",
                                               f"signing-secret:{etc}/signing-secret"]
    assert _values(path, "EnvironmentFile") == [f"{etc}/pgdispatch.env"]
    text = path.read_text()
    # The example URL names a role that may log in: one docs/install.md creates, not the group
    # role dispatch_listener (NOLOGIN), with which the listener exits 2.
    example = re.search(r"postgresql://([^@/]+)@", text)
    assert example is not None
    assert f"CREATE ROLE {example[1]} LOGIN" in (ROOT / "docs" / "install.md").read_text()
    # The listener drains within its grace period (25 s by default) before systemd kills it.
    assert int(service["TimeoutStopSec"]) > 25
    # `systemctl status` shows the project's manual, which the install steps above put there.
    unit = _unit(path)["Unit"]
    assert unit["Documentation"] == f"file:{DOCS}/deployment.md"
    assert f"install -D -m 0644 -t {DOCS} docs/*.md" in text
    assert f"install -D -m 0644 -t {DOCS} docs/*.md" in (ROOT / "docs" / "deployment.md").read_text()


def test_the_template_is_the_unit_with_an_instance_folder() -> None:
    """pgdispatch@.service differs from pgdispatch.service only where an instance needs its own:
    the description names it, and its files are in /etc/pgdispatch/NAME/."""
    def general(directive: tuple[str, str, str]) -> tuple[str, str, str]:
        section, key, value = directive
        return section, key, value.replace("/etc/pgdispatch/%i/", "/etc/pgdispatch/").replace(
            "pgdispatch listener %i ", "pgdispatch listener ")

    assert [general(directive) for directive in _directives(TEMPLATE)] == _directives(UNIT)
    assert _unit(TEMPLATE)["Unit"]["Description"].startswith("pgdispatch listener %i ")


@pytest.mark.parametrize(("unit", "etc"), [(UNIT, "/etc/pgdispatch"), (TEMPLATE, "/etc/pgdispatch/%i")],
                         ids=["pgdispatch.service", "pgdispatch@.service"])
def test_the_rotation_drop_in_signs_with_both_secrets(unit: Path, etc: str, tmp_path: Path) -> None:
    """The drop-in loads the next secret as a second credential and gives the unit's command
    both files, next first; the listener reads them as its two secrets."""
    drop_in = _drop_in(unit)
    assert _values(drop_in, "LoadCredential") == [f"signing-secret-next:{etc}/signing-secret-next"]
    starts = _values(drop_in, "ExecStart")
    assert starts[0] == ""  # clears the unit's ExecStart: a notify service has exactly one
    assert len(starts) == 2
    command = shlex.split(starts[1])
    (unit_command,) = _values(unit, "ExecStart")
    assert command[:2] == shlex.split(unit_command)
    assert command[2:] == ["--signing-secret-file", "${CREDENTIALS_DIRECTORY}/signing-secret-next",
                           "--signing-secret-file", "${CREDENTIALS_DIRECTORY}/signing-secret"]
    # What systemd hands the service: every credential of the unit and the drop-in, by name.
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    for value in _values(unit, "LoadCredential") + _values(drop_in, "LoadCredential"):
        name = value.split(":", 1)[0]
        (credentials / name).write_text(f"{name} secret\n" if "secret" in name else "postgresql://l@db/app")
    files = [arg.replace("${CREDENTIALS_DIRECTORY}", str(credentials)) for arg in command[3::2]]
    settings = load_settings({"signing_secret": files}, environ={
        "CREDENTIALS_DIRECTORY": str(credentials),
        "PGDISPATCH_INVOKE_URL": "http://fn.internal/projects/{project_id}/functions/{function_name}"})
    assert settings.signing_secret == b"signing-secret-next secret"
    assert settings.second_signing_secret == b"signing-secret secret"
    assert settings.database_url == "postgresql://l@db/app"


def _drop_in(unit: Path) -> Path:
    return unit.parent / f"{unit.name}.d" / "signing-secret-next.conf"


def _for_this_checkout(source: Path, target: Path) -> None:
    """A unit file with only ExecStart pointed at this checkout's pgdispatch (verify checks that
    the binary exists)."""
    text = source.read_text()
    changed = text.replace("ExecStart=/opt/pgdispatch/bin/pgdispatch ",
                           f"ExecStart={Path(os.sys.executable).parent / 'pgdispatch'} ")
    assert changed.count("\n") == text.count("\n") and changed != text
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(changed)


def _unit_for_this_checkout(tmp_path: Path, unit: Path = UNIT, *, drop_in: bool = False) -> Path:
    """The unit (and its rotation drop-in) in tmp_path, for this checkout; the unit to name to
    systemd-analyze (an instance, app, of the template)."""
    _for_this_checkout(unit, tmp_path / unit.name)
    if drop_in:
        _for_this_checkout(_drop_in(unit), tmp_path / f"{unit.name}.d" / "signing-secret-next.conf")
    return tmp_path / unit.name.replace("@.", "@app.")


VERIFIED = [(UNIT, False), (UNIT, True), (TEMPLATE, False), (TEMPLATE, True)]
VERIFIED_IDS = ["pgdispatch.service", "pgdispatch.service+rotation", "pgdispatch@app.service",
                "pgdispatch@app.service+rotation"]


@pytest.mark.parametrize(("unit", "drop_in"), VERIFIED, ids=VERIFIED_IDS)
def test_systemd_analyze_verify(tmp_path: Path, unit: Path, drop_in: bool) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    named = _unit_for_this_checkout(tmp_path, unit, drop_in=drop_in)
    done = subprocess.run([tool, "verify", str(named)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "pgdispatch" not in done.stderr, done.stderr  # no warning about the unit or the drop-in


@pytest.mark.parametrize("unit", [UNIT, TEMPLATE], ids=["pgdispatch.service", "pgdispatch@app.service"])
def test_systemd_analyze_security(tmp_path: Path, unit: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    named = _unit_for_this_checkout(tmp_path, unit)
    # Exposure 0.0 (locked down) to 10.0 (unsafe); the threshold is in tenths.
    done = subprocess.run([tool, "security", "--offline=yes", "--threshold=20", "--no-pager", str(named)],
                          capture_output=True, text=True, timeout=60, check=False)
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        pytest.skip("this systemd-analyze cannot assess a unit file offline (systemd < 252)")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert f"Overall exposure level for {named.name}: 1." in done.stdout
