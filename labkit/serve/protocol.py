"""OpenAI `/v1/completions` wire format: request validation, response and stream chunks,
and incremental detokenization.

Validation is strict and names the field: a bad type, a value out of range, an unknown
field, or an OpenAI field this server does not implement (with a non-default value)
is a `BadRequest` (HTTP 400), never silently ignored.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import time
import uuid
from typing import Any

# OpenAI fields accepted only at their default (this server does not implement them).
UNSUPPORTED_DEFAULTS = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "stop": None, "suffix": None,
                        "logit_bias": None, "presence_penalty": 0, "frequency_penalty": 0}


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400); `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status

    def body(self) -> dict[str, Any]:
        return error_body(str(self), "invalid_request_error", self.param)


def error_body(message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


@dataclasses.dataclass
class CompletionRequest:
    """A validated request. `prompt` is text or token ids."""

    prompt: str | list[int]
    model: str | None = None
    max_tokens: int = 16  # OpenAI's default for completions
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    ignore_eos: bool = False

    def cache_params(self) -> dict[str, Any]:
        """What, besides the prompt, decides the answer (the result cache's key)."""
        return dict(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                    top_k=self.top_k, seed=self.seed, ignore_eos=self.ignore_eos)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}", "body") from None


def parse_completion(payload: Any) -> CompletionRequest:
    """Check a decoded JSON body against the completions schema; BadRequest names the field."""
    if not isinstance(payload, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(payload).__name__}", "body")
    known = {f.name for f in dataclasses.fields(CompletionRequest)} - {"include_usage"} | {"stream_options"}
    for key, value in payload.items():
        if key in UNSUPPORTED_DEFAULTS:
            if value != UNSUPPORTED_DEFAULTS[key] and value is not None:
                raise BadRequest(f"'{key}' is not supported by this server (only {UNSUPPORTED_DEFAULTS[key]!r})",
                                 key)
        elif key not in known:
            raise BadRequest(f"unknown field '{key}'; allowed: {', '.join(sorted(known))}", key)
    if "prompt" not in payload:
        raise BadRequest("'prompt' is required (a string or a list of token ids)", "prompt")
    prompt = payload["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # OpenAI accepts a batch of one string
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(_is_int(t) for t in prompt))):
        raise BadRequest("'prompt' must be a string or a list of token ids (batches of prompts are not "
                         "supported)", "prompt")
    req = CompletionRequest(prompt=prompt if isinstance(prompt, str) else [int(t) for t in prompt])

    def get(key: str, ok, what: str) -> None:
        v = payload.get(key)
        if v is None:
            return
        if not ok(v):
            raise BadRequest(f"'{key}' must be {what}, got {v!r}", key)
        setattr(req, key, v)

    get("model", lambda v: isinstance(v, str), "a string")
    get("max_tokens", lambda v: _is_int(v) and v >= 1, "an integer >= 1")
    get("temperature", lambda v: _is_num(v) and 0 <= v <= 2, "a number in [0, 2]")
    get("top_p", lambda v: _is_num(v) and 0 < v <= 1, "a number in (0, 1]")
    get("top_k", lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 = off)")
    get("seed", _is_int, "an integer")
    get("stream", lambda v: isinstance(v, bool), "true or false")
    get("user", lambda v: isinstance(v, str), "a string")
    get("ignore_eos", lambda v: isinstance(v, bool), "true or false")
    opts = payload.get("stream_options")
    if opts is not None:
        if not (isinstance(opts, dict) and set(opts) <= {"include_usage"}
                and isinstance(opts.get("include_usage", False), bool)):
            raise BadRequest(f"'stream_options' must be {{\"include_usage\": true|false}}, got {opts!r}",
                             "stream_options")
        if not req.stream:
            raise BadRequest("'stream_options' is only allowed with 'stream': true", "stream_options")
        req.include_usage = opts.get("include_usage", False)
    req.temperature, req.top_p = float(req.temperature), float(req.top_p)
    return req


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Reply:
    """Builds the response objects of one completion (same id and `created` throughout)."""

    def __init__(self, model: str):
        self.id, self.model, self.created = f"cmpl-{uuid.uuid4().hex}", model, int(time.time())

    def _obj(self, choices: list[dict[str, Any]], usage_: dict[str, int] | None) -> dict[str, Any]:
        out = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
               "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def full(self, text: str, finish_reason: str, usage_: dict[str, int]) -> dict[str, Any]:
        return self._obj([{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}], usage_)

    def chunk(self, text: str, finish_reason: str | None = None) -> bytes:
        return sse(self._obj([{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}], None))

    def usage_chunk(self, usage_: dict[str, int]) -> bytes:
        return sse(self._obj([], usage_))


def sse(obj: Any) -> bytes:
    """One server-sent event carrying `obj` as JSON (or the literal [DONE])."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class Detokenizer:
    """Text of a growing token sequence, released piece by piece.

    Byte-level BPE can split one UTF-8 character over several tokens, so decoding token
    by token would emit replacement characters. As vLLM does, decode a short window and
    hold text back while it ends in an incomplete character."""

    def __init__(self, tokenizer: Any, skip: set[int] = frozenset()):
        self.tok, self.skip = tokenizer, skip
        self.ids: list[int] = []
        self.prefix = self.read = 0  # window start; tokens already turned into text

    def add(self, token: int) -> str:
        """Append `token`; return the new text it completes (maybe "")."""
        if token in self.skip:
            return ""
        self.ids.append(token)
        before = self.tok.decode(self.ids[self.prefix: self.read])
        now = self.tok.decode(self.ids[self.prefix:])
        if now.endswith("\ufffd") or len(now) <= len(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return now[len(before):]

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the very end, as U+FFFD)."""
        rest = self.tok.decode(self.ids[self.prefix:])[len(self.tok.decode(self.ids[self.prefix: self.read])):]
        self.prefix = self.read = len(self.ids)
        return rest
