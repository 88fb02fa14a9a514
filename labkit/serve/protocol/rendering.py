"""OpenAI response objects: a completion or chat completion, its stream chunks (server-sent
events), usage and the server's spans."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from labkit.serve.logprobs import TokenLogprob
from labkit.serve.protocol.validation import CompletionRequest

if TYPE_CHECKING:  # an Output registers itself with its Reply; output.py imports this module
    from labkit.serve.protocol.output import Output


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Reply:
    """Builds the response objects of one completion or chat completion (same id and `created`
    throughout). An `Output` registers itself as `out` and supplies per-token logprobs; for
    echo, `prompt_ids` (and `prompt_lp`, the prompt's logprobs) come first; `usage_now()`
    gives the usage so far when the client asked for `continuous_usage_stats`."""

    def __init__(self, model: str, req: CompletionRequest | None = None, prompt_ids: list[int] | None = None,
                 tokenizer: Any = None):
        self.req = req if req is not None else CompletionRequest(prompt="")
        self.chat = self.req.chat
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.model, self.created = model, int(time.time())
        self.prompt_ids, self.tok = prompt_ids or [], tokenizer
        self.prompt_lp: list[TokenLogprob | None] | None = None
        self.out: Output | None = None
        self.usage_now: Any = None
        self.spans: Any = None  # () -> {span: s}, set by the server; added to the last JSON object sent
        self._first = True

    def _with_spans(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.spans is not None:
            obj["labkit_spans"] = self.spans()
        return obj

    def _obj(self, choices: list[dict[str, Any]], usage_: dict[str, int] | None, chunk: bool = False) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        out = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def _prefix(self) -> str:
        """Text that goes before the first generated piece: the prompt, with echo."""
        return self.tok.decode(self.prompt_ids) if self.req.echo and self.prompt_ids else ""

    def _logprobs(self, records: list[TokenLogprob | None], offset: int = 0) -> dict[str, Any] | None:
        """`records` in OpenAI's shape: completions {tokens, token_logprobs, top_logprobs,
        text_offset}; chat {content: [{token, logprob, bytes, top_logprobs}]}."""
        if self.req.logprobs is None:
            return None
        dec = self.tok.decode
        if self.chat:
            return {"content": [
                {"token": dec([t]), "logprob": lp, "bytes": list(dec([t]).encode("utf-8")),
                 "top_logprobs": [{"token": dec([a]), "logprob": v, "bytes": list(dec([a]).encode("utf-8"))}
                                  for a, v in top.items()][: self.req.logprobs]}
                for t, lp, top in filter(None, records)]}
        tokens, lps, tops, offsets = [], [], [], []
        for rec in records:
            if rec is None:
                continue
            t, lp, top = rec
            tokens.append(dec([t]))
            lps.append(lp)
            tops.append({dec([a]): v for a, v in top.items()} if top else None)
            offsets.append(offset)
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def _echo_records(self) -> list[TokenLogprob]:
        """The prompt's tokens as logprob records (the first has no logprob: null, as OpenAI)."""
        lp = self.prompt_lp or [None] * len(self.prompt_ids)
        return [(t, rec[1], rec[2]) if rec is not None else (t, None, None) for t, rec in zip(self.prompt_ids, lp)]

    def full(self, text: str, finish_reason: str, usage_: dict[str, int]) -> dict[str, Any]:
        """The whole answer (non-streaming)."""
        records = (self.out.records if self.out is not None else [])
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": self._logprobs(records), "finish_reason": finish_reason}
        else:
            if self.req.echo and self.req.logprobs is not None:
                records = self._echo_records() + list(records)
            choice = {"text": self._prefix() + text, "index": 0, "logprobs": self._logprobs(records),
                      "finish_reason": finish_reason}
        self._first = False
        return self._with_spans(self._obj([choice], usage_))

    def chunk(self, text: str, finish_reason: str | None = None, last: bool = False) -> bytes:
        """One SSE chunk carrying the new `text` (and the logprobs of the tokens it completes);
        `last`: the last JSON chunk of the stream, which carries the spans."""
        records = self.out.take() if self.out is not None else []
        prefix, first = "", self._first
        if first and not self.chat and self.req.echo:
            prefix = self._prefix()
            if self.req.logprobs is not None:
                records = self._echo_records() + records
        self._first = False
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            if finish_reason is not None and not text:
                delta = {} if not first else delta
            choice = {"index": 0, "delta": delta, "logprobs": self._logprobs(records), "finish_reason": finish_reason}
        else:
            choice = {"text": prefix + text, "index": 0, "logprobs": self._logprobs(records),
                      "finish_reason": finish_reason}
        obj = self._obj([choice], self.usage_now() if self.req.continuous_usage and self.usage_now else None,
                        chunk=True)
        return sse(self._with_spans(obj) if last else obj)

    def usage_chunk(self, usage_: dict[str, int]) -> bytes:
        """The usage chunk, the last JSON chunk of a stream that asked for usage (carries the spans)."""
        return sse(self._with_spans(self._obj([], usage_, chunk=True)))


def sse(obj: Any) -> bytes:
    """One server-sent event carrying `obj` as JSON (or the literal [DONE])."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
