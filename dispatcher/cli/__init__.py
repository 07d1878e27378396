"""The `pgdispatch` command and what operators run from a terminal (see dispatcher/__init__.py).

main          the parser and `main()`, the console script's entry point; `listen` and `install`
admin         `schedules add/update/list/show/enable/disable/delete`, `runs list`
schedule_verbs `schedules pause/resume/run/backfill` (dispatch.pause, resume, run_now, backfill)
schedule_rows one schedule as the commands read it; the database's refusals as one line
durations     `30s`, `5m`, `1h30m` on the command line
doctor        `doctor`: what stands between a deployment and its promises
demo          `demo`: a private PostgreSQL, a function and a listener in one process
demo_function `demo-function`: the demo's function on its own
console       what the commands share: the connection, tables, `--json`, exit statuses
"""

from dispatcher.cli.main import main

__all__ = ["main"]
