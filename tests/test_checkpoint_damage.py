"""checkpoint.damage: what a resume checks before Accelerate loads a checkpoint, on real files
written by safetensors (the end-to-end fall-back to the checkpoint before is in test_resume.py)."""
import torch
from safetensors.torch import save_file

from deepen_run.run.checkpoint import damage


def _checkpoint(folder):
    folder.mkdir()
    save_file({"w": torch.arange(64, dtype=torch.float32), "b": torch.ones(3)}, str(folder / "model.safetensors"))
    torch.save({"state": {}}, folder / "optimizer.bin")
    torch.save({"last_epoch": 1}, folder / "scheduler.bin")
    return folder


def test_a_whole_checkpoint_has_no_damage(tmp_path):
    assert damage(_checkpoint(tmp_path / "step-4")) is None


def test_truncated_extended_or_garbled_weights_are_named(tmp_path):
    whole = (_checkpoint(tmp_path / "whole") / "model.safetensors").read_bytes()
    for i, data in enumerate((whole[:-100], whole[:-1], whole + b"\0", b"not safetensors", whole[:6])):
        ckpt = _checkpoint(tmp_path / f"step-{i}")
        (ckpt / "model.safetensors").write_bytes(data)
        why = damage(ckpt)
        assert why is not None and why.startswith("model.safetensors is truncated or damaged ("), (i, why)


def test_missing_or_empty_parts_are_named(tmp_path):
    ckpt = _checkpoint(tmp_path / "step-1")
    (ckpt / "optimizer.bin").write_bytes(b"")
    assert damage(ckpt) == "optimizer.bin is missing or empty"
    (ckpt / "model.safetensors").unlink()
    assert damage(ckpt) == "model.safetensors is missing"
    assert damage(tmp_path / "nowhere") == "model.safetensors is missing"
