"""Bandwidth probe users run on their own cluster (needs the `probe` extra: torch).

    torchrun --nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HEAD:29500 \
        probe/p2p_bandwidth.py -o bandwidth.json

then `python cli.py cluster import bandwidth.json --gpu ... --gpus-per-node ... -o cluster.toml`.
"""
