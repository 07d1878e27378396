"""The settings operators add: systemd credentials ($CREDENTIALS_DIRECTORY) and --metrics-port."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dispatcher.config import ConfigError, load_settings, resolve_database_url, resolve_signing_secret

URL = "postgresql://dispatch_listener@db.internal/app"
INVOKE = "http://fn.internal/projects/{project_id}/functions/{function_name}"
BASE = {"PGDISPATCH_DATABASE_URL": URL, "PGDISPATCH_INVOKE_URL": INVOKE}


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    (tmp_path / "database-url").write_text(URL + "\n")
    (tmp_path / "signing-secret").write_bytes(b"s3cret\n")
    return tmp_path


def test_credentials_fill_in_what_flags_and_variables_do_not_give(credentials: Path) -> None:
    env = {"CREDENTIALS_DIRECTORY": str(credentials), "PGDISPATCH_INVOKE_URL": INVOKE}
    settings = load_settings({}, env)
    assert (settings.database_url, settings.listen_database_url) == (URL, URL)
    assert settings.signing_secret == b"s3cret"
    assert resolve_database_url(None, env) == URL
    assert resolve_signing_secret(None, env) == b"s3cret"
    # The variable wins over the credential, the flag over both.
    env["PGDISPATCH_DATABASE_URL"] = "postgresql://env@db/app"
    env["PGDISPATCH_SIGNING_SECRET"] = "from-env"  # noqa: S105
    settings = load_settings({}, env)
    assert (settings.database_url, settings.signing_secret) == ("postgresql://env@db/app", b"from-env")
    flagged = load_settings({"database_url": "postgresql://flag@db/app"}, env)
    assert flagged.database_url == "postgresql://flag@db/app"
    assert resolve_database_url("postgresql://flag@db/app", env) == "postgresql://flag@db/app"


def test_missing_or_empty_credentials(tmp_path: Path) -> None:
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "PGDISPATCH_INVOKE_URL": INVOKE}
    with pytest.raises(ConfigError, match=r"^--database-url / PGDISPATCH_DATABASE_URL is required$"):
        load_settings({}, env)
    (tmp_path / "database-url").write_text("\n")
    with pytest.raises(ConfigError, match=f"credential {tmp_path}/database-url is empty"):
        load_settings({}, env)
    (tmp_path / "database-url").write_text(URL)
    assert load_settings({}, env).signing_secret is None  # no signing-secret credential: unsigned


@pytest.mark.parametrize(("raw", "host", "port"), [
    ("9464", None, 9464), ("127.0.0.1:9464", "127.0.0.1", 9464), ("[::1]:0", "::1", 0), (":9100", None, 9100),
])
def test_metrics_port(raw: str, host: str | None, port: int) -> None:
    settings = load_settings({"metrics_port": raw}, BASE)
    assert (settings.metrics_host, settings.metrics_port) == (host, port)
    from_env = load_settings({}, {**BASE, "PGDISPATCH_METRICS_PORT": raw})
    assert from_env.metrics_port == port


@pytest.mark.parametrize(("raw", "message"), [
    ("http", "must be PORT or HOST:PORT, not 'http'"),
    ("70000", "must be a port number (0-65535), not 70000"),
])
def test_metrics_port_refused(raw: str, message: str) -> None:
    expected = "^" + re.escape(f"--metrics-port / PGDISPATCH_METRICS_PORT {message}")
    with pytest.raises(ConfigError, match=expected):
        load_settings({"metrics_port": raw}, BASE)
    assert load_settings({}, BASE).metrics_port is None
