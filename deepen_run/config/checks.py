"""The schema's own checks of values that composition lets through (a type is right, the number is
not): each config dataclass runs its function here from __post_init__, so every place that builds
one from a composed config (run/preflight.py numbers, OmegaConf.to_object) gets the same one-line
UserError naming the key. Checks that need more than one section (files, the backbone's config, a
method) stay in the pre-flight."""
from __future__ import annotations

import math

from deepen_run.errors import UserError

POSITIVE = ("learning_rate", "new_params_lr_scale", "batch_size", "eval_batch_size", "gradient_accumulation_steps",
            "log_every")
NON_NEGATIVE = ("save_every", "eval_every", "max_grad_norm", "weight_decay")
# transformers' SchedulerType values that get_scheduler builds from warmup and total steps alone and
# that step without a metric (the others need extra kwargs or a loss). A literal, because the config
# imports no transformers (SchedulerType brings torch: 4 s); tests/test_bad_input.py derives the same
# set from transformers.SchedulerType and fails when the two differ.
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt")
MIN_SEQ_LENGTH = 8  # [CLS] a [SEP] b [SEP] plus a few tokens; shorter leaves no text to classify


def train(t) -> None:
    for key in POSITIVE:
        if not 0 < getattr(t, key) < math.inf:  # `not > 0` also catches NaN
            raise UserError(f"train.{key}={getattr(t, key)} must be a positive finite number")
    for key in NON_NEGATIVE:
        if not 0 <= getattr(t, key) < math.inf:
            raise UserError(f"train.{key}={getattr(t, key)} must be a finite number >= 0")
    if t.save_total_limit < 1:
        raise UserError(f"train.save_total_limit={t.save_total_limit} must be >= 1 (checkpoints to keep); "
                        "use train.save_every=0 to save none")
    if not 0 < t.layer_decay <= 1:  # `not` also catches NaN; > 1 would train the embeddings fastest
        raise UserError(f"train.layer_decay={t.layer_decay} must be in (0, 1] (1.0 = no layer-wise decay; "
                        "ELECTRA and DeBERTa use 0.75-0.9)")
    if not 0 <= t.warmup_ratio <= 1:
        raise UserError(f"train.warmup_ratio={t.warmup_ratio} must be in [0, 1]")
    if t.lr_scheduler not in SCHEDULERS:
        raise UserError(f"train.lr_scheduler={t.lr_scheduler!r}; choose from {', '.join(SCHEDULERS)}")
    if t.model_selection == "best" and not (t.eval_every > 0 or t.eval_per_epoch):
        raise UserError("train.model_selection=best picks among the evaluations during training: set "
                        "train.eval_every=N or train.eval_per_epoch=true (with neither, best = final)")
    if t.model_selection == "best" and t.save_best is False:
        raise UserError("train.model_selection=best keeps the best weights to evaluate them at the end: drop "
                        "train.save_best=false")
    if t.early_stopping_patience is not None and (t.early_stopping_patience < 1 or
                                                  not (t.eval_every > 0 or t.eval_per_epoch)):
        raise UserError(f"train.early_stopping_patience={t.early_stopping_patience} counts evaluations during "
                        "training: give a number >= 1 and set train.eval_every=N or train.eval_per_epoch=true")
    if not 0 <= t.early_stopping_threshold < math.inf:
        raise UserError(f"train.early_stopping_threshold={t.early_stopping_threshold} must be a finite number >= 0")
    if not math.isfinite(t.num_epochs):
        raise UserError(f"train.num_epochs={t.num_epochs} must be a finite number (or set train.max_steps)")
    if t.max_steps < -1 or t.max_steps == 0:  # HF would train num_epochs epochs: a typo'd count, hours long
        raise UserError(f"train.max_steps={t.max_steps}: give a number of steps > 0, or -1 (the default) to "
                        "train train.num_epochs epochs")
    if t.max_steps <= 0 and not t.num_epochs > 0:
        raise UserError("set train.max_steps or train.num_epochs to a positive number")
    for key in ("steps_per_epoch", "steps_per_task"):
        if getattr(t, key) is not None and getattr(t, key) <= 0:
            raise UserError(f"train.{key}={getattr(t, key)} must be positive (or null)")


def schedule(s) -> None:
    for key in ("alpha", "alpha_end"):
        if not math.isfinite(getattr(s, key)):
            raise UserError(f"schedule.{key}={getattr(s, key)} must be a finite number (the exponent on the "
                            "training-set sizes)")


def data(d) -> None:
    if d.max_seq_length < MIN_SEQ_LENGTH:
        raise UserError(f"data.max_seq_length={d.max_seq_length} must be at least {MIN_SEQ_LENGTH} "
                        "(tokens per example, special tokens included)")
    if d.num_workers < 0:
        raise UserError(f"data.num_workers={d.num_workers} must be >= 0 (0 = load in the main process)")
    f = d.train_fraction
    if f is not None and not 0 < f <= 1:  # `not` also catches NaN
        raise UserError(f"data.train_fraction={f} must be in (0, 1] (or null for the whole training set)")
    for key in ("max_train_samples", "max_eval_samples"):
        if getattr(d, key) is not None and getattr(d, key) <= 0:
            raise UserError(f"data.{key}={getattr(d, key)} must be positive (or null for all)")


def backbone(b) -> None:
    """A randomly initialised backbone's shape (pretrained=false), which transformers would refuse
    only when it builds the model, with a traceback and a FAILED run."""
    if b.pretrained:
        return
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings"):
        if getattr(b, key) < 1:
            raise UserError(f"backbone.{key}={getattr(b, key)} must be a positive integer")
    if b.type_vocab_size < 0:  # 0: no segment embeddings (DeBERTa-v3's)
        raise UserError(f"backbone.type_vocab_size={b.type_vocab_size} must be >= 0")
    if b.hidden_size % b.num_attention_heads:
        raise UserError(f"backbone.hidden_size={b.hidden_size} must be a multiple of backbone.num_attention_heads="
                        f"{b.num_attention_heads} (each head takes hidden_size / heads of it)")
    if not 0 <= b.pad_token_id < b.vocab_size:
        raise UserError(f"backbone.pad_token_id={b.pad_token_id} must be a token id, in [0, backbone.vocab_size)")
