"""The plumbing a reader of the recipe may skip:

- tokenizer.py, gguf.py: the parents' tokenizers (on tiktoken, SentencePiece for TinyLlama) and the one GGUF reader
- hub.py, parents.py: hub ids and short names to local files; a parent's HF directory or GGUF to our weights
- raven.py: the published raven checkpoint format (Huginn-0125, the McLeish et al. retrofits), both directions
- batches.py, run_dir.py, guards.py, device.py: train.py's rows and batches, its run directory (saves,
  resume, log), its NaN and divergence stops, and its device / DDP setup
- checkpoint.py: a run directory as one unit (atomic saves, weights_only loads, one process per out_dir)
- eval_data.py, math_grader.py: eval_math.py's problems and its MATH answer grading
- exit_sweep.py: eval_math.py --exit_sweep, the depth task's accuracy against mean loops per exit criterion
- analyze_plots.py, plots.py: analyze.py's figures, and matplotlib for files with the one way the scripts save a PNG
- hf_remote.py, hf/: the modeling code transformers runs (trust_remote_code) for our directories and the raven
  export, written into each with a copy of model.py (which it imports) and config.json's auto_map
- model_card.py, upload.py: the README.md model card of a checkpoint, and the push to the hub
- cli.py: what the scripts' command lines share (one-line errors, flag checks)
"""
