"""Datasets: the Sample schema, adapters (JSONL, HF datasets, image folders), images and the shapes task.

Knows nothing of models, rollout or training.
"""
