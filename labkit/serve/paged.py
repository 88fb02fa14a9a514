"""Paged KV storage: block pools, and a per-pass view that reads and writes through block tables.

`PagedKVCache` owns the pools, one tensor per K and V of shape
``(n_layers, n_blocks + 1, n_kv_heads, block_size, head_dim)``; block `n_blocks` is a
sink that takes the writes of right-padding tokens (so no pass needs data-dependent
shapes) and is never read as real data. With ``kv_dtype="int8"`` the pools hold int8
codes plus fp32 scales ``(..., block_size, 1)``, one per (token, KV head) vector
(`labkit.model.kv_quant`).

`PagedKVCache.view(tables, lengths)` returns a `PagedBatch`: an object with the model's
cache protocol (`lengths`, `filled`, `max_len`, `static`, `nbytes`, `writer`), so
``model.prefill(tokens, view, lengths=new_lens)`` runs a batch of sequences whose
tokens are scattered over the pools. Token position p of row b lives in block
``tables[b][p // block_size]`` at offset ``p % block_size``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from labkit import ragged as _ragged
from labkit.model.config import ModelConfig
from labkit.model.kv_quant import check_kv_dtype, dequantize_kv, quantize_kv
from labkit.ragged import ragged_groups  # noqa: F401  (re-exported: the paged batch's grouping)

Write = Callable[[int, torch.Tensor, torch.Tensor],
                 tuple[torch.Tensor, torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]]]

class PagedKVCache:
    """Pools of `n_blocks` KV blocks of `block_size` tokens for every layer of `cfg`'s model."""

    def __init__(self, cfg: ModelConfig, n_blocks: int, block_size: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", kv_dtype: str = "model",
                 ragged: bool = True):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"PagedKVCache needs n_blocks >= 1 and block_size >= 1 token, got {n_blocks}, {block_size}")
        self.kv_dtype = check_kv_dtype(kv_dtype)
        self.n_blocks, self.block_size, self.dtype = n_blocks, block_size, dtype
        self.ragged = ragged  # False: every row of a pass reads to the longest (one group), for comparison
        # token-rows one more read group is worth (`labkit.ragged`); None: the module's default,
        # read at each pass. The engine's profile sets it to time one group against two.
        self.split_cost: float | None = None
        self.sink = n_blocks
        shape = (cfg.n_layers, n_blocks + 1, cfg.n_kv_heads, block_size, cfg.head_dim)
        store = torch.int8 if kv_dtype == "int8" else dtype
        self.k = torch.zeros(shape, dtype=store, device=device)
        self.v = torch.zeros(shape, dtype=store, device=device)
        self.k_scale = self.v_scale = None
        if kv_dtype == "int8":
            self.k_scale = torch.zeros(shape[:-1] + (1,), dtype=torch.float32, device=device)
            self.v_scale = torch.zeros_like(self.k_scale)
        self.heads = torch.arange(cfg.n_kv_heads, device=device)

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (int8: codes + scales), sink block included."""
        tensors = [t for t in (self.k, self.v, self.k_scale, self.v_scale) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def view(self, tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> "PagedBatch":
        """A cache view over the sequences whose block tables are `tables`, holding
        `lengths` tokens each; each row may grow up to its table's capacity."""
        if len(tables) != len(lengths) or not tables:
            raise ValueError(f"need one block table per row, got {len(tables)} tables for {len(lengths)} rows")
        width = max(len(t) for t in tables)
        rows = [list(t) + [self.sink] * (width - len(t)) for t in tables]
        return PagedBatch(self, torch.tensor(rows, dtype=torch.long, device=self.device),
                          torch.tensor([len(t) for t in tables], dtype=torch.long, device=self.device),
                          torch.tensor(list(lengths), dtype=torch.long, device=self.device))


class PagedBatch:
    """The model's cache protocol over a `PagedKVCache` for one batch of rows.

    `table` (B, width) block numbers, sink-padded; `n_blocks` (B,) real blocks per row;
    `lengths` (B,) tokens held (the model advances it in place)."""

    static = False

    def __init__(self, pool: PagedKVCache, table: torch.Tensor, n_blocks: torch.Tensor, lengths: torch.Tensor):
        self.pool, self.table, self.n_blocks, self.lengths = pool, table, n_blocks, lengths
        self.max_len = table.shape[1] * pool.block_size
        self.filled = int(lengths.max())

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes

    def _slots(self, positions: torch.Tensor, table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Physical (block, offset) of logical `positions` (B, T), row by row of `table` (default:
        the batch's)."""
        table = self.table if table is None else table
        bs = self.pool.block_size
        col = (positions // bs).clamp_(max=table.shape[1] - 1)
        return table.gather(1, col), positions % bs

    def writer(self, positions: torch.Tensor, valid: torch.Tensor, kv_len: int) -> Write:
        """Plan one pass (see `labkit.model.KVCache.writer`): new K/V of valid tokens go to
        their blocks, padding to the sink. Reads are ragged: rows are grouped by how far they
        read (`ragged_groups`), and each group gathers only up to its own longest row, so a
        batch with one long sequence does not make every row read that far. The returned
        ``write(layer, k, v)`` gives one (K, V) per group, each (rows, Hkv, its length, w) (one
        group: the (K, V) itself, every row in order to `kv_len`), and carries ``write.groups``:
        [(row indices, length)], the order the model attends in."""
        pool = self.pool
        # A valid token past its row's blocks would land in the sink and be lost: refuse.
        beyond = valid & (positions // pool.block_size >= self.n_blocks[:, None])
        if bool(beyond.any()):
            raise ValueError(f"a row writes past its block table ({self.n_blocks.tolist()} blocks of "
                             f"{pool.block_size} tokens); grow the table before the pass")
        # Flat row numbers into a layer's pool viewed as (blocks·heads·block_size, head_dim):
        # one index_select/index_copy_ per tensor (5x faster on CPU than 3-tensor indexing).
        blk, off = self._slots(positions)
        w_rows = self._rows(torch.where(valid, blk, pool.sink), off)
        ends = (torch.where(valid, positions, -1).amax(1) + 1).tolist()  # tokens each row reads
        groups, reads = [], []
        split = pool.split_cost
        if split is None:  # the module's default, read at call time: tests move it
            split = _ragged.SPLIT_COST_TOKENS
        if not pool.ragged:
            split = math.inf
        for rows, length in ragged_groups(ends, kv_len, split):
            idx = torch.tensor(rows, dtype=torch.long, device=positions.device)
            r_blk, r_off = self._slots(torch.arange(length, device=positions.device).expand(len(rows), length),
                                       self.table[idx])
            groups.append((idx, length))
            reads.append(self._rows(r_blk, r_off))

        def put(store: torch.Tensor, new: torch.Tensor) -> list[torch.Tensor]:
            """Write `new` (B, Hkv, T, w) into `store` (one layer's pool); read back each group's
            rows, (rows, Hkv, length, w)."""
            w = store.shape[-1]
            flat = store.view(-1, w)
            flat.index_copy_(0, w_rows, new.reshape(-1, w))
            return [flat.index_select(0, r).view(len(idx), -1, n, w) for r, (idx, n) in zip(reads, groups)]

        if pool.kv_dtype == "model":
            def write(i: int, k: torch.Tensor, v: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
                return list(zip(put(pool.k[i], k), put(pool.v[i], v)))
        else:
            def write(i: int, k: torch.Tensor, v: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
                out = []
                for codes, scales, new in ((pool.k[i], pool.k_scale[i], k), (pool.v[i], pool.v_scale[i], v)):
                    q, s = quantize_kv(new)
                    out.append([dequantize_kv(c, sc, pool.dtype) for c, sc in zip(put(codes, q), put(scales, s))])
                return list(zip(*out))
        if len(groups) == 1:  # every row reads to kv_len in order: the plain (K, V), no per-group indexing
            def one(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return ragged(i, k, v)[0]
            ragged, write = write, one
        write.groups = groups  # type: ignore[attr-defined]
        return write

    def _rows(self, blk: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        """Flat pool rows (B·Hkv·T,) of (block, head, offset) for `blk`, `off` (B, T), head-major
        per row so the result reshapes to (B, Hkv, T, ·)."""
        pool = self.pool
        heads, bs = len(pool.heads), pool.block_size
        rows = (blk[:, None, :] * heads + pool.heads[None, :, None]) * bs + off[:, None, :]
        return rows.reshape(-1)
