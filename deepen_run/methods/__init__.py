"""The method registry: name = conf/method/<name>.yaml = deepen_run/methods/<name>.py.

A method module provides
  Config                       its config dataclass (validated by Hydra), with `name`
  build(backbone, cfg, tasks)  -> nn.Module with forward(task, input_ids, attention_mask,
                               token_type_ids) -> logits and a `heads` ModuleDict; it sets
                               requires_grad for what trains
and optionally
  after_build(model, ctx)      before training (ctx: deepen_run.context.RunContext)
  after_train(model, ctx)      after the final evaluation (figures, tables)
  check(cfg)                   cheap validation of the whole config before anything loads (called
                               by preflight.method_checks after the backbone preflight); raise UserError
"""
from deepen_run.methods import baseline, duplicate, hire, pals

METHODS = {
    "baseline": baseline,
    "duplicate": duplicate,
    "hire": hire,
    "pals": pals,
}
