"""File formats and presets: everything that reads or writes a file, and builds the specs the
cost model takes (GPU and model presets, Hugging Face configs, cluster TOML, measured bandwidth,
intra-node topologies, plan files and JSON views, the published runs and their comparison).

The cost model (model/) never imports this package; it imports model/ for the specs it builds.
"""
