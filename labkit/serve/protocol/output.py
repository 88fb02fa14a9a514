"""Output processing: what the client gets of a growing token sequence: text released piece by
piece (`Detokenizer`), cut before the first stop string, with each token's logprob record."""

from __future__ import annotations

from typing import Any

from labkit.serve.logprobs import TokenLogprob
from labkit.serve.protocol.rendering import Reply, usage
from labkit.serve.protocol.validation import CompletionRequest


class Output:
    """What the client gets of a growing token sequence: text released piece by piece
    (`Detokenizer`), cut before the first stop string, with each token's logprob record.

    Text that could be the start of a stop string is held back until it is known not to
    be one, so a streamed answer never shows part of a stop string. After a stop string
    `stopped` is True and further tokens add nothing; the caller ends the sequence."""

    def __init__(self, tokenizer: Any, req: CompletionRequest, reply: Reply | None = None, handle: Any = None,
                 skip: set[int] = frozenset()):
        self.detok, self.skip, self.stops, self.handle = Detokenizer(tokenizer, skip), skip, req.stop, handle
        self.want_lp = req.logprobs is not None
        self.pending = ""
        self.stopped = False
        self.n = 0  # tokens taken (the client's completion tokens)
        self.records: list[TokenLogprob] = []
        self._sent = 0
        if reply is not None:
            reply.out = self
            if handle is not None:  # continuous_usage_stats: usage so far in every chunk
                reply.usage_now = lambda: usage(handle.prompt, self.n)

    def add(self, token: int) -> str:
        """Take the next generated token; return the text it releases (maybe "")."""
        if self.stopped:
            return ""
        lp = getattr(self.handle, "lp", None)
        if self.want_lp and token not in self.skip and lp is not None and self.n < len(lp):
            self.records.append(lp[self.n])
        self.n += 1
        return self._release(self.detok.add(token))

    def flush(self) -> str:
        """The rest at the end of the sequence (nothing after a stop string)."""
        return "" if self.stopped else self._release(self.detok.flush(), final=True)

    def take(self) -> list[TokenLogprob]:
        """Logprob records not handed out yet (for the next stream chunk)."""
        new, self._sent = self.records[self._sent:], len(self.records)
        return new

    def _release(self, piece: str, final: bool = False) -> str:
        self.pending += piece
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[: min(hits)], "", True
            return out
        hold = 0 if final else max((k for s in self.stops for k in range(1, len(s))
                                    if self.pending.endswith(s[:k])), default=0)
        out, self.pending = self.pending[: len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return out


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
