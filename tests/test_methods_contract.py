"""Contracts every registered method keeps, on a tiny random BERT (a new method is tested here
automatically): the Protocols of deepen_run/methods/contract.py and its declared hooks, defaults only
in the dataclass, builds from its YAML, right output shapes per task, gradients flow into what
trains, and the parameter report adds up."""
import pytest
import torch
from omegaconf import OmegaConf

from conftest import make_cfg, token_batch
from deepen_run.model import backbone as bb
from deepen_run.config.schema import ROOT
from deepen_run.data.glue import get_tasks
from deepen_run.model import steps as backbone_steps
from deepen_run.methods import FOLDERS, METHODS, NAMES, config_of, contract, hook, owner, schema_of
from deepen_run.model.heads import EncoderClassifier, count, new_parameters, param_report
from deepen_run.config.redact import public_config
from deepen_run.run.train import optimizer_for

TASKS = ["sst2", "stsb", "rte"]


def build(method: str, *extra):
    cfg = make_cfg("backbone=tiny", f"method={method}", f"task.names=[{','.join(TASKS)}]", *extra)
    torch.manual_seed(0)
    backbone = bb.load_model(cfg.backbone)
    n = count(backbone)
    model = METHODS[method].build(backbone, cfg.method, get_tasks(TASKS))
    return model, n


@pytest.mark.parametrize("method", list(METHODS))
def test_method_yaml_name_and_module_agree(method):
    assert make_cfg(f"method={method}").method.name == method
    assert METHODS[method].__name__ == f"deepen_run.methods.{owner(method)}.model"


@pytest.mark.parametrize("method", list(METHODS))
def test_output_shapes(method):
    model, _ = build(method)
    model.eval()
    for task, n in [("sst2", 2), ("stsb", 1), ("rte", 2)]:
        assert model(task, **token_batch()).logits.shape == (3, n)


@pytest.mark.parametrize("method", list(METHODS))
def test_trainable_parameters_get_gradients(method):
    model, _ = build(method)
    model.train()
    model("sst2", **token_batch()).logits.sum().backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable
    # The active task's head and the backbone's top layer (if it trains) get gradients.
    assert model.heads["sst2"][1].weight.grad is not None
    assert model.heads["rte"][1].weight.grad is None  # another task's head is untouched


@pytest.mark.parametrize("method", list(METHODS))
def test_param_report_adds_up(method):
    model, n = build(method)
    r = param_report(model, n)
    assert r["params/backbone"] == n
    assert r["params/backbone"] + r["params/method"] + r["params/heads"] == r["params/total"]
    assert r["params/heads"] == sum(p.numel() for p in model.heads.parameters())
    assert r["params/trainable"] <= r["params/total"]
    assert r["params/ratio"] == pytest.approx(r["params/total"] / n)


def test_baseline_adds_nothing_but_heads():
    model, n = build("baseline")
    r = param_report(model, n)
    assert r["params/method"] == 0
    assert r["params/heads"] == (32 * 2 + 2) * 2 + (32 + 1)  # sst2, rte: 2 labels; stsb: 1 output


@pytest.mark.parametrize("scale", [1.0, 10.0])
@pytest.mark.parametrize("method", list(METHODS))
def test_new_parameters_get_the_same_lr_rule_in_every_method(method, scale):
    # Fair comparisons: whatever the method, what it declares new (heads, HIRE's GRUs, PALs) trains
    # at lr x scale, the pretrained backbone at lr.
    model, _ = build(method, f"train.new_params_lr_scale={scale}")
    tcfg = make_cfg(f"train.new_params_lr_scale={scale}").train
    lr = tcfg.learning_rate
    # What the backbone was loaded with (a method's weights inside it, LoRA's adapters, are its own)
    backbone = {id(p) for p in model.backbone.parameters()} - {id(p) for p in model.new_parameters()}
    opt = optimizer_for(model, tcfg, "cpu", new_parameters(model, tuple(model.backbone.parameters()),
                                                           backbone_steps.Added()))
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert len(lr_of) == len(trainable)  # every trainable tensor is in exactly one group
    new = [n for n, p in trainable if id(p) not in backbone]
    assert any(n.startswith("heads.") for n in new)
    for n, p in trainable:
        want = lr if id(p) in backbone else scale * lr
        assert lr_of[id(p)] == pytest.approx(want), (n, lr_of[id(p)], want)
    for head in model.heads.values():
        assert all(lr_of[id(p)] == pytest.approx(scale * lr) for p in head.parameters())
    pooler = getattr(model.backbone, "pooler", None)
    if pooler is not None and pooler.dense.weight.requires_grad:  # LoRA freezes it with the backbone
        assert lr_of[id(pooler.dense.weight)] == pytest.approx(lr)  # pretrained
    method_new = {n.split(".")[0] for n in new} - {"heads"}
    assert method_new == {"hire": {"hire"}, "pals": {"pals"}, "scalar_mix": {"mix"}, "lora": {"backbone"}}.get(method, set())


class InsideAdapter(EncoderClassifier):
    """A toy LoRA-style method: a low-rank update of layer 0's query projection, its weights living
    inside the backbone (where the old rule, "outside model.backbone = new", would miss them)."""

    def __init__(self, backbone, tasks):
        super().__init__(backbone, tasks, pooling="cls")
        query = backbone.encoder.layer[0].attention.self.query
        query.lora_a = torch.nn.Parameter(torch.randn(4, query.in_features) * 0.01)
        query.lora_b = torch.nn.Parameter(torch.zeros(query.out_features, 4))
        query.register_forward_hook(lambda m, args, out: out + args[0] @ m.lora_a.t() @ m.lora_b.t())
        self.adapted = query

    def new_parameters(self):
        return [self.adapted.lora_a, self.adapted.lora_b, *super().new_parameters()]


class OutsideGate(EncoderClassifier):
    """A toy method whose new weights sit outside the backbone: a learned scale per hidden unit."""

    def __init__(self, backbone, tasks):
        super().__init__(backbone, tasks, pooling="cls")
        self.scale = torch.nn.Parameter(torch.ones(backbone.config.hidden_size))

    def encode(self, task, input_ids, attention_mask, token_type_ids=None):
        return super().encode(task, input_ids, attention_mask, token_type_ids) * self.scale

    def new_parameters(self):
        return [self.scale, *super().new_parameters()]


@pytest.mark.parametrize("toy,own", [(InsideAdapter, 2), (OutsideGate, 1)])
@pytest.mark.parametrize("dup", [[], [1]])
def test_a_new_method_gets_the_lr_rule_for_exactly_its_declared_weights(toy, own, dup):
    # A fourth method only implements the contract (build, new_parameters): run/train.py is untouched,
    # and its new weights train at new_params_lr_scale x lr wherever they sit; with duplicated
    # layers (plain copies) the copies stay at 1x.
    cfg = make_cfg("backbone=tiny", "train.new_params_lr_scale=10", f"backbone.duplicate_layers={dup}")
    torch.manual_seed(0)
    backbone = bb.load_model(cfg.backbone)
    loaded = tuple(backbone.parameters())
    added = backbone_steps.apply(backbone, cfg)
    model = toy(backbone, get_tasks(TASKS))
    new = {id(p) for p in new_parameters(model, loaded, added)}
    opt = optimizer_for(model, cfg.train, "cpu", new_parameters(model, loaded, added))
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    lr = cfg.train.learning_rate
    assert len(new) == own + len(list(model.heads.parameters()))
    for name, p in model.named_parameters():
        assert lr_of[id(p)] == pytest.approx(10 * lr if id(p) in new else lr), name
    model("sst2", **token_batch()).logits.sum().backward()  # the toy trains like any method
    assert all(p.grad is not None for p in model.new_parameters() if p in set(model.heads["sst2"].parameters()))


def test_an_undeclared_new_parameter_is_an_error():
    cfg = make_cfg("backbone=tiny")
    backbone = bb.load_model(cfg.backbone)
    loaded = tuple(backbone.parameters())
    model = OutsideGate(backbone, get_tasks(TASKS))
    model.new_parameters = lambda: list(model.heads.parameters())  # forgets its scale
    with pytest.raises(RuntimeError, match="does not declare in new_parameters.*: scale"):
        new_parameters(model, loaded, backbone_steps.Added())


# The explicit contract (deepen_run/methods/contract.py), checked for every registered method.

@pytest.mark.parametrize("method", list(METHODS))
def test_method_modules_and_model_satisfy_the_contract(method):
    light, module = config_of(method), METHODS[method]
    assert isinstance(light, contract.MethodConfigModule)
    assert isinstance(module, contract.MethodModule)
    assert module.Config is light.Config  # one schema, re-exported by the model module
    model, _ = build(method)
    assert isinstance(model, contract.MethodModel)
    assert isinstance(model.heads, torch.nn.ModuleDict) and set(model.heads) == set(TASKS)
    assert model.backbone.config.hidden_size == 32  # the encoder it was given, reachable as model.backbone
    # Hooks: each declared hook is looked for in its own module (check in the light one, the others
    # in the model module); hook() gives the method's function, or the no-op it leaves out.
    for name, (home, noop) in contract.OPTIONAL_HOOKS.items():
        mod = light if home == "config" else module
        own = getattr(mod, name, None)
        assert own is None or callable(own), (method, name)
        assert hook(mod, name) is (own or noop)
        if home == "model":
            assert not hasattr(light, name), f"{method}_config.{name} would never run: it belongs in {method}.py"
    stray = [n for m in (light, module) for n in vars(m) if n.startswith(("after_", "before_", "on_"))
             and n not in contract.OPTIONAL_HOOKS]
    assert not stray, f"{method}: {stray} look like hooks but are not declared in contract.OPTIONAL_HOOKS"


def test_hook_defaults_to_a_no_op_and_knows_only_declared_names():
    assert hook(METHODS["baseline"], "after_train")(None, None) is None
    assert hook(METHODS["hire"], "after_train") is METHODS["hire"].after_train
    assert hook(config_of("hire"), "check") is config_of("hire").check
    with pytest.raises(KeyError, match="after_trian"):
        hook(METHODS["hire"], "after_trian")


@pytest.mark.parametrize("method", FOLDERS)
def test_defaults_live_only_in_the_dataclass(method):
    # conf/method/<name>.yaml only selects the schema: composing it gives exactly Config()'s values,
    # and changing a dataclass default changes the run (no YAML copy to fall out of step).
    yaml = OmegaConf.load(ROOT / "conf" / "method" / f"{method}.yaml")
    assert set(yaml) == {"defaults"}, f"conf/method/{method}.yaml sets {set(yaml) - {'defaults'}}: keep defaults in the dataclass"
    composed = OmegaConf.to_container(make_cfg(f"method={method}").method, enum_to_str=True)
    assert composed == OmegaConf.to_container(OmegaConf.structured(config_of(method).Config()), enum_to_str=True)
    assert composed["name"] == method


@pytest.mark.parametrize("preset", sorted(set(NAMES) - set(FOLDERS)))
def test_a_preset_is_configuration_of_its_method(preset):
    # Its schema is its method's Config plus its own keys; its model is its method's.
    cfg = make_cfg(f"method={preset}")
    assert issubclass(schema_of(preset), config_of(preset).Config)
    assert METHODS[preset] is METHODS[owner(preset)]
    composed = OmegaConf.to_container(cfg.method, enum_to_str=True)
    assert composed == OmegaConf.to_container(OmegaConf.structured(schema_of(preset)()), enum_to_str=True)


def test_choice_options_are_plain_strings_where_the_run_uses_them():
    # StrEnums: compare equal to their strings, log as strings (redact.public_config), save as YAML strings.
    cfg = make_cfg("method=hire", "method.pool=max", "train.mixed_precision=no", "schedule=round_robin")
    assert cfg.method.pool == "max" and cfg.train.mixed_precision == "no" and cfg.schedule.kind == "round_robin"
    flat = public_config(cfg)
    assert (flat["method"]["pool"], flat["method"]["summary"], flat["train"]["mixed_precision"]) == ("max", "mean", "no")
    assert all(type(v) is str for v in (flat["method"]["pool"], flat["train"]["mixed_precision"], flat["schedule"]["kind"]))
    again = OmegaConf.create(OmegaConf.to_yaml(cfg))  # the saved config.yaml reads back as the same strings
    assert again.train.mixed_precision == "no" and type(again.train.mixed_precision) is str
