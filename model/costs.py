"""Per-operation times of one shape: a layer's forward and backward (compute from
model/compute.py, tensor-parallel collectives from model/communication.py, with what each
overlap hides), the embedding and output layer, pipeline transfers, gradient synchronization and
the optimizer step. All times are in milliseconds, sizes in bytes, bandwidths in GB/s.

Shared by the estimator, the MILP and the annealer: every time any of them uses comes from
here, and every one is linear in the layer counts for a fixed shape and placement (the MILP
relies on that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .cluster import ClusterSpec
from .communication import (allreduce_ms, alltoall_ms, exposed_async_ms, exposed_pipelined_ms,
                            gather_ms, hierarchical_dispatch_ms)
from .compute import ComputeModel
from .memory import cp_chunk_bytes, fp8_params_apply, gathered_weight_bytes, keeps_unsharded
from .plan import Shape, dispatch_tokens, layer_params, num_microbatches
from .specs import GPUSpec, JobSpec, ModelSpec, Options, element_bytes

# Megatron-LM's DDP buckets gradients (and, with the distributed optimizer, parameters) in
# buckets of max(40M, 1M x DP) parameters (megatron/core/distributed: the default of
# DistributedDataParallelConfig.bucket_size); with overlap, each bucket's collective starts
# when its last gradient is ready, so the last bucket's cannot hide behind the backward.
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP = 1_000_000


def hsdp_overlapped(job: JobSpec, shape: Shape) -> bool:
    """Whether Megatron-FSDP's HSDP all-reduce across replicas overlaps the last backward
    (CostModel.hsdp_overlapped)."""
    return job.framework == "megatron" and shape.zero >= 3 and shape.shard_group < shape.cols


def ties_stages(model: ModelSpec, job: JobSpec, shape: Shape) -> bool:
    """Whether the first and the last pipeline stage all-reduce a tied embedding's gradient
    (CostModel.tied_allreduce_ms): tied input and output embeddings under Megatron-LM or
    DeepSpeed with more than one stage (torchtitan's models do not tie them under PP)."""
    return (model.tied_embeddings and shape.pp > 1
            and job.framework in ("megatron", "deepspeed"))


def bucket_params(dp: int) -> float:
    return float(max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_DP * dp))


def adam_bytes_per_param(job: JobSpec) -> int:
    """Bytes an element-wise Adam step reads and writes per parameter: the gradient, fp32
    master, m and v read and written back, the 16-bit weight written. Memory-bound, so time is
    bytes / HBM bandwidth. fp16 also copies fp16 grads into an fp32 buffer (read 2, write 4)."""
    b = job.reduce_bytes + 12 + 12 + (job.weight_bytes if job.precision != "fp32" else 0)
    return b + (6 if job.precision == "fp16" else 0)


@dataclass(frozen=True)
class LayerTimes:
    """Per micro-batch, per transformer layer, on one GPU type and TP ring bandwidth (ms)."""

    fwd_ms: float
    bwd_ms: float  # includes recompute
    emb_fwd_ms: float  # embedding (first virtual stage), per micro-batch
    emb_bwd_ms: float
    head_fwd_ms: float  # final norm + output projection + loss (last virtual stage)
    head_bwd_ms: float
    tp_comm_fwd_ms: float = 0.0  # exposed tensor-parallel communication inside fwd_ms
    tp_comm_bwd_ms: float = 0.0  # ... and inside bwd_ms (without recompute)
    cp_comm_fwd_ms: float = 0.0  # exposed context-parallel K/V ring exchange inside fwd_ms
    cp_comm_bwd_ms: float = 0.0  # ... and of K/V and their gradients inside bwd_ms
    shard_fill_fwd_ms: float = 0.0  # ZeRO-3: a chunk's first gather, per micro-batch
    shard_fill_bwd_ms: float = 0.0  # ... its first gather and last reduce-scatter
    ep_comm_fwd_ms: float = 0.0  # expert parallelism: dispatch + combine all-to-all in fwd_ms
    ep_comm_bwd_ms: float = 0.0  # ... and their gradients' inside bwd_ms (without recompute)
    # what the backward's recompute reruns of each exposed communication (inside bwd_ms): all
    # of the forward's under full recompute, half the TP part under torchtitan's per-op SAC
    tp_comm_rerun_ms: float = 0.0
    cp_comm_rerun_ms: float = 0.0
    ep_comm_rerun_ms: float = 0.0
    # ZeRO-3: what of a layer's parameter gather (and, in the backward, gradient
    # reduce-scatter) outlasts the compute it prefetches behind, inside fwd_ms and bwd_ms (the
    # recompute's gather included), and the embedding's or output layer's own gather
    # (+ reduce-scatter), inside emb_* and head_*
    shard_comm_fwd_ms: float = 0.0
    shard_comm_bwd_ms: float = 0.0
    shard_edge_fwd_ms: float = 0.0
    shard_edge_bwd_ms: float = 0.0  # the embedding's
    shard_head_bwd_ms: float = 0.0  # the output layer's (no gather where it stays unsharded)

def combined_layer_steps(n: int, pf: float, df: float, mf: float, cf: float, cb: float,
                         mb: float, mw: float, db: float, pb: float, pw: float) -> float:
    """Time of n layer steps of Megatron-Core's combined forward-backward
    (CostModel._ep_overlap: the two streams, each running its work in issue order, and the
    waits between them)."""
    comp = comm = f_ready = b_ready = 0.0
    for _ in range(n):
        cb_end = comm = max(comm, b_ready) + cb
        pf_end = comp = max(comp, f_ready) + pf
        mb_end = comp = max(comp, cb_end) + mb
        df_end = comm = max(comm, pf_end) + df
        comp += mw
        db_end = comm = max(comm, mb_end) + db
        comp = max(comp, df_end) + mf
        f_ready = comm = max(comm, comp) + cf
        b_ready = comp = max(comp, db_end) + pb
        comp += pw
    return max(comp, comm)


@dataclass(frozen=True)
class TailParts:
    """A stage's data-parallel synchronization and optimizer step (ms)."""

    reduce_ms: float  # gradient all-reduce, or reduce-scatter with the distributed optimizer
    gather_ms: float  # parameter all-gather (distributed optimizer)
    exposed_ms: float  # what of the two is not hidden by the overlaps the plan asks for
    optimizer_ms: float


class CostModel:
    """Costs that depend on the shape but not on the placement (or only through the node's GPU
    type and the bandwidths given to each method)."""

    def __init__(self, model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                 options: Options):
        self.model, self.job, self.cluster, self.shape, self.options = (
            model, job, cluster, shape, options)
        # tokens per micro-batch on one GPU (1/cp of each sequence with context parallelism)
        self.tokens = shape.micro_batch * job.seq_length // shape.cp
        self.act_msg_bytes = self.tokens * model.hidden_size * job.activation_bytes
        # what one tensor rank sends of a pipeline transfer where each sends what it holds
        # (hop_ms): DeepSpeed's pipeline engine, Megatron-Core (JobSpec.p2p_scatter_gather)
        self.ds_msg_bytes = self.act_msg_bytes / (shape.tp if shape.sequence_parallel else 1)
        self.whole_p2p = job.framework == "deepspeed" or (
            job.framework == "megatron" and not job.p2p_scatter_gather)
        self._layer_cache: dict = {}
        self._compute_cache: dict = {}
        # tied input and output embeddings split over the pipeline: the first and last stage
        # each hold a copy and all-reduce its gradient once an iteration (tied_allreduce_ms)
        self.tied_grad_bytes = (model.vocab_size * model.hidden_size / shape.tp
                                * job.reduce_bytes if ties_stages(model, job, shape) else 0.0)
        # whether ZeRO-3's per-layer collectives get NCCL's hierarchical rings (one channel per
        # member of a node): not for DeepSpeed's ZeRO-3 (_shard_collectives)
        self.shard_ring_channels = job.framework != "deepspeed"
        # gradient reductions per iteration: one, or with ZeRO-2 one per micro-batch; its
        # gradients are kept sharded, so each micro-batch's are reduce-scattered before the
        # next accumulates (DeepSpeed stage_1_and_2.py: 'ZeRO stage 2 communicates during non
        # gradient accumulation boundaries as well'; Megatron-FSDP optim_grads likewise keeps
        # only its shard); ZeRO-3 reduces per layer and micro-batch (layer_times)
        self.grad_reductions = num_microbatches(job, shape) if shape.zero == 2 else 1
        # Megatron-FSDP's HSDP all-reduces each layer's shard across the replicas on a stream
        # of its own as the last micro-batch's backward reduce-scatters it (megatron_fsdp.py
        # outer_fsdp_group_grad_reduce on the last micro-batch; param_and_grad_buffer.py
        # _bucket_group_gradient_reduce, outer_fsdp_group_grad_reduce_stream): the overlap of
        # --overlap-grad-reduce, in buckets of one layer
        self.hsdp_overlapped = hsdp_overlapped(job, shape)
        # whether the end-of-iteration gradient reduction hides in the last backward
        self.sync_overlapped = shape.overlap_grad_reduce or self.hsdp_overlapped
        # parameters of one layer on one GPU: the routed experts are split over EP and expert
        # TP, the rest over TP (Megatron-LM's MoELayer: E / ep local experts)
        lp = layer_params(model, shape)
        self.layer_expert_params = lp.experts
        self.layer_params = lp.total
        self.layer_linear_params = lp.linear
        self.experts_split = lp.split
        # how many times finer than the data-parallel shard the experts' optimizer state is
        # sharded: over the expert-data-parallel group, tp x cols / (ep x etp) ranks
        self.expert_shard_factor = lp.expert_shard_factor
        # leading dense layers (all in virtual stage 0, plan.validate_shape): their cost model
        self.first_dense = model.first_dense_layers
        self._dense: CostModel | None = None
        self._full: CostModel | None = None
        # FP8 weights (--fp8-param-gather): the distributed optimizer all-gathers each linear
        # weight in FP8, 1 byte instead of the 16-bit weight's (Megatron-LM's param buffer of
        # the FP8 weights is uint8): bytes saved per linear weight of the data-parallel sync.
        # Not where the routed experts sync apart (their gather stays at 16 bits, an upper
        # bound), so that the dense sync's linear weights are the stage's. MXFP8 weights are
        # gathered in 16 bits through the gradient buffer and quantized again (Megatron-Core
        # param_and_grad_buffer.py: "For MXFP8 param: Create a shared buffer for param AG and
        # grad RS", params stored in bf16 there; _post_param_sync): no saving
        self.fp8_gather_saving = (float(job.weight_bytes - 1) if fp8_params_apply(job, shape)
                                  and not lp.split and job.fp8_recipe != "mxfp8" else 0.0)

    # -- compute -----------------------------------------------------------------------------

    def compute(self, gpu: GPUSpec) -> ComputeModel:
        hit = self._compute_cache.get(gpu.name)
        if hit is None:
            sh = self.shape
            hit = ComputeModel(self.model, self.job, gpu, tp=sh.tp, micro_batch=sh.micro_batch,
                               sequence_parallel=sh.sequence_parallel, fp8=sh.fp8, cp=sh.cp,
                               ep=sh.ep, etp=sh.expert_tp, tp_comm_overlap=sh.tp_comm_overlap)
            self._compute_cache[gpu.name] = hit
        return hit

    def layer_times(self, gpu: GPUSpec, tp_ring_gb_per_s: float,
                    shard_ring_gb_per_s: float = math.inf,
                    cp_ring_gb_per_s: float = math.inf,
                    ep_alltoall_ms: float = 0.0) -> LayerTimes:
        """Per layer and micro-batch. `shard_ring_gb_per_s`: the ring of the stage's ZeRO-3 /
        FSDP shard group (its per-layer gathers and reduce-scatters); unused otherwise.
        `cp_ring_gb_per_s`: the slowest hop of the context-parallel ring (CP > 1).
        `ep_alltoall_ms`: one all-to-all of the expert-parallel group (`ep_alltoall_ms`, on
        the group's links; EP > 1)."""
        if self.shape.zero < 3:
            shard_ring_gb_per_s = math.inf
        if self.shape.cp <= 1:
            cp_ring_gb_per_s = math.inf
        if self.shape.ep <= 1:
            ep_alltoall_ms = 0.0
        key = (gpu.name, tp_ring_gb_per_s, shard_ring_gb_per_s, cp_ring_gb_per_s,
               ep_alltoall_ms)
        hit = self._layer_cache.get(key)
        if hit is not None:
            return hit
        sh = self.shape
        cm = self.compute(gpu)
        lc = cm.layer()
        f_comm, b_comm = self._layer_tp_comm(lc, tp_ring_gb_per_s, gpu)
        cp_f, cp_b = self._cp_exchange_ms(lc, cp_ring_gb_per_s)
        # expert parallelism: dispatch and combine in the forward, their gradients' in the
        # backward, each on the critical path (Megatron-LM's token dispatchers wait for them),
        # unless the plan overlaps them with another micro-batch's compute (below)
        ep_f = ep_b = 2 * ep_alltoall_ms
        fwd = lc.fwd.total_ms + f_comm + cp_f + ep_f
        bwd = lc.bwd.total_ms + b_comm + cp_b + ep_b
        rerun = (0.0, 0.0, 0.0)  # (tp, cp, ep) communication the recompute runs again
        if sh.recompute == "full":
            bwd += fwd  # the forward runs again, collectives included
            rerun = (f_comm, cp_f, ep_f)
        elif sh.recompute == "selective" and self.job.framework == "torchtitan":
            # it reruns the tensor-parallel all-gathers: half of the forward's collectives
            # (the reduce-scatter outputs are kept)
            rerun = (f_comm / 2, 0.0, 0.0)
            bwd += self._op_sac_recompute_ms(lc) + rerun[0]
        elif sh.recompute == "selective":
            # the attention core (Korthikanti et al. Sec. 5); under context parallelism the
            # core is Transformer Engine's ring attention, so its K/V exchange runs again
            # with it (Megatron-Core attention.py _checkpointed_attention_forward reruns
            # core_attention)
            rerun = (0.0, cp_f, 0.0)
            bwd += lc.attention_fwd_ms + cp_f
        m_ = num_microbatches(self.job, sh)
        if sh.ep_comm_overlap and ep_alltoall_ms > 0 and m_ > 1:
            # Megatron-LM's combined 1F1B without pipelining (combined_1f1b_schedule_for_no_
            # pipelining): the first forward and the last backward run alone, and each of the
            # m - 1 steps between runs a forward beside the previous micro-batch's backward;
            # what a step saves is spread over the m forwards and backwards, half to each (only
            # their sum is on a one-stage critical path)
            cut = (m_ - 1) / m_ * self._ep_overlap(lc, f_comm, b_comm, cp_f, cp_b,
                                                   ep_alltoall_ms) / 2
            # from the all-to-all's share first (what else the communication stream ran and
            # the overlap hid, the unpermutation and residual add, is compute)
            fwd, bwd = fwd - cut, bwd - cut
            ep_f, ep_b = ep_f - min(cut, ep_f), ep_b - min(cut, ep_b)
        ef, eb = cm.embedding()
        hf, hb = cm.head()
        (emb_f, emb_b), (head_f, head_b) = self._edge_tp_comm(hb, tp_ring_gb_per_s)
        emb_f, emb_b = ef.total_ms + emb_f, eb.total_ms + emb_b
        head_f, head_b = hf.total_ms + head_f, hb.total_ms + head_b
        fill_f = fill_b = 0.0
        shard = (0.0, 0.0, 0.0, 0.0, 0.0)  # LayerTimes.shard_comm_*, shard_edge_*, head
        # torchtitan's FSDP2 under PP gathers once a step and keeps the weights (and the
        # gradients) unsharded across the micro-batches: nothing per micro-batch here, its
        # step's collectives are in the tail (`unsharded_step_coefs`)
        if sh.zero >= 3 and not keeps_unsharded(self.job, sh):
            ag, rs, e_ag, e_rs = self.shard_unit_collectives(shard_ring_gb_per_s)
            # prefetch: the next layer's gather runs during this layer's compute (and in the
            # backward the previous layer's reduce-scatter too); only what outlasts it shows,
            # plus the first gather (and last reduce-scatter) of every chunk: `fill`
            z_f = exposed_async_ms(ag, fwd)
            if self.job.framework == "deepspeed":
                # DeepSpeed reduces gradients beside the backward only with overlap_comm,
                # off by default (DeepSpeed config reference, zero_optimization); the emitted
                # config sets it off: each layer's reduce-scatter waits in line
                z_b = exposed_async_ms(ag, bwd) + rs
            else:
                z_b = exposed_async_ms(ag + rs, bwd)
            fwd, bwd = fwd + z_f, bwd + z_b
            fill_f, fill_b = ag, ag + rs
            # the embedding and output layer are units of their own, gathered when reached;
            # torchtitan v0.2 keeps the output layer (with the final norm) unsharded from its
            # forward to its backward (llama3/infra/parallelize.py apply_fsdp: [norm, output]
            # reshard_after_forward only under the "always" policy), so gathers it once
            head_again = 0.0 if self.job.framework == "torchtitan" and \
                not self.job.repeat_kv else e_ag
            emb_f, emb_b = emb_f + e_ag, emb_b + e_ag + e_rs
            head_f, head_b = head_f + e_ag, head_b + head_again + e_rs
            shard = (z_f, z_b, e_ag, e_ag + e_rs, head_again + e_rs)
        out = LayerTimes(fwd, bwd, emb_f, emb_b, head_f, head_b, f_comm, b_comm, cp_f, cp_b,
                         fill_f, fill_b, ep_f, ep_b, *rerun, *shard)
        self._layer_cache[key] = out
        return out

    def _ep_overlap(self, lc, f_comm: float, b_comm: float, cp_f: float, cp_b: float,
                    a2a_ms: float) -> float:
        """What Shape.ep_comm_overlap saves per MoE layer of a forward-backward pair, ms.

        Megatron-Core splits a MoE layer into pre-dispatch compute (attention, the pre-MLP
        norm, the shared experts, router and the dispatcher's preprocessing: P), the dispatch
        (D), the routed experts (M: grouped GEMMs and activation) and the combine (C: the
        transfer, the dispatcher's postprocessing and the residual add, mlp_bda), and runs one
        micro-batch's layer forward beside another's layer backward, P and M on the compute
        stream, D and C on the communication stream (models/common/model_chunk_schedule_plan
        .py TransformerLayerSchedulePlan.run, issue order; gpt/fine_grained_callables.py).
        The alltoall dispatcher permutes in its preprocessing (P) and unpermutes in the
        combine's (C: token_dispatcher.py combine_postprocess); the flex dispatchers permute
        after the transfer and unpermute before it (M: dispatch_postprocess,
        combine_preprocess). Compute P_f, M_b, M_b weight gradients, M_f, P_b, P_b weight
        gradients; communication C_b, D_f, D_b, C_f; M_b waits for C_b, D_f for P_f, M_f for
        D_f, D_b for M_b's data gradients (--delay-wgrad-compute: backward_dw neither waits nor
        records, models/common/utils.py), C_f for M_f, P_b for D_b, and the next layer's C_b
        for P_b, its P_f for C_f. `combined_layer_steps` walks that over the stage's MoE layers
        (all of them: PP 1, so the count is the model's and the time stays linear in the
        stage's layers); the saving is a layer's forward + backward less its share of the walk
        (at most what runs on the communication stream). Each transfer is one
        `ep_alltoall_ms`; the attention's exposed TP and CP communication stays with P (the
        compute stream); under selective recompute P_b reruns the attention core."""
        flex = self.job.moe_dispatcher != "alltoall"
        mlp = {"fc1", "act", "fc2"} | ({"permute", "unpermute"} if flex else set())
        comm = {"bda2"} | (set() if flex else {"unpermute"})

        def part(p, names, wgrad: bool | None = None, inside: bool = True) -> float:
            return sum(v for k, v in p.ms.items()
                       if (k.split(".")[0] in names) == inside
                       and (wgrad is None or k.endswith(".wgrad") == wgrad))
        pre = mlp | comm  # P is what neither M nor C runs
        pf = part(lc.fwd, pre, inside=False) + f_comm + cp_f
        pb = part(lc.bwd, pre, False, inside=False) + b_comm + cp_b + (
            lc.attention_fwd_ms + cp_f if self.shape.recompute == "selective" else 0.0)
        pw = part(lc.bwd, pre, True, inside=False)
        mf, mb, mw = part(lc.fwd, mlp), part(lc.bwd, mlp, False), part(lc.bwd, mlp, True)
        cf, cb = a2a_ms + part(lc.fwd, comm), a2a_ms + part(lc.bwd, comm)
        steps = (pf, a2a_ms, mf, cf, cb, mb, mw, a2a_ms, pb, pw)
        n = self.model.moe_layers
        alone = pf + mf + pb + pw + mb + mw + cf + cb + 2 * a2a_ms  # forward + backward
        return alone - combined_layer_steps(n, *steps) / n

    def stage_edges(self, stage: int) -> int:
        """How many of the embedding and the output layer pipeline stage `stage` holds (on its
        virtual stages stage, stage + pp, ...)."""
        v = self.shape.num_virtual
        return sum((j == 0) + (j == v - 1) for j in range(stage, v, self.shape.pp))

    def unsharded_step_coefs(self, gpu: GPUSpec, tp_ring_gb_per_s: float,
                             shard_ring_gb_per_s: float, cp_ring_gb_per_s: float = math.inf,
                             ep_alltoall_ms: float = 0.0,
                             fwd_window_ms: float | None = None) -> tuple[float, float, float]:
        """torchtitan's FSDP2 with pipeline parallelism (memory.keeps_unsharded): its
        collectives run once a step, not per micro-batch. The default reshard_after_forward
        policy is off when PP is on "to avoid per-microbatch all-gathers"
        (torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy), and PyTorch's
        pipeline stage runs every backward with set_reshard_after_backward(False) and
        set_requires_gradient_sync(False), then reduce-scatters the stage's gradients once
        after its last backward (torch/distributed/pipelining/stage.py
        backward_maybe_with_nosync). So a virtual stage pays, once a step: its layers'
        gathers in the first forward, each prefetched behind the layer before (what outlasts
        it shows, plus the chunk's first gather), and every reduce-scatter after its last
        backward, nothing to hide behind. As (per layer, per chunk, per embedding or output
        layer) ms, a stage's tail: per layer x its layers + per chunk x its chunks + per edge x
        the edge layers it holds. `fwd_window_ms`: the layer forward the gathers hide behind,
        the stage's slowest replica's (Evaluator.unsharded_step_ms); this GPU's by default."""
        if fwd_window_ms is None:
            fwd_window_ms = self.layer_times(gpu, tp_ring_gb_per_s, shard_ring_gb_per_s,
                                             cp_ring_gb_per_s, ep_alltoall_ms).fwd_ms
        ag, rs, e_ag, e_rs = self.shard_unit_collectives(shard_ring_gb_per_s)
        return exposed_async_ms(ag, fwd_window_ms) + rs, ag, e_ag + e_rs

    def shard_unit_collectives(self, ring_gb_per_s: float) -> tuple[float, float, float, float]:
        """ZeRO-3 / FSDP's units on one GPU: (gather, reduce-scatter) of one layer, then of the
        embedding or the output layer (a unit of its own), over the shard ring."""
        m = self.model
        return (*self._shard_collectives(m.layer_params_per_gpu(self.shape.tp), ring_gb_per_s),
                *self._shard_collectives(m.vocab_size * m.hidden_size / self.shape.tp,
                                         ring_gb_per_s))

    def _op_sac_kept(self, F: dict[str, float]) -> float:
        """What torchtitan's per-op selective checkpointing keeps of one layer's forward, of
        `F` (op name -> its milliseconds or FLOPs, compute.Pass): the attention core (the
        fused SDPA kernel its policy saves; eager attention's batched matmuls and softmax are
        not in its save list, so they run again), the q and v multiplies, w1 (every other
        matmul: its policy's mm count) and w2, half of the FP8 casts (memory.op_sac_tensors)."""
        m = self.model
        q, kv = m.q_dim, m.kv_dim
        kept = F.get("attention", 0.0) + F["qkv"] * (q + kv) / (q + 2 * kv) + F["fc2"] + (
            F["fc1"] / 2 if m.gated_mlp else F["fc1"])
        return kept + sum(v for k, v in F.items() if k.endswith(".cast") and k.split(".")[0]
                          in ("qkv", "fc1", "fc2")) / 2

    def _op_sac_recompute_ms(self, lc) -> float:
        """The compute torchtitan's per-op selective checkpointing reruns in the backward:
        every forward operation whose output it did not keep (memory.op_sac_tensors), the k, o
        and w3 multiplies, the norms, rotary and activation kernels (its tensor-parallel
        all-gathers: `layer_times`)."""
        return max(0.0, lc.fwd.total_ms - self._op_sac_kept(lc.fwd.ms))

    def op_sac_recompute_share(self, gpu) -> float:
        """The share of one layer's forward FLOPs (eq. 3's terms) that torchtitan's per-op
        selective checkpointing runs again (the k, o and w3 multiplies): what its recompute
        adds to the hardware FLOPs, as `_op_sac_recompute_ms` adds it to the time."""
        f = self.compute(gpu).layer().fwd
        return max(0.0, f.flops - self._op_sac_kept(f.op_flops)) / f.flops if f.flops else 0.0

    def cp_step_bytes(self) -> float:
        """Bytes one CP rank sends per ring step of one layer's forward: its K and V chunk
        (memory.cp_chunk_bytes)."""
        return cp_chunk_bytes(self.model, self.job, self.shape)

    def _cp_exchange_ms(self, lc, ring_gb_per_s: float) -> tuple[float, float]:
        """Exposed K/V exchange of context parallelism in one layer (forward, backward).

        Megatron-LM (Transformer Engine's p2p ring attention; Liu et al. 2023): the attention
        core runs in cp steps, one per K/V chunk; while step i computes, chunk i + 1 travels
        from the previous rank, so each of the cp - 1 transfers hides behind one step's
        compute (1/cp of the core) and only what outlasts it shows. The backward sends the
        K/V chunk and its gradient (twice the bytes) beside the backward core's steps, but for
        the first step's window (the chunk alone) and the last's (the gradients alone).

        torchtitan (PyTorch's context_parallel, torch/distributed/tensor/experimental/
        _attention.py `_templated_ring_attention` and its backward, with torchtitan's default
        rotate method "allgather": ba24697 config_manager.py, v0.2 job_config.py): the
        forward all-gathers every rank's K/V chunk in one collective, launched before step 0
        and waited for at step 1, so the whole gather, (cp - 1) chunks through the ring's
        slowest hop, hides only behind step 0. The backward gathers the K/V again the same
        way, and passes the K/V gradients, accumulated in fp32 (convert_to_f32), to the next
        rank after every step by an all-to-all: each of those hides behind the next step, and
        the last, which returns the gradients to their owner, waits in full. With its
        "alltoall" rotation (`Shape.cp_alltoall`, `_AllToAllRotater`) the forward passes each
        chunk on to the next rank while a step computes, as the ring above, and in the
        backward each step also carries the previous step's fp32 gradients (the last
        gradients waited for in full).

        torchtitan v0.1 compiled (`JobSpec.repeat_kv` marks that release, `compile` on; its
        2024-12 stack, torchtitan 9dec370 `apply_compile`: each block compiled with
        fullgraph=True): the ring loop is traced into the block's graph, where a functional
        collective's wait follows it at once (`_functional_collectives._maybe_wrap_tensor`
        under tracing) and Inductor's `reorder_for_compute_comm_overlap` is off, so no
        exchange hides: the forward waits for its (cp - 1) chunks, the backward for them again
        and for every step's gradient pass. Priced so, the published 405B CP 2/4/8 runs
        read -5/-1/-12% where overlapped they read -13/-16/-25%. Whether v0.2's stack
        overlaps them is not known here: priced overlapped, as above."""
        cp = self.shape.cp
        if cp <= 1:
            return 0.0, 0.0
        lat = self.cluster.latency_us / 1e3
        step = self.cp_step_bytes() / (ring_gb_per_s * 1e6) + lat
        f, b = lc.fwd.ms["attention"] / cp, lc.bwd.ms["attention"] / cp  # one step each
        ring_fwd = (cp - 1) * exposed_async_ms(step, f)  # a chunk beside each step
        if self.job.framework != "torchtitan":
            # backward: cp windows, each issued before a step and waited for after it; the
            # first carries the next K/V chunk, the middle cp - 2 a chunk and the K/V
            # gradients so far (in K/V's dtype), the last the gradients home (Transformer
            # Engine context_parallel.py AttnFuncWithCPAndKVP2P.backward: send_tensor[0],
            # both halves, send_tensor[1])
            return ring_fwd, (2 * exposed_async_ms(step, b)
                              + (cp - 2) * exposed_async_ms(2 * step, b))
        grad_step = element_bytes("fp32") / self.job.activation_bytes * (step - lat) + lat
        if self.job.compile and self.job.repeat_kv:  # v0.1 compiled: nothing overlaps
            return (cp - 1) * step, (cp - 1) * step + cp * grad_step
        if self.shape.cp_alltoall:
            # backward step windows: the first carries the next K/V chunk, the middle cp - 2
            # a chunk and the previous step's gradients, the last the gradients
            return ring_fwd, (exposed_async_ms(step, b) + (cp - 2) * exposed_async_ms(
                step + grad_step, b) + exposed_async_ms(grad_step, b) + grad_step)
        gather = (cp - 1) * step
        return exposed_async_ms(gather, f), (exposed_async_ms(gather, b) + (cp - 1)
                                             * exposed_async_ms(grad_step, b) + grad_step)

    @property
    def dispatch_tokens(self) -> float:
        """Tokens one GPU routes per micro-batch and layer (plan.dispatch_tokens)."""
        return dispatch_tokens(self.job, self.shape)

    def ep_alltoall_bytes(self) -> float:
        """Bytes one GPU holds for one all-to-all of expert parallelism: its tokens (1/tp of
        the micro-batch's with sequence parallelism, which EP with TP requires), each copied
        to its top-k experts, hidden-size wide in the activation precision (Megatron-LM's
        alltoall token dispatcher: permute, all-to-all over the EP group, then an all-gather
        over the expert-TP ranks, which `_layer_tp_comm` counts)."""
        m = self.model
        return (self.dispatch_tokens * m.moe_topk
                * self.job.moe_capacity_factor * m.hidden_size * self.job.activation_bytes)

    def ep_alltoall_ms(self, cluster: ClusterSpec, members: list[tuple[int, int]]) -> float:
        """One dispatch (or combine) all-to-all among `members` [(node, GPU)], an EP group of
        one TP rank: `communication.alltoall_ms` on the measured links, with the network's
        latency per peer once the group leaves a node.

        The dispatch also sends each routed copy's probability, in an all-to-all of its own
        after the tokens' (Megatron-LM token_dispatcher.py MoEAlltoAllTokenDispatcher:
        all_to_all of permuted_probs; autograd runs its mirror in the backward), in the
        router's precision (moe_utils.py: softmax in float32, then type_as(logits)): one such
        all-to-all each way beside the tokens' two, counted as half of one with each tokens'
        all-to-all, so that a layer's two each way (dispatch, combine) add up to what runs."""
        if len(members) <= 1:
            return 0.0
        if self.job.moe_dispatcher != "alltoall":
            return self._flex_dispatch_ms(cluster, members)
        inter = len({n for n, _ in members}) > 1
        lat = cluster.latency_us if inter else cluster.intra_latency_us
        tokens = self.ep_alltoall_bytes()
        probs = tokens / self.model.hidden_size  # one probability per routed copy
        return (alltoall_ms(cluster, members, tokens, lat)
                + 0.5 * alltoall_ms(cluster, members, probs, lat))

    def flex_token_bytes(self) -> float:
        """Bytes of one token in the flex dispatcher's transfers: its hidden state in the
        activation precision, its top-k expert indices and weights (4 bytes each) and an 8-byte
        source record, in 16-byte units (DeepEP internode.cu get_num_bytes_per_token: hidden +
        sizeof(SourceMeta) + topk_idx x 4 + topk_weights x 4, aligned to 16). Every transfer
        of a layer (dispatch, combine and their gradients') is counted so, at most 8k + 8
        bytes over the hidden state's (2% of a 2048-wide bf16 token at top-8)."""
        m = self.model
        raw = m.hidden_size * self.job.activation_bytes + 8 * m.moe_topk + 8
        return 16 * math.ceil(raw / 16)

    def _flex_dispatch_ms(self, cluster: ClusterSpec, members: list[tuple[int, int]]
                          ) -> float:
        """`ep_alltoall_ms` for the flex dispatcher (JobSpec.moe_dispatcher deepep /
        hybridep; expert TP 1, so its TP x EP group is the EP group): the hierarchical
        transfer of `communication.hierarchical_dispatch_ms` for the GPU's tokens (its 1/tp
        sequence shard under sequence parallelism). HybridEP all-gathers each GPU's boolean
        routing map, tokens x experts bytes, across the group at every dispatch where the
        group spans nodes (DeepEP hybrid-ep branch, executor.cu: all_gather_into_tensor);
        spread here over the layer's four transfers (dispatch and combine each way), so the
        layer's total holds while its forward carries half of the gather, its backward the
        other half (where the run has it all in the forward)."""
        m, tokens = self.model, self.dispatch_tokens
        t = hierarchical_dispatch_ms(cluster, members, tokens, self.flex_token_bytes(),
                                     m.num_experts, m.moe_topk)
        if self.job.moe_dispatcher == "hybridep" and len({n for n, _ in members}) > 1:
            # each member's map to every other: `alltoall_ms` of n maps per member, once
            t += alltoall_ms(cluster, members, tokens * m.num_experts * len(members),
                             cluster.latency_us) / 4
        return t

    def _shard_collectives(self, params: float, ring_gb_per_s: float) -> tuple[float, float]:
        """(all-gather of the weights, reduce-scatter of the gradients) of `params` parameters
        over the shard group (ZeRO-3 / FSDP, per micro-batch).

        FSDP2 and Megatron-FSDP gather a unit's parameters as one flat buffer (one collective
        per layer); DeepSpeed's ZeRO-3 partitions and gathers every parameter tensor on its
        own (deepspeed/runtime/zero/partition_parameters.py), so a layer pays the ring's
        per-step latency once per tensor (`ModelSpec.tensors_per_layer`).

        DeepSpeed's ZeRO-3 rings are taken flat, one network stream per GPU rather than
        NCCL's hierarchical k-channel rings (`shard_ring_channels`). This is a measurement,
        not a derivation: Narayanan et al. 2021 Table 2's ZeRO-3 runs of the 175B model take
        the same 66.75 s on 768 and 1,536 GPUs (per-GPU traffic is constant, compute halves),
        i.e. they are communication-bound at about one 25 GB/s HDR stream per GPU."""
        d = self.shape.shard_group
        lat = min(self.cluster.latency_us, self.cluster.intra_latency_us)
        extra = 0.0
        if self.job.framework == "deepspeed" and d > 1:
            extra = (self.model.tensors_per_layer - 1) * (d - 1) * lat / 1e3
        return (gather_ms(params * gathered_weight_bytes(self.job), d, ring_gb_per_s, lat)
                + extra, gather_ms(params * self.job.reduce_bytes, d, ring_gb_per_s, lat) + extra)

    def _tp(self, ring_gb_per_s: float) -> tuple[float, float]:
        """(all-reduce, all-gather or reduce-scatter) of one activation over the TP ring."""
        t, M = self.shape.tp, self.act_msg_bytes
        lat = self.cluster.intra_latency_us
        return (allreduce_ms(M, t, ring_gb_per_s, lat), gather_ms(M, t, ring_gb_per_s, lat))

    def _layer_tp_comm(self, lc, ring_gb_per_s: float, gpu: GPUSpec
                       ) -> tuple[float, float]:
        """Exposed tensor-parallel communication of one layer, forward and backward.

        Megatron-LM (Shoeybi et al. 2019 Fig. 3; Korthikanti et al. 2022 Sec. 4.2.2):
        - without sequence parallelism, an all-reduce after the output projection and after
          the MLP's down projection (forward, exposed); in the backward the all-reduce of the
          QKV and MLP-up input gradients runs asynchronously beside their weight gradients;
        - with sequence parallelism, an all-gather before QKV and MLP-up and a reduce-scatter
          after the two row-parallel GEMMs (forward, exposed); in the backward the row-parallel
          layers all-gather their output gradient first (exposed), and the column-parallel ones
          re-gather their input beside the data gradient and reduce-scatter the input gradient
          beside the weight gradient;
        - with TP communication overlap, each exposed all-gather / reduce-scatter is split into
          t ring steps pipelined with its GEMM (communication.exposed_pipelined_ms).
        torchtitan's Float8 TP (torchao float8_tensor_parallel.py, 2024-12:
        PrepareFloat8ModuleInput and Float8Colwise/RowwiseParallel) casts a linear layer's input
        to float8 before its all-gather, and its output gradient before the backward's
        all-gather: the four all-gathers move 1 byte per element; the reduce-scatters stay in
        bf16. Transformer Engine (Megatron-LM) does the same for a dense layer: it quantizes
        the QKV and MLP-up inputs and the row-parallel layers' output gradients on the local
        shard and all-gathers them in FP8 (module/linear.py, module/base.py
        grad_output_preprocess; model/compute.py), the block recipes an input's one copy and
        a gradient's two with their scales (model/fp8.py); a mixture of experts' token
        gathers stay 16-bit (the dispatcher's, not TE's)."""
        sh = self.shape
        t = sh.tp
        if t <= 1:
            return 0.0, 0.0
        ar, rs = self._tp(ring_gb_per_s)
        f_in, f_grad = self._gather_fractions(gpu)
        ag, ag_grad = rs * f_in, rs * f_grad
        F, B = lc.fwd.ms, lc.bwd.ms
        if not sh.sequence_parallel:
            fwd = 2 * ar
            bwd = (exposed_async_ms(ar, B["qkv.wgrad"]) + exposed_async_ms(ar, B["fc1.wgrad"]))
            return fwd, bwd

        # the MLP's collectives, in activations: a dense MLP's, a mixture of experts' shared
        # experts' (their own input and output, as a dense MLP's), and where expert TP = TP
        # each token's k routed copies gathered over the expert-TP ranks (expert TP 1: whole
        # experts, no collective of their own). Megatron-LM's alltoall dispatcher gathers
        # those after the dispatch and reduce-scatters them before the combine, blocking
        # (token_dispatcher.py: gather_from_sequence_parallel_region and
        # reduce_scatter_to_sequence_parallel_region on the expert-TP group), and autograd runs
        # their mirrors in the backward (tensor_parallel/mappings.py: an all-gather's gradient
        # is a reduce-scatter, and the other way round); Transformer Engine's grouped expert
        # linears do no communication of their own (explicit_expert_comm: tp_size 1), so
        # nothing overlaps them: `routed` activations' worth of four exposed 16-bit
        # collectives. torchtitan's are counted with its MLP's
        m = self.model
        routed = (m.moe_topk * self.job.moe_capacity_factor
                  if m.is_moe and sh.expert_tp == t else 0)
        mlp = (1 if m.moe_shared_experts else 0) if m.is_moe else 1
        if not self.job.transformer_engine:
            mlp, routed = mlp + routed, 0

        def serial(gemm, scale=1, comm=rs):
            if sh.tp_comm_overlap:
                return exposed_pipelined_ms(scale * comm, gemm, t)
            return scale * comm

        # the MLP's gathers: FP8 for a dense layer, 16-bit tokens for TE's mixture of experts;
        # the GEMMs they can hide behind: a dense MLP's, or Transformer Engine's shared
        # experts' (the routed experts' collectives are the dispatcher's, above)
        ag_mlp, ag_mlp_grad = (rs, rs) if m.is_moe and self.job.transformer_engine else (
            ag, ag_grad)
        te_shared = m.is_moe and self.job.transformer_engine and m.moe_shared_experts
        mlp_fc1, mlp_fc2 = ("shared_fc1", "shared_fc2") if te_shared else ("fc1", "fc2")
        # the attention's input gathers, in hidden widths: multi-latent attention gathers its
        # latents, not the hidden states (the down projections run on the sequence shard:
        # compute.ComputeModel._latent_projections): the column-parallel up projections gather
        # the query latent (or, without one, the hidden states) and the key/value latent, and
        # the shared rotary key is gathered on its own (multi_latent_attention.py
        # gather_from_sequence_parallel_region(k_pos_emb))
        qkv = 1.0
        if m.is_mla and self.job.framework != "torchtitan":
            qkv = (m.mla_q_lora_rank or m.hidden_size) + m.mla_kv_lora_rank + m.mla_qk_rope_dim
            qkv /= m.hidden_size
        # forward: all-gather before QKV and MLP-up, reduce-scatter after the projections
        fwd = serial(F["qkv"], qkv, ag) + serial(F["proj"]) + serial(
            F[mlp_fc1], mlp, ag_mlp) + serial(F[mlp_fc2], mlp) + 2 * routed * rs
        # backward: the row-parallel layers all-gather their output gradient
        bwd = serial(B[f"{mlp_fc2}.dgrad"], mlp, ag_mlp_grad) + serial(B["proj.dgrad"],
                                                                        comm=ag_grad)
        for lin, scale, g in (("qkv", qkv, ag), (mlp_fc1, mlp, ag_mlp)):
            bwd += exposed_async_ms(scale * g, B[f"{lin}.dgrad"]) + exposed_async_ms(
                scale * rs, B[f"{lin}.wgrad"])
        return fwd, bwd + 2 * routed * rs

    def _gather_fractions(self, gpu: GPUSpec) -> tuple[float, float]:
        """Bytes a TP all-gather of an activation, and of an output gradient, moves as a
        fraction of the 16-bit activation: with FP8 linear layers the recipe's (model/fp8.py
        `Fp8Bytes.gather_input`, `gather_grad`: 1 byte for the per-tensor recipes and
        torchtitan's Float8 TP, the block recipes' copies with their scales; `_layer_tp_comm`);
        1 where the torchtitan release leaves Float8 TP off (JobSpec.fp8_tp_gathers)."""
        if self.shape.fp8 and self.job.fp8_tp_gathers:
            fb = self.compute(gpu).fp8b  # the recipe's bytes on this GPU, as its casts take
            return (fb.gather_input / self.job.activation_bytes,
                    fb.gather_grad / self.job.activation_bytes)
        return 1.0, 1.0

    def _edge_tp_comm(self, head_bwd, ring_gb_per_s: float):
        """Tensor-parallel communication of the embedding and the output layer: the
        vocabulary-parallel embedding's output is all-reduced (reduce-scattered with sequence
        parallelism; its backward then all-gathers the gradient); the output layer all-gathers
        its input with sequence parallelism, reduces its input gradient beside its weight
        gradient, and the vocabulary-parallel cross-entropy all-reduces three per-token fp32
        vectors (max, target logit, sum of exponentials)."""
        sh = self.shape
        t = sh.tp
        if t <= 1:
            return (0.0, 0.0), (0.0, 0.0)
        ar, ag = self._tp(ring_gb_per_s)
        ce = 3 * allreduce_ms(4.0 * self.tokens, t, ring_gb_per_s,
                              self.cluster.intra_latency_us)
        wgrad = head_bwd.ms["logits.wgrad"]
        if sh.sequence_parallel:
            emb = (ag, ag)
            head = (ag + ce, exposed_async_ms(ag, wgrad))
        else:
            emb = (ar, 0.0)
            head = (ce, exposed_async_ms(ar, wgrad))
        return emb, head

    def dense_costs(self) -> CostModel:
        """The cost model of the leading dense layers (model.dense_layer_model, no EP)."""
        if self._dense is None:
            from dataclasses import replace
            self._dense = CostModel(self.model.dense_layer_model, self.job, self.cluster,
                                    replace(self.shape, ep=1, etp=0), self.options)
        return self._dense

    def full_costs(self) -> CostModel:
        """The cost model of a windowed model's full-attention layers (ModelSpec.
        window_full_every): the same model without the window."""
        if self._full is None:
            from dataclasses import replace
            self._full = CostModel(replace(self.model, sliding_window=0, window_full_every=0),
                                   self.job, self.cluster, self.shape, self.options)
        return self._full

    def full_layer_delta(self, gpu: GPUSpec, tp_ring_gb_per_s: float,
                         shard_ring_gb_per_s: float = math.inf,
                         cp_ring_gb_per_s: float = math.inf,
                         ep_alltoall_ms: float = 0.0) -> tuple[float, float]:
        """(forward, backward) ms a full-attention layer takes beyond a windowed one (0, 0
        without full layers among windowed ones): the attention core over the whole causal
        triangle instead of the window."""
        m = self.model
        if not (m.sliding_window and m.window_full_every):
            return 0.0, 0.0
        args = (gpu, tp_ring_gb_per_s, shard_ring_gb_per_s, cp_ring_gb_per_s, ep_alltoall_ms)
        lt, lf = self.layer_times(*args), self.full_costs().layer_times(*args)
        return lf.fwd_ms - lt.fwd_ms, lf.bwd_ms - lt.bwd_ms

    def virtual_stage_ms(self, gpu: GPUSpec, tp_ring_gb_per_s: float, j: int,
                         layers: int, shard_ring_gb_per_s: float = math.inf,
                         cp_ring_gb_per_s: float = math.inf,
                         ep_alltoall_ms: float = 0.0,
                         full_layers: int = 0) -> tuple[float, float]:
        """Forward and backward time of virtual stage j holding `layers` layers (virtual
        stage 0's first `first_dense` of them dense: a constant difference, so the time stays
        linear in the layer count; with a sliding window, `full_layers` of them attend fully,
        plan.full_attention_layers, each a constant more than a windowed layer)."""
        lt = self.layer_times(gpu, tp_ring_gb_per_s, shard_ring_gb_per_s, cp_ring_gb_per_s,
                              ep_alltoall_ms)
        f, b = layers * lt.fwd_ms + lt.shard_fill_fwd_ms, layers * lt.bwd_ms + \
            lt.shard_fill_bwd_ms
        if full_layers:
            df, db = self.full_layer_delta(gpu, tp_ring_gb_per_s, shard_ring_gb_per_s,
                                           cp_ring_gb_per_s, ep_alltoall_ms)
            f, b = f + full_layers * df, b + full_layers * db
        if j == 0:
            f, b = f + lt.emb_fwd_ms, b + lt.emb_bwd_ms
            if self.first_dense:
                d = self.dense_costs().layer_times(gpu, tp_ring_gb_per_s, shard_ring_gb_per_s,
                                                   cp_ring_gb_per_s)
                f += self.first_dense * (d.fwd_ms - lt.fwd_ms)
                b += self.first_dense * (d.bwd_ms - lt.bwd_ms)
        if j == self.shape.num_virtual - 1:
            f, b = f + lt.head_fwd_ms, b + lt.head_bwd_ms
        return f, b

    # -- pipeline transfers -------------------------------------------------------------------

    def hop_ms(self, link_gb_per_s: float, same_node: bool, recv_ring_gb_per_s: float) -> float:
        """One activation (or gradient) transfer between consecutive stages.

        Megatron-Core: every tensor rank sends the tensor it holds to its peer on its own
        link, the whole [s/cp, b, h] one, or with sequence parallelism its 1/t sequence shard
        (JobSpec.p2p_scatter_gather). Legacy Megatron-LM (p2p_scatter_gather), and
        torchtitan (which runs SP wherever TP, so its 1/t shard either way): each tensor rank
        sends its 1/t slice (scatter/gather optimization,
        Narayanan et al. 2021 Sec. 4.1), so the slices travel in parallel; without sequence
        parallelism the receiver all-gathers them over NVLink. DeepSpeed's pipeline engine:
        every tensor rank sends the activation it holds to its peer: the whole one, or with
        Megatron-DeepSpeed's sequence parallelism its sequence shard (the stage's output is
        [s/t, b, h] on each rank; megatron/model/language_model.py scatters the embedding's
        output). Where the engine partitions the tensor over the tensor ranks
        (plan.deepspeed_pipe_partitioned) it sends 1/t and gathers; the whole tensor is
        charged there, as validated on BLOOM.
        """
        t = self.shape.tp
        lat = self.cluster.intra_latency_us if same_node else self.cluster.latency_us
        if self.whole_p2p:
            return lat / 1e3 + self.ds_msg_bytes / (link_gb_per_s * 1e6)
        ms = lat / 1e3 + self.act_msg_bytes / t / (link_gb_per_s * 1e6)
        if t > 1 and not self.shape.sequence_parallel:
            ms += gather_ms(self.act_msg_bytes, t, recv_ring_gb_per_s,
                            self.cluster.intra_latency_us)
        return ms

    def tied_allreduce_ms(self, link_gb_per_s: float, same_node: bool) -> float:
        """The tied embedding's gradient all-reduce between the first and the last stage, each
        tensor rank with its peer over its own link (`tied_grad_bytes` each): Megatron-LM's
        finalize_model_grads runs it after the data-parallel synchronization, before the
        optimizer step (core/distributed/finalize_model_grads.py _allreduce_word_embedding_grads
        on the embedding group, the fp32 main_grad with bf16), DeepSpeed's pipeline engine
        before it (runtime/pipe/engine.py _exec_reduce_tied_grads, its bf16 optimizer's fp32
        _hp_grad); nothing overlaps it. A ring all-reduce of 2 ranks sends each rank's buffer
        once, in 2 steps (2 (n - 1) / n of it, NCCL's ring algorithm: communication.ring_ms).
        `link_gb_per_s`: the slower way of the link between the two GPUs."""
        if not self.tied_grad_bytes:
            return 0.0
        lat = self.cluster.intra_latency_us if same_node else self.cluster.latency_us
        return allreduce_ms(self.tied_grad_bytes, 2, link_gb_per_s, lat)

    def tied_matrix_ms(self) -> np.ndarray:
        """`tied_allreduce_ms` between every pair of nodes (the slower way of the pair; the
        diagonal is not a pair of nodes and reads 0)."""
        c = self.cluster
        if not self.tied_grad_bytes:
            return np.zeros((c.num_nodes, c.num_nodes))
        with np.errstate(divide="ignore"):  # the diagonal's 0 GB/s
            out = allreduce_ms(self.tied_grad_bytes, 2,
                               np.minimum(c.inter_gb_per_s, c.inter_gb_per_s.T), c.latency_us)
        np.fill_diagonal(out, 0.0)
        return out

    def node_hop_ms(self, a: int, b: int) -> float:
        """Transfer from a group on node a to a group on node b, default GPU layout."""
        c = self.cluster
        ring = c.nodes[b].ring_gb_per_s(tuple(range(self.shape.tp)))
        if a == b:
            return self.hop_ms(c.nodes[a].intra_gb_per_s, True, ring)
        return self.hop_ms(float(c.inter_gb_per_s[a, b]), False, ring)

    def hop_matrix_ms(self) -> np.ndarray:
        """`node_hop_ms(a, b)` for every pair of nodes at once (same formula, vectorized)."""
        c = self.cluster
        out = self._inter_hops_ms(c.inter_gb_per_s)
        for a in range(c.num_nodes):
            out[a, a] = self.node_hop_ms(a, a)
        return out

    def min_hop_ms(self) -> float:
        """`hop_matrix_ms().min()`, equal to it, without the node-by-node matrix: a transfer's
        time falls as its link's bandwidth rises (the same float operations on a larger
        divisor), so each receiving node's cheapest hop from another node comes from the
        fastest stream into it, and a node's own hop depends only on its kind."""
        c, t = self.cluster, self.shape.tp
        best = min(self.hop_ms(nd.intra_gb_per_s, True, nd.ring_gb_per_s(tuple(range(t))))
                   for nd in c.node_kinds)
        if c.num_nodes > 1:
            best = min(best, float(self._inter_hops_ms(c.inbound_max_gb_per_s).min()))
        return best

    def _inter_hops_ms(self, bw_gb_per_s: np.ndarray) -> np.ndarray:
        """`hop_ms(bw, False, receiver's TP ring)` elementwise, the last axis indexing the
        receiving node (one gather time per node kind)."""
        c, t = self.cluster, self.shape.tp
        per_rank = self.ds_msg_bytes if self.whole_p2p else self.act_msg_bytes / t
        with np.errstate(divide="ignore"):
            out = c.latency_us / 1e3 + per_rank / (bw_gb_per_s * 1e6)
        if t > 1 and not self.shape.sequence_parallel and not self.whole_p2p:
            gath = np.array([gather_ms(self.act_msg_bytes, t, nd.ring_gb_per_s(
                tuple(range(min(t, nd.num_gpus)))), c.intra_latency_us) for nd in c.node_kinds])
            out = out + gath[c.node_kind_index]
        return out

    # -- parameters ----------------------------------------------------------------------------

    def stage_params(self, stage: int, layers: tuple[int, ...] | None = None) -> float:
        """Parameters held by one GPU of `stage` (its TP shard)."""
        m, sh = self.model, self.shape
        layers = layers if layers is not None else sh.layers
        # in units of tp: divided by tp below (replicated weights: ModelSpec.
        # layer_params_per_gpu, whole on every rank)
        per_layer = (self.layer_params * sh.tp if self.experts_split
                     or m.tp_replicated_params_per_layer else m.params_per_layer)
        dm = m.dense_layer_model if self.first_dense else None
        n = 0.0
        for c in range(sh.chunks):
            j = c * sh.pp + stage
            n += layers[j] * per_layer
            if j == 0:
                n += m.embedding_params
                if self.first_dense:  # its leading dense layers instead of MoE ones
                    dense = (dm.layer_params_per_gpu(sh.tp) * sh.tp
                             if dm.tp_replicated_params_per_layer else dm.params_per_layer)
                    n += self.first_dense * (dense - per_layer)
            if j == sh.num_virtual - 1:
                n += m.final_norm_params
                if not m.tied_embeddings or sh.pp > 1:
                    # the output layer (a copy of the tied weight if PP > 1)
                    n += m.vocab_size * m.hidden_size
        return n / sh.tp

    def stage_expert_params(self, stage: int, layers: tuple[int, ...] | None = None) -> float:
        """Routed-expert weights among `stage_params` (0 unless EP > 1 or expert TP differs
        from TP: otherwise every parameter synchronizes over the same group, and none is told
        apart)."""
        sh = self.shape
        if not self.experts_split:
            return 0.0
        layers = layers if layers is not None else sh.layers
        n = sum(layers[c * sh.pp + stage] for c in range(sh.chunks))
        if stage == 0:
            n -= self.first_dense  # (negative with no layers: the constant part of a stage)
        return n * self.layer_expert_params

    def stage_linear_params(self, stage: int, layers: tuple[int, ...] | None = None) -> float:
        """Linear-layer weights of one GPU of `stage` (those FP8 keeps copies of)."""
        sh = self.shape
        layers = layers if layers is not None else sh.layers
        n = sum(layers[c * sh.pp + stage] for c in range(sh.chunks))
        per = self.layer_linear_params
        if stage == 0 and self.first_dense:
            return n * per + self.first_dense * (
                self.model.dense_layer_model.layer_params_per_gpu(sh.tp, linear=True) - per)
        return n * per

    # -- data parallel -------------------------------------------------------------------------

    def sync_bytes(self, params: float, linear: float = 0.0) -> tuple[float, float]:
        """(gradient bytes reduced, parameter bytes gathered) per GPU per iteration at the end
        of the iteration (ZeRO-3 reduces and gathers per layer instead, in layer_times; with
        HSDP its shards are all-reduced across the replicas here). `linear`: the linear
        weights among `params`, gathered in FP8 with FP8 weights (`fp8_gather_saving`)."""
        sh = self.shape
        if sh.zero >= 3:
            return (params / sh.shard_group * self.job.reduce_bytes if sh.shard_size else
                    0.0), 0.0
        grad = params * self.job.reduce_bytes
        gather = (params * self.job.weight_bytes - linear * self.fp8_gather_saving
                  if sh.zero >= 1 else 0.0)
        return grad, gather

    def sync_bucket(self, group: int) -> float:
        """Parameters of the last bucket the overlapped reduction waits for: Megatron-LM's
        bucket (bucket_params) or, under Megatron-FSDP's HSDP, one layer on this GPU."""
        return self.layer_params if self.hsdp_overlapped else bucket_params(group)

    def sync_group(self) -> int:
        """Ranks of the end-of-iteration synchronization: the data x context parallel group
        (CP ranks' gradients are partial sums of one replica's), or with HSDP the replicas of
        one shard."""
        sh = self.shape
        return sh.cols // sh.shard_group if sh.zero >= 3 else sh.cols

    def expert_sync_group(self) -> int:
        """Ranks that hold the same experts: Megatron-LM's expert-data-parallel group
        (tp x cols / (ep x expert TP) ranks of a stage), which synchronize the expert
        gradients."""
        sh = self.shape
        return sh.tp * sh.cols // (sh.ep * sh.expert_tp)

    def sync_parts_ms(self, params: float, dp_ring_gb_per_s: float,
                      inter_node: bool, group: int | None = None,
                      linear: float = 0.0) -> tuple[float, float]:
        """(gradient reduction, parameter all-gather) at the end of the iteration, over the
        synchronization group's ring: an all-reduce; reduce-scatter + all-gather with the
        distributed optimizer, ZeRO-1 and ZeRO-2 (Rajbhandari et al. 2020); with HSDP the
        all-reduce of each shard across the replicas. `group`: another group than the
        synchronization group (the routed experts' expert-data-parallel group)."""
        sh = self.shape
        d = self.sync_group() if group is None else group
        if d <= 1:
            return 0.0, 0.0
        lat = self.cluster.latency_us if inter_node else self.cluster.intra_latency_us
        grad, gather = self.sync_bytes(params, linear)
        if sh.zero in (1, 2):
            return (self.grad_reductions * gather_ms(grad, d, dp_ring_gb_per_s, lat),
                    gather_ms(gather, d, dp_ring_gb_per_s, lat))
        return allreduce_ms(grad, d, dp_ring_gb_per_s, lat), 0.0

    def sync_ms(self, params: float, dp_ring_gb_per_s: float, inter_node: bool) -> float:
        return sum(self.sync_parts_ms(params, dp_ring_gb_per_s, inter_node))

    def exposed_sync_ms(self, params: float, dp_ring_gb_per_s: float, inter_node: bool,
                        bwd_window_ms: float, fwd_window_ms: float, group: int | None = None,
                        linear: float = 0.0) -> tuple[float, float, float]:
        """(reduction, all-gather, exposed part of both). With --overlap-grad-reduce the
        reduction runs bucket by bucket during the last micro-batch's backward of the stage
        (`bwd_window_ms`): what shows is the larger of the last bucket's reduction and what
        outlasts the window. --overlap-param-gather does the same for the all-gather against
        the first forward (`fwd_window_ms`). `linear`: the linear weights among `params`
        (FP8 weights gather them at 1 byte); a last bucket smaller than the stage is counted at
        16 bits, an upper bound on a bucket that may hold FP8 weights."""
        sh = self.shape
        red, gat = self.sync_parts_ms(params, dp_ring_gb_per_s, inter_node, group, linear)
        last = min(params, self.sync_bucket(self.sync_group() if group is None else group))
        red_b, gat_b = self.sync_parts_ms(last, dp_ring_gb_per_s, inter_node, group,
                                          linear if last >= params else 0.0)
        # ZeRO-2 reduces each micro-batch's gradients during that micro-batch's backward: m
        # windows, one per reduction (grad_reductions)
        ex_red = (max(red_b, red - self.grad_reductions * bwd_window_ms)
                  if self.sync_overlapped else red)
        ex_gat = max(gat_b, gat - fwd_window_ms) if sh.overlap_param_gather else gat
        return red, gat, ex_red + ex_gat

    def optimizer_shard(self, params: float, expert_params: float = 0.0) -> float:
        """Parameters whose Adam step this GPU runs: all it holds, or with sharding its
        shard group's share; the routed experts among them (`expert_params`) are sharded
        over the expert-data-parallel group, `expert_shard_factor` times smaller."""
        sh = self.shape
        if not sh.zero:
            return params
        return (params + expert_params * (self.expert_shard_factor - 1)) / sh.shard_group

    def optimizer_ms(self, params: float, gpu: GPUSpec, linear_params: float = 0.0,
                     expert_params: float = 0.0) -> float:
        """Adam step over this GPU's shard: memory-bound, bytes / HBM bandwidth (+ the FP8
        weight copies' refresh)."""
        shard = self.optimizer_shard(params, expert_params)
        nbytes = shard * adam_bytes_per_param(self.job)
        if self.shape.fp8:
            nbytes += linear_params * self.fp8_recast_bytes(gpu)
        return nbytes / gpu.hbm_bytes_per_ms

    def fp8_recast_bytes(self, gpu: GPUSpec) -> float:
        """Bytes per linear weight of the FP8 copies' refresh, once an iteration: the first
        micro-batch casts each weight (Transformer Engine's is_first_microbatch caching; the
        recipe's weight cast on this GPU, model/fp8.py), counted with the optimizer step.
        FP8 weights of a per-tensor recipe (fp8_param_gather) are cast by the optimizer from
        its fp32 shard, 4 bytes read and 1 written per element of 1 / shard group of them
        (Megatron-Core fp8_utils.py _quantize_param_shard_impl), and after the gather given
        the transpose the GPU needs (post_all_gather_processing: Hopper's, read 1 + write 1);
        MXFP8 weights are gathered in 16 bits and cast whole as before."""
        if not self.shape.fp8:
            return 0.0
        fb = self.compute(gpu).fp8b
        if fp8_params_apply(self.job, self.shape) and self.job.fp8_recipe in (
                "delayed", "tensorwise"):
            return 5.0 / self.shape.shard_group + fb.gathered_transpose
        return fb.weight_cast
