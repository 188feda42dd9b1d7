"""The device fast paths (deepen_run/run/fast.py): which precision, AdamW kernel and attention kernel a
run picks, and that the run records them as params."""
import pytest
import torch

from conftest import cli, runs_of
from deepen_run.precision import choose_attention
from deepen_run.run.fast import adamw_kwargs, choose_precision, cpu_flags, optimizer_impl, resolve_precision

TINY = ["backbone=tiny", "task=rte", "train.batch_size=8", "data.max_train_samples=32", "data.max_eval_samples=32",
        "data.max_seq_length=32", "train.max_steps=2"]


def test_auto_is_bf16_only_where_the_hardware_runs_it_natively():
    assert choose_precision("auto", True, set()) == ("bf16", "auto: the GPU supports bf16")
    assert choose_precision("auto", False, {"sse2", "amx_bf16", "amx_tile"}) == ("bf16", "auto: CPU with amx_bf16")
    assert choose_precision("auto", False, {"avx512f", "avx512_bf16"})[0] == "bf16"
    precision, why = choose_precision("auto", False, {"avx512f", "avx2", "amx_int8"})  # no bf16 unit: fp32
    assert precision == "no" and "no amx_bf16" in why
    assert choose_precision("auto", False, set())[0] == "no"
    for value in ("no", "bf16", "fp16"):  # an explicit choice is never second-guessed
        assert choose_precision(value, True, {"amx_bf16"}) == (value, "set by train.mixed_precision")
    assert resolve_precision("no") == "no"


def test_attention_auto_is_eager_only_for_bf16_on_a_cpu():
    assert choose_attention("auto", "bf16", cuda=False) == ("eager", "auto: bf16 on a CPU")
    for precision, cuda in (("no", False), ("bf16", True), ("fp16", True), ("no", True)):
        assert choose_attention("auto", precision, cuda) == (None, "auto: transformers' default")
    for value in ("sdpa", "eager"):  # an explicit choice is kept
        assert choose_attention(value, "bf16", False) == (value, "set by train.attention")


def test_the_backbone_is_built_with_the_chosen_attention():
    from conftest import make_cfg
    from deepen_run.model import steps

    for value, want in (("eager", "eager"), ("sdpa", "sdpa")):
        backbone = steps.load(make_cfg("backbone=tiny", "backbone.duplicate_layers=[0]", f"train.attention={value}"))[0]
        assert backbone.config._attn_implementation == want  # transformers' record of what its layers call
    fp32 = steps.load(make_cfg("backbone=tiny", "train.mixed_precision=no"))[0]
    assert fp32.config._attn_implementation == "sdpa"  # auto in fp32: the default, the exact path of before


def test_cpu_flags_read_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx512_bf16 amx_tile\n\n"
                    "processor\t: 1\nflags\t\t: fpu sse2 avx512_bf16 amx_tile\n")
    assert cpu_flags(str(info)) == {"fpu", "sse2", "avx512_bf16", "amx_tile"}
    assert cpu_flags(str(tmp_path / "missing")) == set()
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(str(tmp_path / "arm")) == set()  # not an x86 flags line: fp32 stays


def test_optimizer_impl_auto_is_fused_and_each_choice_builds_adamw():
    assert optimizer_impl("auto", "cpu") == optimizer_impl("auto", "cuda") == "fused"
    assert optimizer_impl("auto", "mps") == "foreach"
    assert optimizer_impl("loop", "cpu") == "loop"
    p = torch.nn.Parameter(torch.ones(3))
    for impl, key, value in (("fused", "fused", True), ("foreach", "foreach", True), ("loop", "foreach", False)):
        opt = torch.optim.AdamW([p], **adamw_kwargs(impl))
        assert opt.defaults[key] is value


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_run_records_its_precision_and_optimizer(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/m.db"
    for extra in (["train.mixed_precision=no", "train.optimizer_impl=foreach"], []):
        r = cli(*TINY, *extra, f"tracking.uri={uri}", f"data.glue_dir={glue_dir}")
        assert r.returncode == 0, r.stderr[-3000:]
    _, (fp32, auto) = runs_of(uri)
    assert {k: fp32.data.params[k] for k in ("train/precision", "train/precision_reason", "train/optimizer_impl",
                                             "train/attention", "train/dropout_masks", "train/dropout_masks_in")} \
        == {"train/precision": "no", "train/precision_reason": "set by train.mixed_precision",
            "train/optimizer_impl": "foreach", "train/attention": "default", "train/dropout_masks": "torch",
            "train/dropout_masks_in": "-"}
    expected = resolve_precision("auto")  # this machine's answer
    assert auto.data.params["train/precision"] == expected and auto.data.params["train/optimizer_impl"] == "fused"
    assert auto.data.params["train/precision_reason"].startswith("auto: ")
    assert auto.data.params["train/attention"] == ("eager" if expected == "bf16" else "default")
    # bf16 on this CPU: every dropout, the attention's included, draws the cheaper masks
    fast = {"train/dropout_masks": "fast", "train/dropout_masks_in": "hidden,attention"}
    torchs = {"train/dropout_masks": "torch", "train/dropout_masks_in": "-"}
    assert {k: auto.data.params[k] for k in fast} == (fast if expected == "bf16" else torchs)
    # and the layers' Linears skip the padding in training (deepen_run/model/unpad.py): the tiny BERT's 2 x 6
    assert fp32.data.params["train/unpad"] == "off" and fp32.data.params["train/unpad_linears"] == "0"
    assert {k: auto.data.params[k] for k in ("train/unpad", "train/unpad_linears")} == \
        ({"train/unpad": "on", "train/unpad_linears": "12"} if expected == "bf16" else
         {"train/unpad": "off", "train/unpad_linears": "0"})
    r = cli(*TINY, "train.optimizer_impl=adam8bit", f"tracking.uri={uri}", f"data.glue_dir={glue_dir}")
    assert r.returncode == 2 and "train.optimizer_impl" in r.stderr and "fused" in r.stderr, r.stderr


def _bench_limit():
    import importlib.util
    import sys
    from pathlib import Path

    scripts = Path(__file__).resolve().parent.parent / "scripts"
    sys.path.insert(0, str(scripts))
    spec = importlib.util.spec_from_file_location("bench_limit", scripts / "bench_limit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_counts_model_flops_and_sorts_profile_ops():
    lim = _bench_limit()
    minilm = type("C", (), {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6})
    # 6 layers x (4 x 384^2 + 2 x 384 x 1536) = 10,616,832 matmul weights; x6, + 12 x 6 x 384 x 40 for attention
    assert lim.flops_per_token(minilm, 40) == 6 * 10_616_832 + 12 * 6 * 384 * 40
    groups = {op: lim.group_of(op) for op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::_fused_adamw_",
                                              "aten::_foreach_mul_", "aten::copy_", "aten::_to_copy", "aten::to",
                                              "aten::native_layer_norm_backward", "aten::_softmax",
                                              "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::gelu",
                                              "aten::add_", "aten::sum", "aten::bernoulli_", "aten::native_dropout",
                                              "aten::random_")}
    assert groups == {"aten::mm": "matmuls", "aten::addmm": "matmuls", "aten::bmm": "matmuls",
                      "aten::_fused_adamw_": "optimizer", "aten::_foreach_mul_": "optimizer", "aten::copy_": "casts",
                      "aten::_to_copy": "casts", "aten::to": "casts", "aten::native_layer_norm_backward": "norms",
                      "aten::_softmax": "attention", "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
                      "aten::gelu": "other", "aten::add_": "other", "aten::sum": "other",
                      "aten::bernoulli_": "dropout masks", "aten::native_dropout": "dropout masks",
                      "aten::random_": "dropout masks"}


def test_bench_profile_shares_and_limit_table_on_a_tiny_encoder():
    from transformers import BertConfig, BertModel

    lim = _bench_limit()
    cpu = torch.device("cpu")
    tiny = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64))
    prof = lim.profile_shares(cpu, False, 1, encoder=tiny)
    assert sum(prof["shares"].values()) == pytest.approx(1.0)
    assert prof["shares"]["matmuls"] > 0 and prof["shares"]["optimizer"] > 0 and prof["shares"]["norms"] > 0
    assert prof["calls_per_step"]["optimizer"] >= 1  # the fused kernel: one call a step, not one per tensor
    peak = lim.peak_matmul(cpu, 128, 1)
    assert peak["fp32"] > 0 and peak["bf16"] > 0
    report = {"precision": "fp32", "peak_gflops": peak, "profile": prof,
              "achieved": lim.achieved(cpu, False, peak, 1, ("minilm",), pretrained=tiny)}
    table = lim.markdown(report)
    assert "| minilm | 1,536 |" in table and "of bf16 peak" in table and "matmuls" in table


def test_the_bench_race_runs_deepen_runs_own_loop_to_a_finished_record(glue_dir, tmp_path):
    """make bench's deepen-run contender is train.fit with a checkpointer that writes nothing: it must
    keep up with what fit asks of a checkpointer (it crashed once fit read saver.extra), time every
    chunk, and end its MLflow run FINISHED."""
    import sys
    from pathlib import Path

    from conftest import make_cfg
    from deepen_run.data.glue import TASKS
    from deepen_run.data.loaders import load_task
    from deepen_run.model.backbone import load_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_contenders as bc
    from bench_race import Baton, Lap

    cfg = make_cfg("backbone=tiny", "task=rte", f"data.glue_dir={glue_dir}", f"data.cache_dir={tmp_path}/cache",
                   "train.max_steps=4", "train.batch_size=8", "data.max_train_samples=64", "data.max_eval_samples=16",
                   "data.max_seq_length=32")
    tok = load_tokenizer(cfg.backbone)
    data = load_task(TASKS["rte"], cfg.data, tok, cfg.seed)
    lap = Lap("deepen-run", Baton(["deepen-run"]), 2, torch.device("cpu"))
    out = bc.deepen_run(cfg, TASKS["rte"], tok, data.train, data.dev["rte"], None, lap, f"sqlite:///{tmp_path}/b.db")
    assert 0 <= out["dev_accuracy"] <= 1 and len(lap.times) == 2
    (run,) = runs_of(f"sqlite:///{tmp_path}/b.db", "bench")[1]
    assert run.info.status == "FINISHED"


def test_a_bad_bench_backbone_or_task_is_refused_before_the_long_sections(capsys, monkeypatch):
    """`make bench` measures for about 20 minutes before its race: a --backbone or --task it cannot
    use is one error line at once (was a Hydra traceback after those 20 minutes). bench.py's main, in
    this process (a fresh one would only add its imports)."""
    import importlib.util
    import sys
    from pathlib import Path

    scripts = Path(__file__).resolve().parent.parent / "scripts"
    monkeypatch.syspath_prepend(str(scripts))
    monkeypatch.setattr(sys, "argv", [str(scripts / "bench.py")])  # argparse names the program from it
    spec = importlib.util.spec_from_file_location("bench", scripts / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def section(*_, **__):  # a refusal that failed would go on to measure for 20 minutes in this process
        raise AssertionError("bench.py went on to its measurements")

    monkeypatch.setattr(bench.bench_startup, "measure", section)
    monkeypatch.setattr(bench, "in_worker", section)
    for args, culprit in ((["--backbone", "nosuch"], "Could not find 'backbone/nosuch'"),
                          (["--task", "stsb"], "--task stsb: use one single-dev-set classification task")):
        with pytest.raises(SystemExit) as e:
            bench.main(args)
        out, err = capsys.readouterr()
        assert e.value.code == 2 and "bench: start-up" not in out, out[-1000:] + err[-2000:]
        assert err.strip().splitlines()[-1].startswith("bench.py: error:") and culprit in err
