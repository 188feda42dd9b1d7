"""train.model_selection (issue: one model-selection rule, recorded as a param): final = the last
step's weights; best = the best evaluation's weights, evaluated again at the end."""
import math

import pytest
import torch

from conftest import cli, make_cfg, runs_of

TINY = ["backbone=tiny", "task=rte", "train.batch_size=8", "data.max_train_samples=64", "data.max_eval_samples=64",
        "data.max_seq_length=32"]


def test_load_best_restores_the_kept_weights_a_shared_tensor_included(tmp_path):
    """Saved at its best, the model moves on; load_best puts every weight back, a parameter shared by two
    modules (stored once by safetensors, as PALs' shared projections) included."""
    from deepen_run.run.checkpoint import Checkpointer
    from deepen_run.precision import resolve
    from deepen_run.run.fast import make_accelerator

    cfg = make_cfg("train.model_selection=best", "train.eval_every=1")
    acc = make_accelerator(cfg.train, resolve(cfg.train).precision)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model[1].weight = model[0].weight  # one tensor, two names
    saver = Checkpointer(tmp_path, cfg.train, acc, total=10)
    saver.save_best(model, 3, 0.7)
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    saver.save_best(model, 4, 0.6)  # worse: not kept
    saver.load_best(model)
    assert saver.best_step == 3
    assert all(torch.equal(model.state_dict()[k], v) for k, v in kept.items())
    assert model[1].weight is model[0].weight


def test_best_needs_evaluations_during_training_and_its_weights():
    r = cli(*TINY, "train.model_selection=best")
    assert r.returncode == 2 and "train.model_selection=best" in r.stderr and "eval_every" in r.stderr, r.stderr
    r = cli(*TINY, "train.model_selection=best", "train.eval_every=2", "train.save_best=false")
    assert r.returncode == 2 and "save_best" in r.stderr, r.stderr
    r = cli(*TINY, "train.model_selection=worst")
    assert r.returncode == 2 and "model_selection" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_rule_is_a_param_and_best_reports_the_best_evaluation(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/m.db"
    for rule in ("final", "best"):
        r = cli(*TINY, "train.max_steps=12", "train.eval_every=3", "train.learning_rate=1e-3",
                f"train.model_selection={rule}", f"tracking.uri={uri}", f"data.glue_dir={glue_dir}")
        assert r.returncode == 0, r.stderr[-3000:]
    client, (final, best) = runs_of(uri)
    assert final.data.params["train.model_selection"] == "final"
    assert best.data.params["train.model_selection"] == "best"
    for run in (final, best):
        history = client.get_metric_history(run.info.run_id, "eval/score")
        firsts = {}
        for m in sorted(history, key=lambda m: m.timestamp):
            firsts.setdefault(m.step, m.value)  # the loop's evaluations (best's re-evaluation comes last)
        assert sorted(firsts) == [3, 6, 9, 12]
        result = run.data.metrics["eval/score"]
        if run is final:
            assert result == firsts[12]
        else:
            step = int(run.data.tags["selected_step"])
            assert firsts[step] == max(firsts.values())
            assert result == firsts[step] == run.data.metrics["eval/best_score"]  # the same weights, again
            assert math.isfinite(result)


def test_a_run_saved_before_the_key_existed_still_resumes():
    """resume compares saved and current configs: a key a newer deepen-run added, at its default now,
    is no difference (the old run ran with it); set otherwise, or a changed key, still is one."""
    from omegaconf import OmegaConf

    from deepen_run.run.resume import differences, plain_config

    now = plain_config(make_cfg())
    then = OmegaConf.to_container(OmegaConf.create(now))
    del then["train"]["model_selection"]
    assert differences(then, now) == []
    assert differences(then, plain_config(make_cfg("train.model_selection=best", "train.eval_every=5"))) == \
        ["train.eval_every", "train.model_selection"]


def test_a_checkpoint_being_written_is_not_a_step_dir(tmp_path):
    """While its files are written, a checkpoint lives in a hidden folder; only the rename makes it
    checkpoints/step-N. A reader globbing step-*/trainer_state.json (test_resume's wait) once found the
    half-written one, and read an empty state after a SIGKILL (seen under load)."""
    from deepen_run.run.checkpoint import Checkpointer
    from deepen_run.precision import resolve
    from deepen_run.run.fast import make_accelerator

    cfg = make_cfg("train.save_every=1")
    acc = make_accelerator(cfg.train, resolve(cfg.train).precision)
    saver = Checkpointer(tmp_path, cfg.train, acc, total=10)
    seen = []

    def fill(tmp):
        (tmp / "trainer_state.json").write_text("")  # the moment a kill can land: created, not yet written
        seen.extend(p.name for p in (tmp_path / "checkpoints").iterdir())
        assert not list((tmp_path / "checkpoints").glob("step-*"))

    saver._write(tmp_path / "checkpoints" / "step-7", fill)
    assert seen == [".step-7.tmp"] and [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-7"]
