"""A sampling profiler of the server's own threads: where is each thread, N times a second?

`sample(seconds, hz)` reads every thread's Python stack (`sys._current_frames`) at `hz`
for `seconds` and counts the innermost frame of each, the way py-spy's "top" view does,
but from inside the process: it needs no ptrace permission, so it works in containers
and CI. A thread blocked in C (waiting for a lock, a socket, a condition) shows the Python
line that made the call, e.g. the ``with self.lock:`` line of a lock it waits for.

Frames where a thread idles (an executor thread waiting for work, the event loop waiting
for sockets) are counted apart as "idle", so the table shows where threads work or wait
for something that matters. A thread blocked reading a socket for an answer (a database, a
document store) is not idle: it waits for a resource, and its line says which labkit call
made the read (" <- serve/docstore.py:... fetch").
"""

from __future__ import annotations

import collections
import linecache
import sys
import threading
import time
from typing import Any

# (file name ends with, function) of frames where a thread waits for work, not for a resource.
IDLE = (("threading.py", "wait"), ("queue.py", "get"), ("selectors.py", "select"),
        ("concurrent/futures/thread.py", "_worker"), ("threading.py", "_wait_for_tstate_lock"),
        # a thread reading the engine process's pipe waits for its next step's outputs
        ("multiprocessing/connection.py", "_recv"), ("multiprocessing/connection.py", "_poll"),
        # the event loop under uvloop: its selector runs in C, so the innermost Python frame is the runner
        ("asyncio/runners.py", "run"))
MAX_SECONDS, MAX_HZ = 30.0, 1000.0


def _one(frame: Any) -> str:
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    name = code.co_filename.replace("\\", "/")
    short = name.split("/labkit/")[-1] if "/labkit/" in name else name.rsplit("/", 1)[-1]
    return f"{short}:{frame.f_lineno} {code.co_name}: {line}"


def _ours(frame: Any) -> bool:
    return "/labkit/" in frame.f_code.co_filename.replace("\\", "/")


def _where(frame: Any) -> str:
    """The innermost frame; when it is outside labkit (a socket read, a library call), the
    nearest labkit frame that led there too, after " <- " (which of our lines is waiting)."""
    here = _one(frame)
    if _ours(frame):
        return here
    caller = frame.f_back
    while caller is not None and not _ours(caller):
        caller = caller.f_back
    return here if caller is None else f"{here} <- {_one(caller)}"


def _idle(frame: Any) -> bool:
    name = frame.f_code.co_filename.replace("\\", "/")
    return any(name.endswith(f) and frame.f_code.co_name == fn for f, fn in IDLE)


def sample(seconds: float = 2.0, hz: float = 100.0) -> dict[str, Any]:
    """Sample every other thread's innermost frame `hz` times a second for `seconds` (s).

    Returns {"samples": thread samples taken, "idle": how many of them idled, "top":
    [{"frame": "file:line function: source", "samples": n, "share": n / busy samples,
    "threads": thread names}], best first}. ValueError for seconds outside (0, 30] or hz
    outside (0, 1000]."""
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must lie in (0, {MAX_SECONDS:g}], got {seconds!r}")
    if not 0 < hz <= MAX_HZ:
        raise ValueError(f"hz must lie in (0, {MAX_HZ:g}], got {hz!r}")
    me = threading.get_ident()
    counts: collections.Counter[str] = collections.Counter()
    who: dict[str, set[str]] = collections.defaultdict(set)
    total = idle = 0
    end, period = time.monotonic() + seconds, 1.0 / hz
    while time.monotonic() < end:
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            total += 1
            if _idle(frame):
                idle += 1
                continue
            where = _where(frame)
            counts[where] += 1
            who[where].add(names.get(ident, str(ident)))
        time.sleep(period)
    busy = max(1, total - idle)
    top = [{"frame": f, "samples": n, "share": n / busy, "threads": sorted(who[f])} for f, n in counts.most_common(15)]
    return {"samples": total, "idle": idle, "top": top}
