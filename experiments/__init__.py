"""Experiments over the recipe, run as modules from the repository root:

- repeat.py: one recipe under several seeds, the (depth k, loops r) table as mean and spread
  (python -m experiments.repeat --out_dir out/seeds/depth --seeds 1337,2,3 -- --config config/cpu_depth.json)
- claims.py, claim_plots.py: the papers' claims at CPU scale, each under 3 seeds, and their figures (make claims)
"""
