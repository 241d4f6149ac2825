"""Preset data (GPUs, models, clusters, published runs), loaded on demand by formats/ (formats.presets, formats.clusters, ...)."""
