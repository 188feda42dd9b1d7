"""Run names say what tells a run apart (deepen_run/run/names.py): duplicated layers, a tiny
backbone's family, a method's non-default options; a sweep's child puts its swept values first."""
from conftest import make_cfg

from deepen_run.run.names import run_name, tags_for
from deepen_run.sweep import summary as sweep_summary


def test_duplicated_layers_and_a_tiny_family_change_the_name():
    plain = run_name(make_cfg("backbone=minilm", "task=sst2"))
    dup = run_name(make_cfg("backbone=minilm", "task=sst2", "backbone.duplicate_layers=[2,3]"))
    assert plain == "minilm-baseline-sst2-s42"
    assert dup == "minilm+dup2.3-baseline-sst2-s42"
    gated = run_name(make_cfg("backbone=minilm", "task=sst2", "backbone.duplicate_layers=[2,3]",
                              "backbone.duplicate_init=gated"))
    assert gated == "minilm+dup2.3:gated-baseline-sst2-s42"
    # method=duplicate links backbone.duplicate_layers to method.layers: said once, by +dup
    preset = make_cfg("backbone=minilm", "task=sst2", "method=duplicate", "method.layers=[2,3]")
    assert run_name(preset) == "minilm+dup2.3-duplicate-sst2-s42"
    assert tags_for(preset)["duplicate_layers"] == "2.3" and "duplicate_layers" not in tags_for(make_cfg("task=sst2"))

    deberta = run_name(make_cfg("backbone=tiny", "method=hire", "task=rte", "backbone.model_type=deberta-v2"))
    modern = run_name(make_cfg("backbone=tiny", "method=hire", "task=rte", "backbone.model_type=modernbert"))
    assert deberta == "tiny-deberta-v2-hire-rte-s42" and modern == "tiny-modernbert-hire-rte-s42"
    assert run_name(make_cfg("backbone=tiny", "method=hire", "task=rte")) == "tiny-hire-rte-s42"


def test_non_default_method_options_are_named_but_not_neutral_ones():
    assert run_name(make_cfg("backbone=tiny", "method=hire", "task=rte", "method.gru_layers=1",
                             "method.extractor=false", "method.report_examples=3")) == \
        "tiny-hire(gru_layers=1,extractor=false)-rte-s42"
    assert run_name(make_cfg("backbone=tiny", "method=pals", "task=rte",
                             "method.hidden_size_aug=12", "method.num_heads=6")) == "tiny-pals(hidden_size_aug=12)-rte-s42"
    assert run_name(make_cfg("backbone=tiny", "task=rte", "tracking.run_name=mine")) == "mine"


def test_a_sweep_child_says_its_swept_values_first_and_only_once():
    params = {"method.gru_layers": "1,2", "seed": "1,2", "sweep.overrides": "x"}
    job = ["method.gru_layers=1", "seed=2"]
    cfg = make_cfg("backbone=tiny", "method=hire", "task=rte", *job, "method.extractor=false")
    assert sweep_summary.child_name(cfg, 2, {"params": params}, job) == \
        "gru_layers=1 seed=2 · tiny-hire(extractor=false)-rte"
    dup = {"backbone.duplicate_layers": "[1],[2]"}
    cfg = make_cfg("backbone=minilm", "task=rte", "backbone.duplicate_layers=[1]")
    assert sweep_summary.child_name(cfg, 42, {"params": dup}, ["backbone.duplicate_layers=[1]"]) == \
        "duplicate_layers=[1] · minilm-baseline-rte-s42"


def test_keys_added_later_at_their_default_share_a_row_with_runs_logged_before_them():
    from deepen_run.report.rows import key_of

    old = {"tags": {"task": "rte", "backbone": "tiny", "method": "baseline"},
           "params": {"method.name": "baseline", "train.learning_rate": "2e-05"}}
    new = {"tags": old["tags"], "params": old["params"] | {"train.layer_decay": "1.0",
                                                           "train.early_stopping_patience": "None",
                                                           "train.early_stopping_threshold": "0.0"}}
    decayed = {"tags": old["tags"], "params": new["params"] | {"train.layer_decay": "0.9"}}
    assert key_of(old) == key_of(new) != key_of(decayed)


def test_a_schedule_changed_by_an_override_says_so_in_its_name_and_tag():
    """schedule.alpha=0.8 on `proportional` draws otherwise than proportional: the name and the
    `schedule` tag (the runs table's column, the report's rows) say what changed; a preset as it
    ships keeps its plain name."""
    for given, shown in (([], "proportional"), (["schedule.alpha=0.8"], "proportional(alpha=0.8)"),
                         (["schedule=annealed", "schedule.alpha_end=0.5"], "annealed(alpha_end=0.5)"),
                         (["schedule=round_robin"], "round_robin"), (["schedule=sqrt"], "sqrt")):
        cfg = make_cfg("task.names=[sst2,rte]", *given)
        assert tags_for(cfg)["schedule"] == shown and run_name(cfg).endswith(f"-sst2+rte-{shown}-s42"), given


def test_a_duplicated_models_name_and_tags_differ_from_the_plain_ones():
    """The Models tab and the registry: the 8-layer duplicated model is not named or tagged as the
    plain 6-layer one (it once logged `minilm-baseline-sst2` with the plain run's tags)."""
    from deepen_run.run.names import model_name, model_tags

    plain = make_cfg("backbone=minilm", "task=sst2")
    dup = make_cfg("backbone=minilm", "task=sst2", "backbone.duplicate_layers=[2,3]")
    gated = make_cfg("backbone=minilm", "task=sst2", "backbone.duplicate_layers=[2,3]", "backbone.duplicate_init=gated")
    assert model_name(plain) == "minilm-baseline-sst2" and model_name(dup) == "minilm+dup2.3-baseline-sst2"
    assert model_name(gated) == "minilm+dup2.3:gated-baseline-sst2"
    assert model_tags(plain) == {"method": "baseline", "backbone": "minilm", "task": "sst2"}
    assert model_tags(dup)["duplicate_layers"] == "2.3" and model_tags(gated)["duplicate_layers"] == "2.3:gated"
    # the seed is not in a model's name (a setting's seeds are versions of one model), nor a run's own name
    hire = make_cfg("backbone=tiny", "method=hire", "task=rte", "method.gru_layers=1", "seed=7", "tracking.run_name=mine")
    assert model_name(hire) == "tiny-hire(gru_layers=1)-rte" and model_tags(hire)["variant"] == "gru_layers=1"
    assert tags_for(hire)["variant"] == "gru_layers=1" and "variant" not in tags_for(plain)
