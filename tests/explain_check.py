"""Whether dispatch.explain's verdicts agree with what the next tick and claim actually do.

`explain_agrees` reads every schedule's verdict (the `state` row) and each open run's (the `open
run` rows), then runs dispatch.tick() and dispatch.claim_runs() in the same transaction (one
`now()` for all three: the instants explain compares with are the ones tick and claim use), and
rolls everything back. Used by tests/test_explain.py on each state it builds and by
tests/test_stateful.py on the states the random walk reaches.

A project with a max_concurrency is held to its cap: a run explained `capped` is left by the
claim, one explained `pending` is taken. Two things the tick does first can change that, and
there only what holds whatever it did is checked: a lease of the project that ran out (a place
freed, or a run back in the queue), and a due slot of the project that it marks before the
runs explain saw (an earlier slot takes the room first)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

import psycopg

__all__ = ["explain_agrees"]

# 'infinity': no slot is after it, so the "not run" section costs nothing here
_VERDICTS = """
SELECT s.id::text, e.section, e.item, e.at, e.run_id
FROM dispatch.schedules s CROSS JOIN LATERAL dispatch.explain(s.id, 'infinity') e
WHERE e.section IN ('state', 'open run') AND s.id::text <> ALL (%s::text[])
"""
_RUNS = """
SELECT r.id, r.schedule_id::text, r.kind, r.status, r.not_before = 'infinity' AS waits, r.scheduled_for,
       r.project_id, r.status = 'pending' AND (r.not_before IS NULL OR r.not_before <= now()) AS claimable
FROM dispatch.runs r WHERE r.status IN ('pending', 'running') OR r.id = ANY (%s::bigint[]) OR r.id > %s
"""
_CAPPED = "SELECT project_id FROM dispatch.projects WHERE max_concurrency IS NOT NULL"
STOPPED = ("paused", "disabled", "deleted")
# what the claim does with an open run, by its verdict: "claimed", "ended", or left as it is
# ("breaker": held by its function's open breaker, unless the claim lets it go as the one probe;
# "capped": its project's cap leaves the claim no room for it, or its row is held)
_BY_CLAIM = {"pending": "claimed", "missed": "ended", "late": "ended", "stale": "ended", "breaker": "maybe",
             "capped": "left"}


def explain_agrees(conn: psycopg.Connection, *, skip: Collection[str] = ()) -> Counter[str]:
    """Assert that explain's verdicts hold for the next tick and claim (schedules in `skip` are
    left out: a transaction holds them). `conn` is an autocommit superuser session; nothing it
    does here stays. Returns the verdicts it checked, by section and item."""
    seen: Counter[str] = Counter()
    with conn.transaction(force_rollback=True):
        verdicts = conn.execute(_VERDICTS, (list(skip),)).fetchall()
        last_id: int = conn.execute("SELECT coalesce(max(id), 0) FROM dispatch.runs").fetchone()[0]  # type: ignore[index]
        state = {sid: (item, at, run_id) for sid, section, item, at, run_id in verdicts if section == "state"}
        open_runs = {run_id: (sid, item)
                     for sid, section, item, _, run_id in verdicts if section == "open run"}
        before = {row[0]: row for row in conn.execute(_RUNS, (list(open_runs), last_id)).fetchall()}
        capped = {project for (project,) in conn.execute(_CAPPED)}

        now, last_audit = conn.execute(
            "SELECT now(), (SELECT coalesce(max(id), 0) FROM dispatch.audit_log)").fetchone()  # type: ignore[misc]
        conn.execute("SELECT dispatch.tick()")
        calendar_gaps = dict(conn.execute(
            "SELECT metadata->>'scheduleId', (metadata->>'first')::timestamptz FROM dispatch.audit_log"
            " WHERE id > %s AND action = 'schedule.slots.skipped' AND metadata->>'reason' = 'calendar'",
            (last_audit,)).fetchall())
        ticked = {row[0]: row for row in conn.execute(_RUNS, (list(open_runs), last_id)).fetchall()}
        claimed = {run_id for (run_id,) in conn.execute(
            "SELECT run_id FROM dispatch.claim_runs('explain-check', 100000, '1 hour')")}
        after = {row[0]: row for row in conn.execute(_RUNS, (list(open_runs), last_id)).fetchall()}

    # A run whose lease ran out goes back to pending (attempts left) or ends lost in the tick.
    for run_id, (_, item) in open_runs.items():
        if item == "expired":
            assert ticked[run_id][3] in ("pending", "lost"), f"{run_id}: lease ran out: {ticked[run_id]}"
    # What the tick does to an open run (that one, or a lease that runs out between explain's
    # now() and the tick's clock) changes what follows for its schedule (a lost run's follow-up
    # lets the next one go): there only the verdicts that hold whatever it did are checked.
    disturbed = {sid for run_id, (sid, _) in open_runs.items() if ticked[run_id][3] != before[run_id][3]}
    # In a capped project, that changes what the claim takes of every schedule of the project.
    shaken = {before[run_id][6] for run_id, (sid, _) in open_runs.items() if sid in disturbed} & capped
    disturbed |= {sid for run_id, (sid, _) in open_runs.items() if before[run_id][6] in shaken}
    new = {run_id: row for run_id, row in ticked.items() if run_id > last_id}
    # capped projects in which the tick marked a run the claim may take: it may come first
    crowded = {row[6] for row in new.values() if row[7]} & capped
    for sid, (item, at, _run_id) in state.items():
        seen[f"state {item}"] += 1
        claimed_here = {r for r in claimed if after[r][1] == sid}
        if item in STOPPED:
            assert not claimed_here, f"schedule {sid} is {item}, yet the claim took {claimed_here}"
            assert not [r for r in new.values() if r[1] == sid], f"schedule {sid} is {item}: the tick marked"
        if sid in disturbed:
            continue
        # the tick marks a run to go (not one waiting behind the open run) exactly when explain
        # says "due", and the slot it said
        marked = sorted(r[5] for r in new.values()
                        if r[1] == sid and r[2] == "scheduled" and r[3] == "pending" and not r[4])
        if item == "due":
            assert marked and marked[0] == at, f"{sid}: explain said {at} is due; the tick marked {marked}"
        elif item == "excluded" and at <= now:
            # a slot in a period of its calendar, due: the tick passes over the period from it
            assert not marked and calendar_gaps.get(sid) == at, \
                f"{sid}: explain said {at} excluded; the tick marked {marked}, gap {calendar_gaps.get(sid)}"
        else:
            assert not marked, f"schedule {sid}: explain said {item}, yet the tick marked {marked}"
        # the claim takes exactly the open runs explain said it takes, and ends those it said
        for run_id, (run_sid, run_item) in open_runs.items():
            if run_sid != sid:
                continue
            expected = _BY_CLAIM.get(run_item, "left")
            status = after[run_id][3]
            overtaken = before[run_id][6] in crowded and status == before[run_id][3]
            if expected in ("claimed", "ended") and overtaken:
                seen[f"open run {run_item} overtaken"] += 1  # by a run the tick marked: it took the room
                continue
            if expected == "claimed":
                assert run_id in claimed, f"run {run_id}: explain said the claim takes it; it is {status}"
            elif expected == "maybe":
                assert status in ("pending", "running"), \
                    f"run {run_id}: explain said {run_item} (held, or the probe); it is {status}"
            elif expected == "ended":
                assert run_id not in claimed and status not in ("pending", "running"), \
                    f"run {run_id}: explain said {run_item}, so the claim ends it; it is {status}"
            else:
                assert run_id not in claimed and status == before[run_id][3], \
                    f"run {run_id}: explain said {run_item}; the claim took it or changed it ({status})"
        named = {r for r, (s, i) in open_runs.items() if s == sid and i in ("pending", "breaker")}
        assert claimed_here <= named | set(new), f"schedule {sid}: the claim took {claimed_here - named}"
    seen.update(f"open run {item}" for _, item in open_runs.values())
    return seen

