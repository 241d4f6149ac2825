"""What one annealing move costs: milliseconds to score a neighbour, per move kind.

    python bench/anneal_moves.py [--sizes 128,512] [--moves 300]

On bench/anneal_vs_paper.py's instances (random matrix; Llama-2 7B, TP 8, PP 8, DP = nodes /
8), with the compiled walks loaded first: from the identity permutation, `--moves` neighbours
of each of Pipette's five kinds (swap, 2-opt, insert, insert-route, insert-reversed;
solvers.anneal.perm_move), each scored by `PlacementProblem.cost` as the annealer scores it
(after 20 unscored warm-up moves of that kind). Prints ms per move and their mean. A faster
move is more moves in the same budget, with the same answer for a given move count.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from anneal_vs_paper import instance  # noqa: E402
from model import walk_jit  # noqa: E402
from solvers.anneal import perm_move  # noqa: E402

KINDS = ("swap", "2-opt", "insert", "insert-route", "insert-reversed")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="128,512")
    ap.add_argument("--moves", type=int, default=300)
    a = ap.parse_args(argv)
    walk_jit.load()
    print(f"{'nodes':>5s} " + " ".join(f"{k:>15s}" for k in KINDS) + f" {'mean':>8s}  (ms/move)")
    for n in (int(x) for x in a.sizes.split(",")):
        prob = instance(n, "random")
        lay = prob.start_layers()
        perm = list(range(prob.num_slots))
        prob.cost(perm, lay)
        ms = []
        for kind in range(len(KINDS)):
            rng = np.random.default_rng(kind)
            r = (kind + 0.5) / len(KINDS)  # perm_move's fifth of [0, 1) for this kind
            for _ in range(20):
                prob.cost(perm_move(rng, perm, r), lay)
            t = time.perf_counter()
            for _ in range(a.moves):
                prob.cost(perm_move(rng, perm, r), lay)
            ms.append((time.perf_counter() - t) / a.moves * 1e3)
        print(f"{n:5d} " + " ".join(f"{x:15.2f}" for x in ms) + f" {sum(ms) / len(ms):8.2f}")


if __name__ == "__main__":
    main()
