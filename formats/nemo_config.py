"""A NeMo 1.x run's plan, read from the configuration its own log printed, for `calibrate`
without a plan file.

NeMo 1.x's Megatron GPT pre-training script logs the whole composed configuration at start-up
(examples/nlp/language_modeling/megatron_gpt_pretraining.py, main: a '************** Experiment
configuration ***********' line, then `OmegaConf.to_yaml(cfg)`, on global rank 0, NeMo 8cfedd7):
the Hydra composition of megatron_gpt_config.yaml and the run's overrides, every key of the
`trainer` and `model` sections included. Its vocabulary is the tokenizer's padded as NeMo pads
it, which the log prints too (megatron_base_model.py `_vocab_size_with_padding`: 'Padded
vocab_size: N, original vocab_size: M, dummy tokens: K.').

The model section's keys are NeMo's names for Megatron-Core's settings (the inverse of
launch/emit.py `nemo_config`). They are renamed to Megatron-LM's argument names and read by
formats/megatron_args.py's rules, so the same refusals apply there, and here also: NeMo's
legacy (non-Megatron-Core) model, 16-bit training without megatron_amp_O2 (autocast over fp32
weights), hybrid FSDP, activation offloading, a batch-size ramp-up, an optimizer other than
Adam, and interpolations (`${...}`) other than references to another key. The attention is
what NeMo builds (megatron_gpt_model.py get_specs): without Transformer Engine the local layer
spec, whose attention stores the scores; with it Transformer Engine's, FlashAttention or
cuDNN's fused kernel unless its backend is unfused or local.
"""

from __future__ import annotations

import re
import textwrap

from model.cluster import ClusterSpec
from model.errors import SpecError
from model.plan import Plan
from model.specs import JobSpec, ModelSpec

from .megatron_args import plan_from_megatron_args
from .reading import yaml_mapping

# NeMo model key -> Megatron-LM argument name, where the value carries over as it is
_SAME = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
         "virtual_pipeline_model_parallel_size", "microbatch_group_size_per_vp_stage",
         "sequence_parallel", "micro_batch_size",
         "global_batch_size", "num_layers", "hidden_size", "ffn_hidden_size",
         "num_attention_heads", "num_query_groups", "kv_channels", "hidden_dropout",
         "attention_dropout", "make_vocab_size_divisible_by", "rotary_base",
         "max_position_embeddings", "expert_model_parallel_size",
         "expert_tensor_parallel_size", "moe_router_topk", "moe_expert_capacity_factor",
         "moe_pad_expert_input_to_capacity", "moe_layer_freq", "cross_entropy_loss_fusion",
         "cross_entropy_fusion_impl", "use_tp_pp_dp_mapping", "multi_latent_attention")
_RENAMED = {"encoder_seq_length": "seq_length", "num_moe_experts": "num_experts",
            "rotary_percentage": "rotary_percent", "bias": "add_bias_linear",
            "activations_checkpoint_granularity": "recompute_granularity",
            "activations_checkpoint_method": "recompute_method",
            "activations_checkpoint_num_layers": "recompute_num_layers",
            "num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
            "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
            "ub_tp_comm_overlap": "tp_comm_overlap", "fp8_params": "fp8_param_gather"}
_NORMS = {"layernorm": "LayerNorm", "layernorm1p": "LayerNorm", "rmsnorm": "RMSNorm"}
# megatron_gpt_config.yaml's activations: the gated ones are a GLU (the cost model's gated MLP)
_GATED = {"swiglu", "fast-swiglu", "geglu", "fast-geglu", "reglu", "fast-reglu"}
_PLAIN = {"gelu", "relu", "squared-relu"}
# NeMo's optimizer names (nemo/core/optim/optimizers.py): the distributed ones shard the Adam
# state over data-parallel ranks (Megatron's distributed optimizer)
_DISTRIBUTED = {"distributed_fused_adam", "mcore_distributed_optim"}
_ADAM = {"fused_adam", "adam", "adamw"}
# model.fsdp_sharding_strategy -> Megatron-FSDP's --data-parallel-sharding-strategy (the
# same ZeRO stages as launch/emit.py's mapping)
_FSDP = {"grad": "optim_grads", "full": "optim_grads_params"}
_REF = re.compile(r"^\$\{(\.*)([\w.]+)\}$")
_HEADER = "Experiment configuration"
# megatron_base_model.py (_vocab_size_with_padding)
PADDED_VOCAB = re.compile(r"Padded vocab_size: (\d+), original vocab_size: \d+")


def _resolve(doc: dict, where: tuple[str, ...], value, source: str, key: str, depth: int = 0):
    """A value with a reference to another key (`${.key}` beside it, `${a.b}` from the top)
    replaced by that key's value; other interpolations (resolvers) are refused."""
    if not (isinstance(value, str) and "${" in value):
        return value
    m = _REF.match(value)
    if not m or depth > 8:
        raise SpecError(f"the interpolation {value!r} is not resolved in the printed "
                        "configuration; give --plan for this log", source=source, field=key)
    dots, path = m.groups()
    # OmegaConf: '.' is the node holding the key, each further '.' one level up
    node = (list(where[:len(where) - (len(dots) - 1)]) if dots else []) + path.split(".")
    base: object = doc
    for part in node:
        if not isinstance(base, dict) or part not in base:
            raise SpecError(f"{value!r} refers to no key of the printed configuration; give "
                            "--plan for this log", source=source, field=key)
        base = base[part]
    return _resolve(doc, tuple(node[:-1]), base, source, key, depth + 1)


def nemo_printed(doc: dict, source: str, strict: bool = True) -> dict[str, str]:
    """The run's settings in Megatron-LM's argument names, as its _print_args would print them
    (str of each value), from a NeMo 1.x composed configuration (its `trainer` and `model`
    sections). `strict`: what NeMo runs that the cost model does not price is refused, naming
    the key; else (checking a log against a plan file) the settings are translated as they
    stand, for the comparison."""

    def fail(key: str, why: str):
        if strict:
            raise SpecError(f"{why}; give --plan for this log", source=source, field=key)

    for name in ("trainer", "model"):
        if not isinstance(doc.get(name), dict):
            raise SpecError(f"no '{name}' section: not NeMo 1.x's printed configuration",
                            source=source, field=name)
    t, m = doc["trainer"], doc["model"]

    def get(section: dict, where: str, key: str, default=None):
        try:
            return _resolve(doc, tuple(where.split(".")), section.get(key, default), source,
                            f"{where}.{key}")
        except SpecError:
            if strict:
                raise
            return section.get(key, default)

    def flag(key: str, default: bool = False) -> bool:
        v = get(m, "model", key, default)
        if not isinstance(v, bool):
            fail(f"model.{key}", f"{v!r}, not true or false")
        return v is True

    if not flag("mcore_gpt"):
        fail("model.mcore_gpt", "NeMo's legacy (non-Megatron-Core) GPT model is not priced")
    if flag("cpu_offloading"):
        fail("model.cpu_offloading", "activation offloading is not priced")
    if get(m, "model", "rampup_batch_size") is not None:
        fail("model.rampup_batch_size", "a batch-size ramp-up runs other batches than the "
             "plan's")
    out = {k: str(get(m, "model", k)) for k in _SAME if k in m}
    out.update({new: str(get(m, "model", old)) for old, new in _RENAMED.items() if old in m})
    norm = str(get(m, "model", "normalization", "layernorm"))
    out["normalization"] = _NORMS.get(norm, norm)
    act = str(get(m, "model", "activation", "gelu"))
    if act not in _GATED | _PLAIN:
        fail("model.activation", f"{act!r} is not priced ({', '.join(sorted(_GATED | _PLAIN))})")
    out["swiglu"] = str(act in _GATED)
    out["position_embedding_type"] = str(get(m, "model", "position_embedding_type",
                                             "learned_absolute"))
    out["untie_embeddings_and_output_weights"] = str(
        not flag("share_embeddings_and_output_weights", True))
    groups, heads = get(m, "model", "num_query_groups"), get(m, "model", "num_attention_heads")
    out["group_query_attention"] = str(groups is not None and groups != heads)
    # the attention NeMo's Megatron-Core model builds (module docstring)
    backend = str(get(m, "model", "attention_backend", "auto"))
    out["attention_backend"] = backend if flag("transformer_engine") else "local"
    # precision: Lightning's names (bf16, bf16-mixed, 16, 16-mixed, 32, 32-true)
    prec = str(get(t, "trainer", "precision", 32))
    bits = prec.split("-")[0]
    if bits not in ("bf16", "16", "32", "64"):
        fail("trainer.precision", f"{prec!r} is not a Lightning precision NeMo trains with")
    out["bf16"], out["fp16"] = str(bits == "bf16"), str(bits == "16")
    if flag("fp8"):
        out["fp8"] = "e4m3" if flag("fp8_e4m3") else "hybrid"
        out["fp8_recipe"] = "delayed"  # NeMo 1.x: Transformer Engine's DelayedScaling
    fsdp = flag("fsdp")
    if bits in ("bf16", "16") and not fsdp and not flag("megatron_amp_O2"):
        fail("model.megatron_amp_O2", "16-bit training without megatron_amp_O2 (autocast over "
             "fp32 weights) is not priced")
    optim = get(m, "model", "optim", {})
    optim = optim if isinstance(optim, dict) else {}
    name = str(optim.get("name"))
    if name not in _DISTRIBUTED | _ADAM:
        fail("model.optim.name", f"the optimizer {name!r} is not priced (Adam: "
             f"{', '.join(sorted(_DISTRIBUTED | _ADAM))})")
    out["use_distributed_optimizer"] = str(name in _DISTRIBUTED)
    # bf16 main gradients: NeMo 1.x builds Megatron-Core's DDP with grad_reduce_in_fp32 =
    # (optim.grad_sync_dtype == 'fp32'), its default (megatron_base_model.py
    # setup_mcore_distributed_parallel), under the distributed optimizer; without it bf16 O2
    # keeps fp32 main gradients (megatron_gpt_model.py configure_optimizers: fp32_grad_accum)
    sync = str(optim.get("grad_sync_dtype", "fp32"))
    if name in _DISTRIBUTED and bits == "bf16":
        if sync not in ("fp32", "bf16"):
            fail("model.optim.grad_sync_dtype", f"{sync!r} is not priced (fp32, bf16)")
        out["grad_reduce_in_bf16"] = str(sync == "bf16")
    else:
        out["grad_reduce_in_bf16"] = "False"
    for key, arg in (("overlap_grad_sync", "overlap_grad_reduce"),
                     ("overlap_param_sync", "overlap_param_gather")):
        if key in optim:
            out[arg] = str(get(optim, "model.optim", key))
        elif name in _DISTRIBUTED:
            # unset: NeMo's MegatronDistributedFusedAdam takes apex's defaults, True for both
            # (apex/contrib/optimizers/distributed_fused_adam.py DistributedFusedAdam)
            out[arg] = "True"
    if fsdp:
        strategy = str(get(m, "model", "fsdp_sharding_strategy", "full"))
        if strategy not in _FSDP:
            fail("model.fsdp_sharding_strategy", f"{strategy!r} FSDP is not priced here "
                 "(grad, full)")
        out.update(use_megatron_fsdp="True",
                   data_parallel_sharding_strategy=_FSDP.get(strategy, strategy))
    # the data-parallel size: the GPUs NeMo ran over, less the model-parallel ranks
    world = 1
    for key in ("num_nodes", "devices"):
        v = get(t, "trainer", key, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            fail(f"trainer.{key}", f"{v!r}, not a count (a list of devices is not read)")
            v = 1
        world *= v
    per_replica = 1
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                "context_parallel_size"):
        v = get(m, "model", key, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            fail(f"model.{key}", f"{v!r}, not a degree")
            v = 1
        per_replica *= v
    if str(get(m, "model", "tensor_model_parallel_size", 1)) == "1":
        # NeMo turns sequence parallelism off at TP 1 (megatron_base_model.py
        # _validate_and_override_config)
        out["sequence_parallel"] = "False"
    if world % per_replica:
        fail("model.tensor_model_parallel_size", f"TP x PP x CP = {per_replica} does not "
             f"divide the {world} GPUs the trainer ran")
    out["data_parallel_size"] = str(world // max(per_replica, 1))
    return out


class NemoConfigBlocks:
    """The configurations a NeMo 1.x log printed (module docstring), fed line by line (a rank
    prefix already taken off), one YAML text per start: after the 'Experiment configuration'
    line, the lines that follow the next log header, up to a blank line or the next bracketed
    prefix, less their common indentation (NeMo's formatter indents a message's continuation
    lines by 4 spaces: nemo/utils/formatters/base.py BaseFormatter.format)."""

    # a block longer than this is no configuration (megatron_gpt_config.yaml composes to about
    # 230 lines): it is closed there
    MAX_LINES = 20_000

    def __init__(self):
        self.texts: list[str] = []
        self.state: str | None = None
        self.block: list[str] = []

    def feed(self, line: str) -> None:
        if self.state is None:
            if _HEADER in line and "****" in line:
                self.state = "header"
        elif self.state == "header":
            if line.lstrip().startswith("[") and line.rstrip().endswith("]"):
                self.state, self.block = "yaml", []
            elif line.strip():
                self.state = None
        elif not line.strip() or line.startswith("[") or len(self.block) >= self.MAX_LINES:
            self._close()
        else:
            self.block.append(line)

    def _close(self) -> None:
        self.texts.append(textwrap.dedent("\n".join(self.block) + "\n"))
        self.state = None

    def done(self) -> list[str]:
        """Every configuration read (one cut short by the log's end included)."""
        if self.state == "yaml" and self.block:
            self._close()
        return self.texts


def load_nemo_config(text: str, source: str) -> dict:
    """The printed configuration as a mapping (one line naming the log when it is not)."""
    return yaml_mapping(text, source, "Experiment configuration",
                        "its printed configuration")


def plan_from_nemo_config(text: str, cluster: ClusterSpec, *, source: str, vocab: int | None,
                          node_order: list[int] | None = None
                          ) -> tuple[ModelSpec, JobSpec, Plan, dict[str, str]]:
    """(model, job, plan, the settings in Megatron-LM's names) of the NeMo 1.x run whose log
    printed the configuration `text` and the padded vocabulary `vocab`, on `cluster`."""
    if vocab is None:
        raise SpecError("no 'Padded vocab_size' line in the log (NeMo prints it when it builds "
                        "the model), so the vocabulary is unknown; give --plan for this log",
                        source=source, field="log")
    printed = nemo_printed(load_nemo_config(text, source), source)
    model, job, plan = plan_from_megatron_args(printed, cluster, source=source, vocab=vocab,
                                               node_order=node_order)
    return model, job, plan, printed
