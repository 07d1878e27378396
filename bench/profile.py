"""Where a listener's CPU goes: py-spy sampling a live listener process, summarised by the
code that was running (its own frame) grouped into the parts of the stack. py-spy samples the
Python threads only: the HTTP client's own thread (pyreqwest's, in Rust) is in the process's
CPU figures, not in these shares."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import TracebackType

__all__ = ["PySpy", "summarize"]

# A sample is charged to the first part whose marker appears in its innermost frame's file.
PARTS = [
    ("HTTP client, its Python side", ("pyreqwest/", "aiohttp/", "yarl/", "multidict/")),
    ("psycopg (claims, completions)", ("psycopg/", "psycopg_pool/", "psycopg_binary/")),
    ("pgdispatch", ("dispatcher/",)),
    ("json, hmac", ("json/", "hmac.py", "hashlib")),
    ("asyncio event loop", ("asyncio/", "selectors.py")),
]


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("bench: py-spy is not installed (pip install -e '.[bench]'; scripts/bench does it)")
    return found


class PySpy:
    """`py-spy record` on `pid` while the block runs, raw (collapsed stacks) into `output`."""

    def __init__(self, pid: int, output: Path, rate: int = 250) -> None:
        self.output = output
        self._argv = [_py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
                      "--output", str(output), "--nonblocking"]
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PySpy:
        self._process = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        _, stderr = self._process.communicate(timeout=60)
        if not self.output.exists():
            raise SystemExit(f"bench: py-spy wrote no profile: {stderr.decode(errors='replace')[-500:]}")


def summarize(raw: Path, top: int = 8) -> str:
    """Share of samples by part of the stack, and the busiest own frames."""
    parts: Counter[str] = Counter()
    frames: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        innermost = stack.rsplit(";", 1)[-1]
        frames[innermost] += n
        if "select (selectors.py" in innermost:
            parts["idle (waiting in epoll)"] += n
            continue
        parts[next((name for name, markers in PARTS if any(m in innermost for m in markers)), "other")] += n
    if not total:
        return "    (no samples)"
    lines = [f"    {share / total:6.1%}  {name}" for name, share in parts.most_common()]
    lines.append("    busiest frames (own time):")
    lines += [f"    {share / total:6.1%}  {frame[:120]}" for frame, share in frames.most_common(top)]
    return "\n".join(lines)
