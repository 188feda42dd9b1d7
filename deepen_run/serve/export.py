"""`deepen-export`: a trained model as a self-describing folder (bundle.py's files, the tokenizer
and a model card). A plain classifier (hf.py) is written as transformers writes its own, so
AutoModelForSequenceClassification.from_pretrained reads it; any other model keeps our state dict
and loads with deepen_run.load. The card says which, and why."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError
from deepen_run.signals import catch
from deepen_run.safe_fs import shared_mode
from deepen_run.model import backbone as bb
from deepen_run.serve import bundle, card, hf


def check_target(dest: Path) -> None:
    """A folder with files of its own is never written into; an earlier export is replaced."""
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest} is a file; give a folder to export into")
    parent = next((p for p in dest.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UserError(f"{dest}: {parent} is a file, not a folder")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / bundle.INFO).is_file():
        raise UserError(f"{dest} holds files of its own; export into a new or empty folder")
    if dest.is_dir() and not os.access(dest, os.W_OK | os.X_OK):
        raise UserError(f"{dest}: you cannot write in this folder; give a folder you can write")
    if (dest / bundle.INFO).is_file() and "files" not in json.loads((dest / bundle.INFO).read_text()):
        raise UserError(f"{dest} holds a model that does not list its files (a run's model, or an older "
                        "export): its files cannot be told from yours; export into a new or empty folder")


def export(source, dest: Path, tracking_uri: Optional[str] = None,
           trust_remote_code: bool = False) -> tuple[Path, Optional[str]]:
    """-> (the folder, the transformers class it loads with, or None: deepen_run.load only)."""
    from deepen_run.serve.loading import build, open_model

    dest = Path(dest).resolve()  # `.` has no name to put the temporary folder beside
    check_target(dest)
    # Filled beside dest under a name no one else has (mkdir refuses one that exists), then moved in:
    # a user's file is never touched. Made before the model loads: an unwritable target is one line now.
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:12]}.tmp")
    with removed_on_signal(tmp, dest):
        folder, cfg, info = open_model(source, tracking_uri, trust_remote_code)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
        except OSError as e:
            raise UserError(f"cannot write the export at {dest} ({e.strerror or e}); give a folder you can "
                            "write") from None
        try:
            trained = build(folder, cfg, info, device="cpu")
            hf_class = fill(tmp, folder, cfg, info, trained)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # Moving in is short: a stop signal waits until it is done (half an export in dest would be
        # worse), and then meets the handlers in force before the export (the export is whole).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        move_in(tmp, dest)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return dest, hf_class


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def removed_on_signal(tmp: Path, dest: Path):
    """SIGINT, SIGTERM, SIGHUP while the export is filled: the temporary folder goes, one line says
    so, and the command exits 128+signum (what a shell or scheduler reads as "stopped by it"). The
    handler ends the process itself (no exception travels through the libraries)."""
    def stop(signum, frame):
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"deepen-export: stopped by {signal.Signals(signum).name}; nothing was written to {dest}",
              file=sys.stderr, flush=True)
        os._exit(128 + signum)

    before = catch(STOPS, stop)  # the main thread's only; one ignored at start (nohup) stays ignored
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def move_in(tmp: Path, dest: Path) -> None:
    """The filled export into dest, which keeps its identity (the shell's current folder, say). Of an
    earlier export there, only the files it listed go, inside its subfolders too (method=lora: lora/),
    then the folders they leave empty: a file the user put beside or inside them stays.
    deepen_run.json comes last, so the folder says it is an export only once it is whole."""
    dest.mkdir(exist_ok=True)
    if (dest / bundle.INFO).is_file():
        listed = json.loads((dest / bundle.INFO).read_text())
        # deepest first, so a listed folder is looked at once the files listed in it are gone
        for name in sorted({*listed["files"], *listed.get("inside", [])} - {bundle.INFO}, key=lambda n: -n.count("/")):
            old = dest / name
            if old.is_symlink():
                continue
            if old.is_file():
                old.unlink()
            elif old.is_dir():
                for d in sorted((p for p in old.rglob("*") if p.is_dir() and not p.is_symlink()),
                                key=lambda p: -len(p.parts)) + [old]:
                    if not any(d.iterdir()):
                        d.rmdir()
    for f in sorted((f for f in tmp.rglob("*") if f.is_file()), key=lambda f: f == tmp / bundle.INFO):
        (dest / f.relative_to(tmp)).parent.mkdir(parents=True, exist_ok=True)
        f.replace(dest / f.relative_to(tmp))
    shutil.rmtree(tmp)  # the export's own temporary folder, left with empty folders only


def fill(tmp: Path, folder: Path, cfg, info: dict, trained) -> Optional[str]:
    """The export's files into `tmp`; -> the transformers class it loads with, or None."""
    model = trained.model
    state = model.state_dict()
    why = hf.why_not(model, state)
    hf_class = None
    if why is None:
        from transformers import AutoModelForSequenceClassification

        task = info["tasks"][0]
        family = model.backbone.config.model_type
        plain = AutoModelForSequenceClassification.from_config(hf.hf_config(model, trained.tasks[task]), dtype=bb.DTYPE)
        missing, unexpected = plain.load_state_dict(hf.to_hf(state, family, task), strict=False)
        if missing or unexpected:  # the table and the model disagree: keep our own format instead
            why = f"its weights do not map onto {type(plain).__name__} (missing {missing[:2]}, unexpected {unexpected[:2]})"
        else:
            plain.save_pretrained(str(tmp))
            hf_class = type(plain).__name__
    if hf_class is None:
        from safetensors.torch import save_model

        save_model(model, str(tmp / bundle.WEIGHTS))
    meta = {k: v for k, v in info.items() if k not in ("format", "weights", "files")} | ({"hf_class": hf_class} if hf_class else {})
    backbone_config = bundle.backbone_config_from(folder / bundle.BACKBONE) if (folder / bundle.BACKBONE).is_file() \
        else bundle.pristine_backbone_config(cfg.backbone)

    from deepen_run.serve.publish import method_files

    note = method_files(cfg, model, tmp)  # before the card, which says how to load them
    bundle.write_meta(tmp, bundle.model_config(cfg), meta, backbone_config)
    if hf_class:
        (tmp / bundle.INFO).write_text(json.dumps(json.loads((tmp / bundle.INFO).read_text()) | {"weights": "hf"},
                                                  indent=1))
    # The run's length limit, not the backbone's: transformers then truncates as the run did.
    trained.tokenizer.model_max_length = cfg.data.max_seq_length
    trained.tokenizer.save_pretrained(str(tmp))
    (tmp / "README.md").write_text(card.text(cfg, info, hf_class, why, note))
    shared_mode(tmp)  # safetensors writes 0600; the export's weights are as readable as its other files
    # What this export wrote: a later export into the same folder replaces these files and no other.
    names = sorted(p.name for p in tmp.iterdir())
    inside = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file() and p.parent != tmp)
    (tmp / bundle.INFO).write_text(json.dumps(json.loads((tmp / bundle.INFO).read_text())
                                              | {"files": names, "inside": inside}, indent=1))
    return hf_class
