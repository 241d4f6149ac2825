"""Pairwise node-to-node point-to-point bandwidth with torch.distributed, in round-robin rounds.

Run one process per node (each drives one GPU, local GPU 0 unless --gpu is given):

    torchrun --nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HEAD:29500 \
        probe/p2p_bandwidth.py -o bandwidth.json [--size-mb 256 --iters 20]

Schedule: the circle method (round-robin tournament; Berge / "Kirkman" schedule): with n nodes
(n even) there are n-1 rounds of n/2 disjoint pairs, and every pair meets exactly once; an odd n
gets a dummy node, so n rounds in which one node rests. The pairs of a round run concurrently
(like the streams of a real job), and within a pair first the lower rank sends, then the other
way. Each direction: `warmup` untimed messages, then `iters` messages of `size` bytes timed on
the sender from the first send until the receiver's 1-element acknowledgement arrives after its
last receive, so the time covers delivery: bandwidth = size x iters / time, in GB/s (1e9 bytes/s).

Output (rank 0 writes it): JSON {"nodes": [...], "gb_per_s": [[null, ...], ...], ...} with the
sender on the row, which `python cli.py cluster import` reads; a path ending in .csv gets the
same matrix as CSV (header of node names, first column the sender, empty diagonal).
Node names are host names (--name-by host, the default; two processes on one host is then an
error) or rank0, rank1, ... (--name-by rank, for local tests).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import socket
import sys
import time
from pathlib import Path

FORMAT = "pipette-probe/1"


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs (a < b) covering every pair of range(n) exactly once.

    Circle method: fix slot 0, rotate the others one step per round; round r pairs slot k with
    slot m-1-k (m = n rounded up to even; the dummy's partner rests)."""
    if n < 2:
        return []
    slots: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(slots)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = slots[k], slots[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        slots = [slots[0], slots[-1]] + slots[1:-1]
    return rounds


def _one_direction(dist, torch, buf, ack, me: int, src: int, dst: int, iters: int,
                   warmup: int, sync) -> float | None:
    """Send `iters` messages src -> dst; the sender returns GB/s, the receiver None."""
    for n_msgs, timed in ((warmup, False), (iters, True)):
        if n_msgs == 0:
            continue
        if me == src:
            sync()
            t0 = time.perf_counter()
            for _ in range(n_msgs):
                dist.send(buf, dst)
            dist.recv(ack, dst)
            sync()
            dt = time.perf_counter() - t0
            if timed:
                # GB/s = bytes / s / 1e9 (the cluster file's unit, model/cluster.py)
                return buf.numel() * buf.element_size() * n_msgs / dt / 1e9
        else:
            for _ in range(n_msgs):
                dist.recv(buf, src)
            sync()
            dist.send(ack, src)
    return None


def measure(size_bytes: int, iters: int, warmup: int, backend: str, name_by: str,
            gpu: int | None) -> dict | None:
    import torch
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        dev = torch.device("cuda", gpu if gpu is not None else int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
        sync = torch.cuda.synchronize
    else:
        dev = torch.device("cpu")
        sync = lambda: None  # noqa: E731 (gloo send/recv are synchronous on the CPU)
    host = socket.gethostname()
    names: list = [None] * world
    dist.all_gather_object(names, host if name_by == "host" else f"rank{rank}")
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        dist.destroy_process_group()
        raise SystemExit(f"error: several processes on host(s) {', '.join(dup)}: run one "
                         "process per node (torchrun --nproc-per-node 1), or --name-by rank")
    buf = torch.empty(size_bytes, dtype=torch.uint8, device=dev)
    ack = torch.zeros(1, dtype=torch.uint8, device=dev)
    rounds = round_robin(world)
    mine: dict[str, float] = {}
    for pairs in rounds:
        dist.barrier()
        for a, b in pairs:
            if rank not in (a, b):
                continue
            for src, dst in ((a, b), (b, a)):
                bw = _one_direction(dist, torch, buf, ack, rank, src, dst, iters, warmup, sync)
                if bw is not None:
                    mine[f"{src},{dst}"] = bw
    dist.barrier()
    allres: list = [None] * world
    dist.all_gather_object(allres, mine)
    dist.destroy_process_group()
    if rank != 0:
        return None
    mat: list[list[float | None]] = [[None] * world for _ in range(world)]
    for res in allres:
        for key, bw in res.items():
            s, d = map(int, key.split(","))
            mat[s][d] = round(bw, 4)
    return {"format": FORMAT, "nodes": names, "gb_per_s": mat,
            "units": "GB/s (1e9 bytes/s) of one stream from the row node to the column node",
            "backend": backend, "size_bytes": size_bytes, "iters": iters, "warmup": warmup,
            "rounds": [[list(p) for p in r] for r in rounds],
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat()}


def write(result: dict, path: str) -> None:
    if path.endswith(".csv"):
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["from\\to"] + result["nodes"])
            for name, row in zip(result["nodes"], result["gb_per_s"]):
                w.writerow([name] + ["" if v is None else v for v in row])
    else:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("-o", "--output", required=True, help="JSON (or .csv) file to write.")
    ap.add_argument("--size-mb", type=float, default=256.0,
                    help="Message size in MB (1e6 bytes) [256].")
    ap.add_argument("--iters", type=int, default=20, help="Timed messages per direction [20].")
    ap.add_argument("--warmup", type=int, default=5, help="Untimed messages first [5].")
    ap.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                    help="auto: nccl where CUDA is available, else gloo.")
    ap.add_argument("--name-by", choices=("host", "rank"), default="host",
                    help="Name the matrix's nodes by host name or by rank [host].")
    ap.add_argument("--gpu", type=int, default=None, help="Local GPU to use [LOCAL_RANK].")
    a = ap.parse_args(argv)
    size = a.size_mb * 1e6 if math.isfinite(a.size_mb) else 0.0
    if not 1 <= size <= 2**40 or a.iters < 1 or a.warmup < 0:
        ap.error("--size-mb must be a number from 1e-6 (one byte) to 1e6, --iters >= 1, "
                 "--warmup >= 0")
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        ap.error(f"{', '.join(missing)} not set: launch one process per node with torchrun "
                 "(README: Measuring a cluster), which sets them")
    out = Path(a.output)
    if out.is_dir() or not out.parent.is_dir():
        ap.error(f"{a.output}: give a file in an existing folder (checked before measuring)")
    res = measure(int(a.size_mb * 1e6), a.iters, a.warmup, a.backend, a.name_by, a.gpu)
    if res is not None:
        write(res, a.output)
        print(f"wrote {a.output}: {len(res['nodes'])} nodes, {len(res['rounds'])} rounds",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
