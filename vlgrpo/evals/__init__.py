"""Evaluation: POPE probes (builder + scorer), loaders for the real benchmarks in the top-level `evals/`.

The builder, the scorer and the loaders are pure Python and need no model; the runner that asks a model the
questions builds on them. Knows nothing of training.
"""
