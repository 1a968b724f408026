"""
The decoder of a recurrent-depth model (the nanorecur remote code runs this file too): its KV cache, one entry per
(layer, loop), and the cached forward pass that reads and writes it (Geiping et al. 2025, arXiv 2502.05171, §6; the
model is McLeish et al. 2025, arXiv 2511.07384).

A looped core runs every layer r times per token, so a cache keeps r entries per core layer and position. Huginn's
"KV-cache sharing" caps that at a budget of N slots per core layer: loop i writes slot i mod N, so memory stops
growing with r (reported stable down to N = 4). The prelude and the coda run once per token: one slot each.
Everything is preallocated to (B, n_kv_head, max_len, head_dim), so a decode step copies one position in place
instead of concatenating the past.

CachedForward is the one loop over the recurrent core besides model.forward. It drives the model's pieces
(run_prelude, init_state, iterate, readout) itself because decoding needs three things one forward call does not
do: write each new token's keys and values into the cache at its position, let each row of a batch exit the loop
on its own (exited rows stop writing), and break out of the loop once every row has exited. Without a cache it is
the plain forward pass, the reference the cache must match. sample.py (sequential decoding, adaptive exit,
self-speculative decoding) and diffusion.py (the parallel sampler) decode through it.

The model talks to a cache through `cache.update(key, k, v) -> (k_all, v_all)` with key = (part, layer, loop)
(model.py's attend_cached); CachedForward calls `cache.start(pos, T, r)` (where the T new positions go) before each
forward pass, and hands the core and coda `WriteRows(cache, rows)` while they run on some rows only (adaptive exit:
the rows still looping). Where the cache indexes with a trick for speed, the plain indexing it stands for is
written beside it (KVCache.read_plain), and the tests hold the two equal.

    python sample.py --r 32 --exit kl --kv_budget 4 --prompt "The capital of France is"   # decodes through this
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
    `n_run` (B, max_len) holds how many loops each position ran; CachedForward sets it through
    start() (every new position runs r) and mark_exited(). update(..., rows) takes the keys and values
    of those rows only, writes them and returns theirs: exited rows keep their own entries in their slots.
    A row that exited at the current step has left the batch (CachedForward._exit_loops): its entry is
    read from the next step on, so within a step the reads depend on the earlier positions only.
    A pass over several new tokens (prefill, a speculative verify) writes loop i of all of them
    before any reads it, so with N < r they see each other's loop-i entries, where
    token-by-token decoding would read the latest entry of that slot: with a budget, prefill and
    decoding differ slightly (as in Huginn's code); with N >= r they agree exactly."""

    def __init__(self, config, batch_size, max_len, n_slots, device="cpu", dtype=torch.float32, plain=False):
        if n_slots < 1:
            raise ValueError(f"the KV budget must be at least 1 slot, got {n_slots}")
        c = config
        self.n_slots, self.max_len, self.plain = n_slots, max_len, plain  # plain: read_plain's indexing
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
        slot = i % self.n_slots if part == "core" else 0
        if self.plain:
            return self.read_plain(part, layer, slot, i, k, v, rows)
        K, V = self.views[part][layer][slot]  # (B, nkv, S, hd); read_plain indexes the buffer
        if rows is None:
            K.narrow(2, a, b - a).copy_(k)
            V.narrow(2, a, b - a).copy_(v)
        else:
            K[rows, :, a:b], V[rows, :, a:b] = k, v
        if part != "core" or i < self.min_run:  # one slot holds every position's entry (below min_run all ran i)
            if rows is None:
                return K.narrow(2, 0, b), V.narrow(2, 0, b)  # views, no copy
            # index_select copies whole (nkv, b, hd) rows; read_plain: K[rows, :, :b], the same values
            return K[:, :, :b].index_select(0, rows), V[:, :, :b].index_select(0, rows)
        slots = self.core[:, layer]  # (2, N, B, nkv, S, hd)
        if i not in self._rows:  # exited positions read the slot of their last loop
            N, B, nkv, L, hd = slots.shape[1:]
            row, head = torch.arange(B, device=k.device)[:, None, None], torch.arange(nkv, device=k.device)[:, None]
            # the entry (slot, row, head, p) of the contiguous (N, B, nkv, L, hd) block, as a row of its (-1, hd) view
            self._rows[i] = ((self.read_slots(i)[:, None] * B + row) * nkv + head) * L + torch.arange(b, device=k.device)
        idx = self._rows[i] if rows is None else self._rows[i][rows]  # (n, nkv, b)
        # one index_select of hd-float rows per k and v, the gather of read_plain as a flat copy
        take = lambda t: t.reshape(-1, t.shape[-1]).index_select(0, idx.reshape(-1)).view(*idx.shape, -1)
        return take(slots[0]), take(slots[1])

    def read_slots(self, i):
        """(B, end) long: the slot each position's entry is read from at core loop i: i mod N where the position ran
        loop i, else the slot of its last loop n - 1 (it exited after n loops)."""
        run = self.n_run[:, :self.end]
        return torch.where(run > i, i % self.n_slots, (run - 1) % self.n_slots)

    def read_plain(self, part, layer, slot, i, k, v, rows=None):
        """update() written plainly (KVCache(..., plain=True)), the reference of its indexing: write the new
        positions of `rows` into the slot, then read every position of those rows from the slot the policy names."""
        a, b = self.pos, self.end
        K, V = self.core[:, layer, slot] if part == "core" else getattr(self, part)[:, layer]  # (B, nkv, S, hd) each
        rows = torch.arange(K.shape[0], device=k.device) if rows is None else rows
        K[rows, :, a:b], V[rows, :, a:b] = k, v
        if part != "core":
            return K[rows, :, :b], V[rows, :, :b]
        src = self.read_slots(i)[rows]  # (n, b): per row and position, the slot to read
        n, nkv = len(rows), K.shape[1]
        at = (src[:, None, :], rows[:, None, None], torch.arange(nkv, device=k.device)[None, :, None],
              torch.arange(b, device=k.device)[None, None, :])  # each broadcast to (n, nkv, b)
        return self.core[0, layer][at], self.core[1, layer][at]


class WriteRows:
    """A cache as model.iterate and model.readout see it while they run on some rows only (adaptive exit):
    the model's blocks call update(key, k, v), and this passes `rows` ((n,) long, the batch rows of k and v)
    on. sample.py says at the call site which rows run, instead of a flag on the cache that update() would
    have to read."""

    def __init__(self, cache, rows):
        self.cache, self.rows = cache, rows

    def update(self, key, k, v):
        return self.cache.update(key, k, v, rows=self.rows)


# -----------------------------------------------------------------------------
# the cached forward pass: prefill, decode steps and verify passes over a (B, T) block of new tokens


class CachedForward:
    """Runs the model's pieces (run_prelude, init_state, iterate, readout) over new tokens at position
    self.pos, reading and writing the KV cache, with left padding: row b has pads[b] pad tokens first,
    its real positions start at 0 and no real token attends to a pad. cache=None recomputes (the
    caller passes the whole sequence). Not an nn.Module: it holds the decoding state, not weights."""

    def __init__(self, model, pads, max_len, r, cache=None, exit_rule=None, warm_start=False, generator=None):
        self.model, self.r, self.cache = model, r, cache
        self.exit_rule, self.warm_start, self.generator = exit_rule, warm_start, generator
        device = model.embed_tokens.weight.device
        self.pads = torch.tensor(pads, device=device)
        self.has_pad = any(p > 0 for p in pads)
        self.key_valid = torch.arange(max_len, device=device)[None] >= self.pads[:, None]  # (B, S)
        self.pos = 0  # positions already in the cache
        self.warm = None  # (B, 1, h) final state of the last token, for warm start

    def _mask(self, T):
        # None lets attention use its causal default: right when nothing is padded and either the
        # block starts at 0 (T == S) or it is one token that may see everything
        if not self.has_pad and (T == 1 or self.pos == 0):
            return None
        S, dev = self.pos + T, self.pads.device
        q = torch.arange(self.pos, S, device=dev)[:, None]
        j = torch.arange(S, device=dev)[None]
        allowed = self.key_valid[:, None, :S] & (j <= q)  # (B, T, S)
        return (allowed | (j == q))[:, None]  # a pad query sees itself: no empty softmax row (NaN)

    def _positions(self, T):
        """Rotary (cos, sin) and the attention mask of T new tokens at self.pos (pads count no position)."""
        pos = torch.arange(self.pos, self.pos + T, device=self.pads.device)
        return self.model.rope((pos[None] - self.pads[:, None]).clamp_min(0)), self._mask(T)

    def refine(self, idx, s, num_loops, first):
        """One pass of the parallel sampler (diffusion.py) over the block idx (B, T) at positions self.pos..: the
        states s (B, T, h) carried over from the last pass run loops 0..num_loops-1 (the cache entries of those
        loops), then the coda reads every position out -> logits (B, T, V), s. self.pos stays where it is: the
        next pass writes again what of this block is still being refined. first (B, T) bool: the positions that
        ran no loop before this pass: loop 0 is their first loop only (model.iterate's first_loop "identity")."""
        m, cache = self.model, self.cache
        rope, mask = self._positions(idx.shape[1])
        cache.start(self.pos, idx.shape[1], num_loops)
        e = m.run_prelude(idx, rope, mask, cache)  # (B, T, h): the tokens may have changed since the last pass
        for i in range(num_loops):
            s = m.iterate(s, e, rope, i, mask, cache, first if i == 0 else None)
        return m.readout(s, rope, mask, cache), s

    def run(self, idx, num_loops=None, adaptive=False, last_only=False):
        """idx (B, T) new tokens -> logits (B, T, V), loops (B,). num_loops: this pass's r (default
        self.r). adaptive (T == 1 only) applies the exit rule per row: exited rows keep their state,
        stop writing the cache and leave the batch (_exit_loops). last_only: logits (B, 1, V) of the last
        position only (a prefill): the head, a 49k-vocabulary matmul for the parents, skips the rest
        (B x T x V fp32 logits are 2 GB for 32 GSM8K prompts)."""
        m, cache = self.model, self.cache
        B, T = idx.shape
        r = self.r if num_loops is None else num_loops
        if adaptive and (T != 1 or cache is None or self.exit_rule is None):
            raise ValueError("adaptive exit runs one token per step, with a KV cache and an exit rule")
        rope, mask = self._positions(T)
        if cache is not None:
            cache.start(self.pos, T, r)
        e = m.run_prelude(idx, rope, mask, cache)  # (B, T, h)
        if self.warm_start and self.warm is not None and T == 1:
            s = self.warm  # continuous CoT: start where the last token ended
        else:
            s = m.init_state(e, self.generator)
        loops = torch.full((B,), r, dtype=torch.long)
        rule, logits = (self.exit_rule if adaptive else None), None
        if rule is None:
            for i in range(r):
                s = m.iterate(s, e, rope, i, mask, cache)
        else:  # Huginn §6.1, per row: a row that converged stops looping and writing; the rest go on
            s, logits = self._exit_loops(s, e, rope, mask, r, loops)
        if logits is None:
            last = None
            if last_only and T > 1:
                last = torch.zeros(B, T, dtype=torch.bool, device=idx.device)
                last[:, -1] = True
            logits = m.readout(s, rope, mask, cache, positions=last)  # (B, T, V), or (B, V) at last
            logits = logits if last is None else logits.view(B, 1, -1)
        self.warm = s[:, -1:]
        if cache is not None:
            self.pos += T
        return logits, loops

    def _exit_loops(self, s, e, rope, mask, r, loops):
        """The loops of an adaptive step. After every loop the rows that converged leave the batch: the
        next loop runs on the n rows still looping only (their state, e, rotary and mask gathered; the cache
        writes and returns theirs only), so a step costs the loops its rows ran, not B times the slowest
        row's. Fills loops (B,) in place; returns every row's final state (B, 1, h) and, when the rule
        reads out after every loop, each row's logits of its last loop (B, 1, V), else None."""
        m, cache, rule, B = self.model, self.cache, self.exit_rule, s.shape[0]
        rule.reset()
        rows = torch.arange(B, device=s.device)  # the rows still looping
        out, lg = s.clone(), None
        out_logits = torch.empty(B, 1, m.config.vocab_size, device=s.device) if rule.needs_readout else None
        for i in range(r):
            view = cache if len(rows) == B else WriteRows(cache, rows)  # all rows: the plain cache, no gather
            s_new = m.iterate(s, e, rope, i, mask, view)  # (n, 1, h)
            lg = m.readout(s_new, rope, mask, view) if rule.needs_readout else None
            done = rule.converged(i, s, s_new, lg)  # (n,) bool
            s = s_new
            if i + 1 < r and bool(done.any()):
                gone, keep = rows[done], ~done
                out[gone] = s[done]
                if lg is not None:
                    out_logits[gone], lg = lg[done], lg[keep]
                loops[gone.cpu()] = i + 1
                cache.mark_exited(gone, i + 1)
                rule.keep(keep)
                rows, s, e = rows[keep], s[keep], e[keep]
                rope, mask = tuple(t[keep] for t in rope), None if mask is None else mask[keep]
                if len(rows) == 0:
                    break
        out[rows] = s
        if lg is not None:
            out_logits[rows] = lg
        return out, out_logits
