"""A Megatron-Bridge run's plan, read from the configuration it ran with, for `calibrate`
without a plan file.

Bridge's log does not print enough to rebuild the plan. Its start-up summary lists only the
values that differ from Megatron Core's defaults, and leaves out the model's own fields:
sequence, vocabulary, position embedding, tied embeddings (src/megatron/bridge/training/
config.py, `log_non_default_values`, at 067f987). So the plan comes from the run's
`run_config.yaml`. Bridge writes one into every checkpoint directory
(training/checkpointing.py `cfg.to_yaml`; docs/training/checkpointing.md), and the same
file goes to `logger.save_config_filepath` where that is set. Both are written after
`runtime_config_update` (training/config.py), so the mixed-precision recipe and the
communication-overlap settings are already applied to the model and DDP sections. A file
written before that update still holds the recipe's name as a string; it is refused, because
its model fields are not what ran.

The model section is a Megatron Core TransformerConfig. Since Bridge's GPTModelConfig it sits
nested under `transformer`; the older GPTModelProvider kept it flat. Its field names are
Megatron-LM's argument names. This module renames the few that differ and reads the plan with
formats/megatron_args.py's rules, so the same refusals apply: latent attention, recompute
other than the priced kinds, FP8 recipes other than delayed, tensorwise, mxfp8 and blockwise,
and so on.

Refused here as well: FP8 with the first and last layers kept in bf16 (Bridge's
current-scaling recipes), FP4, activation offloading, and torch FSDP2 under Megatron. The
data-parallel size is what the cluster's GPUs leave, and is checked against the one Bridge
recorded (comm_overlap.data_parallel_size).
"""

from __future__ import annotations

from pathlib import Path

from model.cluster import ClusterSpec
from model.errors import SpecError
from model.plan import Plan
from model.specs import JobSpec, ModelSpec

from .megatron_args import PrintedArgs, padded_vocab, plan_from_megatron_args
from .reading import FieldReader, read_text, yaml_mapping

# TransformerConfig / GPTModelConfig field -> Megatron-LM argument name, where they differ
_RENAMES = {"num_moe_experts": "num_experts",
            "num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
            "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
            "gated_linear_unit": "swiglu"}
# GPTModelConfig's own fields (beside its nested TransformerConfig)
_MODEL_FIELDS = ("seq_length", "position_embedding_type", "rotary_base", "rotary_percent",
                 "make_vocab_size_divisible_by", "vocab_size", "should_pad_vocab",
                 "share_embeddings_and_output_weights")
_DDP_FIELDS = ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
               "use_megatron_fsdp", "data_parallel_sharding_strategy", "fp8_param_gather")
# Megatron Core's LayerType names in a pipeline layout given as lists (pipeline_parallel_
# layer_layout.py: its string form's characters)
_LAYER_CHARS = {"embedding": "E", "decoder": "t", "loss": "L"}


def _plain(v):
    """A YAML value as Megatron-LM prints the argument (str of the value); an enum serialized
    by Megatron's yaml_utils (_enum_representer: {_target_, _call_, _args_, _name_}) by its
    name, a function or dtype (_function_representer: {_target_, _call_: false}) by its
    path."""
    if isinstance(v, dict) and "_name_" in v:
        return str(v["_name_"])
    if isinstance(v, dict) and "_target_" in v and v.get("_call_") is False:
        return str(v["_target_"])
    return str(v)


def _layout(v, fail) -> str | None:
    """A pipeline layout in Megatron Core's string form ('E', 't', 'L', '|' between virtual
    stages): given as that string, or as one list of layer names per virtual stage."""
    if v is None or isinstance(v, str):
        return v
    if not isinstance(v, list) or not all(isinstance(s, list) for s in v):
        fail("pipeline_model_parallel_layout", "neither a layout string nor a list of stages")
    segs = []
    for stage in v:
        names = [_plain(x).strip().lower() for x in stage]
        if set(names) - set(_LAYER_CHARS):
            fail("pipeline_model_parallel_layout", f"layer kinds {sorted(set(names))} beyond "
                 "embedding, decoder and loss are not priced")
        segs.append("".join(_LAYER_CHARS[n] for n in names))
    return "|".join(segs)


def bridge_printed(doc: dict, num_gpus: int, source: str) -> tuple[dict[str, str], int]:
    """(the run's settings in Megatron-LM's argument names, as _print_args would print them;
    the vocabulary the model built) from a Bridge run_config.yaml's mapping."""

    def fail(field: str, why: str):
        raise SpecError(f"{why}; give --plan for this log", source=source, field=field)

    rd = FieldReader(source)
    for name in ("model", "train", "ddp"):
        if not isinstance(doc.get(name), dict):
            raise SpecError(f"{'no' if doc.get(name) is None else 'a malformed'} '{name}' "
                            "section: not a Megatron-Bridge run_config.yaml (a checkpoint's "
                            "iter_N/run_config.yaml, or the file logger.save_config_filepath "
                            "names)", source=source, field=name)
    model, train, ddp = doc["model"], doc["train"], doc["ddp"]
    if isinstance(doc.get("mixed_precision"), str):
        fail("mixed_precision", f"the recipe name {doc['mixed_precision']!r}: this file was "
             "written before Bridge applied it (runtime_config_update), so its model fields "
             "are not what ran; give a checkpoint's run_config.yaml")
    dist, data, overlap, mp = (rd.obj(doc, n, "", optional=True) or {} for n in (
        "dist", "dataset", "comm_overlap", "mixed_precision"))
    tr = model["transformer"] if isinstance(model.get("transformer"), dict) else model
    fields = {k: v for k, v in tr.items() if not k.startswith("_")}
    fields.update({k: model[k] for k in _MODEL_FIELDS if k in model})
    fields.update({k: ddp[k] for k in _DDP_FIELDS if k in ddp})
    fields["grad_reduce_in_fp32"] = ddp.get("grad_reduce_in_fp32", True)
    # update_config_with_precision_overrides (already applied, but the recipe's word is final)
    fields.update({k: mp[k] for k in ("bf16", "fp16", "fp8", "fp8_recipe", "fp8_param_gather",
                                      "first_last_layers_bf16", "fp4", "grad_reduce_in_fp32")
                   if k in mp})
    def flag(where: dict, name: str, default: bool = False) -> bool:
        return rd.get(where, name, "", bool, default)

    if flag(dist, "use_torch_fsdp2"):
        fail("use_torch_fsdp2", "torch FSDP2 under Megatron is not priced")
    for name in ("cpu_offloading", "fine_grained_activation_offloading"):
        if flag(fields, name):
            fail(name, "activation offloading is not priced")
    if fields.get("fp4") is not None:
        fail("fp4", f"FP4 ({fields['fp4']}) is not priced")
    if fields.get("fp8") is not None and flag(fields, "first_last_layers_bf16"):
        fail("first_last_layers_bf16", "FP8 with the first and last layers in bf16 (Bridge's "
             "current-scaling recipes) is not priced")
    flag(fields, "cross_entropy_loss_fusion")  # read by calibrate (megatron_args loss_unpriced)

    printed = {_RENAMES.get(k, k): _plain(v) for k, v in fields.items()}
    printed["pipeline_model_parallel_layout"] = str(_layout(
        fields.get("pipeline_model_parallel_layout"), fail))
    printed["untie_embeddings_and_output_weights"] = str(
        not flag(fields, "share_embeddings_and_output_weights", True))
    printed["group_query_attention"] = str(fields.get("num_query_groups") is not None)
    printed["grad_reduce_in_bf16"] = str(bool(fields.get("bf16"))
                                         and not flag(fields, "grad_reduce_in_fp32", True))
    # attention_backend None: Transformer Engine picks FlashAttention or cuDNN's fused kernel
    # (neither stores the scores); Megatron's local implementation stores them
    if fields.get("attention_backend") is None:
        local = fields.get("transformer_impl") == "local"
        printed["attention_backend"] = "local" if local else "auto"
    # the model's length (learned positions) and the training sequence, the dataset's
    printed["max_position_embeddings"] = printed.get("seq_length", "None")
    seq = data.get("seq_length", data.get("sequence_length"))
    if seq is not None:
        printed["seq_length"] = str(seq)
    for k in ("global_batch_size", "micro_batch_size"):
        printed[k] = str(train.get(k))
    printed["use_tp_pp_dp_mapping"] = str(flag(dist, "use_tp_pp_dp_mapping"))

    a = PrintedArgs(printed, source)
    tp = a.integer("tensor_model_parallel_size")
    per_replica = tp * a.integer("pipeline_model_parallel_size") * \
        a.integer("context_parallel_size", default=1)
    if per_replica < 1 or num_gpus % per_replica:
        fail("tensor_model_parallel_size", f"TP x PP x CP = {per_replica} does not divide the "
             f"cluster's {num_gpus} GPUs")
    dp = num_gpus // per_replica
    recorded = overlap.get("data_parallel_size")
    if recorded is not None and recorded != dp:
        fail("comm_overlap.data_parallel_size", f"the run had data-parallel size {recorded}; "
             f"on the cluster's {num_gpus} GPUs it is {dp}")
    printed["data_parallel_size"] = str(dp)
    vocab = a.integer("vocab_size")
    if a.flag("should_pad_vocab"):  # GPTModelConfig: calculate_padded_vocab_size
        vocab = padded_vocab(a, tp)
    return printed, vocab


# Megatron Core's defaults of the values checked against a plan (model_parallel_config.py and
# transformer_config.py, Megatron-LM d98e8a6): what Bridge's summary leaves out equals these
_MCORE_DEFAULTS = {"tensor_model_parallel_size": "1", "pipeline_model_parallel_size": "1",
                   "context_parallel_size": "1", "virtual_pipeline_model_parallel_size": "None",
                   "sequence_parallel": "False", "expert_model_parallel_size": "1",
                   "bf16": "False", "fp16": "False", "recompute_granularity": "None",
                   "fp8": "None", "cross_entropy_loss_fusion": "False",
                   "cross_entropy_fusion_impl": "native", "use_distributed_optimizer": "False",
                   "num_query_groups": "None", "num_experts": "None", "moe_router_topk": "2"}


def bridge_summary_args(summary: dict[str, str]) -> dict[str, str]:
    """The settings a Megatron-Bridge log's configuration summary (formats/logs.py
    LogReading.bridge_summaries: 'section.name' -> repr) gives, in Megatron-LM's names as
    _print_args prints them, for formats/megatron_args.py megatron_args_mismatch: the model
    section's values (Megatron Core's default where the summary leaves one out), the train
    section's batch sizes, the dataset's sequence and the DDP section's distributed
    optimizer."""
    def plain(v: str) -> str:  # a repr'd string as printed bare
        return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"" else v

    out = dict(_MCORE_DEFAULTS)
    for key, v in summary.items():
        section, name = key.split(".", 1)
        if section == "model":
            out[_RENAMES.get(name, name)] = plain(v)
        elif (section, name) in (("train", "global_batch_size"), ("train", "micro_batch_size"),
                                 ("dataset", "seq_length"),
                                 ("ddp", "use_distributed_optimizer")):
            out[name] = plain(v)
    return out


def plan_from_bridge_config(path: Path, cluster: ClusterSpec,
                            node_order: list[int] | None = None
                            ) -> tuple[ModelSpec, JobSpec, Plan, dict[str, str]]:
    """(model, job, plan, the settings read in Megatron-LM's names) of the Megatron-Bridge run
    whose run_config.yaml is `path`, on `cluster` (ranks over its nodes in `node_order`, by
    default the cluster's)."""
    # the file is YAML (Bridge's yaml_utils.dump_dataclass_to_yaml: safe_dump)
    src = str(path)
    text = read_text(path, field="--run-config", what="the run's run_config.yaml")
    doc = yaml_mapping(text, src, "--run-config", "the Megatron-Bridge run_config.yaml")
    printed, vocab = bridge_printed(doc, cluster.num_gpus, src)
    model, job, plan = plan_from_megatron_args(printed, cluster, source=src, vocab=vocab,
                                               node_order=node_order)
    return model, job, plan, printed
