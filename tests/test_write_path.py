"""The write path: a plain INSERT/UPDATE from any client validates, computes next_run_at,
keeps updated_at, audits and notifies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors

INSERT = """
    INSERT INTO dispatch.schedules (project_id, function_name, cron_expression, timezone, args, enabled)
    VALUES (%(project_id)s, %(function_name)s, %(cron_expression)s, %(timezone)s, %(args)s, %(enabled)s)
    RETURNING id
"""


def schedule(**overrides: Any) -> dict[str, Any]:
    return {
        "project_id": "proj_1",
        "function_name": "send-report",
        "cron_expression": "*/5 * * * *",
        "timezone": "Europe/Berlin",
        "args": '{"to": "ops"}',
        "enabled": True,
    } | overrides


def counts(db: psycopg.Connection) -> tuple[int, int]:
    row = db.execute(
        "SELECT (SELECT count(*) FROM dispatch.schedules), (SELECT count(*) FROM dispatch.audit_log)"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_insert_computes_next_run_at_in_its_zone(db: psycopg.Connection) -> None:
    with db.transaction():
        sid = db.execute(INSERT, schedule(cron_expression="30 9 * * *")).fetchone()[0]  # type: ignore[index]
        row = db.execute(
            "SELECT next_run_at = dispatch.cron_next('30 9 * * *', now(), 'Europe/Berlin'),"
            " (next_run_at AT TIME ZONE 'Europe/Berlin')::time, next_run_at > now()"
            " FROM dispatch.schedules WHERE id = %s",
            (sid,),
        ).fetchone()
    assert row is not None
    assert row[0] is True
    assert str(row[1]) == "09:30:00"
    assert row[2] is True


def test_disabled_and_deleted_have_no_next_run_at(db: psycopg.Connection) -> None:
    sid = db.execute(INSERT, schedule(enabled=False)).fetchone()[0]  # type: ignore[index]
    assert db.execute("SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone() == (
        None,
    )

    db.execute("UPDATE dispatch.schedules SET enabled = true WHERE id = %s", (sid,))
    (next_at,) = db.execute("SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone()  # type: ignore[misc]
    assert next_at is not None

    db.execute("UPDATE dispatch.schedules SET deleted_at = now() WHERE id = %s", (sid,))
    assert db.execute("SELECT next_run_at FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone() == (
        None,
    )

    # The schema itself refuses a next_run_at on a row that is not live.
    with pytest.raises(errors.CheckViolation, match="schedules_next_run_at_live_check"):
        db.execute("UPDATE dispatch.schedules SET next_run_at = now() WHERE id = %s", (sid,))


def test_changes_recompute_only_when_the_timing_changes(db: psycopg.Connection) -> None:
    sid = db.execute(INSERT, schedule(cron_expression="0 3 * * *", timezone="UTC")).fetchone()[0]  # type: ignore[index]

    def state() -> tuple[Any, ...]:
        row = db.execute(
            "SELECT next_run_at, updated_at FROM dispatch.schedules WHERE id = %s", (sid,)
        ).fetchone()
        assert row is not None
        return tuple(row)

    db.execute("UPDATE dispatch.schedules SET next_run_at = '2031-01-01 03:00+00' WHERE id = %s", (sid,))
    pinned, updated_at = state()
    # args do not move the slot, but they are a definition change
    db.execute("UPDATE dispatch.schedules SET args = '{\"x\": 1}' WHERE id = %s", (sid,))
    assert state()[0] == pinned
    assert state()[1] > updated_at
    # the expression and the zone do
    db.execute("UPDATE dispatch.schedules SET cron_expression = '0 4 * * *' WHERE id = %s", (sid,))
    assert state()[0] != pinned
    assert db.execute(
        "SELECT next_run_at = dispatch.cron_next('0 4 * * *', now(), 'UTC') FROM dispatch.schedules"
    ).fetchone() == (True,)
    db.execute("UPDATE dispatch.schedules SET timezone = 'Asia/Tokyo' WHERE id = %s", (sid,))
    assert db.execute(
        "SELECT next_run_at = dispatch.cron_next('0 4 * * *', now(), 'Asia/Tokyo') FROM dispatch.schedules"
    ).fetchone() == (True,)


def test_dispatcher_updates_do_not_touch_updated_at_or_audit(db: psycopg.Connection) -> None:
    db.execute(INSERT, schedule())
    before = db.execute("SELECT updated_at FROM dispatch.schedules").fetchone()
    audits = counts(db)[1]
    db.execute("UPDATE dispatch.schedules SET next_run_at = now(), last_status = 'ok', last_run_at = now()")
    assert db.execute("SELECT updated_at FROM dispatch.schedules").fetchone() == before
    assert counts(db)[1] == audits


def test_audit_rows_for_create_update_delete(db: psycopg.Connection) -> None:
    sid = db.execute(INSERT, schedule()).fetchone()[0]  # type: ignore[index]
    db.execute("UPDATE dispatch.schedules SET cron_expression = '0 * * * *' WHERE id = %s", (sid,))
    db.execute(
        "UPDATE dispatch.schedules SET cron_expression = '0 * * * *' WHERE id = %s", (sid,)
    )  # no change
    db.execute("UPDATE dispatch.schedules SET deleted_at = now() WHERE id = %s", (sid,))
    rows = db.execute(
        "SELECT action, actor_id, project_id, metadata FROM dispatch.audit_log ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == ["schedule.create", "schedule.update", "schedule.delete"]
    assert {r[1] for r in rows} == {"postgres"}
    assert {r[2] for r in rows} == {"proj_1"}
    assert rows[0][3]["scheduleId"] == str(sid)
    assert rows[0][3]["functionName"] == "send-report"
    assert rows[1][3]["changed"] == {"cron_expression": "0 * * * *"}


def test_schedule_changes_notify_listeners(db: psycopg.Connection, connect: Callable[..., Any]) -> None:
    listener = connect()
    listener.execute("LISTEN dispatch")
    sid = db.execute(INSERT, schedule()).fetchone()[0]  # type: ignore[index]
    note = next(listener.notifies(timeout=5, stop_after=1))
    assert (note.channel, note.payload) == ("dispatch", "schedules")
    db.execute("UPDATE dispatch.schedules SET enabled = false WHERE id = %s", (sid,))
    assert next(listener.notifies(timeout=5, stop_after=1)).payload == "schedules"


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("function_name", "", errors.InvalidParameterValue, 'function_name "" is not a function name'),
        ("function_name", "../x", errors.InvalidParameterValue, 'function_name "../x" is not'),
        ("function_name", "a/b", errors.InvalidParameterValue, 'function_name "a/b" is not'),
        ("function_name", ".hidden", errors.InvalidParameterValue, "function_name"),
        ("function_name", "two words", errors.InvalidParameterValue, "function_name"),
        ("function_name", " lead", errors.InvalidParameterValue, "function_name"),
        ("function_name", "tab\there", errors.InvalidParameterValue, "function_name"),
        ("function_name", "new\nline", errors.InvalidParameterValue, "function_name"),
        ("function_name", "a%2Fb", errors.InvalidParameterValue, "function_name"),
        ("function_name", "q?x=1", errors.InvalidParameterValue, "function_name"),
        ("function_name", "frag#x", errors.InvalidParameterValue, "function_name"),
        ("function_name", "ünïcode", errors.InvalidParameterValue, "function_name"),
        ("function_name", "x" * 129, errors.InvalidParameterValue, "function_name"),
        ("function_name", None, errors.InvalidParameterValue, "function_name NULL is not"),
        ("project_id", "", errors.InvalidParameterValue, 'project_id "" is not a project id'),
        ("project_id", "a b", errors.InvalidParameterValue, 'project_id "a b" is not a project id'),
        ("project_id", "a/b", errors.InvalidParameterValue, 'project_id "a/b" is not a project id'),
        ("project_id", "..", errors.InvalidParameterValue, r'project_id "\.\." is not a project id'),
        ("project_id", "x" * 201, errors.InvalidParameterValue, "is not a project id"),
        ("project_id", None, errors.InvalidParameterValue, "project_id NULL is not a project id"),
        ("args", "[1, 2]", errors.CheckViolation, "schedules_args_check"),
        ("args", '"text"', errors.CheckViolation, "schedules_args_check"),
        ("args", "null", errors.CheckViolation, "schedules_args_check"),
        ("args", "{broken", errors.InvalidTextRepresentation, "json"),
        ("cron_expression", None, errors.InvalidParameterValue,
         "a schedule needs cron_expression, every or run_at"),
        (
            "cron_expression",
            "61 * * * *",
            errors.InvalidParameterValue,
            'cron_expression "61 * * * *": minute 61 is outside 0-59',
        ),
        ("timezone", "PST", errors.InvalidParameterValue, 'timezone "PST" is not a time zone name'),
        ("timezone", "+05", errors.InvalidParameterValue, 'timezone "+05"'),
        ("timezone", None, errors.InvalidParameterValue, "timezone must not be null"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    db: psycopg.Connection, field: str, value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message.replace("?", r"\?").replace("*", r"\*").replace("+", r"\+")):
        db.execute(INSERT, schedule(**{field: value}))
    assert counts(db) == (0, 0)


def test_nul_byte_in_a_name_is_refused(db: psycopg.Connection) -> None:
    # as psql would send it, and through a driver
    with pytest.raises(errors.ProgramLimitExceeded, match="null character not permitted"):
        db.execute(
            "INSERT INTO dispatch.schedules (project_id, function_name, cron_expression)"
            " VALUES ('p', 'a' || chr(0), '* * * * *')"
        )
    with pytest.raises(psycopg.DataError, match="NUL"):
        db.execute(INSERT, schedule(function_name="a\x00b"))
    assert counts(db) == (0, 0)


def test_bad_update_is_refused_and_the_row_is_unchanged(db: psycopg.Connection) -> None:
    sid = db.execute(INSERT, schedule()).fetchone()[0]  # type: ignore[index]
    before = db.execute("SELECT * FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone()
    for assignment in [
        "cron_expression = '* * * *'",
        "timezone = 'Mars/Olympus'",
        "function_name = 'a/b'",
        "args = '[]'",
    ]:
        with pytest.raises(psycopg.Error):
            db.execute(f"UPDATE dispatch.schedules SET {assignment} WHERE id = %s", (sid,))
    assert db.execute("SELECT * FROM dispatch.schedules WHERE id = %s", (sid,)).fetchone() == before
    assert counts(db) == (1, 1)


def test_the_project_id_check_refuses_what_the_first_one_did(db: psycopg.Connection) -> None:
    """Migration 0017 said the check of 0002 without its bounded repetition: the same verdict,
    from the trigger and from the CHECK constraint alone (the trigger skipped)."""
    chars = ["a", "é", "😀", ".", "/", " ", "\t", "\n", "\x7f", "\x85", "\u00a0", "\u2028", "-", "_", "%"]
    candidates = ["", ".", "..", "...", ".a", "a.", "x" * 199 + "é", "x" * 200, "x" * 201, "😀" * 200,
                  "😀" * 201, *chars, *(a + b for a in chars for b in chars), *(c * 3 for c in chars)]
    first_check = "p ~ '^[^[:space:][:cntrl:]/]{1,200}$' AND p !~ '^[.]{1,2}$'"
    refused_by_first = dict(db.execute(
        f"SELECT p, NOT ({first_check}) FROM unnest(%s::text[]) AS p", (candidates,)).fetchall())
    assert any(refused_by_first.values()) and not all(refused_by_first.values())
    for project_id in candidates:
        with db.transaction(force_rollback=True):
            try:
                with db.transaction():
                    db.execute(INSERT, schedule(project_id=project_id))
            except errors.InvalidParameterValue:
                refused_by_trigger = True
            else:
                refused_by_trigger = False
            db.execute("SET LOCAL session_replication_role = replica")  # the CHECK alone
            try:
                with db.transaction():
                    db.execute("INSERT INTO dispatch.schedules (project_id, function_name, cron_expression,"
                               " cron_spec, next_run_at) VALUES (%s, 'f', '* * * * *',"
                               " dispatch.cron_parse('* * * * *'), now() + interval '1 minute')",
                               (project_id,))
            except errors.CheckViolation as exc:
                refused_by = exc.diag.constraint_name
                refused_by_check = True
            else:
                refused_by_check = False
            if refused_by_check:
                assert refused_by == "schedules_project_id_check", repr(project_id)
        assert (refused_by_trigger, refused_by_check) == (refused_by_first[project_id],) * 2, repr(project_id)
