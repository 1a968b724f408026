"""
The model a train.py run trains, built from --init: a new model from scratch of --shape and width, or what
surgery.load_model makes of --init (our checkpoint for phase 2, a raven checkpoint, a parent cut to --shape /
--layers), or on --resume the run's own save; with --exit_gate's new gate. train.py's start() calls it.

    python train.py --init=llama --shape 4,6,4       # a parent, cut here
    python train.py --config config/cpu_depth.json    # from scratch
"""

from exit_gate import add_exit_gate
from model import RecurrentConfig, RecurrentGPT
from plumbing import run_dir
from plumbing.cli import int_list


def build_model(args, meta, ckpt_dir=None):
    """(model, tokenizer source or None) from --init, or on --resume from ckpt_dir (the verified save
    checkpoint.find chose; the run's tokenizer files are at the top of out_dir). surgery.load_model decides
    what --init is: our checkpoint (phase 2), a raven checkpoint, or a parent, cut to --shape / --layers.
    The model's tokenizer (or the data it was trained on) must be the data's: a ValueError says
    what does not fit (train.py prints it as one line)."""
    from plumbing import hub
    import surgery

    shape = tuple(int_list(args.shape, "--shape", n=3))  # checked by check_args
    over = {k: getattr(args, k) for k in ("state_init", "first_loop") if getattr(args, k)}  # "": the model's own
    if args.init == "scratch" and ckpt_dir is None:
        P, R, C = shape
        config = RecurrentConfig(
            vocab_size=meta["vocab_size"], n_embd=args.n_embd, n_head=args.n_head,
            n_kv_head=args.n_kv_head or args.n_head, head_dim=args.n_embd // args.n_head,
            intermediate_size=args.intermediate_size or 4 * args.n_embd, block_size=args.block_size,
            n_prelude=P, n_core=R, n_coda=C, recurrent=not args.static, adapter_init=args.adapter_init,
            tie_embeddings=not args.untie, mean_recurrence=args.mean_recurrence,
            bos_id=meta.get("bos_id"), eos_id=meta.get("eos_id"), **over)
        model, tok_src = RecurrentGPT(config), None
    else:
        try:
            model, src = surgery.load_model(ckpt_dir or args.init, shape=shape, layers=args.layers or None,
                                            static=args.static, untie=args.untie, adapter_init=args.adapter_init,
                                            mean_recurrence=args.mean_recurrence, **over)
            tok_src = run_dir.check_vocabulary(meta, args.data, args.out_dir if ckpt_dir else src, src)
            unapplied = None if ckpt_dir else surgery.cut_not_applied(model, args.init, shape, args.layers, args.static)
            if unapplied:  # a config file's --shape for runs from scratch, or a cut asked of a checkpoint
                print(f"note: {unapplied}")
        except (surgery.SurgeryError, hub.CheckpointError, FileNotFoundError) as err:
            raise ValueError(str(err)) from None
    if meta["vocab_size"] > model.config.vocab_size:
        raise ValueError(f"data vocab_size {meta['vocab_size']} > model vocab_size {model.config.vocab_size}")
    if args.freeze != "none" and not model.config.recurrent:
        raise ValueError(f"--freeze={args.freeze} trains the adapter (and the core), which a --static model does not have")
    if args.exit_gate and not model.config.recurrent:
        raise ValueError(f"--exit_gate needs a recurrent model: {args.init} runs its layers once")
    if args.exit_gate and not model.config.exit_gate:  # a new gate (p = 0.5), saved under exit_gate.*
        add_exit_gate(model)
    return model, tok_src
