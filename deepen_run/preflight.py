"""Pre-flight: every check that needs no model, before any heavy import, MLflow run or download.

Bad input must cost seconds: numbers, task names, the GLUE files (every row parsed once, so a bad
row is reported as file:line), the backbone's whereabouts and the method's own config checks run
here, cheapest first; torch/transformers are imported only by the later checks that need them.
"""
from __future__ import annotations

from deepen_run import tsv
from deepen_run.errors import UserError
from deepen_run.glue import TaskSpec, get_tasks

POSITIVE = ("learning_rate", "new_params_lr_scale", "batch_size", "eval_batch_size", "gradient_accumulation_steps",
            "log_every")
NON_NEGATIVE = ("save_every", "eval_every", "max_grad_norm", "weight_decay")
PRECISIONS = ("auto", "no", "fp16", "bf16")  # auto: bf16 on a bf16 GPU, else fp32 (deepen_run/fast.py)


def check(cfg) -> list[TaskSpec]:
    """Raises UserError naming the culprit; returns the TaskSpecs of cfg.task.names."""
    tasks = get_tasks(list(cfg.task.names))
    numbers(cfg)
    if not cfg.dry_run:
        tsv.check_glue_dir(cfg.data.glue_dir, tasks)
        tsv.validate(cfg.data.glue_dir, tasks)
        from deepen_run import submission

        submission.check(cfg, tasks)
    from deepen_run import backbone as bb  # transformers: only once the cheap checks passed

    bb.preflight(cfg.backbone)
    method_checks(cfg, tasks)
    return tasks


def numbers(cfg) -> None:
    t = cfg.train
    for key in POSITIVE:
        if not getattr(t, key) > 0:  # `not > 0` also catches NaN
            raise UserError(f"train.{key}={getattr(t, key)} must be positive")
    for key in NON_NEGATIVE:
        if not getattr(t, key) >= 0:
            raise UserError(f"train.{key}={getattr(t, key)} must be >= 0")
    if t.save_total_limit < 1:
        raise UserError(f"train.save_total_limit={t.save_total_limit} must be >= 1 (checkpoints to keep); "
                        "use train.save_every=0 to save none")
    if not 0 <= t.warmup_ratio <= 1:
        raise UserError(f"train.warmup_ratio={t.warmup_ratio} must be in [0, 1]")
    if t.mixed_precision not in PRECISIONS:
        raise UserError(f"train.mixed_precision={t.mixed_precision!r}; choose from {', '.join(PRECISIONS)}")
    for key in ("steps_per_epoch", "steps_per_task"):
        if getattr(t, key) is not None and getattr(t, key) <= 0:
            raise UserError(f"train.{key}={getattr(t, key)} must be positive (or null)")
    if t.max_steps <= 0 and not t.num_epochs > 0:
        raise UserError("set train.max_steps or train.num_epochs to a positive number")
    if not cfg.data.max_seq_length > 0:
        raise UserError(f"data.max_seq_length={cfg.data.max_seq_length} must be positive")
    f = cfg.data.train_fraction
    if f is not None and not 0 < f <= 1:  # `not` also catches NaN
        raise UserError(f"data.train_fraction={f} must be in (0, 1] (or null for the whole training set)")
    for key in ("max_train_samples", "max_eval_samples"):
        if getattr(cfg.data, key) is not None and getattr(cfg.data, key) <= 0:
            raise UserError(f"data.{key}={getattr(cfg.data, key)} must be positive (or null for all)")


def method_checks(cfg, tasks) -> None:
    """A method may define check(cfg) for its own options; it gets the whole config because they
    may depend on the backbone (layer indices against its depth, read from its config file)."""
    from deepen_run.methods import METHODS

    module = METHODS.get(cfg.method.name)
    if module is None:
        raise UserError(f"unknown method {cfg.method.name!r}; choose from {', '.join(METHODS)}")
    if hasattr(module, "check"):
        module.check(cfg)
