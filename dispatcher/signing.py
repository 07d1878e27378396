"""Request signatures: `X-Dispatch-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.

`verify_signature` is what a function should run on every request before trusting it. It
needs only the standard library; copy it as it is::

    import hashlib, hmac, time

    def verify_signature(secret: bytes, body: bytes, header: str | None,
                         *, tolerance_s: int = 300, now: float | None = None) -> bool:
        fields = dict(item.strip().partition("=")[::2] for item in (header or "").split(","))
        try:
            timestamp, received = int(fields["t"]), fields["v1"]
        except (KeyError, ValueError):
            return False
        if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
            return False  # too old (a replay) or from the future
        expected = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, received)

Verify the raw body bytes as received, before parsing JSON: re-serialising changes them.
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["SIGNATURE_HEADER", "sign", "verify_signature"]

SIGNATURE_HEADER = "X-Dispatch-Signature"


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The X-Dispatch-Signature value for `body` sent at `timestamp` (unix seconds)."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify_signature(
    secret: bytes, body: bytes, header: str | None, *, tolerance_s: int = 300, now: float | None = None
) -> bool:
    """True when `header` signs `body` with `secret` and its timestamp is within `tolerance_s`."""
    fields: dict[str, str] = {}
    for item in (header or "").split(","):
        key, _, value = item.strip().partition("=")
        fields[key] = value
    try:
        timestamp, received = int(fields["t"]), fields["v1"]
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False  # too old (a replay) or from the future
    expected = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, received)
