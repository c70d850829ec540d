"""Datasets: the Sample schema, adapters (JSONL, HF datasets, image folders), presets (other projects' row shapes),
images and the shapes task.

Knows nothing of models, rollout or training.
"""
