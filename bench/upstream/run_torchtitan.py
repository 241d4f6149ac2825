"""torchtitan's own config handling on emitted TOML files (run by bench/upstream_check.py with
the Python that has torch, from the root of a torchtitan checkout of one release; imports
nothing of this project).

For each file: torchtitan's ConfigManager parses it as `--job.config_file FILE` would at launch
(unknown keys are errors), then the model named by [model] name/flavor is looked up in
torchtitan's train-spec registry and built on the meta device, and what torchtitan would run is
written as JSON: parallel degrees, schedule, micro-batch, layers per pipeline part, batch,
activation checkpointing, converters, the model's layers, width, heads, FFN width, experts and
parameter count, and the job config as the run would print it at start-up (for `calibrate`'s
reader of it).

usage: python run_torchtitan.py ITEMS.json RESULTS.json  (ITEMS: a list of {"path": TOML,
"vocab": the tokenizer's vocabulary, which v0.1 takes at launch})
"""

import json
import re
import sys
import traceback


def _layers_per_part(par, n_layers):
    fqns = getattr(par, "module_fqns_per_model_part", None)
    if fqns:
        return [sum(1 for m in part if re.fullmatch(r"layers\.\d+", m)) for part in fqns]
    pts = list(getattr(par, "pipeline_parallel_split_points", []) or [])
    if pts and n_layers:
        cuts = [int(p.split(".")[1]) for p in pts]
        edges = [0] + cuts + [n_layers]
        return [b - a for a, b in zip(edges, edges[1:])]
    return None


def _model_view(name, flavor, vocab):
    import dataclasses

    import torch

    from torchtitan.protocols.train_spec import get_train_spec

    spec = get_train_spec(name)
    table = getattr(spec, "model_args", None) or getattr(spec, "config")
    args = table[flavor]
    if getattr(args, "vocab_size", 0) <= 0:  # v0.1 takes it from the tokenizer at launch
        args = dataclasses.replace(args, vocab_size=vocab)
    cls = getattr(spec, "model_cls", None) or getattr(spec, "cls")
    with torch.device("meta"):
        model = cls(args)
    layers = list(model.layers.values()) if hasattr(model.layers, "values") else list(
        model.layers)
    dense = next((b for b in layers if getattr(b, "feed_forward", None) is not None
                  and hasattr(b.feed_forward, "w1")), None)
    moe = next((b for b in layers if getattr(b, "moe", None) is not None), None)
    return {"n_layers": len(layers), "dim": args.dim, "n_heads": args.n_heads,
            "n_kv_heads": getattr(args, "n_kv_heads", None) or args.n_heads,
            "ffn": dense.feed_forward.w1.out_features if dense is not None else None,
            "experts": (moe.moe.experts.num_experts if moe is not None and
                        hasattr(moe.moe.experts, "num_experts") else 0),
            "params": sum(p.numel() for p in model.parameters())}


def _printed(cfg):
    """What the run would print of its job config at start-up, the text after 'Running with
    ...: ': v0.2.2's JobConfig.maybe_log (run, its log record caught) where the release has
    it; before it, train.py's own line (v0.1.0 with [job] print_args, v0.2.0/v0.2.1 with
    print_config: f"Running with args: {job_config.to_dict()}"); None when the config does not
    ask for it."""
    import logging

    job = cfg.job
    if hasattr(cfg, "maybe_log"):
        seen = []

        class Catch(logging.Handler):
            def emit(self, record):
                seen.append(record.getMessage())

        from torchtitan.tools.logging import logger

        h = Catch()
        logger.addHandler(h)
        level = logger.level
        logger.setLevel(logging.INFO)  # as torchtitan's init_logger sets it
        try:
            cfg.maybe_log()
        finally:
            logger.removeHandler(h)
            logger.setLevel(level)
        text = next((m for m in seen if m.startswith("Running with")), None)
        return None if text is None else text.split(": ", 1)[1]
    if getattr(job, "print_args", False) or getattr(job, "print_config", False):
        return f"{cfg.to_dict()}"
    return None


def titan_view(item):
    path, vocab = item["path"], item["vocab"]
    try:
        try:
            from torchtitan.config.manager import ConfigManager  # v0.2
        except ImportError:
            from torchtitan.config_manager import ConfigManager  # v0.1
        cfg = ConfigManager().parse_args(["--job.config_file", path])
    except BaseException as e:
        return {"accepted": False, "error": f"{type(e).__name__}: {e}"[:600]}
    par, tr = cfg.parallelism, cfg.training
    out = {"accepted": True, "model_name": cfg.model.name, "flavor": cfg.model.flavor,
           "converters": list(getattr(cfg.model, "converters", []) or []),
           "tp": par.tensor_parallel_degree, "pp": par.pipeline_parallel_degree,
           "cp": par.context_parallel_degree,
           "cp_rotate": par.context_parallel_rotate_method,
           "dp_replicate": par.data_parallel_replicate_degree,
           "dp_shard": par.data_parallel_shard_degree,
           "ep": getattr(par, "expert_parallel_degree", 1),
           "schedule": par.pipeline_parallel_schedule,
           "microbatch": par.pipeline_parallel_microbatch_size,
           "local_batch": tr.local_batch_size, "global_batch": tr.global_batch_size,
           "seq_len": tr.seq_len, "ac_mode": cfg.activation_checkpoint.mode,
           "async_tp": par.enable_async_tensor_parallel}
    # the float8 recipe (v0.2 quantize.linear.float8, v0.1 float8): parallelize turns Float8
    # TP on for a tensorwise recipe (None is tensorwise) when 'float8' is among the converters
    q = getattr(getattr(getattr(cfg, "quantize", None), "linear", None), "float8", None)
    f8 = q if q is not None else getattr(cfg, "float8", None)
    out["float8_recipe"] = getattr(f8, "recipe_name", None) if f8 is not None else None
    out["printed"] = _printed(cfg)
    try:
        out["model"] = _model_view(cfg.model.name, cfg.model.flavor, vocab)
    except BaseException as e:
        out["model_error"] = f"{type(e).__name__}: {e}"[:300]
        out["model_where"] = traceback.format_exc().splitlines()[-3][:200]
    n = out.get("model", {}).get("n_layers")
    out["layers"] = _layers_per_part(par, n) if par.pipeline_parallel_degree > 1 else None
    return out


def titan_coords(v: dict) -> list | None:
    """rank -> [stage, batch index, cp rank, tensor rank] under torchtitan's own device mesh:
    ParallelDims(...).build_mesh() run for every rank on torch's fake process group (no
    communication), each rank's pp / batch / cp / tp groups read from the meshes it builds."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torchtitan.distributed.parallel_dims import ParallelDims

    kw = dict(dp_replicate=v["dp_replicate"], dp_shard=v["dp_shard"], cp=v["cp"], tp=v["tp"],
              pp=v["pp"])
    world = kw["dp_replicate"] * kw["dp_shard"] * kw["cp"] * kw["tp"] * kw["pp"]
    fields = ParallelDims.__dataclass_fields__
    kw.update({k: 1 for k in ("ep", "etp") if k in fields})
    if "enable_loss_parallel" in fields:  # v0.1
        kw["enable_loss_parallel"] = True
    out = []
    for r in range(world):
        dist.init_process_group("fake", rank=r, world_size=world, store=FakeStore())
        try:
            pd = ParallelDims(world_size=world, **kw)
            try:
                mesh = pd.build_mesh()
            except TypeError:  # v0.1: build_mesh(device_type)
                mesh = pd.build_mesh("cpu")
            coord = []
            for dim in ("pp", "batch", "cp", "tp"):
                sub = pd._meshes.get(dim) if getattr(pd, "_meshes", None) else None
                if sub is None:  # v0.1: named (and flattened "dp") dimensions of the world mesh
                    name = {"batch": "dp"}.get(dim, dim)
                    try:
                        sub = mesh[name]
                    except (KeyError, RuntimeError, ValueError):
                        sub = None
                ranks = sub.mesh.flatten().tolist() if sub is not None else [r]
                coord.append(ranks.index(r))
            out.append(coord)
        finally:
            dist.destroy_process_group()
    return out


def main():
    items = json.load(open(sys.argv[1]))
    dest = sys.argv[2]
    views = []
    for it in items:
        v = titan_view(it)
        if v["accepted"]:
            try:
                v["coords"] = titan_coords(v)
            except BaseException as e:  # a release whose mesh API differs
                v["coords_error"] = f"{type(e).__name__}: {e}"[:300]
        views.append(v)
    with open(dest, "w") as f:
        json.dump(views, f)


if __name__ == "__main__":
    main()
