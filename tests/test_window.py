"""Sliding-window attention through the whole chain: the model spec, FlashAttention's work
with a window, the per-layer mean of windowed and full layers, the frameworks that run it
(and those refused), the Hugging Face import of the window and its layer pattern, and the
emitted Megatron-LM, NeMo and Megatron-Bridge settings."""

import dataclasses
import json

import pytest

from formats.clusters import uniform_cluster
from formats.hf_config import load_hf_config
from launch.emit import bridge_recipe, megatron_args, megatron_args_text, nemo_config
from model.compute import FLASH_BLOCK, flash_work_share
from model.costs import CostModel
from model.errors import SpecError
from model.estimator import estimate, make_plan
from model.specs import JobSpec, ModelSpec, Options

from test_launch import parse_megatron

# Mistral 7B v0.1's shape (config.json: sliding_window 4096, every layer)
MISTRAL = ModelSpec("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, gated_mlp=True,
                    position_embedding="rope", norm="rmsnorm", bias=False, dropout=False,
                    sliding_window=4096)
FULL = dataclasses.replace(MISTRAL, name="full", sliding_window=0)


@pytest.fixture(scope="module")
def c16():
    return uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 50.0)


def test_flash_work_share_counts_the_pairs_the_window_keeps():
    """Causal: the triangle and half a block a row; windowed: s W - W^2 / 2 pairs and a block
    a row, never more than causal; a window no shorter than the sequence is causal."""
    s, b = 32768, FLASH_BLOCK
    assert flash_work_share(s) == pytest.approx(0.5 * (1 + b / s))
    assert flash_work_share(s, s) == flash_work_share(s, 2 * s) == flash_work_share(s)
    w = 4096
    assert flash_work_share(s, w) == pytest.approx((s * w - w * w / 2 + s * b) / s**2)
    # exact pairs of a causal window of w keys (key > query - w), counted
    pairs = sum(min(i + 1, w) for i in range(s))
    assert pairs == s * w - w * (w - 1) // 2
    assert 0 < flash_work_share(s, w) * s * s - pairs <= s * b
    shares = [flash_work_share(s, x) for x in (128, 1024, 4096, 16384, 32767)]
    assert shares == sorted(shares) and shares[-1] <= flash_work_share(s)


def test_each_stage_prices_its_own_mix_of_windowed_and_full_layers(c16):
    """A windowed layer's attention does the window's work, a full layer's the causal
    triangle's; each virtual stage holds the full layers its place in the model gives it
    (Megatron-Core's is_layer_window_attention: layer numbers from 1, full where N divides
    them), so two stages of as many layers differ by their full layers' extra attention.
    Short sequences (window >= s) cost what full attention costs."""
    from model.estimator import Evaluator
    from model.plan import full_attention_layers
    job = JobSpec(global_batch=16, seq_length=32768)
    half = dataclasses.replace(MISTRAL, name="half", window_full_every=3)
    assert half.windowed_layers == 22
    plan = make_plan(FULL, job, c16, tp=8, pp=1, sequence_parallel=True)
    ms = {}
    for m in (MISTRAL, FULL):
        f = CostModel(m, job, c16, plan.shape, Options()).compute(c16.nodes[0].gpu).layer().fwd
        ms[m.name] = (f.ms["attention"], f.total_ms - f.ms["attention"])
    win, full = ms["mistral-7b"], ms["full"]
    assert win[0] < 0.3 * full[0] and win[1] == pytest.approx(full[1])
    assert full_attention_layers(half, (4, 4, 4, 20)) == (1, 1, 2, 6)
    assert full_attention_layers(MISTRAL, (16, 16)) == (0, 0)
    pp4 = make_plan(half, job, c16, tp=4, pp=4, sequence_parallel=True, layers=(9, 7, 8, 8))
    ev = Evaluator(half, job, c16, pp4.shape, Options())
    assert ev.full_layers == (3, 2, 3, 2)
    # said per stage: in estimate's JSON and its table
    from formats.views import estimate_to_dict
    e4 = estimate(half, job, c16, pp4)
    assert [st["full_attention_layers"] for st in estimate_to_dict(e4)["stages"]] == [3, 2, 3, 2]
    d = ev.replica_durations(pp4.placement, 0, [0.0] * 4)
    k = ev.kinds
    cm = ev.costs
    gpu, ring = c16.nodes[0].gpu, c16.nodes[0].ring_gb_per_s((0, 1, 2, 3))
    lt, lf = cm.layer_times(gpu, ring), cm.full_costs().layer_times(gpu, ring)
    # stages 1 and 2 hold no embedding or output layer: their own layers exactly
    assert d[k.F(1)] == pytest.approx(2 * lf.fwd_ms + 5 * lt.fwd_ms, rel=1e-12)
    assert d[k.B(2)] == pytest.approx(3 * lf.bwd_ms + 5 * lt.bwd_ms, rel=1e-12)
    est = {m.name: estimate(m, job, c16, plan) for m in (MISTRAL, half, FULL)}
    assert est["mistral-7b"].iteration_ms < est["half"].iteration_ms < est["full"].iteration_ms
    # the causal MFU counts only the pairs the window keeps; eq. (3)'s MFU counts them all
    e = est["mistral-7b"]
    assert e.windowed and e.mfu > est["full"].mfu and e.mfu_causal < e.mfu
    short = JobSpec(global_batch=16, seq_length=4096)
    p2 = make_plan(FULL, short, c16, tp=8, pp=1, sequence_parallel=True)
    a, b = estimate(half, short, c16, p2), estimate(FULL, short, c16, p2)
    assert a.iteration_ms == b.iteration_ms and not a.windowed


def _window_instances():
    from test_solvers import TINY, tiny_cluster
    from model.plan import Shape
    from solvers.problem import PlacementProblem
    from solvers.space import blocks_for
    model = dataclasses.replace(TINY, name="tiny-swa", sliding_window=256, window_full_every=3)
    out = []
    for nodes, tp, pp, sched, v in [(4, 2, 2, "1f1b", 1), (4, 1, 4, "1f1b", 1),
                                    (4, 2, 2, "interleaved", 2), (6, 2, 3, "1f1b", 1)]:
        c = tiny_cluster(nodes, 0)
        dp = c.num_gpus // (tp * pp)
        sh = Shape(tp=tp, pp=pp, dp=dp, micro_batch=1, schedule=sched, chunks=v,
                   recompute="none", sequence_parallel=tp > 1)
        job = JobSpec(global_batch=4 * pp * dp, seq_length=2048)
        out += [PlacementProblem(model, job, c, sh, blk, Options()) for blk in blocks_for(c, sh)]
    return out


@pytest.mark.parametrize("prob", _window_instances(),
                         ids=lambda p: f"{p.shape.describe()}-j{p.block.j}D{p.block.D}")
def test_milp_with_full_layers_among_windowed_equals_brute_force(prob):
    """Where the split puts the full-attention layers is in the MILP (q[j] = floor(layers up
    to j / N)): its optimum is brute force's, re-evaluates to the estimator's, and its
    relaxations stay below."""
    from solvers.milp import solve_milp
    from test_solvers import brute
    opt = brute(prob)
    milp = solve_milp(prob, time_limit_s=60, mip_rel_gap=1e-9)
    assert milp.termination == "optimal"
    assert milp.objective_ms == pytest.approx(opt.objective_ms, rel=1e-7)
    assert estimate(prob.model, prob.job, prob.cluster, milp.plan).iteration_ms == \
        pytest.approx(milp.objective_ms, rel=1e-6)
    rel = solve_milp(prob, relax_placement=True, mip_rel_gap=1e-9).bound_ms
    assert rel <= opt.objective_ms * (1 + 1e-9)
    frac = solve_milp(prob, relax_placement=True, integral_layers=False).bound_ms
    assert frac <= rel * (1 + 1e-7)


@pytest.mark.parametrize("fw, kw, field, says", [
    ("torchtitan", dict(zero=3), "framework", "gpt-oss model"),
    ("deepspeed", dict(zero=1), "framework", "takes no window"),
    ("megatron", dict(cp=2), "cp", "all-to-all or all-gather")])
def test_frameworks_without_the_window_are_refused(c16, fw, kw, field, says):
    job = JobSpec(global_batch=16, seq_length=8192, framework=fw)
    with pytest.raises(SpecError, match=says) as e:
        estimate(MISTRAL, job, c16, make_plan(MISTRAL, job, c16, tp=2, pp=1, **kw))
    assert e.value.field == field
    # a window no shorter than the sequence is full causal attention: taken
    short = dataclasses.replace(job, seq_length=4096)
    assert estimate(MISTRAL, short, c16, make_plan(MISTRAL, short, c16, tp=2, pp=1, **kw))


def test_model_spec_checks_the_window_fields():
    with pytest.raises(SpecError, match="needs a sliding_window"):
        dataclasses.replace(FULL, window_full_every=4)
    with pytest.raises(SpecError, match="every layer attend fully"):
        dataclasses.replace(MISTRAL, window_full_every=1)
    with pytest.raises(SpecError) as e:
        dataclasses.replace(MISTRAL, sliding_window=-5)
    assert e.value.field == "sliding_window"
    assert dataclasses.replace(MISTRAL, window_full_every=6, num_layers=62).windowed_layers == 52


def _cfg(tmp_path, **kw):
    cfg = {"model_type": "mistral", "num_hidden_layers": 12, "hidden_size": 1024,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 4096,
           "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
           **kw}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_hugging_face_windows_and_layer_patterns(tmp_path):
    """Mistral: every layer slides; transformers v5's layer_types with a full layer every N
    (Gemma 3's 5 to 1, gpt-oss's alternation) give window_full_every N; a pattern neither
    (the upper layers only) stays full attention, said; layer types that are not these two
    are refused with the field named."""
    m = load_hf_config(_cfg(tmp_path))
    assert (m.sliding_window, m.window_full_every, m.unmodelled) == (4096, 0, ())
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(12)]
    m = load_hf_config(_cfg(tmp_path, layer_types=types))
    assert (m.sliding_window, m.window_full_every, m.windowed_layers) == (4096, 6, 10)
    upper = ["full_attention"] * 6 + ["sliding_attention"] * 6
    m = load_hf_config(_cfg(tmp_path, layer_types=upper))
    assert m.sliding_window == 0 and m.unmodelled[0].startswith("sliding_window 4096")
    m = load_hf_config(_cfg(tmp_path, layer_types=["full_attention"] * 12))
    assert (m.sliding_window, m.unmodelled) == (0, ())
    with pytest.raises(SpecError) as e:
        load_hf_config(_cfg(tmp_path, layer_types=["chunked_attention"] * 12))
    assert e.value.field == "layer_types"
    with pytest.raises(SpecError) as e:
        load_hf_config(_cfg(tmp_path, layer_types=types[:5]))
    assert e.value.field == "layer_types"
    # Qwen slides from max_window_layers on, transformers' default 28 where the file has none
    qwen = dict(model_type="qwen2", use_sliding_window=True, num_hidden_layers=28)
    m = load_hf_config(_cfg(tmp_path, **qwen))
    assert (m.sliding_window, m.unmodelled) == (0, ())
    m = load_hf_config(_cfg(tmp_path, **dict(qwen, num_hidden_layers=40)))
    assert m.sliding_window == 0 and m.unmodelled[0].startswith("sliding_window 4096")
    assert load_hf_config(_cfg(tmp_path, **qwen, max_window_layers=0)).sliding_window == 4096
    # a window of 0 is none, and says nothing
    m = load_hf_config(_cfg(tmp_path, sliding_window=0))
    assert (m.sliding_window, m.unmodelled) == (0, ())


def test_emitted_window_in_megatron_nemo_and_bridge(c16):
    """Megatron-LM's --window-size counts the keys before the query's own (W - 1, 0: its
    mask keeps keys >= query - left), and --window-attn-skip-freq N makes layers N, 2N, ...
    full; both need Megatron-Core 0.15, which the header says. NeMo's model config and
    Megatron-Bridge's provider carry the same TransformerConfig fields."""
    job = JobSpec(global_batch=16, seq_length=8192)
    gem = dataclasses.replace(MISTRAL, window_full_every=6)
    plan = make_plan(gem, job, c16, tp=2, pp=2, sequence_parallel=True)
    args, _warn = megatron_args(gem, job, plan)
    a = parse_megatron(args)
    assert a.window_size == (4095, 0) and a.window_attn_skip_freq == 6
    head = megatron_args_text(args, plan)
    assert "--window-size 0.15.0" in head and "--window-attn-skip-freq 0.15.0" in head
    assert parse_megatron(megatron_args(FULL, job, plan)[0]).window_size is None
    nemo = nemo_config(gem, job, c16, plan)[0]["model"]
    assert nemo["window_size"] == [4095, 0] and nemo["window_attn_skip_freq"] == 6
    model = bridge_recipe(gem, job, c16, plan)[0]["model"]
    assert model["window_size"] == [4095, 0] and model["window_attn_skip_freq"] == 6
    every = bridge_recipe(MISTRAL, job, c16, plan)[0]["model"]
    assert every["window_size"] == [4095, 0] and "window_attn_skip_freq" not in every


def test_window_read_back_from_megatron_arguments_and_plan_files(tmp_path, c16):
    """A Megatron-LM arguments block that ran a window reads back as the model's window
    (left + 1 keys; an int or list skip pattern), a window it did not plan is a mismatch, a
    pattern other than a full layer every N is refused naming the argument; plan files keep
    the window."""
    from formats.logs import megatron_arg_blocks
    from formats.megatron_args import _model, PrintedArgs, megatron_args_mismatch
    from formats.planfile import load_plan, save_plan
    from test_calibration import LOGS, _set_arg

    text = (LOGS / "megatron_args_70b.txt").read_text()
    printed = megatron_arg_blocks(_set_arg(_set_arg(text, "window_size", "(4095, 0)"),
                                           "window_attn_skip_freq", 4))[0]
    m = _model(PrintedArgs(printed, "t"), 32000, "t")
    assert (m.sliding_window, m.window_full_every, m.windowed_layers) == (4096, 4, 60)
    listed = dict(printed, window_attn_skip_freq=str([1, 1, 1, 0] * 20))
    assert _model(PrintedArgs(listed, "t"), 32000, "t").window_full_every == 4
    # every layer windowed (a list of 1s, or no skip frequency), none (all 0s, N = 1), and
    # Transformer Engine's -1: no limit, full causal attention
    for freq, want in (([1] * 80, (4096, 0)), ([0] * 80, (0, 0)), (1, (0, 0)),
                       ("None", (4096, 0))):
        got = _model(PrintedArgs(dict(printed, window_attn_skip_freq=str(freq)), "t"),
                     32000, "t")
        assert (got.sliding_window, got.window_full_every) == want, freq
    got = _model(PrintedArgs(dict(printed, window_size="(-1, 0)"), "t"), 32000, "t")
    assert got.sliding_window == 0
    for bad, field in ((dict(printed, window_attn_skip_freq=str([0] * 40 + [1] * 40)),
                        "window_attn_skip_freq"), (dict(printed, window_size="(4095, 7)"),
                                                   "window_size")):
        with pytest.raises(SpecError) as e:
            _model(PrintedArgs(bad, "t"), 32000, "t")
        assert e.value.field == field
    job = JobSpec(global_batch=16, seq_length=8192)
    plain = dataclasses.replace(m, sliding_window=0, window_full_every=0)
    plan = make_plan(plain, job, c16, tp=8, pp=2, sequence_parallel=True)
    assert not [x for x in megatron_args_mismatch(m, job, plan, printed) if "window" in x[0]]
    diff = [x for x in megatron_args_mismatch(plain, job, plan, printed) if "window" in x[0]]
    assert diff == [("window_size, window_attn_skip_freq", "(4095, 0), 4", "None, None")]
    gem = dataclasses.replace(MISTRAL, window_full_every=6)
    p = tmp_path / "plan.json"
    gplan = make_plan(gem, job, c16, tp=8, pp=1, sequence_parallel=True)
    save_plan(p, gem, job, c16, gplan, estimate(gem, job, c16, gplan))
    back = load_plan(p)[0]
    assert (back.sliding_window, back.window_full_every) == (4096, 6)


def test_emit_refuses_what_the_target_framework_cannot_run(tmp_path, c16):
    """A plan priced for Megatron-LM emitted for a framework that lacks what it needs is
    refused, naming the reason, as estimate refuses it there: a window for DeepSpeed and
    torchtitan, tied embeddings under PP for torchtitan."""
    from formats import presets
    from launch.emit import launch_set
    job = JobSpec(global_batch=16, seq_length=8192)
    plan = make_plan(MISTRAL, job, c16, tp=2, pp=2, sequence_parallel=True)
    for fw, says in (("deepspeed", "takes no window"), ("torchtitan", "gpt-oss model")):
        with pytest.raises(SpecError, match=says) as e:
            launch_set(fw, MISTRAL, job, c16, plan)
        assert e.value.field == "--framework" and fw in str(e.value)
    assert launch_set("nemo", MISTRAL, job, c16, plan)
    gpt = presets.model("gpt-7.5b")
    gjob = JobSpec(global_batch=64, seq_length=2048)
    gplan = make_plan(gpt, gjob, c16, tp=2, pp=2, sequence_parallel=True)
    with pytest.raises(SpecError, match="Weight tying"):
        launch_set("torchtitan", gpt, gjob, c16, gplan)
    assert launch_set("deepspeed", gpt, gjob, c16, gplan)


def test_mistral_preset_slides_every_layer():
    """The mistral-7b preset (Jiang et al. 2023 Table 1: window 4096 in every layer, 7.24B
    parameters as its config.json's checkpoint holds) carries its window."""
    from formats import presets
    m = presets.model("mistral-7b")
    assert (m.sliding_window, m.window_full_every, m.windowed_layers) == (4096, 0, 32)
    assert m.total_params / 1e9 == pytest.approx(7.2417, abs=1e-3)
    assert dataclasses.replace(MISTRAL, name=m.name, seq_length=8192, rope_base=1e4) == \
        dataclasses.replace(m, source="")
