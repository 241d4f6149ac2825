"""Preset data (GPUs, models, clusters, published runs), loaded on demand by model.presets."""
