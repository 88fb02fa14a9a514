"""The KV-cache memory model: capacity, allocation (paged or max-length), admission.

Memory is counted in blocks. How much a sequence takes is its `reserve` rule, the same
words the real engine uses (`labkit.serve.blocks`, `labkit serve --kv-reserve`):

* "on_demand" (paged): blocks of `block_size` tokens, taken one at a time as a sequence
  grows (vLLM's PagedAttention);
* "max_len" (contiguous): room for `max_len` tokens reserved at admission (how servers
  without paging size their buffers), in 1-token blocks, so nothing grows and nothing is
  preempted, but most of the reservation sits empty.

The simulator does the per-step growth bookkeeping; this class holds the counts and the
admission rule.
"""

from __future__ import annotations

import dataclasses

from labkit.scheduling import RESERVE  # the real engine's words too (labkit.serve.blocks)


def capacity_tokens(memory_bytes: float, weight_bytes: float, bytes_per_token: int,
                    utilization: float = 0.9) -> int:
    """Tokens of KV cache that fit: (utilization·memory − weights) / bytes per token.

    utilization leaves headroom for activations and the runtime, like vLLM's
    --gpu-memory-utilization."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
    free = utilization * memory_bytes - weight_bytes
    if free <= 0 or bytes_per_token <= 0:
        raise ValueError(f"no room for a KV cache: {utilization}·{memory_bytes:.3g} B memory − "
                         f"{weight_bytes:.3g} B weights = {free:.3g} B")
    return int(free // bytes_per_token)


@dataclasses.dataclass
class KVMemory:
    """KV memory of `capacity` tokens, taken by the `reserve` rule ("on_demand" | "max_len"). It only
    counts blocks (the tensors a real model caches into are `labkit.model.KVCache`).

    block_size: tokens per block (paged). max_len: tokens reserved per sequence (contiguous)
    and the longest prompt + output accepted. watermark: fraction of blocks kept free at
    admission (paged), so running sequences can grow before anyone is preempted.
    """

    capacity: int
    reserve: str = "on_demand"
    block_size: int = 16
    max_len: int = 4096
    watermark: float = 0.01

    def __post_init__(self) -> None:
        if self.reserve not in RESERVE:
            raise ValueError(f"KV reserve {self.reserve!r} unknown; choose one of {', '.join(RESERVE)}")
        if self.block_size < 1 or self.max_len < 1 or self.capacity < 1:
            raise ValueError(f"capacity ({self.capacity}), block_size ({self.block_size}) and max_len "
                             f"({self.max_len}) must be >= 1 token")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark!r}")
        self.paged = self.reserve == "on_demand"  # blocks taken as sequences grow
        self.unit = self.block_size if self.paged else 1  # tokens per block
        self.total = self.capacity // self.unit  # blocks
        self.free = self.total
        self.reserve_min = int(self.watermark * self.total) if self.paged else 0

    def blocks_for(self, tokens: int) -> int:
        """Blocks a sequence holding `tokens` tokens occupies."""
        return -(-tokens // self.unit) if self.paged else self.max_len

    def why_never_fits(self, tokens: int) -> str | None:
        """Why a sequence that reaches `tokens` tokens could never run, even alone (a reason to
        reject it at arrival); None if it can."""
        if tokens > self.max_len:
            return f"prompt + output = {tokens} tokens > max_len {self.max_len}"
        if self.blocks_for(tokens) > self.total:
            return f"needs {tokens} tokens of KV > capacity {self.total * self.unit}"
        return None

    def can_admit(self, tokens: int, final_tokens: int = 0) -> bool:
        """Room to admit a sequence with `tokens` tokens now (keeping the watermark free) and,
        if `final_tokens` is given, room for it to grow to that length without preemption."""
        need = self.blocks_for(max(tokens, final_tokens))
        return self.free - need >= self.reserve_min

    @property
    def used(self) -> int:
        """Blocks in use."""
        return self.total - self.free

    def describe(self) -> str:
        per = f"blocks of {self.block_size} tokens" if self.paged else f"{self.max_len}-token reservations"
        return f"{self.reserve} KV: {self.total * self.unit} tokens in {per}"


def max_concurrency(capacity: int, seq_tokens: int, reserve: str, block_size: int = 16, max_len: int = 4096) -> int:
    """How many sequences of `seq_tokens` tokens fit at once (no watermark)."""
    kv = KVMemory(capacity, reserve, block_size, max_len, watermark=0)
    return kv.total // kv.blocks_for(seq_tokens)
