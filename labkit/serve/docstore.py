"""The document store the pre-processing stage calls: a separate process on loopback.

A retrieval service keeps its search index close and its documents in a store across the
network (a database, a blob store, a vector DB). Here the store is a real process that
answers over a real TCP socket: the stage sends the ids of its BM25 candidates and gets
their texts back, one JSON line each way. The store's answer time `delay_s` stands for
the network round trip and the store's own work; it is a stated parameter of the scenario
(`labkit.loadgen.case` derives it from the measured rate), not something hidden.

    with StoreProcess(delay_s=0.02) as store:      # python -m labkit.serve.docstore, in a child
        client = StoreClient(store.address)
        client.fetch([3, 17])                      # -> ["text of 3", "text of 17"], after ~20 ms

`StoreClient` keeps ONE connection and is not safe for concurrent use: two threads that
wrote requests on it at once would read each other's answers, so it refuses a second
caller with RuntimeError("Already borrowed"), as a Hugging Face fast tokenizer does when it
is shared between threads. The two ways out are a lock around it (one request at a time,
the case study's bug) or one client per thread (the fix).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MAX_DELAY_S = 10.0
MAX_LINE = 1 << 20  # bytes: a request or answer line longer than this is refused


def check_delay(delay_s: float) -> float:
    """`delay_s` if it is a number of seconds in [0, MAX_DELAY_S], else ValueError naming it."""
    if not (isinstance(delay_s, (int, float)) and not isinstance(delay_s, bool) and 0 <= delay_s <= MAX_DELAY_S):
        raise ValueError(f"store delay {delay_s!r} is not allowed: seconds in [0, {MAX_DELAY_S:g}]")
    return float(delay_s)


# ------------------------------------------------------------------------------ the store (child process)
def make_server(docs: list[str], delay_s: float, host: str = "127.0.0.1", port: int = 0) -> socketserver.TCPServer:
    """A threaded TCP server: each connection sends lines {"ids": [int, ...]} and gets, `delay_s`
    (s) later, {"passages": [text, ...]} or {"error": "..."} for a bad request."""
    delay_s = check_delay(delay_s)

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for line in iter(lambda: self.rfile.readline(MAX_LINE), b""):
                time.sleep(delay_s)  # the round trip and the store's own work
                try:
                    ids = json.loads(line)["ids"]
                    if not (isinstance(ids, list) and all(isinstance(i, int) and 0 <= i < len(docs) for i in ids)):
                        raise ValueError(f"ids must be a list of integers in 0..{len(docs) - 1}")
                    answer: dict[str, Any] = {"passages": [docs[i] for i in ids]}
                except (ValueError, KeyError, TypeError) as e:
                    answer = {"error": str(e)}
                self.wfile.write(json.dumps(answer).encode() + b"\n")

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads, allow_reuse_address = True, True

    return Server((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    """`python -m labkit.serve.docstore --delay-ms D --port-file F [--n-docs N]`: serve until SIGTERM."""
    p = argparse.ArgumentParser(prog="labkit.serve.docstore", description=__doc__.split("\n\n")[0])
    p.add_argument("--delay-ms", type=float, default=0.0, help="answer time of each request (ms)")
    p.add_argument("--port-file", required=True, help="write the bound port here once listening")
    p.add_argument("--n-docs", type=int, default=None, help="passages in the store (default: the whole corpus)")
    args = p.parse_args(argv)
    from labkit.passages import load_documents  # torch-free: the store starts fast

    docs = load_documents()
    server = make_server(list(docs[:args.n_docs] if args.n_docs else docs), check_delay(args.delay_ms / 1e3))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    Path(args.port_file).write_text(str(server.server_address[1]))
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    return 0


# ------------------------------------------------------------------------------ the parent's side
class StoreProcess:
    """The store in a child process that dies with its parent (Linux: PR_SET_PDEATHSIG).
    `address` is (host, port); `close()` (or leaving `with`) stops it."""

    def __init__(self, delay_s: float = 0.0, n_docs: int | None = None, timeout_s: float = 30.0):
        from labkit.paths import REPO
        from labkit.serve.loading import die_with_parent as _die_with_parent

        self.delay_s = check_delay(delay_s)
        tmp = Path(tempfile.mkdtemp(prefix="labkit-store-"))
        port_file = tmp / "port"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        # Run as a script, not `-m labkit.serve.docstore`: the package's __init__ imports torch (seconds).
        cmd = [sys.executable, str(Path(__file__).resolve()), "--delay-ms", repr(1e3 * self.delay_s),
               "--port-file", str(port_file)] + (["--n-docs", str(n_docs)] if n_docs else [])
        self.log_path = tmp / "store.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the document store did not start (exit {self.proc.returncode}):\n"
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)
        self.address = ("127.0.0.1", int(port_file.read_text()))

    def close(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)

    def __enter__(self) -> "StoreProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StoreClient:
    """One connection to the store. Not safe for concurrent use: a second thread calling
    `fetch` while a call is under way gets RuntimeError("Already borrowed ...")."""

    def __init__(self, address: tuple[str, int], timeout_s: float = 60.0):
        self.sock = socket.create_connection(address, timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")
        self._borrowed = False

    def fetch(self, ids: list[int]) -> list[str]:
        """The passages with these ids, in order (waits for the store's answer on the socket)."""
        if self._borrowed:  # not a lock: this is the check that tells a caller it shared the client
            raise RuntimeError("Already borrowed: StoreClient is in use by another thread; give each thread "
                               "its own client, or serialise the calls")
        self._borrowed = True
        try:
            self.sock.sendall(json.dumps({"ids": list(ids)}).encode() + b"\n")
            line = self.reader.readline(MAX_LINE)
        finally:
            self._borrowed = False
        if not line:
            raise ConnectionError("the document store closed the connection")
        answer = json.loads(line)
        if "error" in answer:
            raise ValueError(f"the document store refused the request: {answer['error']}")
        return answer["passages"]

    def close(self) -> None:
        """Close the connection; a thread blocked reading it gets ConnectionError at once."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked reader (closing the reader would wait for it)
        except OSError:
            pass
        self.sock.close()
        self.reader.close()


if __name__ == "__main__":
    raise SystemExit(main())
