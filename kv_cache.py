"""
The KV cache of a recurrent-depth model: one entry per (layer, iteration), with Huginn's KV sharing.

A looped core runs every layer r times per token, so a cache keeps r entries per core layer and
position (Geiping et al. 2025, arXiv 2502.05171, §6). Huginn's "KV-cache sharing" caps that at a
budget of N slots per core layer: iteration i writes slot i mod N, so memory stops growing with r
(reported stable down to N = 4). The prelude and the coda run once per token: one slot each.

The model talks to a cache through `cache.update(key, k, v) -> (k_all, v_all)` with key =
(part, layer, step) (see model.py); sample.py sets `cache.pos` (where the T new positions go)
before each forward pass. Everything is preallocated to (B, n_kv_head, max_len, head_dim), so a
decode step copies one position in place instead of concatenating the past.

    python -m pytest -q tests/test_sample.py     # cached == uncached logits, budgets, adaptive exit
"""

import torch


class KVCache:
    """Preallocated keys and values for prelude, core and coda of a RecurrentGPT.

    Policy for the core (sample.py's adaptive exit relies on it):
    - iteration i reads and writes slot i mod n_slots (n_slots = r: a full cache; n_slots < r:
      Huginn's sharing, where a slot holds the latest iteration i' = i mod N the token ran);
    - while `active` (a (B,) bool tensor) is set, rows that are False (tokens that already exited)
      do not write, so their slots keep what they wrote last;
    - `fill_exited(rows, n)`: a token that exited after n < n_slots iterations never wrote slots
      n..N-1; they get its last entry (iteration n-1). So a later token at iteration i always reads
      the latest entry the earlier token has for slot i mod N, else the latest it has at all.
    With n_slots >= r this is "use the latest available iteration" of an exited token.
    A pass over several new tokens (prefill, a speculative verify) writes iteration i of all of them
    before any reads it, so with n_slots < r they see each other's iteration-i entries, where
    token-by-token decoding would read the latest entry of that slot: with a budget, prefill and
    decoding differ slightly (as in Huginn's code); with n_slots >= r they agree exactly."""

    def __init__(self, config, batch_size, max_len, n_slots, device="cpu", dtype=torch.float32):
        if n_slots < 1:
            raise ValueError(f"the KV budget must be at least 1 slot, got {n_slots}")
        c = config
        self.n_slots, self.max_len = n_slots, max_len
        kv = (batch_size, c.n_kv_head, max_len, c.head_dim)
        new = lambda *lead: torch.zeros(*lead, *kv, device=device, dtype=dtype)
        # (layers, [slots,] B, n_kv_head, max_len, hd); keys and values stacked on dim 0
        self.prelude = new(2, c.n_prelude)
        self.core = new(2, c.n_core, n_slots)
        self.coda = new(2, c.n_coda)
        self.pos = 0  # first position the next forward pass writes
        self.active = None  # (B,) bool: rows that write core entries (adaptive exit)

    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.prelude, self.core, self.coda))

    def _slot(self, part, layer, step):
        if part == "core":
            return self.core[:, layer, step % self.n_slots]  # (2, B, nkv, S, hd)
        if part == "prelude":
            return self.prelude[:, layer]
        if part == "coda":
            return self.coda[:, layer]
        raise KeyError(f"unknown cache part {part!r}")

    def update(self, key, k, v):
        part, layer, step = key
        kv = self._slot(part, layer, step)
        a, b = self.pos, self.pos + k.shape[2]
        if b > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions, asked to write up to {b}")
        if part == "core" and self.active is not None:
            keep = ~self.active.view(-1, 1, 1, 1)  # exited rows keep their entry
            k = torch.where(keep, kv[0, :, :, a:b], k)
            v = torch.where(keep, kv[1, :, :, a:b], v)
        kv[0, :, :, a:b] = k
        kv[1, :, :, a:b] = v
        return kv[0, :, :, :b], kv[1, :, :, :b]

    def fill_exited(self, rows, n):
        """Rows (a (B,) bool tensor) exited after n iterations at position self.pos (a one-token
        step): copy their iteration n-1 entry into the slots n..N-1 they never wrote."""
        if n >= self.n_slots or not bool(rows.any()):
            return
        p = self.pos
        last = self.core[:, :, n - 1, :, :, p]  # (2, n_core, B, nkv, hd)
        fill = self.core[:, :, n:, :, :, p]  # (2, n_core, N-n, B, nkv, hd)
        m = rows.view(1, 1, 1, -1, 1, 1)
        self.core[:, :, n:, :, :, p] = torch.where(m, last.unsqueeze(2), fill)
