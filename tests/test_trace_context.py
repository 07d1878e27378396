"""Trace context: the W3C traceparent of each attempt (one trace id per run, the same on every
attempt, a span id per attempt), as dispatch.traceparent computes it in SQL and
dispatcher.tracing in the listener, the two held to each other; dispatch.run_trace lists a run's
spans; a traceparent given on a schedule or to dispatch.run_now is continued (the claim hands it
out). The listener sending it: tests/listener/test_policies.py."""

from __future__ import annotations

import hashlib
import re
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import errors

from dispatcher import tracing

from .runs_kit import YEARLY, add_schedule, claim, release, scalar

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
HEADER = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def traceparents(db: psycopg.Connection, n: int = 10) -> dict[int, str]:
    """Claim, and the header each claimed attempt is sent with (the claim hands out the
    traceparent the run continues; the listener computes the attempt's own)."""
    return {row[0]: tracing.traceparent(row[5], row[7], row[-1]) for row in claim(db, "w", n)}


def test_a_run_is_one_trace_and_each_attempt_a_span(db: psycopg.Connection) -> None:
    add_schedule(db, YEARLY)
    db.execute("SELECT dispatch.tick(now() + interval '1 year')")
    first = claim(db, "w")
    ((run_id, tp1),) = [(row[0], tracing.traceparent(row[5], row[7], row[-1])) for row in first]
    request_id = scalar(db, "SELECT request_id FROM dispatch.runs WHERE id = %s", (run_id,))
    assert release(db, "w", first) == 1
    ((_, tp2),) = traceparents(db).items()
    assert HEADER.fullmatch(tp1) and HEADER.fullmatch(tp2)
    trace_id = request_id.removeprefix("sched_").replace("-", "")
    assert tp1[3:35] == tp2[3:35] == trace_id and tp1[-2:] == "01"  # sampled
    attempts = [row[0] for row in db.execute("SELECT attempt FROM dispatch.run_trace(%s)", (run_id,))]
    # each span as documented: sha256('<request id>/<attempt>'), the first 16 hex digits
    spans = [hashlib.sha256(f"{request_id}/{a}".encode()).hexdigest()[:16] for a in attempts]
    assert [tp1[36:52], tp2[36:52]] == spans and spans[0] != spans[1]
    assert db.execute("SELECT trace_id, span_id, parent_span_id, traceparent FROM dispatch.run_trace(%s)",
                      (run_id,)).fetchall() == [(trace_id, spans[0], None, tp1),
                                                (trace_id, spans[1], None, tp2)]


def test_a_schedules_traceparent_is_continued_from_the_first_claim_on(db: psycopg.Connection) -> None:
    sid = add_schedule(db, YEARLY, traceparent=PARENT)
    db.execute("SELECT dispatch.tick(now() + interval '1 year')")
    first = claim(db, "w")
    assert [row[-1] for row in first] == [PARENT]  # the claim hands out what the run continues
    (tp,) = [tracing.traceparent(row[5], row[7], row[-1]) for row in first]
    assert tp.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and tp.endswith("-00")  # its flags too
    # another parent on the schedule later: the run keeps the one it began with
    db.execute("UPDATE dispatch.schedules SET traceparent = NULL WHERE id = %s", (sid,))
    release(db, "w", first)
    ((run_id, again),) = traceparents(db).items()
    assert again[3:35] == tp[3:35] and again[36:52] != tp[36:52]
    assert {p for (p,) in db.execute("SELECT parent_span_id FROM dispatch.run_trace(%s)", (run_id,))} == {
        "00f067aa0ba902b7"}


def test_run_now_continues_the_traceparent_it_is_given(db: psycopg.Connection) -> None:
    sid = add_schedule(db, YEARLY)
    run_id = scalar(db, "SELECT dispatch.run_now(%s, %s)", (sid, PARENT))
    assert traceparents(db)[run_id][3:35] == "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize("value", ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                                   "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                                   "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                                   "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                                   "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"])
def test_a_bad_traceparent_is_refused_naming_the_field(db: psycopg.Connection, value: str) -> None:
    refused = rf"traceparent '{value}' is not a W3C traceparent"
    with pytest.raises(errors.InvalidParameterValue, match=refused):
        add_schedule(db, YEARLY, traceparent=value)
    sid = add_schedule(db, YEARLY)
    with pytest.raises(errors.InvalidParameterValue, match=refused):
        db.execute("UPDATE dispatch.schedules SET traceparent = %s WHERE id = %s", (value, sid))
    with pytest.raises(errors.InvalidParameterValue, match=refused):
        db.execute("SELECT dispatch.run_now(%s, %s)", (sid, value))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request_id=st.one_of(st.uuids().map(lambda u: f"sched_{u}"),
                            st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                                    min_size=1, max_size=40)),
       attempt=st.integers(1, 1000), parent=st.one_of(st.none(), st.just(PARENT)))
def test_the_listener_computes_the_header_as_sql_does(
    db: psycopg.Connection, request_id: str, attempt: int, parent: str | None
) -> None:
    assert tracing.traceparent(request_id, attempt, parent) == scalar(
        db, "SELECT dispatch.traceparent(%s, %s, %s)", (request_id, attempt, parent))


def test_a_request_id_not_of_the_usual_form_gets_a_trace_id_of_its_own() -> None:
    odd = tracing.traceparent("imported-42", 1)
    assert HEADER.fullmatch(odd) and odd[3:35] == hashlib.sha256(b"imported-42").hexdigest()[:32]
    usual = f"sched_{uuid.uuid4()}"
    assert tracing.traceparent(usual, 1)[3:35] == usual[6:].replace("-", "")
