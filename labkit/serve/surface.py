"""The server's HTTP surface around the completion handler: what real clients (the openai SDK,
guidellm, lm-eval-harness, LangChain, a browser tab) meet before and beside it.

* `Guard` (ASGI middleware): the API key (401), ``Content-Type: application/json`` on every
  POST (415: a web page can then only reach the local server after a CORS preflight, which
  it does not get), and the request-body limit (413). A body announced larger than
  `max_body_bytes` is refused from its headers, before one byte of it is read; a chunked
  body is counted as it arrives and refused once it passes the limit.
* JSON errors in OpenAI's shape for every failure: unknown path (404), wrong method (405),
  anything unexpected (500), never Starlette's plain text.
* ``GET /version``, ``GET /v1/models/{id}``, ``POST /tokenize``, ``POST /detokenize`` (vLLM's).
* `prepare()`: the steps between parsing and the engine: chat's default max_tokens, the
  prompt's logprobs for echo (a model pass, off the event loop), and the answer to
  ``max_tokens: 0`` (lm-eval's loglikelihood requests), which never reaches the engine.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import labkit
from labkit.serve import protocol
from labkit.serve.logprobs import prompt_logprobs
from labkit.serve.protocol import BadRequest, CompletionRequest, Reply

OPEN_PATHS = ("/health", "/metrics", "/version")  # answered without the API key (probes, scrapers)
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: ~250k tokens of text, far past any max_model_len here


class BodyTooLarge(BadRequest):
    """HTTP 413: the request body passes the server's limit."""

    def __init__(self, limit: int, size: int | None = None):
        what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
        super().__init__(f"request body is {what}; at most {limit} bytes allowed (--max-body-bytes)", "body", 413)


def _error(status: int, message: str, kind: str, param: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, kind, param), status_code=status, headers=headers)


class Guard:
    """ASGI middleware: API key, JSON content type, body limit (see the module docstring)."""

    def __init__(self, app: Any, api_key: str | None, max_body_bytes: int):
        self.app, self.api_key, self.limit = app, api_key, max_body_bytes

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._check(scope, headers)
        if refusal is not None:
            return await refusal(scope, receive, send)
        if scope["method"] == "POST":
            receive = self._counting(receive)
        await self.app(scope, receive, send)

    def _check(self, scope: dict, headers: dict[str, str]) -> JSONResponse | None:
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(given.encode(), self.api_key.encode()):
                return _error(401, "missing or wrong API key: send 'Authorization: Bearer <key>' "
                              "(the key given to labkit serve --api-key)", "authentication_error",
                              headers={"WWW-Authenticate": "Bearer"})
        if scope["method"] != "POST":
            return None
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return _error(415, f"Content-Type must be application/json, got {ctype or 'none'!r}",
                          "invalid_request_error", "content-type")
        size = headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.limit:
            # Refused from the headers: the body is never read, tokenized or held in memory.
            e = BodyTooLarge(self.limit, int(size))
            return JSONResponse(e.body(), status_code=413, headers={"Connection": "close"})
        return None

    def _counting(self, receive: Callable[[], Awaitable[dict]]) -> Callable[[], Awaitable[dict]]:
        """`receive` that raises BodyTooLarge once more than the limit has arrived (chunked bodies)."""
        seen = 0

        async def wrapped() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message
        return wrapped


def install(app: FastAPI, service: Any) -> None:
    """Add the guard, the JSON error handlers and the extra endpoints to `app`. Reads
    `service.api_key` (None: no key) and `service.max_body_bytes` (bytes)."""
    engine = service.engine
    app.add_middleware(Guard, api_key=getattr(service, "api_key", None),
                       max_body_bytes=getattr(service, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = (f"no endpoint {request.method} {request.url.path}; endpoints: "
                       f"{', '.join(sorted({r.path for r in app.routes if hasattr(r, 'methods')}))}")
        elif exc.status_code == 405:
            allowed = sorted({m for r in app.routes if getattr(r, "path", None) == request.url.path
                              for m in getattr(r, "methods", ())})
            message = f"method {request.method} not allowed on {request.url.path}; allowed: {', '.join(allowed)}"
        else:
            message = str(exc.detail)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, message, kind, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        loc = first.get("loc", ())
        return _error(400, f"{first.get('msg', 'invalid request')} at {'.'.join(map(str, loc))}",
                      "invalid_request_error", str(loc[-1]) if loc else None)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal server error: {type(exc).__name__}: {exc}", "server_error")

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": labkit.__version__}

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str) -> JSONResponse:
        if model_id != service.model_name:
            raise protocol.NotFound(f"The model '{model_id}' does not exist; this server serves "
                                    f"'{service.model_name}'", "model")
        return JSONResponse({"id": service.model_name, "object": "model", "owned_by": "labkit",
                             "max_model_len": engine.cfg.max_model_len})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        payload = _object(protocol.parse_json(await request.body()), ("model", "prompt", "messages",
                                                                      "add_special_tokens"))
        _check_model(payload, service.model_name)
        if ("prompt" in payload) == ("messages" in payload):
            raise BadRequest("send exactly one of 'prompt' (a string) or 'messages' (a chat)", "prompt")
        if "messages" in payload:
            text = protocol.parse_chat({"messages": payload["messages"]}).prompt
        elif isinstance(payload["prompt"], str):
            text = payload["prompt"]
        else:
            raise BadRequest(f"'prompt' must be a string, got {type(payload['prompt']).__name__}", "prompt")
        ids = await asyncio.to_thread(service.tok.encode, text)  # CPU work: off the event loop
        return JSONResponse({"count": len(ids), "max_model_len": engine.cfg.max_model_len, "tokens": ids})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        payload = _object(protocol.parse_json(await request.body()), ("model", "tokens"))
        _check_model(payload, service.model_name)
        ids = payload.get("tokens")
        if not (isinstance(ids, list) and all(protocol._is_int(t) and 0 <= t < engine.vocab for t in ids)):
            raise BadRequest(f"'tokens' must be a list of token ids in [0, {engine.vocab})", "tokens")
        return JSONResponse({"prompt": await asyncio.to_thread(service.tok.decode, ids)})


def _object(payload: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(payload).__name__}", "body")
    for key in payload:
        if key not in allowed:
            raise BadRequest(f"unknown field '{key}'; allowed: {', '.join(allowed)}", key)
    return payload


def _check_model(payload: dict[str, Any], name: str) -> None:
    model = payload.get("model")
    if model is not None and model != name:
        raise protocol.NotFound(f"The model '{model}' does not exist; this server serves '{name}'", "model")


async def prepare(service: Any, req: CompletionRequest, ids: list[int], reply: Reply) -> Response | None:
    """Between parsing and the engine: fill chat's default max_tokens (as many as fit), compute
    the prompt's logprobs for echo + logprobs (a model pass, in a worker thread), and answer
    ``max_tokens: 0`` here (nothing to generate). Returns that answer, else None."""
    cfg = service.engine.cfg
    if req.chat and req.max_tokens == 0:
        req.max_tokens = cfg.max_model_len - len(ids)
    if req.echo and req.logprobs is not None:
        reply.prompt_lp = await asyncio.to_thread(prompt_logprobs, service.engine.model, ids, req.logprobs)
    if req.max_tokens > 0:
        return None
    use = protocol.usage(len(ids), 0)
    if not req.stream:
        return JSONResponse(reply.full("", "length", use))

    async def events():
        yield reply.chunk("", "length")
        if req.include_usage:
            yield reply.usage_chunk(use)
        yield protocol.sse("[DONE]")
    return StreamingResponse(events(), media_type="text/event-stream")
