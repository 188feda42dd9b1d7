"""Safety: no environment secret reaches MLflow params or config.yaml; remote code stays off;
checkpoints hold only safetensors and weights_only-loadable state."""
import torch

from conftest import make_cfg
from deepen_run.config.redact import public_config
from deepen_run.masking import MASK
from deepen_run.tracking.store import flatten


def test_secrets_are_masked_in_params(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw-s3cr3t-123")
    monkeypatch.setenv("HF_TOKEN", "hf_tok_456789")
    cfg = make_cfg("tracking.uri=http://alice:${oc.env:MLFLOW_TRACKING_PASSWORD}@mlflow.example:5000",
                   "tracking.run_name=run-${oc.env:HF_TOKEN}", "data.cache_dir=/tmp/cache")
    params = flatten(public_config(cfg))
    text = repr(params)
    assert "pw-s3cr3t-123" not in text and "hf_tok_456789" not in text
    assert params["tracking.uri"] == f"http://alice:{MASK}@mlflow.example:5000"
    assert params["tracking.run_name"] == f"run-{MASK}"
    assert params["data.cache_dir"] == "/tmp/cache" and "resume" not in params
    # A literal password in a URL is masked too, without any environment variable.
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    cfg = make_cfg("tracking.uri=https://bob:hunter2@host/mlflow")
    assert flatten(public_config(cfg))["tracking.uri"] == f"https://bob:{MASK}@host/mlflow"


def test_backbones_default_to_no_remote_code():
    for name in ("minilm", "bert_base", "roberta_base", "roberta_large", "tiny"):
        assert make_cfg(f"backbone={name}").backbone.trust_remote_code is False


def test_checkpoint_state_loads_weights_only(tmp_path):
    """What Accelerate writes besides model.safetensors loads with weights_only=True (its loader's
    default): plain tensors and numbers, no pickled code."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model, opt, sched = acc.prepare(model, opt, sched)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    acc.save_state(str(tmp_path), safe_serialization=True)
    names = {p.name for p in tmp_path.iterdir()}
    assert "model.safetensors" in names and not any(n.endswith((".bin", ".pt")) and "model" in n for n in names)
    torch.load(tmp_path / "optimizer.bin", weights_only=True)
    acc.load_state(str(tmp_path))
