"""The device fast paths (deepen_run/run/fast.py): which precision, AdamW kernel and attention kernel a
run picks, and that the run records them as params."""
import pytest
import torch

from conftest import cli, runs_of
from deepen_run.precision import choose_attention, choose_precision, cpu_flags, resolve_precision
from deepen_run.run.optim import adamw_kwargs, optimizer_impl

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

