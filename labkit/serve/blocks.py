"""KV block manager: a free list of fixed-size blocks and one block table per sequence.

A block holds `block_size` tokens of keys and values for every layer and KV head (the
storage lives in `labkit.serve.paged.PagedKVCache`; this class only hands out block
numbers). A sequence's block table lists its blocks in logical order: token position
p lives in block ``table[p // block_size]`` at offset ``p % block_size`` (vLLM's
PagedAttention layout).

`reserve` decides how much a sequence takes at admission:

* "on_demand": blocks for the tokens it holds now; one more each time it crosses a
  block boundary (paged). Memory is nearly all used, but a growing batch can run out,
  and then the engine preempts a sequence;
* "max_len": blocks for `max_len` tokens up front, whatever it will use (how servers
  without paging size contiguous buffers). Nothing grows, nothing is preempted, most of
  the reservation sits empty.

It also answers the admission questions of `labkit.scheduling` policies with the
same names as `labkit.sim.kv.KVMemory` (`blocks_for`, `free`, `total`, `can_admit`,
`why_never_fits`; the `labkit.scheduling.KVView` protocol), so one policy drives the
simulator and the real engine.
"""

from __future__ import annotations

from labkit.scheduling import RESERVE  # one vocabulary for the simulator and the engine



class OutOfBlocks(RuntimeError):
    """No free KV block left for a request that needed one."""


class BlockManager:
    """`total` blocks of `block_size` tokens. `watermark`: share of blocks kept free when
    admitting, so running sequences can grow before anyone is preempted (vLLM's
    watermark). `max_len`: tokens one sequence may reach."""

    def __init__(self, total: int, block_size: int = 16, max_len: int = 512, reserve: str = "on_demand",
                 watermark: float = 0.01):
        if not (isinstance(total, int) and total >= 1):
            raise ValueError(f"total must be an integer >= 1 block, got {total!r}")
        if not (isinstance(block_size, int) and block_size >= 1):
            raise ValueError(f"block_size must be an integer >= 1 token, got {block_size!r}")
        if not (isinstance(max_len, int) and max_len >= 1):
            raise ValueError(f"max_len must be an integer >= 1 token, got {max_len!r}")
        if reserve not in RESERVE:
            raise ValueError(f"reserve {reserve!r} unknown; choose one of {', '.join(RESERVE)}")
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must lie in [0, 1), got {watermark!r}")
        self.total, self.block_size, self.max_len, self.reserve = total, block_size, max_len, reserve
        self.reserve_min = int(watermark * total)
        # Stack of free block numbers; popping the end hands out low numbers first.
        self._free: list[int] = list(range(total - 1, -1, -1))
        self.tables: dict[int, list[int]] = {}

    # ------------------------------------------------------------ the policies' questions
    @property
    def free(self) -> int:
        """Free blocks."""
        return len(self._free)

    @property
    def used(self) -> int:
        """Blocks held by sequences."""
        return self.total - len(self._free)

    def blocks_for(self, tokens: int) -> int:
        """Blocks a sequence holding `tokens` tokens occupies under this reservation rule."""
        if self.reserve == "max_len":
            tokens = self.max_len
        return -(-tokens // self.block_size)

    def can_admit(self, tokens: int, final_tokens: int = 0) -> bool:
        """Room for a sequence of `tokens` tokens now (and `final_tokens` later, if given),
        keeping the watermark free."""
        return self.free - self.blocks_for(max(tokens, final_tokens)) >= self.reserve_min

    def why_never_fits(self, tokens: int) -> str | None:
        """Why a sequence reaching `tokens` tokens could never run, even alone (a reason to
        reject it at submission); None if it can."""
        if tokens > self.max_len:
            return f"prompt + output = {tokens} tokens > max_len {self.max_len}"
        if self.blocks_for(tokens) > self.total - self.reserve_min:
            return (f"needs {self.blocks_for(tokens)} KV blocks of {self.block_size} tokens; "
                    f"the cache has {self.total - self.reserve_min} usable")
        return None

    # ------------------------------------------------------------ allocation
    def allocate(self, seq_id: int, tokens: int) -> list[int]:
        """Give sequence `seq_id` (not holding any) the blocks for `tokens` tokens."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already holds {len(self.tables[seq_id])} blocks")
        n = self.blocks_for(tokens)
        if n > len(self._free):
            raise OutOfBlocks(f"sequence {seq_id} needs {n} blocks, {len(self._free)} free")
        self.tables[seq_id] = [self._free.pop() for _ in range(n)]
        return self.tables[seq_id]

    def blocks_to_grow(self, seq_id: int, tokens: int) -> int:
        """Extra blocks sequence `seq_id` needs to hold `tokens` tokens."""
        return max(0, self.blocks_for(tokens) - len(self.tables[seq_id]))

    def grow(self, seq_id: int, tokens: int) -> None:
        """Make sequence `seq_id`'s table cover `tokens` tokens (taking blocks if needed)."""
        n = self.blocks_to_grow(seq_id, tokens)
        if n > len(self._free):
            raise OutOfBlocks(f"sequence {seq_id} needs {n} more blocks, {len(self._free)} free")
        table = self.tables[seq_id]
        table.extend(self._free.pop() for _ in range(n))

    def release(self, seq_id: int) -> int:
        """Return every block of `seq_id` to the free list (finish, cancel, error or
        preemption); returns how many. Releasing a sequence that holds none is a no-op."""
        table = self.tables.pop(seq_id, None)
        if not table:
            return 0
        self._free.extend(reversed(table))
        return len(table)

    # ------------------------------------------------------------ accounting
    @property
    def tokens_reserved(self) -> int:
        """Token slots held by sequences (used blocks x block size)."""
        return self.used * self.block_size

    def check(self) -> None:
        """Raise AssertionError unless every block is either free or in exactly one table."""
        held = [b for t in self.tables.values() for b in t]
        every = held + self._free
        assert len(every) == self.total and set(every) == set(range(self.total)), \
            f"block accounting broken: {len(held)} held + {len(self._free)} free != {self.total}, or duplicates"
