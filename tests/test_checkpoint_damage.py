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


def _steps(home):
    return sorted(int(p.name[5:]) for p in (home / "checkpoints").glob("step-*") if p.name[5:].isdigit())


def test_rotation_keeps_the_newest_up_to_the_saved_step_and_drops_later_leftovers(tmp_path):
    """A resume from step-20 past a damaged step-40: saving step-30 keeps 30 and 20 (limit 2), and
    the leftover 40 goes, instead of pushing the new and the whole ones out."""
    from deepen_run.run.checkpoint import rotate

    for s in (10, 20, 40):
        (tmp_path / "checkpoints" / f"step-{s}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{s}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoints" / "step-30").mkdir()
    (tmp_path / "checkpoints" / "step-30" / "trainer_state.json").write_text("{}")
    theirs = [tmp_path / "checkpoints" / name for name in ("notes.txt", "step-x", "best")]  # not step-<N>
    theirs[0].write_text("mine")
    theirs[1].mkdir()
    theirs[2].mkdir()
    rotate(tmp_path, 30, 2)
    assert _steps(tmp_path) == [20, 30]
    rotate(tmp_path, 30, 1)
    assert _steps(tmp_path) == [30] and all(p.exists() for p in theirs)


def test_best_weights_caught_between_their_two_renames_come_back(tmp_path):
    from deepen_run.run.checkpoint import recover_best

    old = tmp_path / "checkpoints" / ".best.old"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_text("w")
    leftovers = [tmp_path / "checkpoints" / name for name in (".step-20.old", ".step-30.tmp", ".best.tmp")]
    for p in leftovers:
        p.mkdir()
    mine = tmp_path / "checkpoints" / ".notes.tmp"  # a hidden file of the user's: not a name we write
    mine.write_text("keep")
    recover_best(tmp_path)
    assert (tmp_path / "checkpoints" / "best" / "model.safetensors").read_text() == "w" and not old.exists()
    assert mine.read_text() == "keep"
    assert not any(p.exists() for p in leftovers)  # a kill's leftovers: never read, they only hold disk
    old.mkdir()  # a kill after best/'s second rename: the old one is superseded
    recover_best(tmp_path)
    assert not old.exists() and (tmp_path / "checkpoints" / "best" / "model.safetensors").read_text() == "w"
