"""Settings from flags and PGDISPATCH_* variables; configuration errors exit 2 with one line."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from dispatcher.config import ConfigError, load_settings, redact_conninfo
from dispatcher.logs import JsonFormatter, TextFormatter, configure_logging

from .kit import PGDISPATCH

URL = "postgresql://app:pw@db.internal:5432/app"
INVOKE = "http://fn.internal/projects/{project_id}/functions/{function_name}"


def test_defaults() -> None:
    settings = load_settings({}, {"PGDISPATCH_DATABASE_URL": URL, "PGDISPATCH_INVOKE_URL": INVOKE})
    assert settings.listen_database_url == URL
    assert (settings.concurrency, settings.timeout_s, settings.lease_s) == (64, 30.0, 60.0)
    assert (settings.sweep_interval_s, settings.grace_s, settings.signing_secret) == (10.0, 25.0, None)
    host, pid, suffix = settings.worker_id.rsplit(":", 2)
    assert host and pid.isdigit() and len(suffix) == 6
    again = load_settings({}, {"PGDISPATCH_DATABASE_URL": URL, "PGDISPATCH_INVOKE_URL": INVOKE})
    assert again.worker_id != settings.worker_id  # unique per process start, even as pid 1 in a container
    assert settings.application_name == f"pgdispatch {settings.worker_id}"


def test_flag_wins_over_environment(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-file\n")
    env = {
        "PGDISPATCH_DATABASE_URL": URL, "PGDISPATCH_INVOKE_URL": INVOKE, "PGDISPATCH_CONCURRENCY": "8",
        "PGDISPATCH_TIMEOUT": "5", "PGDISPATCH_WORKER_ID": "env-worker",
        "PGDISPATCH_SIGNING_SECRET": "from-env", "PGDISPATCH_SWEEP_INTERVAL": "3",
        "PGDISPATCH_LISTEN_DATABASE_URL": "host=direct dbname=app",
    }
    from_env = load_settings({}, env)
    assert (from_env.concurrency, from_env.timeout_s, from_env.lease_s) == (8, 5, 35)
    assert from_env.worker_id == "env-worker"
    assert (from_env.signing_secret, from_env.sweep_interval_s) == (b"from-env", 3)
    assert from_env.listen_database_url == "host=direct dbname=app"

    flags = {"concurrency": "16", "timeout_s": "2.5", "worker_id": "flag-worker",
             "signing_secret": str(secret_file), "sweep_interval_s": "1"}
    settings = load_settings(flags, env)
    assert (settings.concurrency, settings.timeout_s, settings.lease_s, settings.worker_id) == (
        16, 2.5, 32.5, "flag-worker")
    assert (settings.signing_secret, settings.sweep_interval_s) == (b"from-file", 1)


def test_signing_secret_files_one_newline_off_and_two_for_a_rotation(tmp_path: Path) -> None:
    """docs/functions.md: the secret is the file's bytes minus one trailing newline; the flag may
    be given twice (sign with both), not three times."""
    new, old = tmp_path / "new", tmp_path / "old"
    new.write_bytes(b"4f9c 0d5e\r\n")
    old.write_bytes(b"e3b0\n\n")
    base = {"database_url": URL, "invoke_url": INVOKE}
    one = load_settings({**base, "signing_secret": [str(new)]}, {})
    assert (one.signing_secret, one.second_signing_secret) == (b"4f9c 0d5e", None)
    both = load_settings({**base, "signing_secret": [str(new), str(old)]}, {})
    assert (both.signing_secret, both.second_signing_secret) == (b"4f9c 0d5e", b"e3b0\n")
    assert both.describe()["signing_secrets"] == 2
    with pytest.raises(ConfigError, match="is given more than twice"):
        load_settings({**base, "signing_secret": [str(new), str(old), str(new)]}, {})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"database_url": None}, "--database-url / PGDISPATCH_DATABASE_URL is required"),
        ({"invoke_url": None}, "--invoke-url / PGDISPATCH_INVOKE_URL is required"),
        ({"database_url": "host='open"}, "--database-url / PGDISPATCH_DATABASE_URL is not a libpq"),
        ({"invoke_url": "http://fn/{project_id}"}, "PGDISPATCH_INVOKE_URL must contain {function_name}"),
        ({"invoke_url": "http://fn/{fn}/{function_name}"}, "may only use {project_id} and {function_name}"),
        ({"invoke_url": "ftp://fn/{function_name}"}, "must be an http:// or https:// URL"),
        ({"concurrency": "many"}, "PGDISPATCH_CONCURRENCY must be a whole number, not 'many'"),
        ({"concurrency": "0"}, "--concurrency / PGDISPATCH_CONCURRENCY must be at least 1, not 0"),
        ({"timeout_s": "0"}, "--timeout / PGDISPATCH_TIMEOUT must be more than 0 seconds"),
        ({"timeout_s": "60", "lease_s": "60"}, "PGDISPATCH_LEASE must be longer than the timeout (60 s)"),
        ({"timeout_s": "10", "lease_s": "5"}, "PGDISPATCH_LEASE must be longer than the timeout (10 s)"),
        ({"signing_secret": "/nonexistent"}, "--signing-secret-file / PGDISPATCH_SIGNING_SECRET cannot be"),
        ({"log_level": "loud"}, "--log-level / PGDISPATCH_LOG_LEVEL must be one of"),
    ],
)
def test_invalid_settings_name_the_setting(flags: dict[str, str | None], message: str) -> None:
    base: dict[str, str | None] = {"database_url": URL, "invoke_url": INVOKE}
    with pytest.raises(ConfigError) as raised:
        load_settings({**base, **flags}, {})
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "pgdispatch listen: --database-url / PGDISPATCH_DATABASE_URL is required"),
        (["--database-url", URL, "--invoke-url", INVOKE, "--timeout", "30", "--lease", "20"],
         "pgdispatch listen: --lease / PGDISPATCH_LEASE must be longer than the timeout (30 s)"),
    ],
)
def test_configuration_error_exits_2_with_one_line(args: list[str], message: str) -> None:
    env = {"PATH": "/usr/bin:/bin"}  # no PGDISPATCH_* from the outside
    done = subprocess.run([str(PGDISPATCH), "listen", *args], capture_output=True, text=True, env=env,
                          timeout=30)
    assert done.returncode == 2
    assert done.stderr.startswith(message)
    assert done.stderr.count("\n") == 1


def test_redacted_connection_strings_have_no_password() -> None:
    assert redact_conninfo(URL) == "user=app dbname=app host=db.internal port=5432"
    assert "pw" not in redact_conninfo("host=h password=pw dbname=d")
    assert "pw" not in json.dumps(load_settings({"database_url": URL, "invoke_url": INVOKE,
                                                 "signing_secret": None}, {}).describe())


def test_json_log_lines() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.listener.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("run %s failed", 7, extra={"event": "run_finished", "run_id": 7, "status": "error"})
        logger.warning("plain")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {key: first[key] for key in ("level", "logger", "event", "message", "run_id", "status")} == {
        "level": "warning", "logger": "tests.listener.json", "event": "run_finished",
        "message": "run 7 failed", "run_id": 7, "status": "error"}
    assert second["event"] == "log"


def test_text_log_lines_on_a_terminal_json_elsewhere(tmp_path: Path) -> None:
    """--log-format: text for a person (the default when stderr is a terminal), JSON otherwise."""
    record = logging.LogRecord("dispatcher.x", logging.WARNING, __file__, 1, "run %s failed", (7,), None)
    record.event, record.run_id, record.error = "run_finished", 7, "HTTP 500: boom"
    line = TextFormatter().format(record)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} warning run_finished: run 7 failed"
                        r"  run_id=7 error=\"HTTP 500: boom\"", line), line

    base = {"database_url": URL, "invoke_url": INVOKE}
    assert load_settings({**base, "log_format": "TEXT"}, {}).log_format == "text"
    assert load_settings(base, {"PGDISPATCH_LOG_FORMAT": "json"}).log_format == "json"
    with pytest.raises(ConfigError, match="PGDISPATCH_LOG_FORMAT must be text or json, not 'xml'"):
        load_settings({**base, "log_format": "xml"}, {})

    # the default follows the stream: a pipe gets JSON, a terminal text
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        piped = io.StringIO()
        configure_logging("info", piped)
        logging.getLogger("dispatcher.test").info("hello", extra={"event": "hello"})
        assert json.loads(piped.getvalue())["event"] == "hello"
        main, follower = os.openpty()
        with os.fdopen(follower, "w") as terminal:
            configure_logging("info", terminal)
            logging.getLogger("dispatcher.test").info("hello", extra={"event": "hello"})
            terminal.flush()
            assert b" info    hello: hello" in os.read(main, 4096)
        os.close(main)
    finally:  # put pytest's own handlers back
        root.handlers[:] = handlers
        root.setLevel(level)
