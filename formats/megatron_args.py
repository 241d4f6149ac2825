"""A plan read back from the arguments a Megatron-LM log printed, for `calibrate` without a plan
file: what the run was (model, job, parallel layout, schedule, recompute, precision) from the
block `_print_args` writes at start-up (megatron/training/arguments.py, after validate_args:
the values that ran), on the cluster the user names (ranks in Megatron-LM's order over its nodes
in the order of the run's hostfile, by default the cluster file's).

The names are Megatron-LM's args namespace (arguments.py and the TransformerConfig fields it
adds); the mapping is the inverse of launch/emit.py `megatron_args`. `megatron_planned_args`
goes the other way, for the check that a log paired with a plan file is the plan's run. What
the cost model cannot price as the run ran it is refused in one line naming the argument
(latent attention, a layout with other than transformer layers, recompute other than
Megatron's full-uniform-1 or selective core attention, token dropping without padding, FP8
recipes the cost model has no rules for (custom; model/fp8.py prices delayed, tensorwise,
mxfp8 and blockwise), activations partitioned over tensor ranks), never
approximated; Transformer Engine's fused loss is read, and calibrate does not fit its
memory. Ranks follow Megatron-LM's order (tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp where the run
says --use-tp-pp-dp-mapping). Megatron-DeepSpeed logs (--deepspeed) are read with DeepSpeed's own
prints: its ZeRO stage and its pipeline partition.
"""

from __future__ import annotations

import ast
import math
import re

from model.cluster import ClusterSpec
from model.errors import SpecError
from model.estimator import make_plan
from model.memory import fp8_params_apply
from model.plan import (TP_PP_DP_ORDER, Plan, deepspeed_runs_zero, megatron_placement,
                        ordered_placement)
from model.specs import FP8_RECIPES, JobSpec, ModelSpec

# --position-embedding-type -> the cost model's: 'none' has no position weights and no rotation,
# which is how the cost model prices ALiBi (a bias on the scores), so it maps there; rotary,
# absolute and alibi are Megatron-DeepSpeed's names (its PositionEmbeddingType enum, printed
# with the enum's name in front: BLOOM trained with --position-embedding-type alibi,
# bigscience-workshop/bigscience train/tr11-176B-ml)
# Megatron-LM's --position-embedding-type (arguments.py: learned_absolute, rope, yarn, mrope,
# relative, none; Megatron-DeepSpeed's rotary, absolute, alibi): YaRN and multimodal RoPE are
# rotary embeddings with rescaled or sectioned frequencies, at RoPE's cost
_POSITIONS = {"rope": "rope", "learned_absolute": "learned", "none": "alibi",
              "rotary": "rope", "absolute": "learned", "alibi": "alibi", "yarn": "rope",
              "mrope": "rope"}
_NORMS = {"RMSNorm": "rmsnorm", "LayerNorm": "layernorm"}
# Megatron-FSDP's --data-parallel-sharding-strategy -> ZeRO stage (launch/emit.py's mapping)
_FSDP_ZERO = {"optim_grads": 2, "optim_grads_params": 3}


def _mb_group(a, pp: int, vp: int) -> int:
    """The plan's interleaved micro-batch group from the printed
    microbatch_group_size_per_vp_stage (None, or PP: the default, 0)."""
    g = a.integer("microbatch_group_size_per_vp_stage", default=0) if vp > 1 else 0
    return 0 if g == pp else g


def megatron_planned_args(model: ModelSpec, job: JobSpec, plan: Plan) -> dict[str, str]:
    """What a Megatron-LM log's printed arguments (`_print_args`, after validate_args: the
    values that ran) must say for the plan, on what the cost model prices, in Megatron-LM's
    names (the args namespace of megatron/training/arguments.py and TransformerConfig) and as
    it prints them (str of the value). The layer split is not among them (its flags have
    several equivalent spellings), nor the FP8 format (`fp8`: e4m3 or hybrid are both FP8;
    megatron_args_mismatch checks only that it is set, and the FP8 recipe only with FP8)."""
    sh = plan.shape
    want: dict[str, object] = {
        "tensor_model_parallel_size": sh.tp, "pipeline_model_parallel_size": sh.pp,
        "context_parallel_size": sh.cp, "data_parallel_size": sh.dp,
        "micro_batch_size": sh.micro_batch,
        "global_batch_size": job.global_batch, "seq_length": job.seq_length,
        "num_layers": model.num_layers, "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size, "num_attention_heads": model.num_heads,
        # validate_args sets it from --num-layers-per-virtual-pipeline-stage (None: no
        # interleaving)
        "virtual_pipeline_model_parallel_size": sh.chunks if sh.chunks > 1 else None,
        "sequence_parallel": sh.sequence_parallel and sh.tp > 1,  # validate_args: off at TP 1
        "use_distributed_optimizer": sh.zero >= 1,
        # HSDP: that many shard groups, replicated across (launch/emit.py; default 1)
        "num_distributed_optimizer_instances": sh.dp // sh.shard_size if sh.shard_size else 1,
        "recompute_granularity": None if sh.recompute == "none" else sh.recompute,
        "bf16": job.precision == "bf16", "fp16": job.precision == "fp16",
        # what launch/emit.py asks for beside them and the estimate prices: bf16 main
        # gradients, the overlaps, FP8 weights only
        "grad_reduce_in_bf16": job.precision == "bf16" and job.grad_reduce_in_bf16,
        "overlap_grad_reduce": sh.overlap_grad_reduce,
        "overlap_param_gather": sh.overlap_param_gather,
        "tp_comm_overlap": sh.tp_comm_overlap,
        "overlap_moe_expert_parallel_comm": sh.ep_comm_overlap,
        "fp8_param_gather": fp8_params_apply(job, sh),
    }
    if job.framework == "megatron" and sh.zero >= 2:
        # Megatron-FSDP overlaps its reduce-scatters (and under ZeRO-3 its gathers) whatever
        # --overlap-grad-reduce and --overlap-param-gather printed (megatron_fsdp.py)
        del want["overlap_grad_reduce"]
        if sh.zero >= 3:
            del want["overlap_param_gather"]
    if job.framework == "megatron":
        # ZeRO-2/3 run on Megatron-FSDP (launch/emit.py): whether it ran, and its strategy
        # (_FSDP_ZERO); a ZeRO-1 plan runs Megatron's own distributed optimizer
        want["use_megatron_fsdp"] = sh.zero >= 2
        if sh.zero >= 2:
            want["data_parallel_sharding_strategy"] = next(
                k for k, v in _FSDP_ZERO.items() if v == sh.zero)
            # its double buffers are what the memory prices (memory.megatron_fsdp_units)
            want["fsdp_double_buffer"] = True
    if sh.zero >= 2:
        # Megatron-FSDP's own gradient dtypes (launch/emit.py fsdp_grads_dtype), printed as
        # torch dtypes by Megatron-Core 0.17 on; they, not grad_reduce_in_bf16, say what ran
        # (megatron_args_mismatch)
        dtype = FSDP_TORCH_DTYPES[fsdp_grads_dtype(job)]
        want.update(megatron_fsdp_main_grads_dtype=dtype, megatron_fsdp_grad_comm_dtype=dtype)
    if model.num_kv_heads != model.num_heads:  # printed as None without GQA
        want["num_query_groups"] = model.num_kv_heads
    if model.num_experts:
        # validate_args fills expert TP (TP) and the experts' FFN width (ffn_hidden_size) when
        # unset; the capacity factor prints None for a dropless router (JobSpec 1.0)
        cf = job.moe_capacity_factor
        want.update(num_experts=model.num_experts, expert_model_parallel_size=sh.ep,
                    moe_router_topk=model.moe_topk, expert_tensor_parallel_size=sh.expert_tp,
                    moe_ffn_hidden_size=model.expert_ffn,
                    moe_expert_capacity_factor=None if cf == 1.0 else float(cf),
                    moe_pad_expert_input_to_capacity=cf != 1.0,
                    moe_token_dispatcher_type="alltoall" if job.moe_dispatcher == "alltoall"
                    or sh.ep == 1 else "flex")
        if job.moe_dispatcher != "alltoall" and sh.ep > 1:
            want["moe_flex_dispatcher_backend"] = job.moe_dispatcher
    return {k: str(v) for k, v in want.items()}


def megatron_args_mismatch(model: ModelSpec, job: JobSpec, plan: Plan,
                           logged: dict[str, str]) -> list[tuple[str, str, str]]:
    """Where the arguments a Megatron-LM log printed differ from the plan
    (megatron_planned_args; names the log does not print are not checked): (name, logged,
    planned) per difference."""
    fsdp = _fsdp_dtypes_ran(logged) if plan.shape.zero >= 2 else {}
    out = [(k, logged[k], v) for k, v in megatron_planned_args(model, job, plan).items()
           if k in logged and fsdp.get(k, logged[k]) != v
           # Megatron-FSDP's own dtypes say what ran where the log prints them
           and not (k == "grad_reduce_in_bf16" and fsdp)]
    # the interleaved schedule's micro-batch group: printed None for Megatron-Core's default
    # (PP: ModelParallelConfig.__post_init__)
    sh = plan.shape
    g = logged.get("microbatch_group_size_per_vp_stage", "None")
    if sh.chunks > 1 and (str(sh.pp) if g == "None" else g) != str(sh.mb_group or sh.pp):
        out.append(("microbatch_group_size_per_vp_stage", g, str(sh.mb_group or sh.pp)))
    # --fp8-format (dest fp8): e4m3 or hybrid, None without FP8; either is FP8 to the plan
    if "fp8" in logged and (logged["fp8"] != "None") != plan.shape.fp8:
        out.append(("fp8", logged["fp8"], "an FP8 format" if plan.shape.fp8 else "None"))
    elif plan.shape.fp8 and logged.get("fp8_recipe", job.fp8_recipe) != job.fp8_recipe:
        # printed whatever --fp8-format says (delayed by default); a recipe only with FP8
        out.append(("fp8_recipe", logged["fp8_recipe"], job.fp8_recipe))
    # the fused loss the plan prices (native); Transformer Engine's is not priced either way
    # (calibrate reports such a run's memory without fitting it: formats/runs.py)
    if "cross_entropy_loss_fusion" in logged and not loss_unpriced(logged) and \
            (logged["cross_entropy_loss_fusion"] == "True") != job.fused_loss:
        out.append(("cross_entropy_loss_fusion", logged["cross_entropy_loss_fusion"],
                    str(job.fused_loss)))
    if plan.shape.cp > 1 and "cp_comm_type" in logged and \
            set(cp_comm_types(logged["cp_comm_type"])) != {"p2p"}:
        out.append(("cp_comm_type", logged["cp_comm_type"], "['p2p']"))
    return out + _architecture_mismatch(model, logged) + _window_mismatch(model, logged)


def _window_mismatch(model: ModelSpec, logged: dict[str, str]) -> list[tuple[str, str, str]]:
    """Where the sliding window a log printed (`_window`: window_size and
    window_attn_skip_freq, Megatron-Core 0.15 on) differs from the model's."""
    if "window_size" not in logged:
        return []
    try:
        ran = _window(PrintedArgs(logged, "log"), model.num_layers)
    except SpecError:
        ran = {"sliding_window": -1}  # printed, but not a window the cost model prices
    if (ran.get("sliding_window", 0), ran.get("window_full_every", 0)) == (
            model.sliding_window, model.window_full_every):
        return []
    want = (f"{(model.sliding_window - 1, 0)}, {model.window_full_every or None}"
            if model.sliding_window else "None, None")
    return [("window_size, window_attn_skip_freq",
             f"{logged['window_size']}, {logged.get('window_attn_skip_freq', 'None')}", want)]


def cp_comm_types(printed: str) -> list[str]:
    """The context-parallel communication types a log's --cp-comm-type printed (a list, one
    type for all layers or one per layer: arguments.py nargs='+'; a bare string too)."""
    return [t.strip(" '\"") for t in printed.strip("[]").split(",") if t.strip(" '\"")]


def vocab_mismatch(model: ModelSpec, plan: Plan, logged: dict[str, str],
                   padded: int | None) -> list[tuple[str, str, str]]:
    """The vocabulary a Megatron-LM run built (its ' > padded vocab' line, else its printed
    --vocab-size padded as vocab_utils.py pads it) where it is another than the plan's: not
    the plan's size, nor that size padded to a multiple of make_vocab_size_divisible_by x TP
    (a tokenizer's vocabulary, padded by the run, is the plan's model)."""
    a = PrintedArgs(logged, "log")
    tp = plan.shape.tp
    try:
        mult = a.integer("make_vocab_size_divisible_by", default=128) * tp
        ran = padded or (padded_vocab(a, tp) if a.integer("vocab_size", default=0) else None)
    except SpecError:  # what cannot be read is not checked here (plan_from_megatron_args)
        return []
    if not ran or mult < 1 or ran in (model.vocab_size,
                                      math.ceil(model.vocab_size / mult) * mult):
        return []
    return [("padded vocab size", str(ran), str(model.vocab_size))]


def _architecture_mismatch(model: ModelSpec, logged: dict[str, str]
                           ) -> list[tuple[str, str, str]]:
    """Where the architecture a log's arguments built differs from the plan's model in what
    the cost model prices beyond the sizes megatron_planned_args checks: the head width
    (kv_channels: validate_args prints hidden / heads where it was not given), the gated
    MLP, separate output weights, biases, the norm and the position embedding (as `_model`
    reads them from a log)."""
    want = {"swiglu": str(model.gated_mlp),
            "untie_embeddings_and_output_weights": str(not model.tied_embeddings),
            "add_bias_linear": str(model.bias),
            # validate_args sets add_qkv_bias with add_bias_linear (arguments.py)
            "add_qkv_bias": str(model.bias or model.qkv_bias)}
    if not model.is_mla:  # latent attention's kv_channels is its non-rotary query width
        want["kv_channels"] = str(model.head_dim)
    out = [(k, logged[k], v) for k, v in want.items() if k in logged and logged[k] != v
           # a configuration printed before validate_args (NeMo 1.x's) leaves kv_channels
           # None: hidden / heads
           and not (k == "kv_channels" and logged[k] == "None"
                    and model.head_dim == model.hidden_size // model.num_heads)]
    norm = logged.get("normalization")
    if norm is not None and _NORMS.get(norm) != model.norm:
        out.append(("normalization", norm, next(
            (k for k, v in _NORMS.items() if v == model.norm), model.norm)))
    pos = logged.get("position_embedding_type")
    if pos is not None and _POSITIONS.get(pos.split(".")[-1]) != model.position_embedding:
        out.append(("position_embedding_type", pos, next(
            (k for k, v in _POSITIONS.items() if v == model.position_embedding),
            model.position_embedding)))
    return out


def loss_unpriced(printed: dict[str, str]) -> bool:
    """Whether the run's arguments say it fused its cross-entropy loss with Transformer
    Engine's implementation (--cross-entropy-fusion-impl te), whose memory is not measured
    and not priced (model/memory.py LOSS_BYTES_PER_LOGIT: unfused, and native fused)."""
    return printed.get("cross_entropy_loss_fusion") == "True" and \
        printed.get("cross_entropy_fusion_impl") == "te"


class PrintedArgs:
    """The printed values (Megatron-LM's names, str of each value), read with one error line
    naming the log and argument."""

    def __init__(self, printed: dict[str, str], source: str):
        self.p, self.source = printed, source

    def _raw(self, name: str) -> str:
        if name not in self.p:
            raise SpecError("the log's Megatron-LM arguments do not print it; give --plan",
                            source=self.source, field=name)
        return self.p[name]

    def fail(self, name: str, why: str):
        raise SpecError(f"{why}; give --plan for this log", source=self.source, field=name)

    def integer(self, name: str, default: int | None = None) -> int | None:
        v = self.p.get(name, "None") if default is not None else self._raw(name)
        if v == "None":
            if default is None:
                self.fail(name, "printed None where a number is needed")
            return default
        try:
            return int(v)
        except ValueError:
            self.fail(name, f"printed {v!r}, not an integer")

    def number(self, name: str, default: float, lo: float = 0.0,
               hi: float = math.inf) -> float:
        v = self.p.get(name, "None")
        try:
            x = default if v == "None" else float(v)
        except ValueError:
            self.fail(name, f"printed {v!r}, not a number")
        if not lo <= x <= hi:  # NaN fails too
            self.fail(name, f"printed {v!r}, outside [{lo:g}, {hi:g}]")
        return x

    def flag(self, name: str, default: bool = False) -> bool:
        v = self.p.get(name)
        if v is None:
            return default
        if v not in ("True", "False"):
            self.fail(name, f"printed {v!r}, not True or False")
        return v == "True"

    def text(self, name: str, default: str | None = None) -> str | None:
        v = self.p.get(name)
        return default if v in (None, "None") else v


# Megatron-FSDP's gradient dtypes: its flags' names -> the torch dtypes it prints (None: 'auto')
FSDP_TORCH_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
_FSDP_DTYPES = {v: k for k, v in FSDP_TORCH_DTYPES.items()}


def fsdp_grads_dtype(job: JobSpec) -> str:
    """Megatron-FSDP's gradient dtype for the job, as its --megatron-fsdp-*-dtype flags spell
    it: the bytes the estimate prices for gradients and their reduction (JobSpec.grad_bytes,
    equal to reduce_bytes for Megatron-LM)."""
    if job.grad_bytes == 4:
        return "fp32"
    return "fp16" if job.precision == "fp16" else "bf16"


def _fsdp_dtypes_ran(logged: dict[str, str]) -> dict[str, str]:
    """Megatron-FSDP's gradient and reduction dtypes a log's arguments ran with, as torch
    dtypes: 'auto' (printed None) is the parameters' dtype, and the reduction's the gradients'
    (_bf16_grads); empty where the log prints none (before Megatron-Core 0.17)."""
    if "megatron_fsdp_main_grads_dtype" not in logged:
        return {}
    params = FSDP_TORCH_DTYPES["bf16" if logged.get("bf16") == "True" else
                               "fp16" if logged.get("fp16") == "True" else "fp32"]
    main = logged["megatron_fsdp_main_grads_dtype"]
    main = params if main == "None" else main
    comm = logged.get("megatron_fsdp_grad_comm_dtype", "None")
    return {"megatron_fsdp_main_grads_dtype": main,
            "megatron_fsdp_grad_comm_dtype": main if comm == "None" else comm}


def _bf16_grads(a: PrintedArgs, precision: str, deepspeed: bool) -> bool:
    """Whether the run keeps (and reduces) bf16 gradients (JobSpec.grad_reduce_in_bf16).
    Megatron-FSDP from Megatron-Core 0.17 on ignores --grad-reduce-in-bf16 and reads its own
    dtypes: 'auto' (printed None) is the parameters' dtype, bf16 in a bf16 run
    (param_and_grad_buffer.py _resolve_group_grad_dtype), and the reduction's 'auto' is the
    gradients' (mixed_precision.py grad_comm_dtype); a log that does not print them is from
    before, when Megatron-FSDP followed grad_reduce_in_fp32 like the rest."""
    ran = _fsdp_dtypes_ran(a.p)
    if deepspeed or not a.flag("use_megatron_fsdp") or not ran:
        return a.flag("grad_reduce_in_bf16")
    grads = _FSDP_DTYPES.get(ran["megatron_fsdp_main_grads_dtype"])
    if _FSDP_DTYPES.get(ran["megatron_fsdp_grad_comm_dtype"]) != grads:
        a.fail("megatron_fsdp_grad_comm_dtype", "printed "
               f"{a.p.get('megatron_fsdp_grad_comm_dtype')} beside main gradients "
               f"{a.p['megatron_fsdp_main_grads_dtype']}: a reduction in another dtype than "
               "the gradients is not priced")
    priced = {"bf16": ("fp32", "bf16"), "fp32": ("fp32",), "fp16": ("fp16",)}[precision]
    if grads not in priced:
        a.fail("megatron_fsdp_main_grads_dtype", "printed "
               f"{a.p['megatron_fsdp_main_grads_dtype']} in a {precision} run: priced are "
               f"{' or '.join(priced)} gradients")
    return precision == "bf16" and grads == "bf16"


def padded_vocab(a: PrintedArgs, tp: int) -> int:
    """The vocabulary Megatron-LM builds when the log has no ' > padded vocab' line: the
    NullTokenizer's --vocab-size padded to a multiple of make_vocab_size_divisible_by x TP
    (megatron/training/vocab_utils.py, _vocab_size_with_padding)."""
    v = a.integer("vocab_size", default=0)
    if not v:
        a.fail("vocab_size", "no vocabulary size printed (a tokenizer's own, and no ' > padded "
               "vocab' line in the log)")
    multiple = a.integer("make_vocab_size_divisible_by", default=128) * tp
    if multiple < 1:
        a.fail("make_vocab_size_divisible_by", "printed a multiple below 1")
    return math.ceil(v / multiple) * multiple


_LAYOUT_CHARS_MAX = 1_000_000  # an expanded layout beyond this is not a real model's


def expand_layout(text: str) -> str | None:
    """A pipeline layout string with its shorthand written out, as Megatron-Core reads it
    (pipeline_parallel_layer_layout.py parse_str_to_list: commas are cosmetic, '(...)*n'
    repeats a group n times, then 'x*n' a character; its docstring's example
    'Ettt|(tt|)*29,m|L'); None where the shorthand is beyond that (nested groups) or would
    expand past any real model's size."""
    text = text.replace(",", "")

    def times(m) -> str:
        body, n = m.group(1), int(m.group(2))
        if n * len(body) > _LAYOUT_CHARS_MAX:
            raise OverflowError
        return body * n

    try:
        text = re.sub(r"\(([^()]+)\)\*(\d+)", times, text)
        text = re.sub(r"(.)\*(\d+)", times, text)
    except OverflowError:
        return None
    return None if set(text) & set("()*") or len(text) > _LAYOUT_CHARS_MAX else text


def _layers(a: PrintedArgs, num_layers: int, pp: int, vp: int) -> tuple[int, ...]:
    """Layers per virtual stage in model order (chunk-major, then pipeline rank), as
    Megatron-Core builds them (transformer_block.py get_num_layers_to_build): its layout string
    (one '|'-separated segment per virtual stage, 't' a transformer layer, 'E' the embedding,
    'L' the loss); else per pipeline rank the first and last ranks' counts
    (--decoder-first/last-pipeline-num-layers) and the rest even, or all even (the embedding
    and loss counted as a layer each where the split accounts for them), each rank's count
    even over its vp virtual stages."""
    printed = a.text("pipeline_model_parallel_layout")
    if printed is not None:
        layout = expand_layout(printed)
        if layout is None:
            a.fail("pipeline_model_parallel_layout", f"layout {printed[:80]!r} has shorthand "
                   "beyond Megatron-Core's ('(...)*n', 'x*n')")
        segs = layout.split("|")
        if len(segs) != pp * vp or set(layout) - set("tEL|"):
            a.fail("pipeline_model_parallel_layout",
                   f"layout {printed[:80]!r} is not {pp * vp} segments of transformer layers "
                   "('t'), the embedding ('E') and the loss ('L')")
        return tuple(s.count("t") for s in segs)
    first = a.integer("decoder_first_pipeline_num_layers", default=0)
    last = a.integer("decoder_last_pipeline_num_layers", default=0)
    emb = a.flag("account_for_embedding_in_pipeline_split")
    loss = a.flag("account_for_loss_in_pipeline_split")
    if first or last:
        left, rest = pp - bool(first) - bool(last), num_layers - first - last
        if rest < 0 or (rest % left if left else rest):
            a.fail("decoder_first_pipeline_num_layers", f"{num_layers} layers do not split "
                   f"over {pp} pipeline ranks with {first} first and {last} last")
        per_rank = [rest // left if left else 0] * pp
        per_rank[0] = first or per_rank[0]
        per_rank[-1] = last or per_rank[-1]
    else:
        per_rank = [(num_layers + emb + loss) // pp] * pp
    if sum(per_rank) != num_layers + (0 if first or last else emb + loss) or \
            any(r % vp for r in per_rank):
        a.fail("num_layers", f"{num_layers} layers do not split evenly over {pp} pipeline "
               f"ranks of {vp} virtual stages")
    out = [r // vp for _c in range(vp) for r in per_rank]
    if emb and not (first or last):
        out[0] -= 1
    if loss and not (first or last):
        out[-1] -= 1
    return tuple(out)


def _deepspeed_layers(a: PrintedArgs, printed: tuple, pp: int,
                      num_layers: int) -> tuple[int, ...]:
    """The transformer layers DeepSpeed's pipeline engine put on each stage, as it printed
    them (one count per stage, summing to the model's layers)."""
    if len(printed) != pp or sum(printed) != num_layers:
        a.fail("pipeline_model_parallel_size", f"DeepSpeed's pipeline partition print gives "
               f"{list(printed) or 'no stages'}, not {num_layers} layers over {pp} stages")
    return tuple(printed)


def _model(a: PrintedArgs, vocab: int, name: str) -> ModelSpec:
    """The architecture the run built."""
    if a.flag("multi_latent_attention"):
        a.fail("multi_latent_attention", "latent attention's dimensions are not read from a "
               "log")
    heads = a.integer("num_attention_heads")
    hidden = a.integer("hidden_size")
    pos = a.text("position_embedding_type", "learned_absolute").split(".")[-1]
    if pos not in _POSITIONS:
        a.fail("position_embedding_type", f"{pos!r} is not priced (rope, yarn, mrope, "
               "learned_absolute, none)")
    norm = a.text("normalization", "LayerNorm")
    if norm not in _NORMS:
        a.fail("normalization", f"{norm!r} is not priced (RMSNorm, LayerNorm)")
    kv = a.integer("kv_channels", default=0)
    experts = a.integer("num_experts", default=0)
    moe: dict = {}
    if experts:
        ffn_e = a.integer("moe_ffn_hidden_size", default=0)
        shared = a.integer("moe_shared_expert_intermediate_size", default=0)
        if shared and (not ffn_e or shared % ffn_e):
            a.fail("moe_shared_expert_intermediate_size", f"{shared} is not a whole number of "
                   f"experts of {ffn_e}")
        freq = a.text("moe_layer_freq", "1")
        dense = 0
        if freq != "1":
            try:
                pattern = ast.literal_eval(freq)
            except (ValueError, SyntaxError):
                pattern = None
            if not isinstance(pattern, list) or pattern != sorted(pattern) or \
                    set(pattern) - {0, 1} or len(pattern) != a.integer("num_layers"):
                a.fail("moe_layer_freq", f"{freq} is not one entry per layer, leading dense "
                       "layers (0) then experts (1)")
            dense = pattern.count(0)
        moe = dict(num_experts=experts, moe_topk=a.integer("moe_router_topk"),
                   moe_ffn_hidden_size=ffn_e if ffn_e != a.integer("ffn_hidden_size") else 0,
                   moe_shared_experts=shared // ffn_e if shared else 0,
                   first_dense_layers=dense)
    return ModelSpec(
        name=name, num_layers=a.integer("num_layers"), hidden_size=hidden, num_heads=heads,
        num_kv_heads=a.integer("num_query_groups") if a.flag("group_query_attention") else heads,
        ffn_hidden_size=a.integer("ffn_hidden_size"), vocab_size=vocab,
        seq_length=a.integer("max_position_embeddings", default=0) or a.integer("seq_length"),
        gated_mlp=a.flag("swiglu"),
        tied_embeddings=not a.flag("untie_embeddings_and_output_weights"),
        position_embedding=_POSITIONS[pos], norm=_NORMS[norm],
        # Megatron-DeepSpeed's --embed-layernorm (BLOOM's LayerNorm after the embedding)
        embedding_norm=a.flag("embed_layernorm"),
        bias=a.flag("add_bias_linear", True),
        # --add-qkv-bias (Qwen2); validate_args sets it with --add-bias-linear, which covers it
        qkv_bias=a.flag("add_qkv_bias") and not a.flag("add_bias_linear", True),
        dropout=a.number("hidden_dropout", 0.1, hi=1.0) > 0 or
        a.number("attention_dropout", 0.1, hi=1.0) > 0,
        kv_channels=kv if kv and kv * heads != hidden else 0,
        rope_base=a.number("rotary_base", 0.0) if _POSITIONS[pos] == "rope" else 0.0,
        rotary_percent=a.number("rotary_percent", 1.0),
        # --norm-epsilon prints as norm_epsilon, and from core 0.16 as layernorm_epsilon
        # (TransformerConfig's field, arguments built from it)
        norm_eps=a.number("layernorm_epsilon", 0.0) or a.number("norm_epsilon", 0.0),
        source=name, **_window(a, a.integer("num_layers")), **moe)


def _window(a: PrintedArgs, num_layers: int) -> dict:
    """ModelSpec's sliding_window and window_full_every from the printed --window-size
    ('(left, right)': left + 1 keys, the query's own included) and --window-attn-skip-freq
    (N, or a list of 1 for a windowed layer and 0 for a full one, which must be a full layer
    every N to be priced)."""
    text = a.text("window_size")
    if text is None:
        return {}
    try:
        left, right = ast.literal_eval(text)
        left, right = int(left), int(right)
    except (ValueError, SyntaxError, TypeError):
        a.fail("window_size", f"printed {text!r}, not (left, right)")
    if (left, right) == (-1, 0):
        return {}  # -1: no limit (Transformer Engine's window_size), full causal attention
    if right != 0 or left < 0:
        a.fail("window_size", f"{text} is not a causal window (left, 0): not priced")
    freq = a.text("window_attn_skip_freq")
    if freq is None:
        return {"sliding_window": left + 1}
    try:
        pattern = ast.literal_eval(freq)
    except (ValueError, SyntaxError):
        pattern = None
    # core/transformer/utils.py is_layer_window_attention: an int N windows the layers whose
    # number (from 1) N does not divide (N = 1: none); a list windows where it holds 1
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 1:
        return ({"sliding_window": left + 1, "window_full_every": pattern} if pattern > 1
                else {})
    if isinstance(pattern, list) and len(pattern) == num_layers and set(pattern) <= {0, 1}:
        if 0 not in pattern:
            return {"sliding_window": left + 1}
        if 1 not in pattern:
            return {}
        n = pattern.index(0) + 1
        if n > 1 and pattern == [int((i + 1) % n != 0) for i in range(num_layers)]:
            return {"sliding_window": left + 1, "window_full_every": n}
    a.fail("window_attn_skip_freq", f"{freq} is not a full-attention layer every N > 1 (the "
           "pattern priced)")


def _attention(a: PrintedArgs) -> str:
    """flash or eager (scores stored): Megatron-Core's --attention-backend (its unfused and
    local backends store the scores, flash, fused and auto do not); before it,
    Megatron-DeepSpeed's --use-flash-attn(-v2); a log that prints neither ran Megatron's
    fused scale-mask-softmax, which stores the scores."""
    backend = a.text("attention_backend")
    if backend is not None:
        return "eager" if backend.split(".")[-1] in ("unfused", "local") else "flash"
    if a.flag("use_flash_attn") or a.flag("use_flash_attn_v2"):
        return "flash"
    return "eager"


def _recompute(a: PrintedArgs) -> str:
    """none, selective or full: --recompute-granularity, or before it (Megatron-LM to 2022,
    Megatron-DeepSpeed) --checkpoint-activations with --checkpoint-num-layers 1 (every layer
    recomputed from its input: full)."""
    for name in ("distribute_saved_activations", "distribute_checkpointed_activations",
                 "partition_activations"):
        if a.flag(name):
            a.fail(name, "activations partitioned over tensor-parallel ranks are not priced")
    if "recompute_granularity" not in a.p and a.flag("checkpoint_activations"):
        if a.integer("checkpoint_num_layers", default=1) != 1:
            a.fail("checkpoint_num_layers", "recompute in groups of more than one layer is "
                   "not priced")
        return "full"
    granularity = a.text("recompute_granularity")
    if granularity is None:
        return "none"
    if granularity == "selective" and a.text("recompute_modules") in (None, "['core_attn']"):
        return "selective"
    if granularity == "full" and a.text("recompute_method") == "uniform" and \
            a.integer("recompute_num_layers", default=0) == 1:
        return "full"
    a.fail("recompute_granularity", "recompute other than full (uniform, one layer per group) "
           "or selective core attention is not priced")


def _dispatcher(a: PrintedArgs) -> str:
    """JobSpec.moe_dispatcher of a MoE run: the printed moe_token_dispatcher_type (alltoall
    where an older log does not print it), the flex dispatcher's backend
    (moe_flex_dispatcher_backend, Megatron-Core 0.16; before it moe_enable_deepep). The
    allgather dispatcher (TransformerConfig's default) and NCCL EP are not priced."""
    kind = a.text("moe_token_dispatcher_type", "alltoall")
    whole = a.integer("expert_tensor_parallel_size", 1) == 1 or \
        a.integer("tensor_model_parallel_size") == 1
    if kind == "alltoall" or (kind == "allgather" and whole
                              and a.integer("expert_model_parallel_size", 1) == 1):
        return "alltoall"  # (with EP 1 and whole experts no dispatcher moves tokens)
    if kind == "flex":
        backend = a.text("moe_flex_dispatcher_backend",
                         "deepep" if a.flag("moe_enable_deepep") else None)
        if backend in ("deepep", "hybridep"):
            return backend
        a.fail("moe_flex_dispatcher_backend", f"the flex dispatcher's {backend} backend is not "
               "priced (deepep and hybridep are)")
    a.fail("moe_token_dispatcher_type", f"the {kind} token dispatcher is not priced (alltoall "
           "and flex with deepep or hybridep are)")


def plan_from_megatron_args(printed: dict[str, str], cluster: ClusterSpec, *, source: str,
                            vocab: int | None = None, deepspeed_zero: int | None = None,
                            deepspeed_layers: tuple = (), node_order: list[int] | None = None
                            ) -> tuple[ModelSpec, JobSpec, Plan]:
    """(model, job, plan) of the run whose arguments block is `printed`, on `cluster`.
    `vocab`: the padded vocabulary the log printed (' > padded vocab ... (new size: N)'), else
    padded from the printed --vocab-size as Megatron-LM pads it. A Megatron-DeepSpeed run
    (--deepspeed) follows DeepSpeed's rules (the cost model's deepspeed framework): its ZeRO
    stage is the one DeepSpeed's engine printed (`deepspeed_zero`), its layers per pipeline
    stage those its pipeline engine printed (`deepspeed_layers`). `node_order`: the cluster's
    node indices in the order the run's hostfile lists them (ranks fill nodes in that order;
    default: the cluster's)."""
    a = PrintedArgs(printed, source)
    tp = a.integer("tensor_model_parallel_size")
    pp = a.integer("pipeline_model_parallel_size")
    cp = a.integer("context_parallel_size", default=1)
    dp = a.integer("data_parallel_size")
    if tp * pp * cp * dp != cluster.num_gpus:
        a.fail("data_parallel_size", f"TP {tp} x PP {pp} x CP {cp} x DP {dp} = "
               f"{tp * pp * cp * dp} GPUs ran, the cluster has {cluster.num_gpus}")
    model = _model(a, vocab or padded_vocab(a, tp), f"{source} (Megatron-LM arguments)")
    if cp > 1 and set(cp_comm_types(a.text("cp_comm_type", "['p2p']"))) != {"p2p"}:
        # Transformer Engine's ring (p2p) is what model/costs.py _cp_exchange_ms prices
        a.fail("cp_comm_type", f"{a.text('cp_comm_type')} is not priced (p2p: the ring "
               "exchange)")
    fp8 = a.text("fp8") is not None
    recipe = a.text("fp8_recipe", "delayed")
    if fp8 and recipe not in FP8_RECIPES:
        a.fail("fp8_recipe", f"{recipe!r} is not priced ({', '.join(FP8_RECIPES)})")
    # TransformerConfig's FP8 options the cost model has no rules for (every linear layer's
    # three GEMMs run FP8 in its pricing)
    if fp8 and a.flag("first_last_layers_bf16"):
        a.fail("first_last_layers_bf16", "FP8 with the first and last layers in bf16 is not "
               "priced")
    if fp8 and not a.flag("fp8_wgrad", True):
        a.fail("fp8_wgrad", "weight-gradient GEMMs in 16 bits beside FP8 ones are not priced")
    cap = a.number("moe_expert_capacity_factor", 1.0)
    if model.num_experts and cap != 1.0 and not a.flag("moe_pad_expert_input_to_capacity"):
        a.fail("moe_pad_expert_input_to_capacity", "token dropping without padding to "
               "capacity is not priced (each expert's load is the router's)")
    dispatcher = _dispatcher(a) if model.num_experts else "alltoall"
    # the expert all-to-all overlap is priced with its delayed weight gradients
    # (Shape.ep_comm_overlap; CostModel._ep_overlap)
    ep_overlap = a.flag("overlap_moe_expert_parallel_comm")
    if ep_overlap and not a.flag("delay_wgrad_compute"):
        a.fail("delay_wgrad_compute", "the expert all-to-all overlap without delayed weight "
               "gradients is not priced")
    precision = "bf16" if a.flag("bf16") else "fp16" if a.flag("fp16") else "fp32"
    ds = a.flag("deepspeed")
    # legacy Megatron-LM's scattered pipeline transfers (JobSpec.p2p_scatter_gather): its
    # flag printed True, by a version from before Megatron-Core's pipeline schedules
    # (3c92fa93b5, 2023-03-23: their p2p sends whole tensors, while arguments.py kept printing
    # the flag, unused, until 2026-04). Later versions print overlap_p2p_comm (2023-05-31) or
    # context_parallel_size; one from the two months between is read as legacy
    legacy_p2p = a.flag("scatter_gather_tensors_in_pipeline") and not (
        {"overlap_p2p_comm", "context_parallel_size"} & set(printed))
    job = JobSpec(global_batch=a.integer("global_batch_size"), seq_length=a.integer("seq_length"),
                  precision=precision, fp8=fp8, fp8_recipe=recipe if fp8 else "delayed",
                  attention=_attention(a), framework="deepspeed" if ds else "megatron",
                  grad_reduce_in_bf16=_bf16_grads(a, precision, ds),
                  # the native fused loss (its default implementation); Transformer Engine's
                  # is not priced (loss_unpriced: calibrate does not fit such a run's memory)
                  fused_loss=a.flag("cross_entropy_loss_fusion") and not ds
                  and a.text("cross_entropy_fusion_impl", "native") == "native",
                  fp8_param_gather=a.flag("fp8_param_gather"),
                  p2p_scatter_gather=legacy_p2p and not ds,
                  moe_capacity_factor=cap if model.num_experts else 1.0,
                  moe_dispatcher=dispatcher, source=source)
    recompute = _recompute(a)
    if ds:
        if deepspeed_zero is None:
            a.fail("deepspeed", "a Megatron-DeepSpeed log without DeepSpeed's configuration "
                   "print (zero_optimization_stage)")
        # BLOOM's production ds_config (bf16, stage 0, pipelined) runs as ZeRO-1
        zero = deepspeed_runs_zero("deepspeed", job.precision, deepspeed_zero, pp)
        if zero is None:
            a.fail("deepspeed", "DeepSpeed without ZeRO and without its pipeline engine "
                   "trains bf16 without fp32 master weights (engine.py DDP_BFLOAT16), "
                   "which is not priced")
    elif a.flag("use_megatron_fsdp"):
        strategy = a.text("data_parallel_sharding_strategy")
        if strategy not in _FSDP_ZERO:
            a.fail("data_parallel_sharding_strategy", f"{strategy!r} is not priced "
                   "(optim_grads, optim_grads_params)")
        zero = _FSDP_ZERO[strategy]
        if "fsdp_double_buffer" in a.p and not a.flag("fsdp_double_buffer"):
            # without it the prefetch and the reduce-scatter queue run to a 1e9-element unit
            # (model/memory.py megatron_fsdp_units): not priced
            a.fail("fsdp_double_buffer", "Megatron-FSDP without its double buffer is not "
                   "priced (its prefetch and reduce-scatter queue hold several layers more)")
    else:
        zero = int(a.flag("use_distributed_optimizer"))
    # HSDP (launch/emit.py): R distributed-optimizer instances, each sharding over dp / R
    # data-parallel ranks (x CP) and replicated across the R (arguments.py
    # --num-distributed-optimizer-instances, default 1)
    instances = a.integer("num_distributed_optimizer_instances", default=1)
    shard_size = 0
    if instances != 1:
        if instances < 1 or dp % instances:
            a.fail("num_distributed_optimizer_instances",
                   f"printed {instances}, which does not divide the data-parallel size {dp}")
        if zero < 3:
            a.fail("num_distributed_optimizer_instances",
                   f"{instances} instances of a ZeRO-{zero} optimizer (partial sharding) are "
                   "not priced; only Megatron-FSDP's (HSDP) are")
        shard_size = dp // instances
    vp = a.integer("virtual_pipeline_model_parallel_size", default=1)
    if vp < 1:
        a.fail("virtual_pipeline_model_parallel_size", f"printed {vp}, not a count of stages")
    etp = a.integer("expert_tensor_parallel_size", default=tp) if model.num_experts else tp
    if etp < 1:
        a.fail("expert_tensor_parallel_size", f"printed {etp}, not a degree")
    if ep_overlap and (pp > 1 or (etp != 1 and tp > 1)):
        # Megatron-LM runs it there (interleaved); the cost model prices it without
        # pipelining and with whole experts only (Shape.ep_comm_overlap)
        raise SpecError("the expert all-to-all overlap "
                        + ("with pipelining" if pp > 1 else "with expert TP > 1")
                        + " is not priced, and no plan file can say it: this run cannot be "
                        "calibrated on", source=a.source, field="overlap_moe_expert_parallel_comm")
    etp = 0 if etp == tp else etp  # the plan's 0: expert TP = TP
    plan = make_plan(model, job, cluster, tp=tp, pp=pp, dp=dp, cp=cp,
                     ep=a.integer("expert_model_parallel_size", default=1),
                     etp=etp,
                     micro_batch=a.integer("micro_batch_size"),
                     schedule="interleaved" if vp > 1 else "1f1b", chunks=vp,
                     mb_group=_mb_group(a, pp, vp),
                     layers=_deepspeed_layers(a, deepspeed_layers, pp, model.num_layers)
                     if ds and pp > 1 else _layers(a, model.num_layers, pp, vp),
                     recompute=recompute,
                     sequence_parallel=a.flag("sequence_parallel"), zero=zero,
                     shard_size=shard_size, fp8=fp8, tp_comm_overlap=a.flag("tp_comm_overlap"),
                     # unset: the framework's (Megatron-FSDP's ZeRO-2 overlaps regardless);
                     # ZeRO-3 overlaps per layer whatever was printed (layer_times)
                     overlap_grad_reduce=None if zero >= 3 and not ds else (
                         a.flag("overlap_grad_reduce") or None),
                     overlap_param_gather=a.flag("overlap_param_gather")
                     and not (zero >= 3 and not ds),
                     ep_comm_overlap=ep_overlap,
                     placement=ordered_placement(cluster, tp, pp, dp, cp, TP_PP_DP_ORDER,
                                                 node_order)
                     if a.flag("use_tp_pp_dp_mapping")
                     else megatron_placement(cluster, tp, pp, dp * cp, node_order))
    return model, job, plan
