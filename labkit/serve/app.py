"""The HTTP side: a FastAPI app over an engine that steps in a process of its own
(`labkit.serve.core`, the default) or in a thread of this one (`--engine inproc`).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (OpenAI-compatible,
streaming as server-sent events or not, with `usage`, stop strings, logprobs), ``GET /health``,
``GET /metrics`` (Prometheus text), ``GET /v1/models``; `labkit.serve.surface` adds the API
key, content-type and body-size guard, JSON errors, /tokenize, /detokenize, /version.

The engine side (the in-process thread, or the thread that reads the engine process's pipe)
hands each step's events to the event loop with one ``call_soon_threadsafe``; each request
reads its own asyncio queue. A client that goes away (stream cancelled by Starlette, or a
non-streaming request whose connection drops) cancels its sequence, which frees its KV
blocks at the engine's next step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.background import BackgroundTask

from labkit.serve import protocol, spans, surface
from labkit.serve.engine import Engine, EngineClosed, Event, InvalidRequest, QueueFull
from labkit.serve.protocol import BadRequest, CompletionRequest, Reply

log = logging.getLogger("labkit.serve")
RETRY_AFTER_S = 1  # what a 429 tells the client to wait (s)


def tenant_of(request: Request, req: CompletionRequest) -> str:
    """Whose cache entries a request may see: the bearer API key, else `user`, else anonymous."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and auth[7:].strip():
        return "key:" + auth[7:].strip()
    return "user:" + req.user if req.user else "anonymous"


class Service:
    """What the handlers share: engine, tokenizer, model name, optional result cache, and the
    optional pre-processing stage (`labkit.serve.preprocess.Stage`) that text prompts of
    /v1/completions go through."""

    def __init__(self, engine: Engine, tokenizer: Any, model_name: str, cache: Any = None, stage: Any = None):
        self.engine, self.tok, self.model_name, self.cache, self.stage = engine, tokenizer, model_name, cache, stage
        self.metrics = engine.metrics
        self.metrics.model_name = model_name
        self.preparing = 0  # requests in tokenization / the pre-processing stage (event-loop thread only)
        self.on_finish: dict[Any, Callable[[], None]] = {}  # engine request -> what its end releases (event loop)
        self.loop: asyncio.AbstractEventLoop | None = None
        engine.listener = self._from_engine

    # engine thread -> event loop
    def _from_engine(self, events: list[Event]) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._dispatch, events)

    def _dispatch(self, events: list[Event]) -> None:
        for req, kind, value in events:
            req.tag.put_nowait((kind, value))
            if kind == "finish" and req in self.on_finish:
                self.on_finish.pop(req)()

    async def cache_call(self, method: str, *args: Any) -> Any:
        """`cache.get` / `cache.put` off the event loop (a semantic cache embeds the prompt);
        a failing cache is logged and treated as a miss, never fails the request."""
        if self.cache is None:
            return None
        try:
            return await asyncio.to_thread(getattr(self.cache, method), *args)
        except Exception:
            log.exception("result cache %s failed; answering without it", method)
            return None

    async def prompt_ids(self, req: CompletionRequest) -> tuple[list[int], dict[str, float], Callable[[], None]]:
        """The prompt's token ids, built off the event loop (tokenizing a large prompt, or the
        pre-processing stage, must not stall other streams), the spans (s) it took:
        "preprocess" (the stage, waiting for a worker thread included, with its parts
        "stage_queue" and "stage_lock": see `labkit.serve.spans`) or "tokenize", and `done`,
        to call once the request has ended (the stage may hold shared state until then). Raises
        InvalidRequest (naming the field) when the engine could not serve them as asked."""
        use_stage = self.stage is not None and isinstance(req.prompt, str) and not req.chat

        def build() -> tuple[list[int], Callable[[], None], dict[str, float]]:
            if use_stage:
                started = time.monotonic()
                ids, info, done = self.stage.begin(req.prompt)
                return ids, done, {"stage_queue": started - t0, **{k: v for k, v in info.items() if k.startswith("stage_")}}
            return (self.tok.encode(req.prompt) if isinstance(req.prompt, str) else req.prompt), _nothing, {}

        t0 = time.monotonic()
        self.preparing += 1
        try:
            pool = self.stage.pool if use_stage else None  # None: asyncio's default worker threads
            job = asyncio.get_running_loop().run_in_executor(pool, build)
            try:
                ids, done, waits = await asyncio.shield(job)
            except asyncio.CancelledError:  # the client left: the stage still finishes, then releases
                job.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result()[1]())
                raise
        finally:
            self.preparing -= 1
        took = time.monotonic() - t0
        if use_stage:
            self.metrics.observe(preprocess=took)
        # The engine's checks, before any model work (max_tokens 0: the prompt alone, as chat fills it
        # in surface.prepare and an echo-only request never reaches the engine).
        try:
            self.engine.check(ids, req.max_tokens or None)
        except BaseException:
            done()
            raise
        return ids, ({"preprocess": took, **waits} if use_stage else {"tokenize": took}), done

    def waiting(self) -> int:
        """Requests waiting: in pre-processing or tokenization, or queued for the engine."""
        return self.preparing + self.engine.queue_depth


def create_app(service: Service) -> FastAPI:
    app = FastAPI(title="labkit serve", docs_url=None, redoc_url=None, openapi_url=None)
    surface.install(app, service)
    engine, metrics = service.engine, service.metrics

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.failure:  # the engine core process died (labkit.serve.core): say why
            return JSONResponse({"status": "engine failed", "error": engine.failure}, status_code=503)
        if engine.closing:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(engine.gauges()), media_type="text/plain; version=0.0.4")

    @app.get("/debug/stacks")
    async def stacks(seconds: float = 2.0, hz: float = 100.0) -> JSONResponse:
        """Sample the server's threads for `seconds` (s) at `hz` (`labkit.serve.stacks`)."""
        from labkit.serve import stacks as _stacks

        try:
            return JSONResponse(await asyncio.to_thread(_stacks.sample, seconds, hz))
        except ValueError as e:
            field = "seconds" if "seconds" in str(e) else "hz"
            return JSONResponse(protocol.error_body(str(e), "invalid_request_error", field), status_code=400)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "owned_by": "labkit",
                                            "max_model_len": engine.cfg.max_model_len}]}

    @app.post("/v1/chat/completions")
    @app.post("/v1/completions")
    async def completions(request: Request):
        t0 = time.monotonic()
        service.loop = service.loop or asyncio.get_running_loop()
        if service.waiting() >= engine.cfg.max_queue:  # bound the whole wait, pre-processing included
            metrics.count("rejected")
            return JSONResponse(protocol.error_body(f"queue full ({engine.cfg.max_queue} requests waiting)",
                                                    "rate_limit_error"), status_code=429,
                                headers={"Retry-After": str(RETRY_AFTER_S)})
        try:
            req = protocol.parse_request(request.url.path, await request.body(), service.model_name)
            ids, before, done = await service.prompt_ids(req)
        except BadRequest as e:
            metrics.count("invalid")
            return JSONResponse(e.body(), status_code=e.status)
        except InvalidRequest as e:
            metrics.count("invalid")
            return _invalid(e)
        try:
            return await answer(request, req, t0, ids, before, done)
        finally:
            if not any(f is done for f in service.on_finish.values()):
                done()  # ended before the engine took it (error, cache hit, echo), or the engine ended it

    async def answer(request: Request, req: protocol.CompletionRequest, t0: float, ids: list[int],
                     before: dict[str, float], done: Callable[[], None]):
        """Everything after the prompt: echo, the result cache, the engine, the response. Once the
        engine has the request, `done` runs when the engine finishes it (`Service._dispatch`)."""
        reply = Reply(service.model_name, req, ids, service.tok)
        early = await surface.prepare(service, req, ids, reply)  # echo logprobs; max_tokens 0 ends here
        if early is not None:
            return early
        tenant = tenant_of(request, req)
        text = await service.cache_call("get", tenant, _text(req.prompt, service.tok), req.cache_params()) \
            if req.cacheable else None
        if text is not None:
            metrics.add("cache_hits")
            return _cached(req, reply, ids, text, service.tok, lambda: spans.request_spans(t0, before, None,
                                                                                          time.monotonic()))
        queue: asyncio.Queue = asyncio.Queue()
        try:
            handle = engine.submit(ids, req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                                   top_k=req.top_k, seed=req.seed, ignore_eos=req.ignore_eos, arrival=t0, tag=queue,
                                   logprobs=req.logprobs)
        except QueueFull as e:
            metrics.count("rejected")
            return JSONResponse(protocol.error_body(str(e), "rate_limit_error"), status_code=429,
                                headers={"Retry-After": str(RETRY_AFTER_S)})
        except EngineClosed as e:
            metrics.count("rejected")
            return JSONResponse(protocol.error_body(str(e), "service_unavailable"), status_code=503,
                                headers={"Retry-After": str(RETRY_AFTER_S)})
        except InvalidRequest as e:
            metrics.count("invalid")
            return _invalid(e)
        service.on_finish[handle] = done  # no await since submit: the finish event cannot have run yet
        detok = protocol.Output(service.tok, req, reply, handle, skip={engine.cfg.eos_id})
        reply.spans = lambda: spans.request_spans(t0, before, handle, time.monotonic())

        async def store(text: str) -> None:
            await service.cache_call("put", tenant, _text(req.prompt, service.tok), req.cache_params(), text)

        if req.stream:
            return StreamingResponse(_stream(engine, handle, queue, req, reply, detok, store),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _complete(engine, handle, queue, request, reply, detok, store)

    return app


def _invalid(e: InvalidRequest) -> JSONResponse:
    """The engine's refusal as OpenAI's 400 error naming the field."""
    return JSONResponse(protocol.error_body(str(e), "invalid_request_error", e.field), status_code=400)


def _full(reply: Reply, text: str, reason: str, use: dict[str, int], **kw: Any) -> JSONResponse:
    """A whole (non-streaming) answer with its spans in the body and the X-Labkit-Spans header."""
    body = reply.full(text, reason, use)
    return JSONResponse(body, headers={spans.HEADER: spans.header_value(body[spans.FIELD])}, **kw)


def _text(prompt: str | list[int], tok: Any) -> str:
    return prompt if isinstance(prompt, str) else tok.decode(prompt)


def _cached(req: CompletionRequest, reply: Reply, ids: list[int], text: str, tok: Any, spans_now):
    """A cache hit, answered in the request's form; completion tokens are the answer's real ids."""
    n = len(tok.encode(text))
    use = protocol.usage(len(ids), n)
    reason = "length" if n >= req.max_tokens else "stop"  # the cache keeps text, not the reason
    reply.spans = spans_now
    if not req.stream:
        return _full(reply, text, reason, use)

    async def events() -> AsyncIterator[bytes]:
        yield reply.chunk(text)
        yield reply.chunk("", reason, last=not req.include_usage)
        if req.include_usage:
            yield reply.usage_chunk(use)
        yield protocol.sse("[DONE]")
    return StreamingResponse(events(), media_type="text/event-stream")


async def _stream(engine: Engine, handle, queue: asyncio.Queue, req: CompletionRequest, reply: Reply,
                  detok: protocol.Output, store) -> AsyncIterator[bytes]:
    """SSE chunks: one per token that completes text, a final one with finish_reason, usage if
    asked, then [DONE]; an engine error becomes an error event. If Starlette cancels this
    generator (the client disconnected), the `finally` cancels the sequence."""
    text: list[str] = []
    try:
        while True:
            kind, value = await queue.get()
            if kind == "token":
                piece = detok.add(value)
                if piece:
                    text.append(piece)
                    yield reply.chunk(piece)
                if not detok.stopped:
                    continue
                engine.cancel(handle, "stop")  # a stop string ended it: free its blocks now
                value = "stop"
            if value in ("stop", "length"):
                rest = detok.flush()
                text.append(rest)
                yield reply.chunk(rest, value, last=not req.include_usage)
                if req.include_usage:
                    yield reply.usage_chunk(protocol.usage(handle.prompt, detok.n))
                yield protocol.sse("[DONE]")
                await store("".join(text))
            else:
                yield protocol.sse(protocol.error_body(handle.error or value, "server_error"))
                yield protocol.sse("[DONE]")
            return
    finally:
        if handle.state != "done":
            engine.cancel(handle)


async def _complete(engine: Engine, handle, queue: asyncio.Queue, request: Request, reply: Reply,
                    detok: protocol.Output, store):
    """Wait for the whole completion, or for the client to hang up (then cancel it). A hang-up
    arrives as one more event in the request's queue, so each token costs one `queue.get`,
    not a task and an `asyncio.wait` (the event loop shares the GIL with the engine)."""
    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    watch.add_done_callback(lambda f: f.cancelled() or queue.put_nowait(("disconnect", None)))
    try:
        text: list[str] = []
        while True:
            kind, value = await queue.get()
            if kind == "disconnect":
                engine.cancel(handle)
                return JSONResponse(protocol.error_body("client disconnected", "cancelled"), status_code=499)
            if kind == "token":
                text.append(detok.add(value))
                if not detok.stopped:
                    continue
                engine.cancel(handle, "stop")  # a stop string ended it: free its blocks now
                value = "stop"
            if value in ("stop", "length"):
                text.append(detok.flush())
                answer = "".join(text)
                return _full(reply, answer, value, protocol.usage(handle.prompt, detok.n),
                             background=BackgroundTask(store, answer))  # cached after sending
            else:
                return JSONResponse(protocol.error_body(handle.error or value, "server_error"),
                                    status_code=503 if engine.closing else 500)
    finally:
        watch.cancel()
        if handle.state != "done":
            engine.cancel(handle)


def _nothing() -> None:
    """`done` of a request that holds nothing."""
