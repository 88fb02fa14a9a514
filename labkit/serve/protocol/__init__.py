"""OpenAI `/v1/completions` and `/v1/chat/completions` wire format, in three parts:

* `validation`: requests parsed and validated (strict: a bad type, a value out of range, an
  unknown field or an OpenAI field this server does not implement is a `BadRequest`, HTTP 400);
* `rendering`: response objects and stream chunks (`Reply`, `sse`, `usage`);
* `output`: output processing (`Output`: stop strings, logprobs; `Detokenizer`).
"""

from labkit.serve.protocol.output import Detokenizer, Output
from labkit.serve.protocol.rendering import Reply, sse, usage
from labkit.serve.protocol.validation import (CHAT_ROLES, CHAT_UNSUPPORTED, MAX_LOGPROBS, MAX_STOPS, SEED_RANGE,
                                              UNSUPPORTED_DEFAULTS, BadRequest, CompletionRequest, NotFound,
                                              _is_int, chat_prompt, error_body, parse_chat, parse_completion,
                                              parse_json, parse_request)

__all__ = ["CHAT_ROLES", "CHAT_UNSUPPORTED", "MAX_LOGPROBS", "MAX_STOPS", "SEED_RANGE", "UNSUPPORTED_DEFAULTS",
           "BadRequest", "CompletionRequest", "Detokenizer", "NotFound", "Output", "Reply", "_is_int",
           "chat_prompt", "error_body", "parse_chat", "parse_completion", "parse_json", "parse_request", "sse",
           "usage"]
