"""A parallel plan: degrees, micro-batch, schedule, layer split, recompute and placement.

Placement maps every (pipeline stage, column) to one node and the local GPU ids of its
tensor-parallel group (tensor rank i runs on `gpus[i]`). A column is one (data-parallel replica,
context-parallel rank) pair, column = replica * cp + cp_rank, so a stage has dp * cp columns and
the cp columns of one replica form its context-parallel group. The default is Megatron-LM's rank
order tp-cp-dp-pp (megatron/core/parallel_state.py, order "tp-cp-ep-dp-pp"):
global rank = stage * (tp * cp * dp) + column * tp + tensor_rank, and ranks fill nodes in
order, `gpus_per_node` at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .cluster import ClusterSpec
from .communication import DEEPEP_GROUP_SIZES, DEEPEP_NVL_PEERS
from .errors import ScheduleTooLongError, SpecError
from .fp8 import cluster_recipe_problem
from .specs import RECOMPUTE, SCHEDULES, JobSpec, ModelSpec
from .topology import best_tp_groups


@dataclass(frozen=True)
class Placement:
    """`node[s][r]`: node index of stage s, column r; `gpus[s][r]`: its local GPU ids."""

    node: tuple[tuple[int, ...], ...]
    gpus: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def pp(self) -> int:
        return len(self.node)

    @property
    def cols(self) -> int:
        """Columns per stage: data-parallel replicas x context-parallel ranks."""
        return len(self.node[0]) if self.node else 0


@dataclass(frozen=True)
class Shape:
    """Everything about a plan except where it runs."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    schedule: str = "1f1b"
    chunks: int = 1  # model chunks per stage (v); > 1 only for "interleaved"
    layers: tuple[int, ...] = ()  # layers per virtual stage, model order, length pp * chunks
    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    fp8: bool = False  # linear-layer GEMMs in FP8 (Transformer Engine / torchao)
    # overlaps the framework is asked for (Megatron-LM --tp-comm-overlap, --overlap-grad-reduce,
    # --overlap-param-gather; torchtitan async TP); model/costs.py says what each hides
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    # data-parallel sharding (Rajbhandari et al. 2020): 0 none, 1 optimizer state (Megatron's
    # distributed optimizer, ZeRO-1), 2 + gradients (ZeRO-2), 3 + parameters (ZeRO-3, FSDP);
    # shard_size > 0 shards inside groups of that many data-parallel ranks and replicates
    # across them (HSDP); 0 shards over the whole data-parallel group
    zero: int = 0
    shard_size: int = 0
    # context parallelism (Megatron-LM --context-parallel-size; Liu et al. 2023 ring attention):
    # each of cp ranks holds 1/cp of every sequence (2 * cp chunks, rank i the i-th and the
    # (2cp-1-i)-th, which balances causal attention) and passes K and V around a ring
    cp: int = 1
    # torchtitan's K/V rotation under CP (its context_parallel_rotate_method): False its
    # default "allgather" (one gather of every rank's K/V per layer), True "alltoall" (each
    # step's chunk passed on while the step computes); model/costs.py prices both
    cp_alltoall: bool = False
    # expert parallelism (Megatron-LM --expert-model-parallel-size): the routed experts of
    # every MoE layer are split over ep consecutive columns of a stage (rank order
    # tp-cp-ep-dp-pp: the EP group sits inside the data x context parallel ranks), and each
    # token goes to its experts' ranks and back by all-to-all
    ep: int = 1
    # expert tensor parallelism (--expert-tensor-parallel-size): 0 = TP (each expert's FFN
    # split like a dense MLP), or 1 (whole experts; the expert grid etp-ep-edp then fills a
    # stage's tp x columns ranks in order, so EP groups can span the TP ranks)
    etp: int = 0
    # Megatron-LM --overlap-moe-expert-parallel-comm with --delay-wgrad-compute: the 1F1B
    # steady state runs one micro-batch's forward and another's backward layer by layer
    # together, each one's expert all-to-alls on a stream of their own beside the other's
    # compute (pipeline_parallel/combined_1f1b.py; model/costs.py `_ep_overlap`); priced
    # without pipelining (PP 1) and with whole experts
    ep_comm_overlap: bool = False
    # interleaved schedule: micro-batches run through one model chunk before the next (Megatron-LM
    # --microbatch-group-size-per-virtual-pipeline-stage, model/schedule.py interleaved_table);
    # 0 = the framework's own grouping (`interleave_group`): PP on Megatron-LM, PyTorch's rounds
    # on torchtitan
    mb_group: int = 0

    def __post_init__(self):
        # `distributed_optimizer` is the ZeRO-1 flag of the code that predates `zero`: the two
        # always agree (zero >= 1 shards the optimizer state)
        zero = self.zero if isinstance(self.zero, int) else 0
        if self.distributed_optimizer is True and zero == 0:
            zero = 1
        object.__setattr__(self, "zero", zero)
        object.__setattr__(self, "distributed_optimizer", zero >= 1)
        # a shard group of every data-parallel rank is plain ZeRO-3 (0), as the search
        # enumerates it: one shape, one price (estimate had priced it as HSDP of one replica)
        if zero >= 3 and self.shard_size == self.dp and isinstance(self.dp, int):
            object.__setattr__(self, "shard_size", 0)

    @property
    def cols(self) -> int:
        """Columns per stage: data-parallel replicas x context-parallel ranks."""
        return self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def shard_group(self) -> int:
        """Ranks one shard of the sharded state spans: the data-parallel group (or HSDP's
        `shard_size` replicas) times CP, as Megatron-LM's distributed optimizer and FSDP2 shard
        over data x context parallel ranks (both hold the same weights)."""
        return (self.shard_size if self.shard_size else self.dp) * self.cp

    @property
    def num_virtual(self) -> int:
        return self.pp * self.chunks

    def stage_layers(self, stage: int) -> int:
        return sum(self.layers[c * self.pp + stage] for c in range(self.chunks))

    def describe(self, degrees: bool = True) -> str:
        """One line; `degrees=False` leaves out TP, PP, DP and CP (the variant within them)."""
        s = f"TP={self.tp} PP={self.pp} DP={self.dp}" if degrees else ""
        if self.cp > 1 and degrees:
            s += f" CP={self.cp}"
        if self.ep > 1 and degrees:
            s += f" EP={self.ep}"
        if self.expert_tp != self.tp and degrees:
            s += f" ETP={self.expert_tp}"
        s += f" mbs={self.micro_batch} {self.schedule}"
        if self.schedule == "interleaved":
            s += f" v={self.chunks}"
            if self.mb_group:
                s += f" group={self.mb_group}"
        s += f" recompute={self.recompute}"
        if self.sequence_parallel:
            s += " SP"
        if self.zero == 1 and not self.shard_size:
            s += " distopt"
        elif self.zero:
            s += f" zero{self.zero}" if not self.shard_size else \
                f" hsdp{self.shard_size}x{self.dp // self.shard_size}"
        if self.fp8:
            s += " fp8"
        if self.cp_alltoall:
            s += " kv-alltoall"
        for f, tag in (("tp_comm_overlap", "tp-overlap"), ("overlap_grad_reduce", "grad-overlap"),
                       ("overlap_param_gather", "param-overlap"),
                       ("ep_comm_overlap", "ep-overlap")):
            if getattr(self, f):
                s += f" {tag}"
        return s.strip()


@dataclass(frozen=True)
class LayerParams:
    """One layer's parameters on one GPU of a shape, the one split the cost and memory models
    share. The routed experts are divided by EP x expert TP, the rest by TP (Megatron-LM's
    MoELayer: E / ep local experts); the experts' sharded state is `expert_shard_factor`
    times finer than the data-parallel shard (their expert-data-parallel group has
    tp x cols / (ep x etp) ranks). `split`: the experts are told apart (EP > 1 or expert TP
    != TP); otherwise every parameter is split and sharded alike, as before EP."""

    total: float
    linear: float
    experts: float
    expert_shard_factor: float
    split: bool


def layer_params(model: ModelSpec, shape: Shape) -> LayerParams:
    ep, et, t = shape.ep, shape.expert_tp, shape.tp
    pe = model.expert_params_per_layer
    split = model.is_moe and (ep > 1 or et != t)
    # the weights every TP rank holds whole (latent attention's down-projections, the
    # router: ModelSpec.tp_replicated_params_per_layer) are not divided by t
    total, linear = model.layer_params_per_gpu(t), model.layer_params_per_gpu(t, linear=True)
    if not split:  # (the arithmetic as before expert parallelism, bit for bit)
        return LayerParams(total, linear, pe / (ep * et), ep * et / t, False)
    return LayerParams(total - pe / t + pe / (ep * et), linear - pe / t + pe / (ep * et),
                       pe / (ep * et), ep * et / t, True)


def ep_groups(shape: Shape) -> list[list[tuple[int, int]]]:
    """The expert-parallel groups of one stage as lists of (column, tensor rank): Megatron-LM
    numbers a stage's ranks column * tp + tensor rank and lays the expert grid etp-ep-edp over
    them (parallel_state.py, expert rank generator "tp-ep-dp-pp"); a group is the ep ranks of
    one (expert-TP rank, expert-data-parallel rank)."""
    tp, et, ep = shape.tp, shape.expert_tp, shape.ep
    edp = tp * shape.cols // (et * ep)
    return [[divmod(e_t + et * (e + ep * d), tp) for e in range(ep)]
            for d in range(edp) for e_t in range(et)]


def expert_dp_groups(shape: Shape) -> list[list[tuple[int, int]]]:
    """The expert-data-parallel groups of one stage (the ranks holding the same experts,
    which synchronize their gradients), as lists of (column, tensor rank)."""
    tp, et, ep = shape.tp, shape.expert_tp, shape.ep
    edp = tp * shape.cols // (et * ep)
    return [[divmod(e_t + et * (e + ep * d), tp) for d in range(edp)]
            for e in range(ep) for e_t in range(et)]


def gpus_without_fp8(cluster: ClusterSpec) -> list[str]:
    """The cluster's GPU types without FP8 tensor cores (no fp8 peak in their datasheet)."""
    return sorted({nd.gpu.name for nd in cluster.nodes if "fp8" not in nd.gpu.peak_tflops})


def no_fp8_cores(cluster: ClusterSpec) -> str:
    return (f"FP8 needs FP8 tensor cores, which {', '.join(gpus_without_fp8(cluster))} lack "
            "(Hopper, Ada or newer)")


def fp8_problem(job: JobSpec, cluster: ClusterSpec) -> tuple[str, str] | None:
    """Why FP8 linear layers cannot run on `cluster` as the job asks, as (field, message): GPU
    types without FP8 tensor cores ("fp8"), or the job's recipe one of its GPU types does not
    run ("fp8_recipe", model/fp8.py); None where they can."""
    if gpus_without_fp8(cluster):
        return "fp8", no_fp8_cores(cluster)
    why = cluster_recipe_problem(job, cluster)
    return ("fp8_recipe", why) if why else None


def dense_moe_option(model: ModelSpec, job: JobSpec) -> tuple[str, str] | None:
    """A mixture-of-experts job option set on a dense model, as (the job field, what to do),
    or None: the commands, plan files and sweeps refuse it alike rather than ignore it."""
    if model.is_moe:
        return None
    if job.moe_capacity_factor != 1.0:
        return ("moe_capacity_factor", f"{job.moe_capacity_factor:g} on {model.name}, which is "
                "dense (no experts): a capacity factor does not apply; set it to 1.0 (drop "
                "--moe-capacity-factor)")
    if job.moe_dispatcher != "alltoall":
        return ("moe_dispatcher", f"{job.moe_dispatcher} on {model.name}, which is dense (no "
                "experts): a token dispatcher does not apply; set it to alltoall (drop "
                "--moe-dispatcher)")
    return None


def dispatcher_problem(job: JobSpec, cluster: ClusterSpec) -> str | None:
    """Why the job's MoE dispatcher cannot run on `cluster`, or None: DeepEP's NVLink domain
    is 8 GPUs (its RDMA team takes every 8th rank: DeepEP csrc/kernels/backend/nvshmem.cu;
    "only 'hybridep' backend supports the MNNVL case", Megatron-Core transformer_config.py),
    so a node of more GPUs (an NVL72 rack as one node) runs HybridEP."""
    if job.moe_dispatcher == "alltoall":
        return None
    # both are CUDA kernels: HybridEP's NVLink path uses the Tensor Memory Accelerator
    # (Hopper and later: DeepEP hybrid-ep docs/README_Hybrid-EP.md); DeepEP's SM80 build has
    # no NVSHMEM, so no internode kernels (setup.py DISABLE_SM90_FEATURES)
    old_gpus = sorted({nd.gpu.name for nd in cluster.nodes
                       if nd.gpu.compute_capability is None
                       or nd.gpu.compute_capability < (9.0 if job.moe_dispatcher == "hybridep"
                                                       else 8.0)})
    if old_gpus:
        return (f"{job.moe_dispatcher} runs on NVIDIA GPUs from "
                + ("Hopper" if job.moe_dispatcher == "hybridep" else "Ampere")
                + f" on, not {', '.join(old_gpus)}; use moe_dispatcher alltoall"
                + (" (or deepep inside a node)" if job.moe_dispatcher == "hybridep" else ""))
    big = sorted({nd.num_gpus for nd in cluster.node_kinds
                  if nd.num_gpus > DEEPEP_NVL_PEERS})
    if job.moe_dispatcher == "deepep" and big:
        return (f"DeepEP runs NVLink domains of up to 8 GPUs, and the cluster has nodes of "
                f"{'/'.join(map(str, big))}; use moe_dispatcher hybridep (Megatron-Core: only "
                "HybridEP supports multi-node NVLink) or alltoall")
    return None


def deepep_shape_problem(shape: Shape, cluster: ClusterSpec) -> str | None:
    """Why DeepEP's buffer cannot take the shape's EP groups, or None: Megatron-Core sizes
    its buffer from DeepEP's dispatch and combine configurations (fused_a2a.py get_buffer),
    which exist only for the group sizes DEEPEP_GROUP_SIZES (any other asserts 'Unsupported
    number of EP ranks'); above 8 ranks its RDMA rank is rank / 8, so the nodes must have 8
    GPUs (DeepEP csrc/legacy/buffer.hpp Buffer; with expert TP 1 its group is the EP
    group)."""
    ep = shape.ep
    if ep > 1 and ep not in DEEPEP_GROUP_SIZES:
        return (f"DeepEP runs EP groups of {', '.join(map(str, DEEPEP_GROUP_SIZES))} ranks "
                f"(its dispatch configurations), not {ep}")
    pre_hopper = sorted({nd.gpu.name for nd in cluster.nodes
                         if (nd.gpu.compute_capability or 0) < 9.0})
    if pre_hopper and ep > min(nd.num_gpus for nd in cluster.node_kinds):
        return (f"DeepEP's internode kernels need Hopper or later (its build for "
                f"{', '.join(pre_hopper)} has no NVSHMEM), and EP {ep} spans nodes")
    odd = sorted({nd.num_gpus for nd in cluster.node_kinds if nd.num_gpus != DEEPEP_NVL_PEERS})
    if ep > DEEPEP_NVL_PEERS and odd:
        return (f"DeepEP spans nodes of 8 GPUs (its RDMA rank is rank / 8), and the cluster "
                f"has nodes of {'/'.join(map(str, odd))}")
    return None


def deepep_block_ok(cluster: ClusterSpec, shape: Shape, k: int) -> bool:
    """Whether DeepEP can start the EP groups of every placement of a block layout whose
    nodes each hold k columns of a stage (solvers.space.Block): a group of consecutive ranks
    (expert TP 1) lies inside one node where the node's k x tp ranks are a multiple of it, or
    fills whole nodes of 8 in runs of 8 (deepep_layout_problem), the latter from Hopper on
    (deepep_shape_problem)."""
    ranks = k * shape.tp
    if ranks % shape.ep == 0:
        return True
    hopper = all((nd.gpu.compute_capability or 0) >= 9.0 for nd in cluster.nodes)
    return hopper and shape.ep % DEEPEP_NVL_PEERS == 0 and ranks == DEEPEP_NVL_PEERS and all(
        nd.num_gpus == DEEPEP_NVL_PEERS for nd in cluster.node_kinds)


def deepep_layout_problem(plan: "Plan", cluster: ClusterSpec) -> str | None:
    """Why DeepEP could not start one of the plan's EP groups where the placement puts it,
    or None: a group of up to 8 ranks must share one node (its intranode kernels reach every
    member over NVLink), a larger one must fill whole nodes of 8 (DeepEP Buffer: the GPUs of
    one RDMA rank are 8 consecutive ranks on one node)."""
    sh, pl = plan.shape, plan.placement
    for s in range(sh.pp):
        for grp in ep_groups(sh):
            nodes: dict[int, int] = {}
            for c, _t in grp:
                nodes[pl.node[s][c]] = nodes.get(pl.node[s][c], 0) + 1
            # in rank order, each run of 8 on one node of its own
            k = DEEPEP_NVL_PEERS
            runs = [{pl.node[s][c] for c, _t in grp[i:i + k]} for i in range(0, len(grp), k)]
            whole = all(len(r) == 1 for r in runs) and len(runs) == len(nodes)
            if len(nodes) > 1 and (any(v != k for v in nodes.values()) or not whole):
                names = ", ".join(f"{cluster.nodes[n].name} ({v})" for n, v in nodes.items())
                return (f"stage {s}'s EP group of {sh.ep} ranks lies on {names}: DeepEP runs a "
                        "group inside one node or over whole nodes of 8 GPUs; use "
                        "moe_dispatcher hybridep, or another placement")
    return None


def torchtitan_seq_problem(job: JobSpec, shape: Shape) -> str | None:
    """Why torchtitan 0.2 would refuse the job's sequence length for the shape, or None: its
    ParallelDims.seq_len_divisor, TP x 2 CP, asserted for every TP or CP run from v0.2.0
    (torchtitan/models/llama3/infra/parallelize.py; v0.1.0 has no such check)."""
    div = shape.tp * 2 * shape.cp
    if div > 2 and job.seq_length % div:
        return (f"torchtitan 0.2 needs the sequence length divisible by TP x 2 CP = {div}, and "
                f"{job.seq_length} is not: choose another sequence length, TP or CP")
    return None


def least_zero(job: JobSpec) -> int:
    """The lowest ZeRO stage that runs as priced: 1 for DeepSpeed's bf16 (deepspeed_problem),
    else 0."""
    return 1 if job.framework == "deepspeed" and job.precision == "bf16" else 0


def deepspeed_runs_zero(framework: str, precision: str, zero: int, pp: int) -> int | None:
    """The ZeRO stage a configured DeepSpeed run has in the cost model's terms: bf16 without
    ZeRO under its pipeline engine runs BF16_Optimizer, which shards the optimizer state as
    ZeRO-1 (engine.py _do_optimizer_sanity_check); without the pipeline engine it is pure bf16
    (DDP_BFLOAT16), None: not priced (deepspeed_problem). Any other run: its stage."""
    if framework == "deepspeed" and precision == "bf16" and zero == 0:
        return 1 if pp > 1 else None
    return zero


def deepspeed_overlaps_grads(job: JobSpec, zero: int) -> bool:
    """Whether DeepSpeed can overlap the gradient reduction with the backward: in its ZeRO
    optimizer (ZeRO-2, or ZeRO-1 outside bf16; deepspeed_problem)."""
    return zero == 2 or (zero == 1 and job.precision != "bf16")


def deepspeed_problem(job: JobSpec, shape: Shape) -> tuple[str, str] | None:
    """(field, why) where DeepSpeed would not run what the cost model prices (DeepSpeed 0.19
    deepspeed/runtime/engine.py _do_optimizer_sanity_check picks the optimizer wrapper):
    - bf16 without ZeRO trains without fp32 master weights (DDP_BFLOAT16), or under the
      pipeline engine shards them like ZeRO-1 (BF16_Optimizer); the estimate prices neither;
    - the gradient reduction overlaps the backward only in the ZeRO optimizer
      (stage_1_and_2.py, overlap_comm read in _configure_zero_optimizer): not without ZeRO,
      and not in bf16 ZeRO-1, which is BF16_Optimizer (reduced after the backward);
    - tensor-parallel and parameter-gather overlap are Megatron-LM's, with no DeepSpeed key."""
    if job.framework != "deepspeed":
        return None
    if shape.zero < least_zero(job):
        return "zero", ("DeepSpeed without ZeRO trains bf16 without fp32 master weights "
                        "(engine.py DDP_BFLOAT16), or under its pipeline engine shards them as "
                        "ZeRO-1 does (BF16_Optimizer): plan ZeRO-1 (--zero 1), which runs "
                        "BF16_Optimizer as priced")
    if shape.overlap_grad_reduce and shape.zero < 3 and not deepspeed_overlaps_grads(
            job, shape.zero):
        return "overlap_grad_reduce", (
            "DeepSpeed overlaps the gradient reduction (overlap_comm) in its ZeRO optimizer "
            "only: " + ("not without ZeRO" if shape.zero == 0 else
                        "bf16 ZeRO-1 runs BF16_Optimizer, which reduces after the backward")
            + "; leave out --overlap-grad-reduce" + ("" if shape.zero == 0 else
                                                     " or plan ZeRO-2"))
    for f in ("tp_comm_overlap", "overlap_param_gather"):
        if getattr(shape, f):
            return f, (f"{f} is a Megatron-LM overlap with no DeepSpeed config key; leave out "
                       f"--{f.replace('_', '-')}")
    return None


def fsdp_overlaps_grads(job: JobSpec, zero: int, sync_ranks: int) -> bool:
    """Whether the framework overlaps the gradient reduction whatever the plan asks: Megatron-
    FSDP sets overlap_grad_reduce for its gradient-sharding strategies and asserts it
    (megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py MegatronFSDP.__init__);
    ZeRO-2 is optim_grads (ZeRO-3's per-layer reduce-scatters are overlapped in
    model/costs.py already). `sync_ranks`: the ranks the gradients are reduced over (DP x CP)."""
    return job.framework == "megatron" and zero == 2 and sync_ranks > 1


def _validate_group(job: JobSpec, shape: Shape, m: int, src: str) -> None:
    """The interleaved schedule's micro-batch grouping, as the plan's framework runs it."""
    p, n = shape.pp, shape.mb_group
    if job.framework == "torchtitan":
        group, why = torch_interleave_group(p, m)
        if n and n != group:
            raise SpecError(f"torchtitan has no setting for the interleaved schedule's "
                            f"micro-batch group: PyTorch runs groups of {group} here; leave "
                            "mb_group out", source=src, field="mb_group")
        if why is None and m < p:
            why = (f"with {m} micro-batches per replica, fewer than PP={p}, PyTorch's "
                   "Interleaved1F1B leaves stages waiting in a way the cost model does not "
                   "price")
        if why:
            raise SpecError(why + "; choose a micro-batch size or DP that gives at least PP "
                            "micro-batches per replica in whole rounds", source=src,
                            field="micro_batch")
        return
    if n and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise SpecError(f"mb_group must be a count of micro-batches, got {n!r}", source=src,
                        field="mb_group")
    why = megatron_group_problem(p, m, n or p)
    if why is None:
        return
    least = megatron_least_group(p, m)
    if least is None:
        raise SpecError(f"interleaved 1F1B needs at least PP={p} micro-batches per replica, "
                        f"not {m} (Megatron-LM requirement): lower the micro-batch size or DP",
                        source=src, field="micro_batch")
    raise SpecError(f"interleaved 1F1B: {why} (Megatron-LM requirement); give mb_group "
                    f"{least} (estimate --mb-group {least}; Megatron-LM's "
                    "--microbatch-group-size-per-virtual-pipeline-stage, Megatron-Core 0.10 "
                    "and later)", source=src, field="mb_group" if n else "micro_batch")


def _validate_ep(model: ModelSpec, job: JobSpec, shape: Shape, src: str) -> None:
    """What Megatron-LM needs of expert parallelism, and what the cost model covers."""
    if shape.ep_comm_overlap:
        why = ("it needs EP > 1" if shape.ep <= 1 else
               "with pipelining it is not priced (Megatron-LM runs it there only interleaved, "
               "whose paired steps the cost model does not build); use PP 1"
               if shape.pp > 1 else
               "it is priced with whole experts (expert TP 1)" if shape.expert_tp != 1 else
               "Megatron-LM refuses it with full recompute" if shape.recompute == "full" else
               "Megatron-LM runs it with a bf16 or fp16 model only"
               if job.precision not in ("bf16", "fp16") else None)
        if why:
            raise SpecError(f"the expert-parallel all-to-all overlap (--ep-comm-overlap): {why}"
                            "; drop it or change the plan", source=src, field="ep_comm_overlap")
    if not model.is_moe:
        raise SpecError(f"EP={shape.ep}" + (f" with expert TP {shape.etp}" if shape.etp else "")
                        + f" needs a mixture-of-experts model; {model.name} is dense: leave "
                        "out --ep and --etp", source=src, field="etp" if shape.etp else "ep")
    if shape.etp not in (0, 1, shape.tp):
        raise SpecError(f"expert TP {shape.etp!r} must be 1 or TP={shape.tp} (other values "
                        "are not modelled)", source=src, field="etp")
    if (shape.tp * shape.cols) % (shape.ep * shape.expert_tp):
        raise SpecError(f"EP x expert TP = {shape.ep} x {shape.expert_tp} must divide TP x DP x "
                        f"CP = {shape.tp * shape.cols} (the expert grid fills a stage's ranks)",
                        source=src, field="ep")
    if model.num_experts % shape.ep:
        raise SpecError(f"EP={shape.ep} does not divide the {model.num_experts} experts of "
                        f"{model.name}; choose an EP that divides it", source=src, field="ep")
    if job.framework not in ("megatron", "nemo"):
        raise SpecError(f"expert parallelism is modelled for Megatron-LM and NeMo, not "
                        f"{job.framework}; use framework megatron (NeMo runs the same: emit "
                        "-f nemo), or ep 1",
                        source=src, field="ep")
    if shape.zero >= 3:
        raise SpecError("expert parallelism with ZeRO-3 / FSDP is not modelled; use the "
                        "distributed optimizer (zero 1) or zero 0, or ep 1", source=src,
                        field="ep")
    if job.moe_dispatcher != "alltoall" and shape.expert_tp != 1:
        # Megatron-Core's flex dispatcher sends each token to every TP rank of its experts
        # over one TP x EP group (token_dispatcher.py MoEFlexTokenDispatcher: router_topk x
        # tp_size); priced with whole experts only
        raise SpecError(f"the {job.moe_dispatcher} dispatcher is priced with whole experts "
                        f"(expert TP 1), not expert TP {shape.expert_tp}: use --etp 1, or "
                        "moe_dispatcher alltoall", source=src, field="etp")


def slot_label(stage: int, col: int, cp: int = 1) -> str:
    """A placement slot as the outputs name it: s<stage>/r<replica>, with c<CP rank> under
    context parallelism (a placement column is replica x CP + CP rank)."""
    return f"s{stage}/r{col // cp}" + (f"c{col % cp}" if cp > 1 else "")


@dataclass(frozen=True)
class Plan:
    shape: Shape
    placement: Placement

    def __getattr__(self, name):  # plan.tp, plan.layers, ... read through to the shape
        if name in Shape.__dataclass_fields__:
            return getattr(self.shape, name)
        raise AttributeError(name)


def num_microbatches(job: JobSpec, shape: Shape) -> int:
    return job.global_batch // (shape.micro_batch * shape.dp)


def dispatch_tokens(job: JobSpec, shape: Shape) -> float:
    """Tokens one GPU routes per micro-batch and MoE layer: its 1/cp of each sequence, and
    its 1/tp shard of those under sequence parallelism (which EP with TP requires). What the
    all-to-alls move (costs.CostModel) and what the flex dispatchers' buffers are sized for
    (memory.dispatcher_buffer_gib)."""
    return (shape.micro_batch * job.seq_length // shape.cp) / (
        shape.tp if shape.sequence_parallel else 1)


# The largest schedule graph the cost model builds, in slots: micro-batches per replica x
# pipeline stages x chunks (each slot a forward and a backward node per stage, walked on every
# evaluation). Measured on this project's 2-core machine (`estimate`, Llama-2 7B, TP 8 x PP 8,
# 1F1B): 2^18 slots take 3.7 s and 0.63 GiB, 2^20 slots 18.6 s and 2.0 GiB, and 2^22 slots
# 98.6 s and 7.1 GiB; 10^9 sequences at DP 4 ran out of 24 GiB. 2^18 covers PP 64 with 4,096
# micro-batches per replica, and keeps one evaluation within a few seconds of a time limit.
MAX_SCHEDULE_SLOTS = 2 ** 18


def megatron_group_problem(p: int, m: int, n: int) -> str | None:
    """Why Megatron-LM's interleaved schedule refuses groups of n micro-batches for PP p and m
    micro-batches per replica, or None (schedules.py forward_backward_pipelining_with_
    interleaving: n within [p, m], and the last group, m % n, empty or at least p; before
    Megatron-Core 0.10 n was p and m a multiple of it)."""
    if not p <= n <= m:
        return f"a group of {n} micro-batches must lie within [PP={p}, {m} micro-batches]"
    if 0 < m % n < p:
        return (f"{m} micro-batches in groups of {n} leave a last group of {m % n}, fewer than "
                f"PP={p}")
    return None


def megatron_least_group(p: int, m: int) -> int | None:
    """The smallest group Megatron-LM's interleaved schedule runs for PP p and m micro-batches
    (p itself where m is a multiple of p, its default), or None where none is valid (m < p).
    The smallest keeps the fewest activations in flight: each stage's warm-up grows by v - 1
    forwards for every micro-batch added to the group (model/schedule.py interleaved_warmup)."""
    return next((n for n in range(p, m + 1) if megatron_group_problem(p, m, n) is None), None)


def torch_interleave_group(p: int, m: int) -> tuple[int, str | None]:
    """PyTorch's grouping for torchtitan's Interleaved1F1B (torch.distributed.pipelining
    schedules.py ScheduleInterleaved1F1B): max(1, m // p) rounds of m / rounds micro-batches,
    refused unless the rounds divide m. (group, why refused or None)."""
    rounds = max(1, m // p)
    if m % rounds:
        return m // rounds, (f"PyTorch's Interleaved1F1B splits the {m} micro-batches per "
                             f"replica into {rounds} rounds and needs them to divide it")
    return m // rounds, None


def interleave_group(job: JobSpec, shape: Shape, m: int) -> int:
    """Micro-batches per group of the plan's interleaved schedule as its framework runs it
    (0 for the other schedules): torchtitan's PyTorch rounds, or the plan's `mb_group`, PP by
    default (Megatron-LM, NeMo, Megatron-Bridge)."""
    if shape.schedule != "interleaved":
        return 0
    if job.framework == "torchtitan":
        return torch_interleave_group(shape.pp, m)[0]
    return shape.mb_group or shape.pp


def sends_block(job: JobSpec, shape: Shape, blocking_p2p: bool) -> bool:
    """Whether the plan's pipeline sends block as Options.blocking_p2p says (Megatron-LM's,
    DeepSpeed's), or never: PyTorch's interleaved runtime (torchtitan's Interleaved1F1B,
    pipelining schedules.py _PipelineScheduleRuntime) starts every send and waits for them
    all at the end of the step, and waits for a receive just before the computation that
    needs it: the overlapped graph."""
    return blocking_p2p and not (job.framework == "torchtitan"
                                 and shape.schedule == "interleaved")


def p2p_style(job: JobSpec, shape: Shape, blocking_p2p: bool) -> str:
    """Whose 1F1B calls the plan's blocking pipeline transfers follow (model/schedule.py
    P2P_STYLES): DeepSpeed's pipeline engine makes every send and receive a blocking call of
    its own, one after the other (p2p.py dist.send / dist.recv in TrainSchedule's order);
    PyTorch's Schedule1F1B (torchtitan) starts its warm-up and cool-down sends without
    waiting and waits for each after the next operation, and its ScheduleGPipe waits for its
    sends at the end of each phase; Megatron-LM batches the steady state's and calls the
    others one at a time."""
    if not blocking_p2p or shape.schedule == "interleaved":
        return "megatron"
    if job.framework == "torchtitan":
        return "torch"
    return "deepspeed" if job.framework == "deepspeed" and shape.schedule == "1f1b" else \
        "megatron"


def schedule_key(job: JobSpec, shape: Shape, blocking_p2p: bool) -> tuple:
    """The arguments of model/schedule.py compile_schedule for the plan as its framework runs
    it: (schedule, PP, micro-batches, chunks, blocking sends, interleaved group, whose 1F1B
    calls). The estimator, the solvers' memory screens and the search's shared cuts all build
    the plan's graph from it, so they price one schedule."""
    m = num_microbatches(job, shape)
    return (shape.schedule, shape.pp, m, shape.chunks, sends_block(job, shape, blocking_p2p),
            interleave_group(job, shape, m), p2p_style(job, shape, blocking_p2p))


def schedule_slots(job: JobSpec, shape: Shape) -> int:
    """Micro-batches per replica x pipeline stages x chunks: the size of the plan's schedule
    graph (MAX_SCHEDULE_SLOTS)."""
    return num_microbatches(job, shape) * shape.pp * shape.chunks


def validate_shape(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                   src: str = "plan", check_layers: bool = True) -> None:
    """Raise SpecError with the field and the fix for anything Megatron-LM could not run."""
    for f in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "chunks"):
        v = getattr(shape, f)
        if not isinstance(v, int) or v < 1:
            raise SpecError(f"must be a positive integer, got {v!r}", source=src, field=f)
    if model.num_heads % shape.tp or model.num_kv_heads % shape.tp:
        raise SpecError(f"TP={shape.tp} does not divide the {model.num_heads} attention heads "
                        f"and {model.num_kv_heads} KV heads of {model.name}; choose a TP that "
                        "divides both", source=src, field="tp")
    if model.ffn_hidden_size % shape.tp:
        raise SpecError(f"TP={shape.tp} does not divide ffn_hidden_size "
                        f"{model.ffn_hidden_size}", source=src, field="tp")
    # every GPU plays a rank and every TP group sits inside one node, so TP divides each
    # node's GPU count (one node of each kind: every Evaluator the search builds checks this)
    odd = sorted({nd.num_gpus for nd in cluster.node_kinds if nd.num_gpus % shape.tp})
    if odd:
        raise SpecError(f"TP={shape.tp} does not divide the {'/'.join(map(str, odd))} GPUs of "
                        "some nodes: a tensor-parallel group must fit inside one node and the "
                        "groups must fill every node; choose a TP that divides each node's "
                        "GPU count", source=src, field="tp")
    n = shape.tp * shape.pp * shape.dp * shape.cp
    if n != cluster.num_gpus:
        names = "TP x PP x DP" + (" x CP" if shape.cp > 1 else "")
        vals = f"{shape.tp}x{shape.pp}x{shape.dp}" + (f"x{shape.cp}" if shape.cp > 1 else "")
        raise SpecError(f"{names} = {vals} = {n} but the cluster has {cluster.num_gpus} GPUs; "
                        "make the product equal", source=src, field="tp/pp/dp/cp")
    if shape.cp > 1:
        # Megatron-LM splits each sequence into 2 * cp chunks, and sequence parallelism
        # splits a chunk further over the TP ranks (arguments.py checks seq % (2 * cp) and
        # seq % tp; the chunk must split evenly)
        div = 2 * shape.cp * (shape.tp if shape.sequence_parallel else 1)
        if job.seq_length % div:
            raise SpecError(f"sequence length {job.seq_length} is not divisible by 2 x CP"
                            + (" x TP" if shape.sequence_parallel else "") + f" = {div}; "
                            "choose a CP (and TP) whose product divides it", source=src,
                            field="cp")
        if job.attention != "flash":
            raise SpecError("context parallelism needs a fused attention kernel (Megatron-LM "
                            "runs it through Transformer Engine's flash/fused attention); use "
                            "attention = flash", source=src, field="cp")
        if job.framework == "deepspeed":
            raise SpecError("DeepSpeed's pipeline engine has no ring context parallelism "
                            "(its Ulysses sequence parallelism is a different scheme); use "
                            "framework megatron, nemo or torchtitan, or CP = 1", source=src,
                            field="cp")
    if job.framework == "torchtitan" and not job.repeat_kv and (
            why := torchtitan_seq_problem(job, shape)):
        # a job that repeats K and V is v0.1 or v0.2.0/1: the emit checks the release it
        # writes for
        raise SpecError(why, source=src, field="seq_length")
    if job.framework == "torchtitan" and shape.schedule == "interleaved" and \
            shape.chunks > 3 and shape.zero >= 3:
        # pipelining schedules.py _add_unshard_reshard: at most 3 of a rank's stages unsharded
        # at once, so with 4 or more each chunk is gathered again for every group of
        # micro-batches it runs (11 gathers of 4 chunks at PP 4 and 8 micro-batches), where
        # the cost model gathers each chunk once a step
        raise SpecError(f"PyTorch's interleaved runtime keeps at most 3 of a rank's "
                        f"{shape.chunks} FSDP chunks gathered and gathers them again as they "
                        "come round, which is not priced: use at most 3 chunks per stage "
                        "with ZeRO-3", source=src, field="chunks")
    if job.framework == "torchtitan" and shape.tp_comm_overlap and not job.compile:
        # torchtitan/distributed/tensor_parallel.py maybe_enable_async_tp (v0.2.2; v0.1.0
        # models/llama3/infra/parallelize.py) raises without torch.compile of the model
        raise SpecError("torchtitan runs async tensor parallelism only compiled ('Async TP "
                        "requires model in --compile.components'): compile the model, or drop "
                        "--tp-comm-overlap", source=src, field="tp_comm_overlap")
    if shape.ep > 1 or shape.etp or shape.ep_comm_overlap:
        _validate_ep(model, job, shape, src)
    if shape.ep > 1 and (why := dispatcher_problem(job, cluster) or (
            job.moe_dispatcher == "deepep" and deepep_shape_problem(shape, cluster))):
        raise SpecError(why + ("" if "use" in why else "; choose another EP, or moe_dispatcher "
                               "hybridep"), source=src, field="moe_dispatcher")
    if model.is_moe and job.framework in ("megatron", "nemo"):
        if shape.tp > 1 and not shape.sequence_parallel:
            # megatron/core/transformer/moe/moe_layer.py (MoELayer.forward, d98e8a6) raises in
            # training whatever the EP (model_parallel_config.py only warns, for EP > 1)
            raise SpecError("Megatron-LM's MoE layer raises in training with tensor "
                            "parallelism and no sequence parallelism (moe_layer.py); turn "
                            "sequence parallelism on (--sp)", source=src,
                            field="sequence_parallel")
        if model.expert_ffn % shape.expert_tp:
            # the experts' grouped linears divide their FFN width over the expert TP ranks
            # (extensions/transformer_engine.py TEGroupedLinear: divide() asserts)
            raise SpecError(f"expert TP {shape.expert_tp} does not divide the experts' FFN "
                            f"width {model.expert_ffn} (moe_ffn_hidden_size); choose an expert "
                            "TP (--etp) or TP that divides it", source=src, field="etp")
    if model.is_mla and (job.framework not in ("megatron", "nemo") or job.attention != "flash"):
        raise SpecError("latent attention (MLA) is modelled as Megatron-LM runs it, with a "
                        "fused attention kernel; use framework megatron or nemo and attention "
                        "flash", source=src, field="framework")
    if job.global_batch % (shape.micro_batch * shape.dp):
        raise SpecError(f"global batch {job.global_batch} is not divisible by micro-batch "
                        f"{shape.micro_batch} x DP {shape.dp}; choose values whose product "
                        "divides it", source=src, field="micro_batch")
    if job.framework == "torchtitan" and shape.pp > 1 and shape.schedule == "1f1b" and \
            num_microbatches(job, shape) < shape.pp:
        # torch.distributed.pipelining Schedule1F1B.__init__ raises
        raise SpecError(f"PyTorch's 1F1B schedule (torchtitan) needs at least PP={shape.pp} "
                        f"micro-batches per replica, not {num_microbatches(job, shape)}: lower "
                        "the micro-batch size or DP, or raise the global batch", source=src,
                        field="micro_batch")
    if (bad := model_refusal(model, job.framework, job.seq_length, shape)) is not None:
        raise SpecError(bad[1], source=src, field=bad[0])
    if shape.schedule not in SCHEDULES:
        raise SpecError(f"unknown schedule '{shape.schedule}'; use one of "
                        f"{', '.join(SCHEDULES)}", source=src, field="schedule")
    if shape.recompute not in RECOMPUTE:
        raise SpecError(f"unknown recompute '{shape.recompute}'; use one of "
                        f"{', '.join(RECOMPUTE)}", source=src, field="recompute")
    m = num_microbatches(job, shape)
    if shape.schedule == "interleaved":
        if shape.chunks < 2:
            raise SpecError("interleaved needs chunks (v) >= 2", source=src, field="chunks")
        if shape.pp < 2:
            raise SpecError("interleaved needs PP >= 2", source=src, field="schedule")
        _validate_group(job, shape, m, src)
    elif shape.chunks != 1:
        raise SpecError(f"chunks={shape.chunks} only applies to the interleaved schedule",
                        source=src, field="chunks")
    elif shape.mb_group:
        raise SpecError(f"mb_group={shape.mb_group} only applies to the interleaved schedule",
                        source=src, field="mb_group")
    if job.framework == "deepspeed" and shape.pp > 1 and shape.schedule != "1f1b":
        # deepspeed/runtime/pipe/schedule.py: TrainSchedule, its one training schedule
        raise SpecError(f"DeepSpeed's pipeline engine runs its own 1F1B schedule "
                        f"(TrainSchedule) only; the {shape.schedule} schedule cannot run there: "
                        "use 1f1b", source=src, field="schedule")
    if shape.sequence_parallel and shape.tp == 1:
        raise SpecError("sequence parallelism needs TP > 1", source=src,
                        field="sequence_parallel")
    if job.zero is not None and shape.zero != job.zero:
        raise SpecError(f"the job fixes ZeRO stage {job.zero} (distributed optimizer "
                        f"{'on' if job.zero else 'off'})", source=src, field="zero")
    if shape.zero not in (0, 1, 2, 3):
        raise SpecError(f"ZeRO stage must be 0, 1, 2 or 3, got {shape.zero!r}", source=src,
                        field="zero")
    if shape.shard_size:
        if not isinstance(shape.shard_size, int) or shape.shard_size < 1 or \
                shape.dp % shape.shard_size:
            raise SpecError(f"shard_size {shape.shard_size!r} must divide DP={shape.dp} (HSDP: "
                            "shard inside groups of that many replicas)", source=src,
                            field="shard_size")
        if shape.zero == 0:
            raise SpecError("a shard group needs sharding (ZeRO stage 1 to 3)", source=src,
                            field="shard_size")
    if shape.shard_size and shape.zero < 3:
        raise SpecError("a shard group smaller than the data-parallel group is HSDP: ZeRO "
                        "stage 3", source=src, field="shard_size")
    if fsdp_overlaps_grads(job, shape.zero, shape.dp * shape.cp) and \
            not shape.overlap_grad_reduce:
        raise SpecError("Megatron-FSDP (ZeRO-2, optim_grads) always overlaps its gradient "
                        "reduce-scatter with the backward (megatron_fsdp.py asserts "
                        "overlap_grad_reduce): give --overlap-grad-reduce, or leave it out",
                        source=src, field="overlap_grad_reduce")
    if shape.zero >= 3 and (shape.overlap_grad_reduce or shape.overlap_param_gather):
        # the field named is the one the plan set (the grad one where both are)
        raise SpecError("ZeRO-3 prefetches and overlaps its per-layer collectives itself; the "
                        "bucket overlaps (--overlap-grad-reduce / --overlap-param-gather) are "
                        "for ZeRO-0 to 2", source=src,
                        field="overlap_grad_reduce" if shape.overlap_grad_reduce
                        else "overlap_param_gather")
    if shape.cp_alltoall and (job.framework != "torchtitan" or shape.cp <= 1):
        raise SpecError("is torchtitan's choice of K/V rotation under context parallelism "
                        "(context_parallel_rotate_method alltoall); it needs framework "
                        "torchtitan and CP > 1 (Megatron-LM's ring passes K/V step by step "
                        "already)", source=src, field="cp_alltoall")
    if job.framework == "torchtitan" and shape.zero not in (0, 3):
        raise SpecError("torchtitan shards with FSDP2 (ZeRO-3) or replicates (DDP); ZeRO-1/2 "
                        "are not among its options", source=src, field="zero")
    if job.framework == "torchtitan" and shape.zero == 0 and shape.dp > 1 and (
            shape.tp > 1 or shape.pp > 1 or shape.cp > 1):
        # torchtitan's parallelize: 'DDP has not supported > 1D parallelism' (the world mesh
        # must be data parallel alone)
        raise SpecError("torchtitan replicates with DDP only when data parallelism is the one "
                        "dimension ('DDP has not supported > 1D parallelism'); with TP, PP or CP "
                        "use FSDP (zero 3)", source=src, field="zero")
    if job.framework == "deepspeed" and shape.zero >= 2 and shape.pp > 1:
        raise SpecError("DeepSpeed's pipeline engine supports ZeRO-1 only (ZeRO-2/3 are "
                        "incompatible with pipeline parallelism)", source=src, field="zero")
    if (why := deepspeed_problem(job, shape)) is not None:
        raise SpecError(why[1], source=src, field=why[0])
    if job.fp8 is not None and shape.fp8 != job.fp8:
        raise SpecError(f"the job's precision fixes fp8={job.fp8}; choose the precision "
                        "bf16,fp8 to let the plan decide", source=src, field="fp8")
    if shape.fp8 and (problem := fp8_problem(job, cluster)):
        fld, why = problem  # the job's (a log's, a file's) own problem, named by its source
        raise SpecError(f"{why}; use bf16, or GPUs that run it" if fld == "fp8" else why,
                        source=job.source or src, field=fld)
    if shape.tp_comm_overlap and not shape.sequence_parallel:
        raise SpecError("tensor-parallel communication overlap needs sequence parallelism "
                        "(Megatron-LM --tp-comm-overlap requires it), and so TP > 1",
                        source=src, field="tp_comm_overlap")
    if shape.overlap_param_gather and not (shape.zero in (1, 2) and
                                           shape.overlap_grad_reduce):
        raise SpecError("overlapping the parameter all-gather needs the distributed optimizer "
                        "(ZeRO-1/2) and gradient-reduce overlap (Megatron-LM "
                        "--overlap-param-gather; ZeRO-3 prefetches its gathers anyway)",
                        source=src, field="overlap_param_gather")
    if model.num_layers < shape.num_virtual:
        raise SpecError(f"{model.name} has {model.num_layers} layers, fewer than the "
                        f"{shape.num_virtual} virtual stages (PP x chunks)", source=src,
                        field="pp")
    # last, so that a shape counted as too long (the search says how many) is otherwise valid
    if schedule_slots(job, shape) > MAX_SCHEDULE_SLOTS:
        raise ScheduleTooLongError(
            f"{num_microbatches(job, shape):,} micro-batches per replica over PP {shape.pp}"
            + (f" x {shape.chunks} chunks" if shape.chunks > 1 else "")
            + f" is a schedule of {schedule_slots(job, shape):,} slots, more than the "
            f"{MAX_SCHEDULE_SLOTS:,} the cost model builds; use a larger micro-batch or DP, or "
            "a smaller global batch (past a few times PP micro-batches the time grows about "
            "linearly with them)", source=src, field="micro_batch")
    if not check_layers:
        return
    if len(shape.layers) != shape.num_virtual:
        raise SpecError(f"layers has {len(shape.layers)} entries; give one per virtual stage "
                        f"(PP x chunks = {shape.num_virtual})", source=src, field="layers")
    if any(not isinstance(x, int) or x < 1 for x in shape.layers):
        raise SpecError("every virtual stage needs at least one layer", source=src,
                        field="layers")
    if shape.layers[0] < model.first_dense_layers:
        raise SpecError(f"the first virtual stage must hold the {model.first_dense_layers} "
                        f"leading dense layers of {model.name}; give it at least "
                        f"{model.first_dense_layers} layers", source=src, field="layers")
    if sum(shape.layers) != model.num_layers:
        raise SpecError(f"layers sum to {sum(shape.layers)} but {model.name} has "
                        f"{model.num_layers}", source=src, field="layers")


def validate_placement(cluster: ClusterSpec, shape: Shape, pl: Placement,
                       src: str = "plan") -> None:
    if pl.pp != shape.pp or any(len(row) != shape.cols for row in pl.node):
        raise SpecError(f"placement must list {shape.pp} stages x {shape.cols} columns "
                        "(DP x CP)", source=src, field="placement")
    used = set()
    for s in range(shape.pp):
        for r in range(shape.cols):
            n = pl.node[s][r]
            g = pl.gpus[s][r]
            at = slot_label(s, r, shape.cp)  # s<stage>/r<replica>[c<CP rank>]
            if not 0 <= n < cluster.num_nodes:
                raise SpecError(f"{at}: node index {n} out of range", source=src,
                                field="placement")
            if len(g) != shape.tp:
                raise SpecError(f"{at}: needs {shape.tp} GPUs, got {len(g)}", source=src,
                                field="placement")
            for x in g:
                if not 0 <= x < cluster.nodes[n].num_gpus or (n, x) in used:
                    raise SpecError(f"{at}: GPU {x} on {cluster.nodes[n].name} is invalid or "
                                    "used twice", source=src, field="placement")
                used.add((n, x))


# Megatron-LM's rank orders (megatron/core/parallel_state.py initialize_model_parallel; the
# derivation is in launch/ranks.py): tensor fastest, then context, data, pipeline; or, with
# --use-tp-pp-dp-mapping, pipeline before data
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"


def megatron_rank(tp: int, cols: int, stage: int, col: int, tensor_rank: int,
                  order: str = DEFAULT_ORDER, pp: int = 1, cp: int = 1) -> int:
    """Global rank of (stage, column, tensor rank), column = replica * cp + cp_rank and cols =
    dp * cp. Default order: tensor fastest, then context, then data, then pipeline; the
    tp-pp-dp order puts the pipeline before data (Megatron-LM parallel_state rank orders, see
    launch/ranks.py's docstring; `pp` and `cp` are needed only for it)."""
    if order == TP_PP_DP_ORDER:
        replica, cp_rank = divmod(col, cp)
        return replica * (tp * cp * pp) + stage * (tp * cp) + cp_rank * tp + tensor_rank
    return stage * (tp * cols) + col * tp + tensor_rank


def ordered_placement(cluster: ClusterSpec, tp: int, pp: int, dp: int, cp: int = 1,
                      order: str = DEFAULT_ORDER,
                      node_order: list[int] | None = None) -> Placement:
    """The placement a Megatron-LM rank order gives: ranks fill the nodes in `node_order`
    (cluster order by default: a hostfile listing them so), each node's GPUs in order; columns
    replica x CP + cp_rank (megatron_rank)."""
    order_n = range(cluster.num_nodes) if node_order is None else node_order
    flat = [(n, g) for n in order_n for g in range(cluster.nodes[n].num_gpus)]
    cols = dp * cp
    if tp * pp * cols != len(flat):
        raise SpecError(f"TP x PP x DP x CP = {tp * pp * cols} but the cluster has {len(flat)} "
                        "GPUs", field="tp/pp/dp")
    node, gpus = [], []
    for s in range(pp):
        nrow, grow = [], []
        for col in range(cols):
            first = megatron_rank(tp, cols, s, col, 0, order, pp, cp)
            members = flat[first:first + tp]
            if len({n for n, _ in members}) != 1:
                raise SpecError(f"TP={tp} tensor-parallel group would span nodes; TP must fit "
                                "inside one node", field="tp")
            nrow.append(members[0][0])
            grow.append(tuple(g for _, g in members))
        node.append(tuple(nrow))
        gpus.append(tuple(grow))
    return Placement(tuple(node), tuple(gpus))


def megatron_placement(cluster: ClusterSpec, tp: int, pp: int, dp: int,
                       node_order: list[int] | None = None) -> Placement:
    """Megatron-LM's default rank order (`dp` counts the columns, replicas x CP), ranks
    filling nodes in cluster order (or `node_order`)."""
    return ordered_placement(cluster, tp, pp, dp, node_order=node_order)


def block_placement(cluster: ClusterSpec, tp: int, pp: int, dp: int, stages_per_node: int,
                    node_order: list[int] | None = None,
                    slots: list[tuple[int, int]] | None = None) -> Placement:
    """Place (stage, replica) blocks of `stages_per_node` consecutive stages x k replicas on each
    node (k = GPUs per node / (tp * stages_per_node)). `slots[i]` = (node-stage, node-replica)
    of the i-th node in `node_order`; by default node-stages vary slowest, as Megatron does.
    Inside a node, tensor groups are consecutive GPUs, or the partition with the fastest rings
    where the node's links are uneven (DGX-1, PCIe servers).
    """
    G = cluster.gpus_per_node
    if G is None:
        raise SpecError("block placement needs the same GPU count on every node",
                        field="cluster")
    j = stages_per_node
    if G % (tp * j) or pp % j:
        raise SpecError(f"cannot put {j} stages of TP={tp} on {G}-GPU nodes", field="placement")
    k = G // (tp * j)
    if dp % k:
        raise SpecError(f"DP={dp} is not a multiple of {k} replicas per node", field="placement")
    ps, ds = pp // j, dp // k
    order = node_order if node_order is not None else list(range(cluster.num_nodes))
    if slots is None:
        slots = [(a, b) for a in range(ps) for b in range(ds)]
    if j == 1 and k == 1 and len(order) == ps * ds and not cluster.gpu_specific_links and \
            list(slots) == [(a, b) for a in range(ps) for b in range(ds)]:
        # one stage and one replica per node (so TP = the node's GPUs), slots in the default
        # order, no GPU link matrices (every node has the same one group): what the loop
        # below builds, in one go (the annealer decodes a permutation per move)
        first = _tp_groups(cluster, order[0], tp)[0]
        return Placement(tuple(tuple(order[s * dp:(s + 1) * dp]) for s in range(pp)),
                         tuple((first,) * dp for _ in range(pp)))
    node = [[-1] * dp for _ in range(pp)]
    gpus = [[()] * dp for _ in range(pp)]
    plain: dict[int, list] = {}  # nodes without a GPU link matrix: groups by GPU count
    for n, (a, b) in zip(order, slots):
        nd = cluster.nodes[n]
        if nd.intra_matrix_gb_per_s is None:
            groups = plain.get(nd.num_gpus)
            if groups is None:
                groups = plain[nd.num_gpus] = _tp_groups(cluster, n, tp)
        else:
            groups = _tp_groups(cluster, n, tp)
        g = 0
        for js in range(j):
            for kr in range(k):
                s, r = a * j + js, b * k + kr
                node[s][r] = n
                gpus[s][r] = groups[g]
                g += 1
    return Placement(tuple(map(tuple, node)), tuple(map(tuple, gpus)))


def _tp_groups(cluster: ClusterSpec, n: int, tp: int) -> list[tuple[int, ...]]:
    """Consecutive GPUs on uniform nodes; on nodes with a GPU-by-GPU link matrix, the partition
    whose slowest tensor-parallel ring is fastest (model.topology.best_tp_groups)."""
    node = cluster.nodes[n]
    if node.intra_matrix_gb_per_s is None:
        return [tuple(range(x, x + tp)) for x in range(0, node.num_gpus, tp)]
    return best_tp_groups(node, tp)


# DeepSpeed PipelineModule partition methods the solver chooses among for a Megatron-DeepSpeed
# GPT (deepspeed/runtime/pipe/module.py _partition_layers): GPTModelPipe's default, and the one
# that also weighs the embeddings (bigscience-workshop/Megatron-DeepSpeed --pp-partition-method,
# as BLOOM ran). 'uniform' counts norms and casts as items and 'parameters' balances parameter
# counts: neither is priced here.
DEEPSPEED_PARTITIONS = ("type:transformer", "type:transformer|embedding")


def deepspeed_split(num_layers: int, pp: int, method: str = "type:transformer",
                    tied_embeddings: bool = True) -> tuple[int, ...] | None:
    """The transformer layers per stage DeepSpeed's PipelineModule gives a Megatron-DeepSpeed
    GPT under partition_method `method` (DEEPSPEED_PARTITIONS), or None where a stage would
    hold no transformer layer.

    'type:X' weighs the items whose class name matches X 1 and the rest 0 and splits them with
    deepspeed/runtime/utils.py partition_balanced, whose tie-breaking gives the first
    items % pp stages one item more (run at deepspeedai/DeepSpeed edaa722 on GPTModelPipe's
    item lists for every 2-129 layers over 2-16 stages: always that split). Under
    'type:transformer|embedding' the items are the layers, the input EmbeddingPipe on the
    first stage and, where tied, the output EmbeddingPipe on the last (an untied output layer
    is an LMHeadPipe, which the pattern does not match; deepspeedai/Megatron-DeepSpeed
    megatron/model/gpt_model.py GPTModelPipe)."""
    lead = trail = 0
    if method == "type:transformer|embedding":
        lead, trail = 1, int(tied_embeddings)
    elif method != "type:transformer":
        raise ValueError(f"unpriced DeepSpeed partition method {method!r}")
    base, extra = divmod(num_layers + lead + trail, pp)
    per = [base + 1] * extra + [base] * (pp - extra)
    per[0] -= lead
    per[-1] -= trail
    return tuple(per) if min(per) >= 1 else None


def framework_splits(model: ModelSpec, job: JobSpec, shape: Shape
                     ) -> dict[tuple[int, ...], str] | None:
    """The layer splits the job's framework can run, each with the setting that gives it, or
    None where any split is taken as given (Megatron-LM, NeMo and torchtitan take per-stage
    counts). DeepSpeed's pipeline engine partitions by its own rule: the splits of
    DEEPSPEED_PARTITIONS (deepspeed_split), the first Megatron-DeepSpeed's default; the
    solvers search only these for it."""
    if job.framework != "deepspeed" or shape.pp <= 1:
        return None
    return deepspeed_splits(model, shape.pp)


def own_split_warnings(model: ModelSpec, job: JobSpec, shape: Shape) -> list[str]:
    """One line where the job's framework cannot run the plan's split (framework_splits):
    the estimate prices a split the run would not have."""
    own = framework_splits(model, job, shape)
    if own is None or tuple(shape.layers) in own:
        return []
    which = ", ".join(f"{'/'.join(map(str, s))} ('{m}')" for s, m in own.items())
    return [f"DeepSpeed's pipeline engine cannot run the layer split "
            f"{'/'.join(map(str, shape.layers))}: its partition methods give {which or 'none'}; "
            "this estimate prices the split given (--layers), not the one the run would have"]


def deepspeed_pipe_partitioned(model: ModelSpec, shape: Shape) -> bool:
    """Whether DeepSpeed's pipeline engine partitions the tensors it passes between stages
    over the tensor ranks (its default with TP > 1: deepspeed/runtime/config.py
    pipe_partitioned, pipe/engine.py is_pipe_partitioned), as the emitted config leaves it;
    it turns it off with sequence parallelism (PartitionedTensor assumes the tensor is the
    same on every tensor rank, not so for sequence shards) and for mixtures of experts
    (Megatron-DeepSpeed's GPTModelPipe refuses it there)."""
    return shape.tp > 1 and not shape.sequence_parallel and not model.is_moe


def deepspeed_splits(model: ModelSpec, pp: int) -> dict[tuple[int, ...], str]:
    """Each split DeepSpeed's partition methods (DEEPSPEED_PARTITIONS) give, with the first
    method that gives it."""
    out: dict[tuple[int, ...], str] = {}
    for method in DEEPSPEED_PARTITIONS:
        split = deepspeed_split(model.num_layers, pp, method, model.tied_embeddings)
        if split is not None and split not in out:
            out[split] = method
    return out


def with_layers(shape: Shape, layers: tuple[int, ...]) -> Shape:
    return replace(shape, layers=tuple(layers))


def model_refusal(model, framework: str, seq_length: int, shape) -> tuple[str, str] | None:
    """(field, why) where `framework` (a job's) cannot run the model as the shape lays it out
    at this sequence length (validate_shape refuses it; emit refuses to write it for another
    framework), else None: a sliding window torchtitan's and DeepSpeed's models lack or CP's
    p2p ring cannot take, and tied embeddings under PP in torchtitan."""
    if model.sliding_window and model.sliding_window < seq_length:
        why = None
        if framework == "torchtitan":
            # torchtitan/models/common/attention.py get_sliding_window_mask_mod serves its
            # gpt-oss model (FlexAttention) only; the Llama-family flavors it is emitted as
            # attend fully
            why = ("torchtitan slides a window only in its gpt-oss model, not in the Llama-"
                   "family models its configs name: use framework megatron or nemo")
        elif framework == "deepspeed":
            why = ("Megatron-DeepSpeed's attention takes no window: use framework megatron "
                   "or nemo")
        elif shape.cp > 1:
            # transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py:
            # a window under CP needs cp_comm_type a2a or all_gather, not Megatron-LM's
            # default p2p ring, the one modelled here
            why = ("context parallelism with a sliding window needs Transformer Engine's "
                   "all-to-all or all-gather exchange, not the p2p ring modelled here: use "
                   "CP 1")
        if why:
            return ("cp" if shape.cp > 1 and framework not in ("torchtitan", "deepspeed")
                    else "framework",
                    f"sliding-window attention ({model.sliding_window} tokens): {why}")
    if framework == "torchtitan" and shape.pp > 1 and model.tied_embeddings:
        # torchtitan/models/common/decoder.py (Aug 2026): 'Weight tying is not supported with
        # Pipeline Parallel'; v0.2's stages are deep copies, whose two weights train apart
        return ("pp", "torchtitan does not tie the input and output embeddings under "
                "pipeline parallelism ('Weight tying is not supported with Pipeline "
                "Parallel'): use PP 1, another framework, or a model with untied embeddings")
    return None


def full_attention_layers(model, layers) -> tuple[int, ...]:
    """Per virtual stage (model order: virtual stage j holds the j-th run of `layers`), how
    many of its layers attend fully in a windowed model with a full layer every N
    (ModelSpec.window_full_every; Megatron-Core's is_layer_window_attention: layer numbers
    from 1, full where N divides them); zeros otherwise."""
    n = model.window_full_every if model.sliding_window else 0
    if not n:
        return (0,) * len(layers)
    out, done = [], 0
    for x in layers:
        out.append((done + x) // n - done // n)
        done += x
    return tuple(out)
