"""
The diffusion-forcing sampler of a recurrent-depth model (the nanorecur remote code runs this file too, as
generate(..., sampler="diffusion")): decoding "diagonally", many positions a few loops each per
forward pass, instead of one position all r loops (Geiping, Yang and Su 2025, "Efficient Parallel Samplers for
Recurrent-Depth Models and Their Connection to Diffusion Language Models", arXiv 2510.14961; the model is McLeish
et al. 2025, arXiv 2511.07384, on Huginn-0125, arXiv 2502.05171).

Sequential decoding runs the core r times for a token before the next one can start, so a token costs P + r R + C
layer applications one after the other. The paper reads the recurrence as a diffusion process over the latent
states: a position does not need a final token before it, only a guess, since the next pass refines both. So a
forward pass here runs over a wavefront of positions, the oldest nearly done, the newest just proposed (§3):

    1. every position of the wave runs loops_per_pass more loops of the core from its own state, then the coda
       reads them all out: each position's guess of the token after it (greedy or sampled);
    2. each guess becomes the next position's input token, and `headway` new positions join at the end
       (its state drawn as s_0 is; a first_loop "identity" model feeds its first loop e, model.iterate), up to
       `wavefront` positions in all;
    3. positions freeze from the front: a position whose state moved less than the threshold over the pass
       (latent-diff, exit_gate.py's criterion of --exit) freezes with every position before it and its own input
       token (a converged state vouches for what it read), and a position that has run freeze_loops loops (default
       r, what sequential decoding gives a token) freezes with its guess if the token it read in this pass is the
       one frozen before it. Frozen tokens are the output.

The last condition matters at headway > 1, where positions that joined together reach their budget together: if
position j's guess changed in the final pass, position j + 1's state was built on the old token, and its guess
continues a sequence that is not the output. It stays for another pass with the new token instead (without it,
headway 2 and 4 lost 14 and 23 points on the depth task's chains at r = 8, and their text had 1.3-2.6x
sequential's NLL; RESULTS, speed). The reference's `fixed` strategy freezes the `headway` oldest positions each pass once the first has run
its budget, whatever they read; its latent-diff freeze is this file's, token for token at headway 1, 2 and 4
(tests/test_diffusion.py).

A pass costs P + loops_per_pass R + C layer applications over a few rows, about what one token's costs at batch 1
when the weights' reads are the bottleneck, and it freezes about one token: at r = 32 and loops_per_pass 4 that is
8x fewer sequential layers than sequential decoding. The KV cache keeps one entry per (layer, loop) as
sequential decoding's does (kv_cache.py): pass loop i writes loop i's slot of the wave's positions, and reads there
what frozen positions wrote in their last pass, and the prompt's, prefilled at all r loops. Limit: a wavefront of
one position and loops_per_pass = r is sequential decoding, token for token (tests/test_diffusion.py); so is any
wavefront with loops_per_pass = r, one pass per token.

    python sample.py --init out/smollm2 --r 32 --sampler diffusion --loops_per_pass 4 --prompt "The capital of"
    python sample.py --init out/depth --r 32 --sampler diffusion --exit latent-diff --exit_threshold 0.03 \\
        --temperature 0 --prompt " c a f b"
    python bench/bench_sample.py --sections 5       # tokens/s and quality against sequential decoding
    python -m pytest -q tests/test_diffusion.py     # the limit, and the reference sampler's tokens on a fixture
"""

import time

import torch

try:  # in the repository
    from exit_gate import exit_value
    from kv_cache import CachedForward, KVCache
except ImportError:  # in a checkpoint directory, where transformers imports these files as one package
    from .exit_gate import exit_value
    from .kv_cache import CachedForward, KVCache


def check_diffusion(r, loops_per_pass, wavefront, headway, freeze_loops, threshold):
    """Every knob's bad value as one ValueError naming it, before the model runs."""
    for name, v in (("loops_per_pass", loops_per_pass), ("wavefront", wavefront), ("headway", headway)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if loops_per_pass > r:
        raise ValueError(f"loops_per_pass {loops_per_pass} is more than r = {r}: the prompt is prefilled at r loops, "
                         "and a pass reads the prompt's entries of its own loops")
    if freeze_loops is not None and freeze_loops < loops_per_pass:
        raise ValueError(f"freeze_loops {freeze_loops} is below loops_per_pass {loops_per_pass}: a position runs "
                         "at least one pass")
    if freeze_loops is None and threshold is None:
        raise ValueError("the sampler needs a way to freeze: a loop budget (freeze_loops) or a latent-diff threshold")
    if freeze_loops is None and wavefront == 1:
        raise ValueError("a wavefront of one without a loop budget never freezes (a converged position freezes what "
                         "comes before it): give freeze_loops or a wider wavefront")


def generate_diffusion(model, prompt, *, max_new_tokens, r, pick, loops_per_pass=4, wavefront=128, headway=1,
                       freeze_loops=-1, threshold=None, eos=frozenset(), stop=None, kv_budget=None, generator=None,
                       stats=None):
    """Complete one prompt (token ids) with the diffusion-forcing sampler. r: the prompt's loops, and the default
    freeze_loops (-1: r; None: no budget, the latent-diff threshold alone freezes). pick(logits (T, V)) -> (T,) ids:
    greedy or sampled. threshold: latent-diff's ||s - s_prev|| / ||s|| over a pass below which a position freezes
    (None: off). eos, stop(row, tokens) end the output as in sample.generate. stats (a dict) receives the counts.
    Returns (tokens, loops): the new tokens and the loops run by the position that proposed each (the first:
    the prefill's r)."""
    freeze_loops = r if freeze_loops == -1 else freeze_loops
    check_diffusion(r, loops_per_pass, wavefront, headway, freeze_loops, threshold)
    if model.config.state_init == "embed":  # s_0 = e needs the prelude of a position before it joins the wave
        raise ValueError("the diffusion sampler starts new positions from s_0 ~ init_state: a state_init 'embed' "
                         "checkpoint has none; load it with state_init 'zero' or 'normal'")
    w = model.embed_tokens.weight
    L = len(prompt)
    end = L + max_new_tokens  # the positions of the output are L .. end - 1 (the first is the prefill's guess)
    cache = KVCache(model.config, 1, end, min(kv_budget or r, r), w.device, w.dtype)
    fwd = CachedForward(model, [0], end, r, cache, generator=generator)
    fresh = lambda n: model.init_state(torch.zeros(1, n, model.config.n_embd, device=w.device, dtype=w.dtype),
                                       generator)  # s_0 of n new positions (1, n, h)
    stats = {} if stats is None else stats
    stats.update(passes=0, wave_positions=0, kv_bytes=cache.nbytes)
    t0 = time.perf_counter()
    with torch.inference_mode():
        logits, _ = fwd.run(torch.tensor([prompt], device=w.device), last_only=True)  # the prompt at r loops
        out, loops = [int(pick(logits[:, -1])[0])], [r]
        stats["prefill_s"], t0 = time.perf_counter() - t0, time.perf_counter()
        # the wave: positions a, a+1, ..; toks[0] is the last frozen token, the rest are guesses
        a, toks, s, ran = L, [out[0]], fresh(1), [0]
        prev = s  # latent-diff: each position's state after the last pass (s_0 for a new one)
        done = out[0] in eos or (stop is not None and stop(0, out))
        while not done and len(out) < max_new_tokens:
            fwd.pos = a
            first = torch.tensor([[n == 0 for n in ran]], device=w.device)  # (1, S): new positions, on loop 1
            logits, s = fwd.refine(torch.tensor([toks], device=w.device), s, loops_per_pass, first)  # 1. (1, S, V)
            ran = [n + loops_per_pass for n in ran]
            guess = pick(logits[0]).tolist()  # guess[j]: the token after position a + j
            stats["passes"] += 1
            stats["wave_positions"] += len(toks)
            if threshold is not None:  # ||s - s_prev|| / ||s|| per position over this pass, in fp32
                moved = exit_value("latent-diff", prev[0].float(), s[0].float())  # (S,)
            # 2. the guesses become the inputs after toks[0]; headway new positions join, the wave capped
            S, inputs = len(toks), toks  # inputs[j]: the token position a + j read in this pass
            cap = min(wavefront, end - a)  # nothing past the last new token's position feeds the output
            toks = (toks[:1] + guess[:S - 1] + [guess[S - 1]] * headway)[:cap]
            s, ran = torch.cat([s, fresh(headway)], dim=1)[:, :cap], (ran + [0] * headway)[:cap]
            # 3. freeze the first f positions of the wave, and the f tokens after them
            f = 0
            if threshold is not None and bool((moved < threshold).any()):
                f = int((moved < threshold).nonzero()[-1])  # the last converged position, which stays
            if freeze_loops is not None:  # the positions past their budget, each only if it read its final token
                spent = next((j for j, n in enumerate(ran) if n < freeze_loops), len(ran))
                f = max(f, next((j for j in range(1, spent) if guess[j - 1] != inputs[j]), spent))
            for j in range(f):
                out.append(guess[j])
                loops.append(ran[j])
                if guess[j] in eos or (stop is not None and stop(0, out)) or len(out) == max_new_tokens:
                    done = True
                    break
            a, toks, s, ran = a + f, toks[f:], s[:, f:], ran[f:]
            if not toks:  # all froze (a wavefront of one): the next position starts afresh
                toks, s, ran = [out[-1]], fresh(1), [0]
            prev = s
            if stats["passes"] > 64 * (max_new_tokens + wavefront) and not done:
                raise ValueError(f"the wave froze {len(out)} of {max_new_tokens} tokens in {stats['passes']} passes: "
                                 "give a loop budget (freeze_loops) or a higher latent-diff threshold")
    stats["decode_s"] = time.perf_counter() - t0
    stats["loops_run"] = stats["wave_positions"] * loops_per_pass  # core loops summed over the wave's positions
    return out, loops

