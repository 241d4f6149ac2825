"""The search space: shapes (degrees, micro-batch, schedule, recompute, ...) and, per shape, the
placements the solvers search.

Placement space ("blocks"): every node hosts a block of `j` consecutive pipeline stages of `k`
data-parallel replicas, with j * k * tp = GPUs per node (Megatron's default order is the block
j = 1, k = G / tp; j = G / tp keeps whole pipeline segments inside a node). The nodes are then
assigned to the A x D block slots (A = pp / j node-stages, D = dp / k node-replicas). This is
Pipette's node-to-stage assignment, generalized to several stages or replicas per node. Inside a
node, tensor groups take consecutive GPUs, or the best rings where the node's links are uneven.
"""

from __future__ import annotations

import functools
import math
import itertools
from dataclasses import dataclass, replace
from typing import Iterator

from model.cluster import ClusterSpec
from model.costs import CostModel
from model.memory import GIB, plan_overheads
from model.errors import ScheduleTooLongError, SpecError
from model.plan import (DEFAULT_ORDER, Placement, Shape, block_placement, deepep_block_ok,
                        deepspeed_overlaps_grads, fp8_problem, fsdp_overlaps_grads,
                        gpus_without_fp8, least_zero, megatron_least_group, megatron_rank,
                        schedule_key, validate_shape)
from model.schedule import compile_schedule
from model.specs import JobSpec, ModelSpec, Options


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Block:
    """j stages x k replicas per node; A x D slots."""

    j: int
    k: int
    A: int
    D: int

    def describe(self) -> str:
        return f"{self.j} stage(s) x {self.k} replica(s) per node"


def blocks_for(cluster: ClusterSpec, shape: Shape, job: JobSpec | None = None) -> list[Block]:
    """The block layouts of `shape` on `cluster`; with `job`, those its MoE dispatcher can
    start (DeepEP: model.plan.deepep_block_ok)."""
    G = cluster.gpus_per_node
    if G is None or G % shape.tp:
        return []
    out = []
    units = G // shape.tp
    for j in divisors(units):
        k = units // j
        if shape.pp % j or shape.cols % k:
            continue
        A, D = shape.pp // j, shape.cols // k
        if A * D == cluster.num_nodes and (
                job is None or job.moe_dispatcher != "deepep" or shape.ep <= 1
                or deepep_block_ok(cluster, shape, k)):
            out.append(Block(j, k, A, D))
    return out


def block_of(cluster: ClusterSpec, shape: Shape, placement) -> Block | None:
    """The block layout `placement` is (every node hosting one j x k rectangle of stages x
    columns, each rectangle on its own node), or None: a placement outside the space the
    search and its bounds cover (Megatron-LM's own rank order can be, where the screening
    scores it)."""
    for blk in blocks_for(cluster, shape):
        owner: dict[tuple[int, int], int] = {}
        if all(owner.setdefault((st // blk.j, c // blk.k), placement.node[st][c])
               == placement.node[st][c] for st in range(shape.pp) for c in range(shape.cols)) \
                and len(set(owner.values())) == len(owner):
            return blk
    return None


@functools.lru_cache(maxsize=4096)
def block_launchable(shape: Shape, block: Block, orders: tuple[str, ...]) -> bool:
    """Whether torchrun can start a block layout under one of the rank `orders` (model.plan
    megatron_rank; launch/ranks.py): each node's ranks, stages [a j, a j + j) x columns
    [b k, b k + k) x every tensor rank, must be consecutive (a node_rank's block). Which node
    plays which slot, and which of its GPUs runs which rank, is free (node_rank,
    CUDA_VISIBLE_DEVICES), so the layout alone decides. The tp-pp-dp order only without
    expert parallelism (its expert groups assume the default order: rank_mapping)."""
    j, k, sh = block.j, block.k, shape
    for order in orders:
        if order != DEFAULT_ORDER and sh.ep > 1:
            continue
        if all(_consecutive(sorted(megatron_rank(sh.tp, sh.cols, st, c, t, order, sh.pp, sh.cp)
                                   for st in range(a * j, a * j + j)
                                   for c in range(b * k, b * k + k) for t in range(sh.tp)))
               for a in range(block.A) for b in range(block.D)):
            return True
    return False


def _consecutive(ranks: list[int]) -> bool:
    return ranks[-1] - ranks[0] == len(ranks) - 1


@functools.lru_cache(maxsize=64)
def _slots(A: int, D: int) -> tuple[tuple[int, int], ...]:
    return tuple((a, b) for a in range(A) for b in range(D))


def decode(cluster: ClusterSpec, shape: Shape, block: Block, perm) -> Placement:
    """perm[i] = node in slot i, slots ordered (node-stage a, node-replica b), b fastest."""
    return block_placement(cluster, shape.tp, shape.pp, shape.cols, block.j,
                           node_order=[int(x) for x in perm], slots=_slots(block.A, block.D))


# Context parallelism is enumerated from this sequence length on (or when the user lists CP
# degrees): below it a sequence's activations fit without it and its ring exchange only costs.
CP_MIN_SEQ = 16384


@dataclass(frozen=True)
class SearchSpace:
    """Which discrete choices the shape enumeration considers."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] = (1, 2, 4, 8)
    schedules: tuple[tuple[str, int], ...] = (("1f1b", 1), ("interleaved", 2))
    recompute: tuple[str, ...] = ("none", "selective", "full")
    distributed_optimizer: tuple[bool, ...] = (False, True)
    # ZeRO stages to consider; None: what the job's framework offers (`framework_zero`),
    # restricted by `distributed_optimizer` (False: stage 0 allowed, True: stages >= 1)
    zero: tuple[int, ...] | None = None
    # HSDP shard groups (data-parallel ranks per shard) for ZeRO-3; None: the whole group and,
    # where it is a proper divisor of DP, the replicas that fit in one node
    shard_sizes: tuple[int, ...] | None = None
    # context-parallel degrees; None: 1, and for sequences of at least CP_MIN_SEQ tokens every
    # power of two up to the GPU count that the sequence admits (validate_shape)
    cp: tuple[int, ...] | None = None
    # torchtitan's K/V rotation under CP (Shape.cp_alltoall): both by default
    cp_alltoall: tuple[bool, ...] = (False, True)
    # the interleaved schedule's micro-batch groups on Megatron-LM's stack (Shape.mb_group):
    # "smallest", the smallest it runs (PP where PP divides the micro-batches: its default),
    # the fewest activations in flight; "whole", one group of every micro-batch, whose longer
    # warm-up can shorten the wait at the chunk boundaries (Llama-3 8B, 15 micro-batches over
    # PP 4: 1889.8 ms in groups of 5, 1875.4 ms in one of 15)
    mb_groups: tuple[str, ...] = ("smallest",)
    # expert-parallel degrees (mixture-of-experts models); None: every degree that divides
    # the experts and the data x context parallel columns (1 for dense models)
    ep: tuple[int, ...] | None = None
    # expert tensor-parallel degrees (1 or TP); None: both where TP > 1
    expert_tp: tuple[int, ...] | None = None
    # overlaps, off by default as in Megatron-LM; where a value cannot apply to a shape
    # (TP overlap without TP, parameter-gather overlap without the distributed optimizer)
    # the shape takes it off
    tp_comm_overlap: tuple[bool, ...] = (False,)
    overlap_grad_reduce: tuple[bool, ...] = (False,)
    overlap_param_gather: tuple[bool, ...] = (False,)
    # Megatron-LM's expert-parallel all-to-all overlap (Shape.ep_comm_overlap); a shape that
    # cannot run it (EP 1, pipelining, expert TP > 1, full recompute) takes it off
    ep_comm_overlap: tuple[bool, ...] = (False,)
    # the rank orders of the framework the plan is for (launch.ranks.ORDERS), when it is to be
    # launched by torchrun (solve --emit): only block layouts one of them can start are placed
    # (block_launchable); None: every layout
    launch_orders: tuple[str, ...] | None = None


def enumerate_shapes(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                     space: SearchSpace = SearchSpace(),
                     too_long: list | None = None,
                     refused: dict | None = None) -> Iterator[Shape]:
    """Every shape Megatron-LM could run on this cluster (layers left empty). Shapes whose
    schedule is beyond what the cost model builds (model.plan.MAX_SCHEDULE_SLOTS) are left out
    and appended to `too_long` when it is given, so that the search can say so; `refused`,
    when given, counts the others validate_shape refuses by field: field -> [count, the first
    refusal's text].

    Sequence parallelism is on whenever TP > 1: it moves the same bytes as plain TP and stores
    less (its backward overlaps fewer bytes, which the cost model counts). FP8 is enumerated when
    the job leaves it open (precision bf16,fp8) and every GPU has FP8 tensor cores."""
    G = cluster.gpus_per_node
    total = cluster.num_gpus
    # every TP that divides each node's GPU count (where the counts differ, their common
    # divisors: only TP 1 had been tried on nodes of 8 and 4, "nothing fits" where TP 4 did)
    tps = space.tp or tuple(divisors(G or math.gcd(*(nd.num_gpus for nd in cluster.nodes))))
    if job.fp8 is None:
        fp8s = (False, True) if not gpus_without_fp8(cluster) \
            else (False,)
    else:
        fp8s = (job.fp8,)
    overlaps = list(itertools.product(space.tp_comm_overlap, space.overlap_grad_reduce,
                                      space.overlap_param_gather))
    seen: set[Shape] = set()
    cps = cp_degrees(job, cluster, space)
    for tp, cp in itertools.product(tps, cps):
        if total % (tp * cp):
            continue
        for pp in (space.pp or tuple(divisors(total // (tp * cp)))):
            if (total // (tp * cp)) % pp or pp > model.num_layers:
                continue
            dp = total // (tp * pp * cp)
            for mbs in space.micro_batch:
                if job.global_batch % (mbs * dp):
                    continue
                for (sched, v), grp in itertools.product(space.schedules, space.mb_groups):
                    if sched == "interleaved" and pp == 1:
                        continue
                    if sched != "interleaved" and pp == 1 and sched != "1f1b":
                        continue
                    shardings = _shardings(job, space, tp, pp, dp, cp, G)
                    rotations = (space.cp_alltoall if cp > 1 and job.framework == "torchtitan"
                                 else (False,))
                    for rc in space.recompute:
                        for (zero, ss), f8, ovl, (ep, etp), a2a, eo in itertools.product(
                                shardings, fp8s, overlaps, _eps(model, space, tp, dp * cp),
                                rotations, space.ep_comm_overlap):
                            sh = Shape(tp=tp, pp=pp, dp=dp, cp=cp, cp_alltoall=a2a, ep=ep,
                                       etp=etp,
                                       micro_batch=mbs,
                                       schedule=sched,
                                       chunks=v, mb_group=_search_group(job, sched, pp,
                                                                         dp, mbs, grp),
                                       layers=(), recompute=rc,
                                       sequence_parallel=tp > 1, zero=zero, shard_size=ss,
                                       fp8=f8, **_overlaps(ovl, tp, dp * cp, zero,
                                                           fsdp_overlaps_grads(job, zero,
                                                                               dp * cp),
                                                           job),
                                       ep_comm_overlap=eo and ep > 1 and pp == 1
                                       and (etp == 1 or tp == 1) and rc != "full"
                                       and job.precision in ("bf16", "fp16"))
                            if sh in seen:
                                continue
                            seen.add(sh)
                            try:
                                validate_shape(model, job, cluster, sh, check_layers=False)
                            except ScheduleTooLongError:
                                if too_long is not None:
                                    too_long.append(sh)
                                continue
                            except SpecError as e:
                                if refused is not None:
                                    refused.setdefault(e.field or "shape", [0, e.problem])
                                    refused[e.field or "shape"][0] += 1
                                continue
                            yield sh


def _search_group(job: JobSpec, sched: str, pp: int, dp: int, mbs: int,
                  kind: str = "smallest") -> int:
    """The interleaved schedule's micro-batch group the search gives a shape (SearchSpace.
    mb_groups): the framework's own (0) where it runs, else, on Megatron-LM's stack, the
    smallest group that runs (plan.megatron_least_group: a batch of micro-batches that PP does
    not divide), or with "whole" one group of every micro-batch (always valid)."""
    m = job.global_batch // (mbs * dp)
    if sched != "interleaved" or job.framework == "torchtitan":
        return 0
    n = m if kind == "whole" and m >= pp else (megatron_least_group(pp, m) or 0)
    return 0 if n == pp else n


def cp_degrees(job: JobSpec, cluster: ClusterSpec, space: SearchSpace) -> tuple[int, ...]:
    """The context-parallel degrees searched: those listed, else 1 and, for sequences of at
    least CP_MIN_SEQ tokens, every power of two up to the GPU count."""
    total = cluster.num_gpus
    return space.cp or ((1,) + tuple(2 ** i for i in range(1, 12) if 2 ** i <= total)
                        if job.seq_length >= CP_MIN_SEQ else (1,))


def check_space(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                space: SearchSpace) -> None:
    """Refuse, in one line naming the option, what the search could only ignore: expert
    parallelism for a dense model, a K/V rotation where no context parallelism is searched,
    FP8 on GPUs without FP8 tensor cores."""
    if space.ep and any(e > 1 for e in space.ep) and not model.is_moe:
        raise SpecError(f"{model.name} is dense (no experts): expert parallelism does not "
                        "apply; drop --ep", source="options", field="--ep")
    if space.cp_alltoall != SearchSpace().cp_alltoall and \
            all(c == 1 for c in cp_degrees(job, cluster, space)):
        why = (f"--cp {','.join(map(str, space.cp))}" if space.cp else
               f"sequence {job.seq_length} is below {CP_MIN_SEQ:,} tokens and no --cp above 1")
        raise SpecError(f"no context parallelism is searched ({why}), so there is no K/V "
                        "to rotate: drop --kv-rotate or add --cp", source="options",
                        field="--kv-rotate")
    problem = fp8_problem(job, cluster) if job.fp8 is not False else None
    if problem and problem[0] == "fp8" and job.fp8:
        raise SpecError(f"{problem[1]}; use bf16, or bf16,fp8 to let the plan decide where it "
                        "can", source="options", field="--precision")
    if problem and problem[0] == "fp8" and job.fp8_recipe != "delayed":
        # bf16,fp8 on GPUs without FP8: no plan runs the recipe asked for
        raise SpecError(f"{problem[1]}, so no plan here runs the {job.fp8_recipe} recipe; drop "
                        "--fp8-recipe or use FP8 GPUs", source="options", field="--fp8-recipe")
    if problem and problem[0] == "fp8_recipe":
        raise SpecError(problem[1], source="options", field="--fp8-recipe")


# the list options a user gives, the Shape field each sets, and what a value needs to be valid
_GIVEN_LISTS = (
    ("tp", "--tp", "tp", "TP must divide the attention heads and the GPUs per node, and TP x "
     "PP x CP the GPU count"),
    ("pp", "--pp", "pp", "PP must divide the GPU count over TP x CP and be at most the layers"),
    ("cp", "--cp", "cp", "CP x TP must divide the GPU count, 2 x CP (x TP) the sequence"),
    ("ep", "--ep", "ep", "EP must divide the experts and the data x context parallel ranks"),
    ("micro_batch", "--mbs", "micro_batch", "micro-batch x DP must divide the global batch"),
    ("zero", "--zero", "zero", "the framework runs ZeRO stages 0 and 3 (torchtitan) or 0 to 3 "
     "(DeepSpeed's bf16 1 to 3: without ZeRO it trains bf16 without fp32 master weights), "
     "and sharding needs data-parallel or context-parallel ranks"),
    ("shard_sizes", "--shard-size", "shard_size", "a shard group is HSDP, ZeRO-3 only (add "
     "--zero 3 where the framework's default search leaves it out), and must divide the "
     "data-parallel ranks"),
    ("schedules", "--schedule", "schedule", "a schedule needs PP > 1 (PP 1 runs 1F1B) and its "
     "V chunks of a stage at least a layer each (PP x V at most the layers)"),
)


def _given_label(attr: str, v) -> str:
    """A listed value as the user writes it (a schedule: name, or interleaved:V)."""
    if attr == "schedules":
        name, chunks = v
        return name if chunks == 1 or (name, chunks) == ("interleaved", 2) else f"{name}:{chunks}"
    return str(v)


def _lost_values(space: SearchSpace, shapes):
    """(flag, values no valid shape has, all given values, rule) per list the user gave."""
    for attr, flag, fld, rule in _GIVEN_LISTS:
        given = getattr(space, attr)
        if given is None or given == getattr(SearchSpace(), attr):
            continue
        have = {getattr(sh, fld) for sh in shapes}
        if attr == "schedules":
            have = {(sh.schedule, sh.chunks) for sh in shapes}
        if attr == "shard_sizes":  # a group of every data-parallel rank is plain ZeRO-3 (0)
            have = {sh.shard_size or (sh.dp if sh.zero == 3 else None) for sh in shapes}
            have |= {0} if any(not sh.shard_size for sh in shapes) else set()
        lost = [v for v in given if v not in have]
        if lost:
            yield flag, [_given_label(attr, v) for v in lost], given, rule


def refuse_unusable_lists(space: SearchSpace, shapes) -> None:
    """Refuse a list option none of whose values any valid shape has (`shapes`: every valid
    one), in one line naming it. The search could only have run without the option, or
    under what is left of it (torchtitan with `--zero 1` had searched the DP 1 shapes alone,
    which no ZeRO stage concerns, while saying it searched without)."""
    if not shapes:
        return  # nothing valid at all: the search's own error says why, lists included
    for flag, lost, given, rule in _lost_values(space, shapes):
        if len(lost) == len(given):
            raise SpecError(f"{flag} {','.join(map(str, lost))}: no valid plan has "
                            f"{'this value' if len(lost) == 1 else 'these values'} here "
                            f"({rule}); give a value a plan can use, or drop {flag}",
                            source="options", field=flag)


def unused_values(space: SearchSpace, shapes) -> list[str]:
    """One line per option value the user listed that no valid shape has (it could only be
    ignored, silently until now: `--tp 3,8` searched TP 8 alone); a list with no usable value
    at all is refused before the search (refuse_unusable_lists)."""
    out = []
    for flag, lost, _given, rule in _lost_values(space, shapes):
        out.append(f"{flag} {','.join(map(str, lost))}: no valid plan has "
                   f"{'this value' if len(lost) == 1 else 'these values'} here ({rule}); "
                   "searched the others")
    # an overlap asked for that no shape can use (_overlaps): said, not dropped
    for attr, flag, rule in _OVERLAPS:
        if True in getattr(space, attr) and shapes and not any(getattr(sh, attr)
                                                               for sh in shapes):
            out.append(f"{flag}: no valid plan here can use it ({rule}); searched without")
    return out


_OVERLAPS = (
    ("tp_comm_overlap", "--tp-comm-overlap", "it needs TP > 1 with sequence parallelism, and "
     "a framework that has it, not DeepSpeed"),
    ("overlap_grad_reduce", "--overlap-grad-reduce", "it needs DP > 1 and ZeRO 0 to 2; ZeRO-3 "
     "overlaps its per-layer collectives itself; DeepSpeed overlaps only in its ZeRO optimizer: "
     "ZeRO-2, or ZeRO-1 outside bf16"),
    ("overlap_param_gather", "--overlap-param-gather", "it needs DP > 1 and the distributed "
     "optimizer, ZeRO 1 or 2, and a framework that has it, not DeepSpeed"),
    ("ep_comm_overlap", "--ep-comm-overlap", "it needs EP > 1 without pipelining, whole experts "
     "(expert TP 1), no full recompute and a bf16 or fp16 model"),
)


def _eps(model: ModelSpec, space: SearchSpace, tp: int, cols: int
         ) -> list[tuple[int, int]]:
    """(EP, expert TP) pairs for one shape, expert TP 0 meaning TP (validate_shape drops
    what cannot run): every EP dividing the experts and the stage's ranks, with whole experts
    (expert TP 1) as well as TP-split ones where TP > 1."""
    if not model.is_moe:
        return [(1, 0)]
    eps = space.ep or tuple(e for e in divisors(tp * cols) if model.num_experts % e == 0)
    etps = (0, 1) if tp > 1 and space.expert_tp is None else (
        tuple(0 if x == tp else x for x in space.expert_tp or (0,)))
    return [(e, x) for e in eps for x in dict.fromkeys(etps)]


# ZeRO stages each framework runs: Megatron-LM's DDP and distributed optimizer (and
# Megatron-FSDP's optim_grads / optim_grads_params strategies), DeepSpeed's stages 0-3,
# torchtitan's DDP replicate or FSDP2 shard
FRAMEWORK_ZERO = {"megatron": (0, 1, 2, 3), "deepspeed": (0, 1, 2, 3), "torchtitan": (0, 3)}
# Megatron-LM's default search: DDP or the distributed optimizer (its FSDP is opt-in)
DEFAULT_ZERO = {"megatron": (0, 1), "deepspeed": (0, 1, 2, 3), "torchtitan": (0, 3)}


def _shardings(job: JobSpec, space: SearchSpace, tp: int, pp: int, dp: int, cp: int,
               gpus_per_node: int | None) -> list[tuple[int, int]]:
    """(ZeRO stage, HSDP shard size) pairs to enumerate for one degree combination (CP ranks
    hold the same weights, so they shard and synchronize like data-parallel ones)."""
    # DeepSpeed's bf16 runs as priced only in a ZeRO optimizer (plan.deepspeed_problem)
    lowest = least_zero(job)
    if dp * cp <= 1:  # nothing to shard over: unsharded, unless only ZeRO-2/3 was asked for
        asked = (job.zero,) if job.zero is not None else space.zero
        return [(lowest, 0)] if asked is None or min(asked) <= 1 else []
    if job.zero is not None:
        zeros = (job.zero,)
    elif space.zero is not None:
        zeros = space.zero
    else:
        zeros = tuple(z for z in DEFAULT_ZERO[job.framework]
                      if (z >= 1) in space.distributed_optimizer and z >= lowest)
    out = []
    for z in zeros:
        if z < 3:
            out.append((z, 0))
            continue
        if space.shard_sizes is not None:
            sizes = space.shard_sizes
        else:
            per_node = (gpus_per_node or 0) // (tp * cp)
            sizes = (0,) + ((per_node,) if 1 < per_node < dp and dp % per_node == 0 else ())
        out += [(3, 0 if s in (0, dp) else s) for s in sizes if s == 0 or dp % s == 0]
    return list(dict.fromkeys(out))


def _overlaps(ovl: tuple[bool, bool, bool], tp: int, dp: int, zero: int,
              forced_grads: bool = False, job: JobSpec | None = None) -> dict:
    """The overlaps asked for, as far as the shape can use them: TP overlap needs TP > 1 (with
    sequence parallelism), gradient and parameter overlap need DP > 1 and ZeRO-0 to 2 (ZeRO-3
    overlaps per layer), parameter-gather overlap the distributed optimizer and gradient-reduce
    overlap (Megatron-LM's rules). `forced_grads`: the framework overlaps the gradient
    reduction unasked (plan.fsdp_overlaps_grads). DeepSpeed (`job`'s framework) overlaps the
    gradient reduction only in its ZeRO optimizer, and has no TP or parameter-gather overlap
    (plan.deepspeed_problem)."""
    tpo, ogr, opg = ovl
    if job is not None and job.framework == "deepspeed":
        tpo = opg = False
        ogr = ogr and deepspeed_overlaps_grads(job, zero)
    ogr = (ogr or forced_grads) and dp > 1 and zero < 3
    opg = opg and dp > 1 and zero in (1, 2)
    return {"tp_comm_overlap": tpo and tp > 1, "overlap_grad_reduce": ogr or opg,
            "overlap_param_gather": opg}


def memory_split(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                 options: Options) -> tuple[tuple[int, ...], float]:
    """(split, peak GiB) of `min_max_memory_split`."""
    lay, peak, _stage = min_max_memory_split(model, job, cluster, shape, options)
    return lay, peak


def stage_memory_events(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                        options: Options, costs: CostModel | None = None) -> list[tuple]:
    """Per stage, (constant bytes, bytes per layer) of each in-flight event
    (schedule.inflight_profile), the stage's layer counts left free: an event's bytes are
    constant[e] + sum over the stage's chunks c of per_layer[e, c] x layers of chunk c. The
    MemoryModel's accounting, as min_max_memory_split and the closed-form bounds read it."""
    import numpy as np

    from model.memory import MemoryModel
    from model.fp8 import plan_fp8_bytes

    cs = compile_schedule(*schedule_key(job, shape, options.blocking_p2p))
    mm = MemoryModel(model, job, shape, cs, options, plan_fp8_bytes(job, shape, cluster),
                     cluster=cluster)
    costs = costs or CostModel(model, job, cluster, shape, options)
    p = shape.pp
    zero = (0,) * shape.num_virtual
    out = []
    for s in range(p):
        base = mm.const_static_bytes(costs.stage_params(s, zero), s)
        is_b, counts = cs.inflight_arrays(s)
        chunk0 = np.array([mm.chunk_act_bytes(c * p + s, 0) for c in range(shape.chunks)])
        # weights, grads and optimizer state grow with every layer, stored or not
        out.append((base + np.where(is_b, mm.stage_work(s), 0.0) + counts @ chunk0,
                    counts * mm.act_layer + mm.layer_static_bytes))
    return out


def _events_over_virtual_stages(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                                shape: Shape, options: Options) -> tuple[list, list]:
    """Per stage: its events as constant bytes (a vector) and bytes per layer of each
    virtual stage (an events x V matrix, zero outside the stage's chunks)."""
    import numpy as np

    p, V = shape.pp, shape.num_virtual
    ev_const, ev_coef = [], []
    for s, (const, per_layer) in enumerate(stage_memory_events(model, job, cluster, shape,
                                                               options)):
        ev_const.append(const)
        coef = np.zeros((len(const), V))
        coef[:, [c * p + s for c in range(shape.chunks)]] = per_layer
        ev_coef.append(coef)
    return ev_const, ev_coef


def events_gib(events_bytes, overheads) -> float:
    """A stage's peak (GiB) from its memory events (bytes, stage_memory_events): the largest,
    with the fragmentation allowance and the CUDA context, as the estimator's total."""
    return (float(events_bytes.max()) * (1 + overheads.fragmentation) / GIB
            + overheads.context_gib)


def min_max_memory_split(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                         options: Options) -> tuple[tuple[int, ...], float, int]:
    """The layer split that minimizes the largest stage memory, that memory (GiB) and the stage
    that reaches it.

    Every candidate peak of a stage (schedule.inflight_profile) is affine in that stage's layer
    counts, so adding layers one at a time where the resulting peak grows least is optimal
    (greedy on separable increasing costs). Tells "cannot fit with any split" from "fits with
    some split"; uses the same MemoryModel as the estimator."""
    import numpy as np

    p, V = shape.pp, shape.num_virtual
    ovh = plan_overheads(model, job, shape, options, cluster)
    ev_const, ev_coef = _events_over_virtual_stages(model, job, cluster, shape, options)

    def stage_peaks_gib(lay):
        arr = np.asarray(lay, dtype=float)
        return [events_gib(ev_const[s] + ev_coef[s] @ arr, ovh) for s in range(p)]

    if shape.chunks == 1:
        # one chunk per stage: each candidate peak is const + coef * l_s, so under a cap every
        # stage holds at most min_e floor((cap - const_e) / coef_e) layers; a cap is feasible
        # iff those add up to L. Bisect on the cap for the smallest feasible one.
        # events of all stages in one padded matrix (padding: a slope of 1 at -inf bytes,
        # never the binding one)
        width = max(len(c) for c in ev_const)
        Cm = np.full((p, width), -np.inf)
        Sm = np.ones((p, width))
        for s in range(p):
            Cm[s, :len(ev_const[s])] = ev_const[s]
            Sm[s, :len(ev_const[s])] = ev_coef[s][:, s]
        C, S = ev_const, [ev_coef[s][:, s] for s in range(p)]

        def max_layers(cap):
            return np.floor(np.min((cap - Cm) / Sm, axis=1) + 1e-9).astype(int).tolist()

        kd = model.first_dense_layers  # stage 0 holds the leading dense layers

        def ok(cap):
            ml = max_layers(cap)
            return min(ml) >= 1 and ml[0] >= kd and sum(ml) >= model.num_layers

        hi = float(max((C[s] + S[s] * model.num_layers).max() for s in range(p)))
        lo = float(max((C[s] + S[s]).max() for s in range(p)))
        if ok(lo):
            hi = lo
        while hi - lo > 1e-7 * hi:  # bytes: a relative 1e-7 is far below any GiB shown
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        ml = max_layers(hi)
        layers = list(ml)
        while sum(layers) > model.num_layers:  # trim the fullest stages first
            s = max((i for i in range(p) if i or layers[i] > kd),
                    key=lambda i: (layers[i], -i))
            layers[s] -= 1
        peaks = stage_peaks_gib(layers)
        return tuple(layers), float(max(peaks)), int(np.argmax(peaks))

    layers = [1] * V
    layers[0] = max(1, model.first_dense_layers)
    cur = [ev_const[s] + ev_coef[s] @ np.asarray(layers, dtype=float) for s in range(p)]
    for _ in range(model.num_layers - sum(layers)):
        best, best_j = None, 0
        for j in range(V):
            s = j % p
            val = float((cur[s] + ev_coef[s][:, j]).max())
            if best is None or val < best:
                best, best_j = val, j
        layers[best_j] += 1
        s = best_j % p
        cur[s] = cur[s] + ev_coef[s][:, best_j]
    peaks = stage_peaks_gib(layers)
    return tuple(layers), float(max(peaks)), int(np.argmax(peaks))


def capacity_split(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                   options: Options, caps_gib: list[float]
                   ) -> tuple[tuple[int, ...], bool, int, float]:
    """The layer split that minimizes the largest stage memory relative to its GPUs' memory
    (`caps_gib`, per pipeline stage, where GPUs of several memory sizes host the stages):
    (split, whether every stage fits, the fullest stage, its GiB). Layers go one at a time to
    the virtual stage whose stage's fill (peak / cap) grows least: each stage's peaks are
    affine in its own layer counts (stage_memory_events), so this greedy is optimal for the
    largest fill, as in min_max_memory_split."""
    import numpy as np

    p, V = shape.pp, shape.num_virtual
    ovh = plan_overheads(model, job, shape, options, cluster)
    const, coef = _events_over_virtual_stages(model, job, cluster, shape, options)

    def fill(s, cur_s):
        return events_gib(cur_s, ovh) / caps_gib[s]

    layers = [1] * V
    layers[0] = max(1, model.first_dense_layers)
    cur = [const[s] + coef[s] @ np.asarray(layers, dtype=float) for s in range(p)]
    for _ in range(model.num_layers - sum(layers)):
        best_j = min(range(V), key=lambda j: (fill(j % p, cur[j % p] + coef[j % p][:, j]), -j))
        layers[best_j] += 1
        cur[best_j % p] = cur[best_j % p] + coef[best_j % p][:, best_j]
    fills = [fill(s, cur[s]) for s in range(p)]
    worst = int(np.argmax(fills))
    return tuple(layers), max(fills) <= 1.0, worst, events_gib(cur[worst], ovh)


def with_layers(shape: Shape, layers) -> Shape:
    return replace(shape, layers=tuple(int(x) for x in layers))


