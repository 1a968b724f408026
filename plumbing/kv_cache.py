"""
The KV cache of a recurrent-depth model: one entry per (layer, loop), with Huginn's KV sharing.

A looped core runs every layer r times per token, so a cache keeps r entries per core layer and
position (Geiping et al. 2025, arXiv 2502.05171, §6). Huginn's "KV-cache sharing" caps that at a
budget of N slots per core layer: loop i writes slot i mod N, so memory stops growing with r
(reported stable down to N = 4). The prelude and the coda run once per token: one slot each.

The model talks to a cache through `cache.update(key, k, v) -> (k_all, v_all)` with key =
(part, layer, loop) (see model.py); sample.py calls `cache.start(pos, T, r)` (where the T new
positions go) before each forward pass, and hands the core and coda `WriteRows(cache, rows)` while
they run on some rows only (adaptive exit: the rows still looping). Everything is preallocated to
(B, n_kv_head, max_len, head_dim), so a decode step copies one position in place instead of
concatenating the past.

    python -m pytest -q tests/test_sample.py     # cached == uncached logits, budgets, adaptive exit
"""

import math

import torch


def available_memory(device):
    """Bytes that new tensors on `device` may take: the GPU's free memory, or the host's MemAvailable
    (None where neither is known)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


class KVCache:
    """Preallocated keys and values for prelude, core and coda of a RecurrentGPT.

    Policy for the core (what a token at loop i reads of an earlier token p):
    - p ran loop i: slot i mod n_slots. With n_slots >= r that is p's loop-i entry; with a
      budget N < r (Huginn's sharing) it is the latest loop of p congruent to i mod N.
    - p exited (adaptive exit) before loop i: p's latest entry, its last loop n_p - 1,
      which sits in slot (n_p - 1) mod N.
    `n_run` (B, max_len) holds how many loops each position ran; sample.py sets it through
    start() (every new position runs r) and mark_exited(). update(..., rows) takes the keys and values
    of those rows only, writes them and returns theirs: exited rows keep their own entries in their slots.
    A row that exited at the current step has left the batch (sample.py's _exit_loops): its entry is
    read from the next step on, so within a step the reads depend on the earlier positions only.
    A pass over several new tokens (prefill, a speculative verify) writes loop i of all of them
    before any reads it, so with N < r they see each other's loop-i entries, where
    token-by-token decoding would read the latest entry of that slot: with a budget, prefill and
    decoding differ slightly (as in Huginn's code); with N >= r they agree exactly."""

    def __init__(self, config, batch_size, max_len, n_slots, device="cpu", dtype=torch.float32):
        if n_slots < 1:
            raise ValueError(f"the KV budget must be at least 1 slot, got {n_slots}")
        c = config
        self.n_slots, self.max_len = n_slots, max_len
        kv = (batch_size, c.n_kv_head, max_len, c.head_dim)
        need = 2 * (c.n_prelude + c.n_core * n_slots + c.n_coda) * math.prod(kv) * dtype.itemsize
        free = available_memory(device)
        if free is not None and need > free:  # refuse before allocating: r slots per core layer add up fast
            raise ValueError(f"the KV cache would need {need / 2**30:.1f} GiB ({n_slots} slots per core layer, "
                             f"{batch_size} x {max_len} positions) but {free / 2**30:.1f} GiB is free on {device}: "
                             "lower r, share slots with a KV budget (sample.py --kv_budget 4) or run without a cache")
        new = lambda *lead: torch.zeros(*lead, *kv, device=device, dtype=dtype)
        # (layers, [slots,] B, n_kv_head, max_len, hd); keys and values stacked on dim 0
        self.prelude = new(2, c.n_prelude)
        self.core = new(2, c.n_core, n_slots)
        self.coda = new(2, c.n_coda)
        # (keys, values) of every (part, layer, slot), each (B, n_kv_head, max_len, hd): views made once, so that a
        # decode step's update (once a layer and loop) indexes nothing but the new positions
        views = lambda kv: [[(kv[0, j, m], kv[1, j, m]) for m in range(kv.shape[2])] for j in range(kv.shape[1])]
        self.views = {"prelude": views(self.prelude[:, :, None]), "core": views(self.core),
                      "coda": views(self.coda[:, :, None])}  # prelude and coda: one slot
        self.n_run = torch.zeros(batch_size, max_len, dtype=torch.long, device=device)
        self.pos = self.end = 0  # the forward pass in progress writes positions [pos, end)
        self.min_run = 0  # min of n_run[:, :end] at start(): below it no position has exited, reads are plain slots
        self._rows = {}  # loop -> (B, nkv, end) row of each entry read in core[k or v, layer].view(-1, hd)

    @property
    def nbytes(self):
        """Bytes of keys and values (the (B, max_len) bookkeeping of n_run left out)."""
        return sum(t.numel() * t.element_size() for t in (self.prelude, self.core, self.coda))

    def start(self, pos, T, r):
        """A forward pass writes positions [pos, pos + T), each running r loops."""
        if pos + T > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions, asked to write up to {pos + T}")
        self.pos, self.end = pos, pos + T
        self.n_run[:, pos:pos + T] = r
        self.min_run = int(self.n_run[:, :pos + T].min())
        self._rows = {}

    def mark_exited(self, rows, n):
        """Rows (indices, or a (B,) bool tensor) exited after n loops at the current one-token step; they read
        nothing more in this step, so min_run and the read map stay (the next start() takes them in)."""
        self.n_run[rows, self.pos] = n

    def update(self, key, k, v, rows=None):
        """Write k, v (B, nkv, T, hd) at the announced positions; return all keys and values so far as
        the loop reads them (the policy above). rows: (n,) long, the batch rows that k and v (n, nkv, T, hd)
        belong to (None: all B): only those write, and only theirs come back, a gathered copy."""
        part, layer, i = key
        a, b = self.pos, self.end
        if k.shape[2] != b - a:
            raise ValueError(f"cache.start() announced {b - a} new positions, got {k.shape[2]}")
        K, V = self.views[part][layer][i % self.n_slots if part == "core" else 0]  # (B, nkv, S, hd)
        if rows is None:
            K.narrow(2, a, b - a).copy_(k)
            V.narrow(2, a, b - a).copy_(v)
        else:
            K[rows, :, a:b], V[rows, :, a:b] = k, v
        if part != "core" or i < self.min_run:  # one slot holds every position's entry (below min_run all ran i)
            if rows is None:
                return K.narrow(2, 0, b), V.narrow(2, 0, b)  # views, no copy
            # index_select copies whole (nkv, b, hd) rows, ~3x faster than the same advanced index on this CPU
            return K[:, :, :b].index_select(0, rows), V[:, :, :b].index_select(0, rows)
        slots = self.core[:, layer]  # (2, N, B, nkv, S, hd)
        if i not in self._rows:  # exited positions read the slot of their last loop
            run = self.n_run[:, :b]
            slot = torch.where(run > i, i % self.n_slots, (run - 1) % self.n_slots)  # (B, b)
            N, B, nkv, L, hd = slots.shape[1:]
            row, head = torch.arange(B, device=k.device)[:, None, None], torch.arange(nkv, device=k.device)[:, None]
            # the entry (slot, row, head, p) of the contiguous (N, B, nkv, L, hd) block, as a row of its (-1, hd) view
            self._rows[i] = ((slot[:, None] * B + row) * nkv + head) * L + torch.arange(b, device=k.device)
        idx = self._rows[i] if rows is None else self._rows[i][rows]  # (n, nkv, b)
        # one index_select of hd-float rows per k and v: a copy at memcpy speed, far faster than advanced indexing
        take = lambda t: t.reshape(-1, t.shape[-1]).index_select(0, idx.reshape(-1)).view(*idx.shape, -1)
        return take(slots[0]), take(slots[1])


class WriteRows:
    """A cache as model.iterate and model.readout see it while they run on some rows only (adaptive exit):
    the model's blocks call update(key, k, v), and this passes `rows` ((n,) long, the batch rows of k and v)
    on. sample.py says at the call site which rows run, instead of a flag on the cache that update() would
    have to read."""

    def __init__(self, cache, rows):
        self.cache, self.rows = cache, rows

    def update(self, key, k, v):
        return self.cache.update(key, k, v, rows=self.rows)
