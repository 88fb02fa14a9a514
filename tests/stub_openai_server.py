"""A stub OpenAI-compatible completions server for the load generator's tests.

It generates no text: it answers `/v1/completions` with `max_tokens` fake tokens, the first
after `ttft_s` and the rest every `token_s` seconds, and reports usage (prompt tokens =
words in the prompt). Requests beyond `max_inflight` get 429 with Retry-After. It counts
what it saw (started, completed, client disconnects, the most in flight at once) so tests
can check the load generator's behaviour from the server's side. Runs its own event loop
in a thread, on a free loopback port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

from aiohttp import web


class StubServer:
    def __init__(self, ttft_s: float = 0.01, token_s: float = 0.002, max_inflight: int = 1000,
                 max_tokens_limit: int = 4096):
        self.ttft_s, self.token_s = ttft_s, token_s
        self.max_inflight, self.max_tokens_limit = max_inflight, max_tokens_limit
        self.inflight = self.peak_inflight = self.started = self.completed = self.disconnected = 0
        self.rejected = 0
        self.bodies: list[dict] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # ------------------------------------------------------------------ handlers

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "malformed JSON", "param": None}}, status=400)
        self.bodies.append(body)
        n = body.get("max_tokens", 16)
        if not isinstance(n, int) or not 1 <= n <= self.max_tokens_limit:
            return web.json_response({"error": {"message": f"max_tokens must be in [1, {self.max_tokens_limit}]",
                                                "param": "max_tokens"}}, status=400)
        if self.inflight >= self.max_inflight:
            self.rejected += 1
            return web.json_response({"error": {"message": "queue full"}}, status=429,
                                     headers={"Retry-After": "1"})
        prompt_tokens = len(str(body.get("prompt", "")).split())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        self.started += 1
        try:
            if not body.get("stream"):
                await asyncio.sleep(self.ttft_s + (n - 1) * self.token_s)
                self.completed += 1
                return web.json_response({"id": "cmpl-stub", "object": "text_completion", "model": "stub-model",
                                          "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}],
                                          "usage": usage})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(self.ttft_s)
            for i in range(n):
                if i:
                    await asyncio.sleep(self.token_s)
                chunk = {"id": "cmpl-stub", "object": "text_completion", "model": "stub-model",
                         "choices": [{"index": 0, "text": " tok", "finish_reason": "length" if i == n - 1 else None}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            self.completed += 1
            return resp
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnected += 1  # the client went away mid-stream
            raise
        finally:
            self.inflight -= 1

    # ------------------------------------------------------------------ lifecycle

    def _serve(self, port: int) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def __enter__(self) -> "StubServer":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._serve, args=(port,), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start within 10 s")
        return self

    def wait_idle(self, timeout_s: float = 5.0) -> None:
        """Wait until the server has no request in flight (disconnects are noticed asynchronously)."""
        end = time.perf_counter() + timeout_s
        while self.inflight and time.perf_counter() < end:
            time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
