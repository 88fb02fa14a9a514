"""OpenAI `/v1/completions` and `/v1/chat/completions` requests: parsing and validation.

Validation is strict and names the field: a bad type, a value out of range, an unknown
field, or an OpenAI field this server does not implement (with a non-default value)
is a `BadRequest` (HTTP 400), never silently ignored.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from typing import Any


# OpenAI fields accepted only at their default (this server does not implement them).
UNSUPPORTED_DEFAULTS = {"n": 1, "best_of": 1, "suffix": None, "logit_bias": None, "presence_penalty": 0,
                        "frequency_penalty": 0}
CHAT_UNSUPPORTED = {"n": 1, "logit_bias": None, "presence_penalty": 0, "frequency_penalty": 0, "tools": None,
                    "tool_choice": "none", "parallel_tool_calls": None, "response_format": {"type": "text"},
                    "functions": None, "function_call": None}
MAX_LOGPROBS = 20  # top alternatives per token one request may ask for (vLLM's default cap)
MAX_STOPS = 4  # stop strings per request (OpenAI's limit)
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # what torch.Generator.manual_seed takes
CHAT_ROLES = ("system", "user", "assistant")


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400); `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status

    def body(self) -> dict[str, Any]:
        return error_body(str(self), "invalid_request_error", self.param)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class NotFound(BadRequest):
    """HTTP 404, e.g. a `model` this server does not serve (as OpenAI and vLLM answer)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param, status=404)

    def body(self) -> dict[str, Any]:
        return error_body(str(self), "invalid_request_error", self.param, "model_not_found")


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
    stop: list[str] = dataclasses.field(default_factory=list)
    logprobs: int | None = None  # top alternatives per token (None: no logprobs)
    echo: bool = False
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage in every chunk
    chat: bool = False  # from /v1/chat/completions: `prompt` is the templated conversation

    @property
    def cacheable(self) -> bool:
        """Whether a result cache may answer it (it keeps text only: no logprobs, no echo)."""
        return self.logprobs is None and not self.echo

    def cache_params(self) -> dict[str, Any]:
        """What, besides the prompt, decides the answer (the result cache's key)."""
        return dict(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                    top_k=self.top_k, seed=self.seed, ignore_eos=self.ignore_eos, stop=self.stop,
                    chat=self.chat)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def parse_json(body: bytes) -> Any:
    """Decode a JSON body. JSON may spell lone UTF-16 surrogates ("\\ud800"), which no UTF-8
    text holds and the tokenizer cannot take: refused here, naming the top-level field."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}", "body") from None
    if isinstance(payload, dict) and b"\\u" in body.lower():  # only an escape can make a surrogate
        for key, value in payload.items():
            try:
                json.dumps([key, value], ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"'{key}' holds a lone UTF-16 surrogate (e.g. \"\\ud800\"), which is not "
                                 "valid Unicode text", key) from None
    return payload


def parse_request(path: str, body: bytes, model_name: str) -> CompletionRequest:
    """Parse the body of POST `path` (/v1/completions or /v1/chat/completions); BadRequest (400)
    names the field, NotFound (404) an unknown `model` (`model_name` is the one served)."""
    payload = parse_json(body)
    req = parse_chat(payload) if path.rstrip("/").endswith("/chat/completions") else parse_completion(payload)
    if req.model is not None and req.model != model_name:
        raise NotFound(f"The model '{req.model}' does not exist; this server serves '{model_name}'", "model")
    return req


def chat_prompt(messages: list[dict[str, str]]) -> str:
    """The plain chat template (the tiny model was trained on prose and has none): each message
    as "<Role>: <content>" on its own paragraph, then "Assistant:" for the model to continue."""
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(turns + ["Assistant:"])


def _content(value: Any, i: int) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise BadRequest(f"'messages[{i}].content' must be a string or a list of text parts "
                     f"({{\"type\": \"text\", \"text\": ...}}; images and audio are not supported)", "messages")


def parse_chat(payload: Any) -> CompletionRequest:
    """Check a /v1/chat/completions body; the conversation becomes the prompt via `chat_prompt`."""
    if not isinstance(payload, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(payload).__name__}", "body")
    msgs = payload.get("messages")
    if not (isinstance(msgs, list) and msgs):
        raise BadRequest("'messages' is required: a non-empty list of {\"role\", \"content\"}", "messages")
    clean = []
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and m.get("role") in CHAT_ROLES and "content" in m):
            raise BadRequest(f"'messages[{i}]' must be {{\"role\": {' | '.join(CHAT_ROLES)}, \"content\": ...}}, "
                             f"got {m!r:.80}", "messages")
        if set(m) - {"role", "content", "name"}:
            raise BadRequest(f"'messages[{i}]' has unknown keys {sorted(set(m) - {'role', 'content', 'name'})}; "
                             "allowed: role, content, name", "messages")
        clean.append({"role": m["role"], "content": _content(m["content"], i)})
    for key, default in CHAT_UNSUPPORTED.items():
        if payload.get(key) not in (None, default):
            raise BadRequest(f"'{key}' is not supported by this server (only {default!r})", key)
    rest = {k: v for k, v in payload.items() if k not in CHAT_UNSUPPORTED and k != "messages"}
    if "max_completion_tokens" in rest:  # the newer name of max_tokens in chat
        mct = rest.pop("max_completion_tokens")
        if mct is not None:
            if rest.get("max_tokens") not in (None, mct):
                raise BadRequest("'max_tokens' and 'max_completion_tokens' disagree; send one", "max_tokens")
            rest["max_tokens"] = mct
    top = rest.pop("top_logprobs", None)
    lp = rest.pop("logprobs", None)
    if lp is not None and not isinstance(lp, bool):
        raise BadRequest(f"'logprobs' must be true or false in chat, got {lp!r}", "logprobs")
    if top is not None and not (_is_int(top) and 0 <= top <= MAX_LOGPROBS):
        raise BadRequest(f"'top_logprobs' must be an integer in [0, {MAX_LOGPROBS}], got {top!r}", "top_logprobs")
    if top is not None and not lp:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if "echo" in rest or "prompt" in rest:
        key = "echo" if "echo" in rest else "prompt"
        raise BadRequest(f"unknown field '{key}' in chat; use /v1/completions for it", key)
    req = parse_completion(dict(rest, prompt=chat_prompt(clean)), default_max=None)
    req.chat, req.logprobs = True, (top or 0) if lp else None
    return req


def parse_completion(payload: Any, default_max: int | None = 16) -> CompletionRequest:
    """Check a decoded JSON body against the completions schema; BadRequest names the field.
    `default_max`: max_tokens when none is given (OpenAI's 16; None: as many as fit, chat's)."""
    if not isinstance(payload, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(payload).__name__}", "body")
    known = ({f.name for f in dataclasses.fields(CompletionRequest)} - {"include_usage", "continuous_usage", "chat"}
             | {"stream_options"})
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
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # OpenAI accepts a batch of one string (lm-eval sends one list of token ids)
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(_is_int(t) for t in prompt))):
        raise BadRequest("'prompt' must be a string or a list of token ids (batches of prompts are not "
                         "supported)", "prompt")
    req = CompletionRequest(prompt=prompt if isinstance(prompt, str) else [int(t) for t in prompt],
                            max_tokens=default_max or 0)

    def get(key: str, ok, what: str) -> None:
        v = payload.get(key)
        if v is None:
            return
        if not ok(v):
            raise BadRequest(f"'{key}' must be {what}, got {v!r}", key)
        setattr(req, key, v)

    get("model", lambda v: isinstance(v, str), "a string")
    echo = payload.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise BadRequest(f"'echo' must be true or false, got {echo!r}", "echo")
    req.echo = bool(echo)
    # max_tokens 0 only makes sense with echo: lm-eval's loglikelihood asks for the prompt's logprobs.
    get("max_tokens", lambda v: _is_int(v) and v >= (0 if req.echo else 1),
        "an integer >= 0" if req.echo else "an integer >= 1 (0 only with 'echo': true)")
    get("temperature", lambda v: _is_num(v) and 0 <= v <= 2, "a number in [0, 2]")
    get("top_p", lambda v: _is_num(v) and 0 < v <= 1, "a number in (0, 1]")
    get("top_k", lambda v: _is_int(v) and v >= -1, "an integer >= -1 (0 or -1 = off)")
    req.top_k = max(req.top_k, 0)  # vLLM spells "off" -1, the engine 0
    get("seed", lambda v: _is_int(v) and SEED_RANGE[0] <= v <= SEED_RANGE[1], "an integer in [-2**63, 2**64)")
    get("logprobs", lambda v: _is_int(v) and 0 <= v <= MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]")
    stop = payload.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not (isinstance(stop, list) and len(stop) <= MAX_STOPS and all(isinstance(x, str) and x for x in stop)):
            raise BadRequest(f"'stop' must be a non-empty string or a list of at most {MAX_STOPS}, got {stop!r:.80}",
                             "stop")
        req.stop = list(stop)
    get("stream", lambda v: isinstance(v, bool), "true or false")
    get("user", lambda v: isinstance(v, str), "a string")
    get("ignore_eos", lambda v: isinstance(v, bool), "true or false")
    opts = payload.get("stream_options")
    if opts is not None:
        keys = ("include_usage", "continuous_usage_stats")
        if not (isinstance(opts, dict) and set(opts) <= set(keys)
                and all(isinstance(opts.get(k, False), bool) for k in keys)):
            raise BadRequest("'stream_options' must be {\"include_usage\": true|false, \"continuous_usage_stats\": "
                             f"true|false}}, got {opts!r}", "stream_options")
        if not req.stream:
            raise BadRequest("'stream_options' is only allowed with 'stream': true", "stream_options")
        req.include_usage = opts.get("include_usage", False)
        req.continuous_usage = opts.get("continuous_usage_stats", False)
    req.temperature, req.top_p = float(req.temperature), float(req.top_p)
    return req
