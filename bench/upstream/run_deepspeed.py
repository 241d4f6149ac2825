"""DeepSpeed's own config handling on emitted ds_config.json files (run by
bench/upstream_check.py with a Python that has deepspeed; imports nothing of this project).

For each file, `DeepSpeedConfig` parses and checks it as `deepspeed.initialize` does, with a
stand-in for the model-parallel unit that reports the plan's data-parallel size (DeepSpeed
checks train_batch_size = micro batch x accumulation x data-parallel size against it) and for
the process group of rank 0, and the
batch, ZeRO and precision settings it ends up with are written as JSON.

It also lists each rank's (stage, replica, tensor rank) under DeepSpeed's pipeline topology,
for the rank check.

usage: python run_deepspeed.py ITEMS.json RESULTS.json  (ITEMS: a list of {"path": JSON,
"dp": data-parallel size, "pp": ..., "tp": ...})
"""

import json
import sys


class _DataParallelOnly:
    """What DeepSpeedConfig asks of an mpu: the data-parallel world size."""

    def __init__(self, dp):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_model_parallel_world_size(self):
        return 1


def ds_coords(pp, dp, tp):
    """rank -> (stage, replica, tensor rank) under DeepSpeed's own pipeline topology
    (deepspeed/runtime/pipe/topology.py PipeModelDataParallelTopology, axes pipe, data,
    model)."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    return [[c.pipe, c.data, c.model] for c in (topo.get_coord(r) for r in range(pp * dp * tp))]


def ds_view(item):
    import deepspeed.runtime.config as dsc
    from deepspeed.runtime.config import DeepSpeedConfig

    # stand-in for the initialized process group of rank 0 (without it DeepSpeedConfig falls
    # back to a world of 1 and ignores the mpu)
    dsc.dist.get_rank = lambda *a, **k: 0

    try:
        cfg = DeepSpeedConfig(item["path"], mpu=_DataParallelOnly(item["dp"]))
    except BaseException as e:
        return {"accepted": False, "error": f"{type(e).__name__}: {e}"[:600]}
    return {"accepted": True, "train_batch_size": cfg.train_batch_size,
            "micro_batch": cfg.train_micro_batch_size_per_gpu,
            "grad_accum": cfg.gradient_accumulation_steps,
            "zero_stage": cfg.zero_optimization_stage,
            # the engines' timing lines print every this many steps (None: never)
            "steps_per_print": cfg.steps_per_print,
            "bf16": getattr(cfg, "bfloat16_config", None) is not None
            and bool(getattr(cfg.bfloat16_config, "enabled", False)),
            "fp16": bool(getattr(cfg, "fp16_enabled", False))}


def main():
    items = json.load(open(sys.argv[1]))
    out = []
    for it in items:
        v = ds_view(it)
        if v["accepted"]:
            v["coords"] = ds_coords(it["pp"], it.get("topo_dp", it["dp"]), it["tp"])
        out.append(v)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
