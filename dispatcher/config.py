"""Listener settings: every option from a flag or a PGDISPATCH_* variable, the flag winning.

Under systemd, the connection strings and the signing secret may also come as credentials
(`LoadCredential=`): files named database-url, listen-database-url and signing-secret in
$CREDENTIALS_DIRECTORY, read when neither the flag nor the variable gives the setting.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psycopg.conninfo

__all__ = [
    "CREDENTIALS",
    "OPTIONS",
    "ConfigError",
    "Option",
    "Settings",
    "load_settings",
    "redact_conninfo",
    "resolve_database_url",
    "resolve_signing_secret",
]

LEASE_MARGIN_S = 30.0
LOG_LEVELS = ("debug", "info", "warning", "error")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# Settings that may come from a systemd credential: option name -> file in $CREDENTIALS_DIRECTORY.
CREDENTIALS = {
    "database_url": "database-url",
    "listen_database_url": "listen-database-url",
    "signing_secret": "signing-secret",
}


class ConfigError(Exception):
    """The listener's configuration is invalid; the message names the setting and why."""


@dataclass(frozen=True)
class Option:
    """One setting of `pgdispatch listen`: its flag, its environment variable and its help."""

    name: str
    flag: str
    env: str
    help: str
    metavar: str = "VALUE"

    @property
    def label(self) -> str:
        return f"{self.flag} / {self.env}"


OPTIONS: tuple[Option, ...] = (
    Option("database_url", "--database-url", "PGDISPATCH_DATABASE_URL",
           "libpq URL or key=value string for claims and completions (required)", "URL"),
    Option("listen_database_url", "--listen-database-url", "PGDISPATCH_LISTEN_DATABASE_URL",
           "a direct session for LISTEN when the main URL goes through a transaction pooler "
           "(default: the main URL)", "URL"),
    Option("invoke_url", "--invoke-url", "PGDISPATCH_INVOKE_URL",
           "URL template with {project_id} and {function_name}, each percent-encoded as one path "
           "segment (required)", "TEMPLATE"),
    Option("concurrency", "--concurrency", "PGDISPATCH_CONCURRENCY",
           "invocations in flight at most (default 64)", "N"),
    Option("timeout_s", "--timeout", "PGDISPATCH_TIMEOUT",
           "seconds an invocation may take, response body included (default 30)", "SECONDS"),
    Option("lease_s", "--lease", "PGDISPATCH_LEASE",
           "seconds a claimed run is held before another listener may retry it; must exceed the "
           "timeout (default timeout + 30)", "SECONDS"),
    Option("worker_id", "--worker-id", "PGDISPATCH_WORKER_ID",
           "name of this listener in dispatch.runs.worker and application_name (default host:pid:random, "
           "unique per start)", "ID"),
    Option("signing_secret", "--signing-secret-file", "PGDISPATCH_SIGNING_SECRET",
           "sign each request with HMAC-SHA256 (X-Dispatch-Signature): the flag names a file holding "
           "the secret (its bytes, minus one trailing newline), the variable holds the secret itself; "
           "give the flag twice during a key rotation to sign with both secrets", "PATH"),
    Option("sweep_interval_s", "--sweep-interval", "PGDISPATCH_SWEEP_INTERVAL",
           "seconds between fallback sweeps (tick and claim) in case a NOTIFY was missed (default 10)",
           "SECONDS"),
    Option("grace_s", "--grace-period", "PGDISPATCH_GRACE_PERIOD",
           "seconds in-flight invocations get to finish after SIGTERM/SIGINT (default 25)", "SECONDS"),
    Option("pool_size", "--pool-size", "PGDISPATCH_POOL_SIZE",
           "database connections for claims and completions, besides the LISTEN one (default 4)", "N"),
    Option("log_level", "--log-level", "PGDISPATCH_LOG_LEVEL",
           "debug, info, warning or error (default info)", "LEVEL"),
    Option("log_format", "--log-format", "PGDISPATCH_LOG_FORMAT",
           "text (one readable line per event) or json (one object per line, for a log shipper); "
           "default text when stderr is a terminal, else json", "FORMAT"),
    Option("event_loop", "--event-loop", "PGDISPATCH_EVENT_LOOP",
           "auto (uvloop, which pip install brings with the package where uvloop supports the "
           "platform, else asyncio's own loop), uvloop or asyncio (default auto)", "LOOP"),
    Option("metrics_port", "--metrics-port", "PGDISPATCH_METRICS_PORT",
           "serve Prometheus metrics at http://HOST:PORT/metrics; a bare PORT listens on every "
           "interface (default: no metrics server)", "[HOST:]PORT"),
    Option("span_export", "--span-export", "PGDISPATCH_SPAN_EXPORT",
           "none, or otlp: export an OpenTelemetry span per invocation, with the trace and span ids "
           "of its traceparent, to the OTLP/HTTP endpoint of the standard OTEL_EXPORTER_OTLP_* "
           "variables (needs pip install 'pgdispatch[otel]'; default none)", "EXPORTER"),
)
SPAN_EXPORTS = ("none", "otlp")
_BY_NAME = {option.name: option for option in OPTIONS}


def _default_worker_id() -> str:
    # Unique per process start, even in containers (pid 1, a reused hostname): the worker id is
    # informational (logs, dispatch.runs.worker); the fence against a late outcome is the attempt.
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What one listener needs. Durations are seconds (`_s`)."""

    database_url: str
    invoke_url: str
    listen_database_url: str = ""  # "" = database_url
    concurrency: int = 64
    timeout_s: float = 30.0
    lease_s: float = 0.0  # 0 = timeout_s + 30
    worker_id: str = field(default_factory=_default_worker_id)
    signing_secret: bytes | None = field(default=None, repr=False)
    # During a key rotation: requests carry a signature with each secret (two v1= fields).
    second_signing_secret: bytes | None = field(default=None, repr=False)
    sweep_interval_s: float = 10.0
    grace_s: float = 25.0
    pool_size: int = 4
    log_level: str = "info"
    log_format: str = ""  # "" = text on a terminal, else json
    event_loop: str = "auto"  # auto = uvloop when installed, else asyncio's
    metrics_port: int | None = None  # None = no metrics server
    metrics_host: str | None = None  # None = every interface
    span_export: str = "none"  # otlp: dispatcher.span_export

    def __post_init__(self) -> None:
        if not self.listen_database_url:
            object.__setattr__(self, "listen_database_url", self.database_url)
        if not self.lease_s:
            object.__setattr__(self, "lease_s", self.timeout_s + LEASE_MARGIN_S)
        self._validate()

    def _validate(self) -> None:
        for name in ("database_url", "listen_database_url"):
            value: str = getattr(self, name)
            if not value:
                raise _invalid(name, "is required")
            try:
                psycopg.conninfo.conninfo_to_dict(value)
            except psycopg.ProgrammingError as exc:
                # libpq quotes the offending part, which can be the whole URL, password and all
                why = _QUOTED.sub(_hide_long_quote, " ".join(str(exc).split()))
                raise _invalid(name, f"is not a libpq connection string or URL ({why})") from None
        _check_template(self.invoke_url)
        if self.concurrency < 1:
            raise _invalid("concurrency", f"must be at least 1, not {self.concurrency}")
        for name in ("timeout_s", "sweep_interval_s"):
            if not getattr(self, name) > 0:
                raise _invalid(name, f"must be more than 0 seconds, not {getattr(self, name):g}")
        if self.grace_s < 0:
            raise _invalid("grace_s", f"must be 0 seconds or more, not {self.grace_s:g}")
        if not self.lease_s > self.timeout_s:
            raise _invalid(
                "lease_s",
                f"must be longer than the timeout ({self.timeout_s:g} s), not {self.lease_s:g} s: "
                "a run would be retried while its first invocation may still be running",
            )
        if self.pool_size < 1:
            raise _invalid("pool_size", f"must be at least 1, not {self.pool_size}")
        if not self.worker_id.strip() or not self.worker_id.isprintable():
            raise _invalid("worker_id", "must be printable text, not blank")
        if self.signing_secret is not None and not self.signing_secret:
            raise _invalid("signing_secret", "is empty")
        second = self.second_signing_secret
        if second is not None and not (self.signing_secret and second):
            raise _invalid("signing_secret", "names a second secret without a first, or an empty one")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise _invalid("metrics_port", f"must be a port number (0-65535), not {self.metrics_port}")
        if self.log_format not in ("", "text", "json"):
            raise _invalid("log_format", f"must be text or json, not {self.log_format!r}")
        if self.event_loop not in EVENT_LOOPS:
            raise _invalid("event_loop", f"must be one of {', '.join(EVENT_LOOPS)}, not {self.event_loop!r}")
        if self.span_export not in SPAN_EXPORTS:
            raise _invalid("span_export",
                           f"must be one of {', '.join(SPAN_EXPORTS)}, not {self.span_export!r}")
        if self.log_level not in LOG_LEVELS:
            raise _invalid("log_level", f"must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")

    @property
    def application_name(self) -> str:
        """What the listener's sessions show in pg_stat_activity."""
        return f"pgdispatch {self.worker_id}"

    def describe(self) -> dict[str, object]:
        """The settings as safe to log: no secret, no password."""
        return {
            "database": redact_conninfo(self.database_url),
            "listen_database": redact_conninfo(self.listen_database_url),
            "invoke_url": self.invoke_url,
            "concurrency": self.concurrency,
            "timeout_s": self.timeout_s,
            "lease_s": self.lease_s,
            "worker_id": self.worker_id,
            "signing": self.signing_secret is not None,
            "signing_secrets": (self.signing_secret is not None) + (self.second_signing_secret is not None),
            "sweep_interval_s": self.sweep_interval_s,
            "grace_s": self.grace_s,
            "pool_size": self.pool_size,
            "event_loop": self.event_loop,
            "metrics_port": self.metrics_port,
            "span_export": self.span_export,
        }


def _invalid(name: str, why: str) -> ConfigError:
    return ConfigError(f"{_BY_NAME[name].label} {why}")


def _check_template(template: str) -> None:
    if not template:
        raise _invalid("invoke_url", "is required")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise _invalid("invoke_url", f"is not a valid template ({exc})") from None
    unknown = fields - {"project_id", "function_name"}
    if unknown:
        raise _invalid(
            "invoke_url", f"may only use {{project_id}} and {{function_name}}, not {sorted(unknown)}"
        )
    if "function_name" not in fields:
        raise _invalid("invoke_url", "must contain {function_name}")
    parts = urlsplit(template.format(project_id="p", function_name="f"))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _invalid("invoke_url", f"must be an http:// or https:// URL, not {template!r}")


_QUOTED = re.compile(r'"([^"]*)"')


def _hide_long_quote(match: re.Match[str]) -> str:
    quoted = match.group(1)
    return '"…"' if len(quoted) > 24 or "@" in quoted or "password" in quoted.lower() else match.group(0)


def redact_conninfo(conninfo: str) -> str:
    """The connection target without its password, for logs and messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<unparseable connection string>"
    kept = ("host", "hostaddr", "port", "dbname", "user")
    shown = {key: value for key, value in params.items() if key in kept}
    return psycopg.conninfo.make_conninfo("", **shown)


def _number(name: str, raw: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number of seconds"
        raise _invalid(name, f"must be {what}, not {raw!r}") from None


def _secret_from_file(path: str) -> bytes:
    try:
        secret = Path(path).read_bytes()
    except OSError as exc:
        raise _invalid("signing_secret", f"cannot be read: {exc.strerror or exc} ({path})") from None
    # One trailing newline is what an editor or `echo` adds; anything else is part of the secret.
    secret = secret.removesuffix(b"\n").removesuffix(b"\r")
    if not secret:
        raise _invalid("signing_secret", f"file {path} is empty")
    return secret


def _credential(name: str, env: Mapping[str, str]) -> bytes | None:
    """The systemd credential for option `name`, if $CREDENTIALS_DIRECTORY holds one."""
    folder = env.get("CREDENTIALS_DIRECTORY")
    if not folder or name not in CREDENTIALS:
        return None
    path = Path(folder) / CREDENTIALS[name]
    try:
        value = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _invalid(name, f"credential {path} cannot be read: {exc.strerror or exc}") from None
    value = value.removesuffix(b"\n").removesuffix(b"\r")  # as a --signing-secret-file
    if not value:
        raise _invalid(name, f"credential {path} is empty")
    return value


def resolve_database_url(flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """--database-url, else PGDISPATCH_DATABASE_URL, else the database-url credential; checked.

    What every command that talks to the database uses. Raises ConfigError.
    """
    env = os.environ if environ is None else environ
    url = flag if flag is not None else env.get("PGDISPATCH_DATABASE_URL")
    if not url:
        credential = _credential("database_url", env)
        url = credential.decode() if credential is not None else ""
    url = url.strip()
    if not url:
        raise _invalid("database_url", "is required")
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        # libpq quotes the URL it could not parse, password and all: leave it out.
        why = " ".join(str(exc).replace(url, "...").split())
        raise _invalid("database_url", f"is not a libpq connection string or URL ({why})") from None
    return url


def resolve_signing_secret(path: str | None, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The secret from the file --signing-secret-file names, else PGDISPATCH_SIGNING_SECRET, else the
    signing-secret credential; None when none is given. Raises ConfigError."""
    env = os.environ if environ is None else environ
    if path is not None:
        return _secret_from_file(path)
    if env.get("PGDISPATCH_SIGNING_SECRET"):
        return env["PGDISPATCH_SIGNING_SECRET"].encode()
    return _credential("signing_secret", env)


def _metrics_address(raw: str) -> tuple[str | None, int]:
    host, _, port = raw.strip().rpartition(":")
    host = host.strip("[]")  # [::1]:9464
    try:
        number = int(port)
    except ValueError:
        raise _invalid("metrics_port", f"must be PORT or HOST:PORT, not {raw!r}") from None
    return host or None, number


def load_settings(flags: Mapping[str, str | list[str] | None], environ: Mapping[str, str] | None = None
                  ) -> Settings:
    """Build Settings from parsed flags (option name → raw text or None), the environment and
    systemd credentials ($CREDENTIALS_DIRECTORY, see CREDENTIALS), in that order.

    Raises ConfigError with one line naming the setting.
    """
    env = os.environ if environ is None else environ
    # --signing-secret-file may be given twice (a key rotation): the second file is read here,
    # the first goes the way of every other flag.
    secret_files = flags.get("signing_secret")
    if isinstance(secret_files, list):
        if len(secret_files) > 2:
            raise _invalid("signing_secret", "is given more than twice: sign with the new secret and the old "
                                             "one while functions move over, then with the new one alone")
        flags = {**flags, "signing_secret": secret_files[0] if secret_files else None}
    raw: dict[str, str] = {}
    from_credential: dict[str, bytes] = {}
    for option in OPTIONS:
        flag_value = flags.get(option.name)
        if isinstance(flag_value, str):
            raw[option.name] = flag_value
        elif env.get(option.env):
            raw[option.name] = env[option.env]
        elif (credential := _credential(option.name, env)) is not None:
            from_credential[option.name] = credential
            raw[option.name] = credential.decode(errors="replace")

    values: dict[str, object] = {}
    for name in ("database_url", "listen_database_url", "invoke_url", "worker_id"):
        if name in raw:
            values[name] = raw[name].strip()
    for name in ("concurrency", "pool_size"):
        if name in raw:
            values[name] = int(_number(name, raw[name], int))
    for name in ("timeout_s", "lease_s", "sweep_interval_s", "grace_s"):
        if name in raw:
            values[name] = _number(name, raw[name], float)
    if "log_level" in raw:
        values["log_level"] = raw["log_level"].strip().lower()
    if "log_format" in raw:
        values["log_format"] = raw["log_format"].strip().lower()
    if "event_loop" in raw:
        values["event_loop"] = raw["event_loop"].strip().lower()
    if "span_export" in raw:
        values["span_export"] = raw["span_export"].strip().lower()
    if "metrics_port" in raw:
        values["metrics_host"], values["metrics_port"] = _metrics_address(raw["metrics_port"])
    if "signing_secret" in from_credential:
        values["signing_secret"] = from_credential["signing_secret"]
    elif flags.get("signing_secret") is not None:
        values["signing_secret"] = _secret_from_file(raw["signing_secret"])
        if isinstance(secret_files, list) and len(secret_files) == 2:
            values["second_signing_secret"] = _secret_from_file(secret_files[1])
    elif "signing_secret" in raw:
        values["signing_secret"] = raw["signing_secret"].encode()
    for name in ("database_url", "invoke_url"):
        if not values.get(name):
            raise _invalid(name, "is required")
    if "lease_s" in values and values["lease_s"] == 0:
        raise _invalid("lease_s", "must be more than 0 seconds")
    return Settings(**values)  # type: ignore[arg-type]
