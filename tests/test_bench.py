"""`make bench` (scripts/bench.py and its parts in scripts/benchkit/): the CPU line that heads its
output, its sections, the FLOP count and profile grouping of its limit part, its deepen-run contender,
and its refusals. Nothing here times anything: the bench's numbers are docs/performance.md's."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from conftest import runs_of

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

# Two machines' /proc/cpuinfo, cut to the lines the bench reads (flags lists shortened).
AMX = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n"
       "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n")
AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx2 fma\n"


@pytest.fixture
def kit(monkeypatch):
    """The scripts folder on sys.path, as `python scripts/bench.py` has it."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import benchkit
    return benchkit


def load_bench(monkeypatch):
    """scripts/bench.py as a module, in this process (a fresh one would only add its imports)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setattr(sys, "argv", [str(SCRIPTS / "bench.py")])  # argparse names the program from it
    spec = importlib.util.spec_from_file_location("bench", SCRIPTS / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="a bf16 GPU decides auto before the CPU's flags")
def test_the_cpu_line_names_the_model_and_the_flags_that_decide_auto(kit, tmp_path):
    from benchkit import cpu

    (tmp_path / "amx").write_text(AMX)
    (tmp_path / "avx2").write_text(AVX2)
    amx, avx2 = cpu.describe(str(tmp_path / "amx")), cpu.describe(str(tmp_path / "avx2"))
    assert amx["model"].startswith("Intel(R) Xeon(R) Platinum 8481C") and avx2["model"] == "AMD EPYC 7B12"
    assert amx["flags"] == {"AMX": True, "AVX-512 BF16": True, "AVX-512": True, "AVX2": True}
    assert avx2["flags"] == {"AMX": False, "AVX-512 BF16": False, "AVX-512": False, "AVX2": True}
    line = cpu.header(amx)
    assert line.startswith("CPU: Intel(R) Xeon(R) Platinum 8481C") and "AMX yes, AVX-512 BF16 yes" in line
    assert "auto -> bf16 (auto: CPU with amx_bf16 and avx512_bf16)" in line
    assert "AMX no, AVX-512 BF16 no, AVX-512 no, AVX2 yes" in cpu.header(avx2) and "auto -> fp32" in cpu.header(avx2)
    assert cpu.cpu_model(str(tmp_path / "missing")) != ""  # no cpuinfo (macOS): the platform's name


def test_bench_output_and_report_start_with_the_cpu_line(monkeypatch, capsys, tmp_path):
    """`--only phases --versus-rounds 0` measures nothing: what is left is the frame every bench prints."""
    bench = load_bench(monkeypatch)
    report = bench.main(["--only", "phases", "--versus-rounds", "0", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("CPU: ") and report["env"]["cpu"]["model"] in out.splitlines()[0]
    assert (tmp_path / "bench.md").read_text().splitlines()[0] == out.splitlines()[0]
    assert "versus" not in report and report["settings"]["sections"] == ["phases"]


def test_only_picks_sections_and_quick_leaves_out_the_compile(monkeypatch, capsys):
    bench = load_bench(monkeypatch)
    assert bench.parse([]).sections == list(bench.SECTIONS)
    assert "compile" not in bench.parse(["--quick"]).sections
    assert bench.parse(["--quick", "--only", "compile", "limit"]).sections == ["compile", "limit"]
    with pytest.raises(SystemExit) as e:
        bench.parse(["--only", "speed"])
    assert e.value.code == 2 and "--only" in capsys.readouterr().err


def test_bench_counts_model_flops_and_sorts_profile_ops(kit):
    from benchkit import limit as lim

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


def test_bench_profile_shares_and_limit_table_on_a_tiny_encoder(kit):
    from transformers import BertConfig, BertModel

    from benchkit import limit as lim

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


def test_the_bench_race_runs_deepen_runs_own_loop_to_a_finished_record(kit, glue_dir, tmp_path):
    """make bench's deepen-run contender is train.fit with a checkpointer that writes nothing: it must
    keep up with what fit asks of a checkpointer (it crashed once fit read saver.extra), time every
    chunk, and end its MLflow run FINISHED."""
    from benchkit import contenders as bc
    from benchkit.race import Baton, Lap
    from conftest import make_cfg
    from deepen_run.data.glue import TASKS
    from deepen_run.data.loaders import load_task
    from deepen_run.model.backbone import load_tokenizer

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
    use is one error line at once (was a Hydra traceback after those 20 minutes), before the CPU line."""
    bench = load_bench(monkeypatch)

    def section(*_, **__):  # a refusal that failed would go on to measure for 20 minutes in this process
        raise AssertionError("bench.py went on to its measurements")

    monkeypatch.setattr(bench.startup, "measure", section)
    monkeypatch.setattr(bench, "in_worker", section)
    for args, culprit in ((["--backbone", "nosuch"], "Could not find 'backbone/nosuch'"),
                          (["--task", "stsb"], "--task stsb: use one single-dev-set classification task")):
        with pytest.raises(SystemExit) as e:
            bench.main(args)
        out, err = capsys.readouterr()
        assert e.value.code == 2 and "bench: start-up" not in out and "CPU:" not in out, out[-1000:] + err[-2000:]
        assert err.strip().splitlines()[-1].startswith("bench.py: error:") and culprit in err
