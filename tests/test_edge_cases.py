"""Edge cases of reliability: a resumed run's result is the selected weights' score; cleanups never
follow a link or touch a file they did not write; secrets stay secret; bad input is one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import forkserver
from conftest import HANG, cli, make_cfg, runs_of
from deepen_run.tracking.store import Tracker


def test_a_resumed_runs_final_record_wins_over_the_killed_attempts_last_step(tmp_path):
    """The killed attempt logged the last step's evaluation (0.46); the resumed attempt's
    model_selection=best re-evaluation at that same step (0.54) is the run's result in MLflow,
    while the loop's own re-logged evaluation of a step it already has is still dropped."""
    uri = f"sqlite:///{tmp_path}/m.db"
    first = Tracker(uri, "resume-best")
    run_id = first.start("r", {})
    first.log_metrics({"eval/score": 0.46, "train/loss": 0.7}, 12)
    first.end("KILLED")

    again = Tracker(uri, "resume-best")
    again.start("r", {}, run_id=run_id)
    again.resume()
    again.log_metrics({"eval/score": 0.46, "train/loss": 0.7}, 12)  # the loop's evaluation: dropped
    again.log_metrics({"eval/score": 0.54}, 12, again=True)  # select_best's record of the best weights
    again.end("FINISHED")
    client, (run,) = runs_of(uri, "resume-best")
    assert run.data.metrics["eval/score"] == 0.54
    assert [m.value for m in client.get_metric_history(run_id, "train/loss")] == [0.7]
    assert sorted(m.value for m in client.get_metric_history(run_id, "eval/score")) == [0.46, 0.54]


def _files(root):
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_make_clean_never_follows_a_link_and_reads_inside_our_folders(tmp_path, capsys):
    """outputs/cache, a run dir and outputs/mlartifacts as links to the user's folders: each stays,
    named, and what it points to is untouched; no OSError halfway. A run dir with data_fingerprint.json
    is ours and goes; one with a user's file inside checkpoints/ or .hydra/ stays."""
    from deepen_run.run.clean import clean

    out, mine = tmp_path / "outputs", tmp_path / "mine"
    for name in ("mycache/my_dataset.arrow", "myrun/notes.txt", "myartifacts/a.bin"):
        (mine / name).parent.mkdir(parents=True, exist_ok=True)
        (mine / name).write_text("user")
    ours = {"runs/d/t1/run.json": "{}", "runs/d/t1/data_fingerprint.json": "{}", "runs/d/t1/run_config.yaml": "",
            "runs/d/t1/.hydra/config.yaml": "", "runs/d/t1/checkpoints/best/model.safetensors": "w",
            "runs/d/t2/run.json": "{}", "runs/d/t2/checkpoints/best/my_notes.txt": "user",
            "runs/d/t3/run.json": "{}", "runs/d/t3/.hydra/todo.txt": "user", "mlflow.db": "",
            "study-floor/sweeps.json": "{}", "study-s3/pilot/report.md": "", "bench/bench.json": "{}"}
    for name, text in ours.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    (out / "cache").symlink_to(mine / "mycache")
    (out / "runs/d/linked").symlink_to(mine / "myrun")
    (out / "mlartifacts").symlink_to(mine / "myartifacts")
    (out / "runs/d/t4").mkdir()
    (out / "runs/d/t4/run.json").write_text("{}")
    (out / "runs/d/t4/checkpoints").symlink_to(mine / "myrun")  # a link inside a run dir: the dir is kept
    gone = clean(out, store=True)
    said = capsys.readouterr().out
    assert _files(mine) == {"mycache/my_dataset.arrow", "myrun/notes.txt", "myartifacts/a.bin"}
    assert not (out / "runs/d/t1").exists() and not (out / "mlflow.db").exists()
    assert not any((out / name).exists() for name in ("study-floor", "study-s3", "bench"))  # the scripts' outputs
    assert (out / "runs/d/t2/checkpoints/best/my_notes.txt").is_file() and (out / "runs/d/t3/.hydra/todo.txt").is_file()
    assert (out / "runs/d/t4/checkpoints").is_symlink()
    assert (out / "cache").is_symlink() and (out / "runs/d/linked").is_symlink() and (out / "mlartifacts").is_symlink()
    for name in ("cache", "linked", "mlartifacts", "t2", "t3", "t4"):
        assert name in said, said
    assert out / "runs/d/t1" in gone


def test_a_failed_attempts_removal_leaves_a_linked_entry_and_its_target(tmp_path):
    from deepen_run.run.rundir import Listing

    run, mine = tmp_path / "run", tmp_path / "mine"
    run.mkdir()
    (run / "old.txt").write_text("before")
    mine.mkdir()
    (mine / "data.txt").write_text("user")
    listing = Listing(run)
    (run / "checkpoints").mkdir()
    (run / "checkpoints/x.bin").write_text("ours")
    (run / "newlink").symlink_to(mine)
    listing.remove_created()
    assert (run / "old.txt").is_file() and not (run / "checkpoints").exists()
    assert (mine / "data.txt").read_text() == "user"


def test_report_out_refuses_a_users_file_and_a_file_as_folder(tmp_path, capsys):
    from deepen_run.report.main import write
    from deepen_run.errors import UserError

    table = {"tasks": [], "rows": [], "contrasts": []}
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.md").write_text("my own results")
    (folder / "paper.tex").write_text("x")
    with pytest.raises(UserError, match="results.md"):
        write(table, folder)
    assert (folder / "results.md").read_text() == "my own results"
    with pytest.raises(UserError, match="is a file"):
        write(table, folder / "paper.tex")
    fresh = tmp_path / "report"
    first = write(table, fresh)
    again = write(table, fresh)  # ours: rewritten
    assert [p.name for p in first] == [p.name for p in again] == ["results.md", "results.csv", "results.png"]
    (fresh / "results.csv").write_text("edited by hand")
    with pytest.raises(UserError, match="results.csv"):
        write(table, fresh)


def test_deepen_report_out_is_one_line_exit_2(tmp_path):
    (tmp_path / "results.md").write_text("mine")
    exe = Path(sys.executable).with_name("deepen-report")
    for out in (tmp_path, tmp_path / "results.md"):
        r = subprocess.run([str(exe), "--uri", f"sqlite:///{tmp_path}/none.db", "--out", str(out)],
                           capture_output=True, text=True, timeout=HANG)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "--out" in r.stderr
    assert (tmp_path / "results.md").read_text() == "mine"


def test_secret_names_are_words_and_a_token_id_is_not_a_secret(monkeypatch):
    from deepen_run.config.redact import public_config
    from deepen_run.masking import MASK, looks_secret, mask_uri
    from conftest import make_cfg

    for name in ("hf_token", "MLFLOW_TRACKING_PASSWORD", "api_key", "AWS_SECRET_ACCESS_KEY", "password",
                 "PGPASSWORD", "MYPASSWORD", "HFTOKEN", "GITHUB_PAT", "AZURE_STORAGE_KEY"):
        assert looks_secret(name), name
    for name in ("pad_token_id", "token_type_ids", "TOKENIZERS_PARALLELISM", "max_tokens", "tokenizer", "path"):
        assert not looks_secret(name), name
    assert mask_uri("http://alice:s3c@retPW@127.0.0.1:5999/x") == f"http://alice:{MASK}@127.0.0.1:5999/x"
    # A password urlsplit cannot find (an unencoded ? or #) is masked all the same; a URI without one,
    # an @ in its path included, is left as it is.
    for pw in ("s3cr?et", "pa#ss"):
        assert pw not in mask_uri(f"http://alice:{pw}@127.0.0.1:5999"), pw
    for plain in ("http://localhost:5000/api@x", "https://host:8080/path@foo", "git+https://github.com/a/b@v1"):
        assert mask_uri(plain) == plain
    assert mask_uri("http://alice:p@ss@host/x@y") == f"http://alice:{MASK}@host/x@y"
    assert not looks_secret("pad_token") and not looks_secret("mask_token")  # a tokenizer's special tokens
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # its value must not be masked everywhere
    monkeypatch.setenv("PWD", "/home/alice/work")  # the shell's working directory: paths under it stay
    cfg = public_config(make_cfg("tracking.uri=http://alice:s3cretPW@127.0.0.1:5999",
                                 "data.cache_dir=/home/alice/work/outputs/cache"))
    assert cfg["tracking"]["uri"] == f"http://alice:{MASK}@127.0.0.1:5999"
    assert cfg["data"]["cache_dir"] == "/home/alice/work/outputs/cache"
    assert cfg["backbone"]["pad_token_id"] != MASK and cfg["data"]["group_by_length"] is not MASK


def test_a_uri_with_user_and_password_reaches_the_server_and_the_password_stays_out(glue_dir, tmp_path,
                                                                                    mlflow_server):
    """The reachability check parses user:password@ (sent as basic auth); the password appears in no
    output, param, tag, run name, cli.log or run_config.yaml."""
    url = mlflow_server
    uri = url.replace("http://", "http://alice:s3cretPW@")
    run = tmp_path / "run"
    r = cli("backbone=tiny", "task=rte", "dry_run=true", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
            f"hydra.run.dir={run}", "tracking.experiment=creds")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "s3cretPW" not in r.stdout + r.stderr and "alice:***@" in r.stdout
    client, (got,) = runs_of(url, "creds")
    record = str(got.data.params) + str(got.data.tags) + got.info.run_name
    assert "s3cretPW" not in record and "alice" in got.data.params["tracking.uri"]
    for f in run.rglob("*"):
        if f.is_file() and f.name in ("cli.log", "run_config.yaml", "run.json"):
            assert "s3cretPW" not in f.read_text(), f
    bad = cli("backbone=tiny", "task=rte", "dry_run=true", f"data.glue_dir={glue_dir}",
              "tracking.uri=http://alice:s3cretPW@127.0.0.1:9", f"hydra.run.dir={tmp_path}/run2")
    assert bad.returncode == 2 and "s3cretPW" not in bad.stdout + bad.stderr and "not reachable" in bad.stderr



def test_a_password_passed_through_the_environment_is_saved_unresolved(glue_dir, tmp_path,
                                                                      mlflow_server):
    """docs/reliability.md, Known limits: Hydra saves an override as typed, so the workaround for a
    password in tracking.uri is `${oc.env:...}`. The run reaches the server with the resolved URI, while
    .hydra/overrides.yaml and config.yaml hold the interpolation unresolved, no file of the run dir,
    output line, MLflow param, tag, run name or config artifact holds the password, and tracking.uri is masked."""
    typed = mlflow_server.replace("http://", "http://alice:${oc.env:MLFLOW_TRACKING_PASSWORD}@")
    run = tmp_path / "run"
    r = cli("backbone=tiny", "task=rte", "dry_run=true", f"data.glue_dir={glue_dir}", f"tracking.uri={typed}",
            f"hydra.run.dir={run}", "tracking.experiment=envcreds", env={"MLFLOW_TRACKING_PASSWORD": "s3cretPW"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "s3cretPW" not in r.stdout + r.stderr
    for name in ("overrides.yaml", "config.yaml"):
        assert "alice:${oc.env:MLFLOW_TRACKING_PASSWORD}@" in (run / ".hydra" / name).read_text(), name
    written = [f for f in run.rglob("*") if f.is_file()]
    assert not [f for f in written if b"s3cretPW" in f.read_bytes()]
    client, (got,) = runs_of(mlflow_server, "envcreds")
    assert got.data.params["tracking.uri"] == mlflow_server.replace("http://", "http://alice:***@")
    assert "s3cretPW" not in str(got.data.params) + str(got.data.tags) + got.info.run_name
    logged = Path(client.download_artifacts(got.info.run_id, "config.yaml", str(tmp_path))).read_text()
    assert "alice:***@" in logged and "s3cretPW" not in logged

def test_hydras_log_lines_are_masked_and_other_loggers_left_alone(monkeypatch):
    """A sweep's launching process masks the records of Hydra's loggers (its launcher logs every
    job's overrides), a URL's password and a secret variable's value in a plain word too; another
    logger's record is untouched, and a record whose format does not fit its args does not raise."""
    import logging

    from deepen_run.config.redact import mask_logs

    monkeypatch.setenv("MY_API_TOKEN", "tok-1234567")
    before = logging.getLogRecordFactory()
    try:
        mask_logs()
        make = logging.getLogRecordFactory()
        hydra = make("hydra._internal.core_plugins.basic_launcher", logging.INFO, __file__, 1,
                     "#0 : tracking.uri=%s to http://alice:pw@host with tok-1234567", ("http://alice:s3c@h",), None)
        assert hydra.getMessage() == "#0 : tracking.uri=http://alice:***@h to http://alice:***@host with ***"
        other = make("mine", logging.INFO, __file__, 1, "pad_token=%s tok-1234567", ("<pad>",), None)
        assert other.getMessage() == "pad_token=<pad> tok-1234567"
        make("hydra.x", logging.INFO, __file__, 1, "bad %s %s", (1,), None)  # logging reports it later, as ever
    finally:
        logging.setLogRecordFactory(before)


def test_an_error_line_never_shows_a_password(glue_dir, tmp_path):
    """Every one-line error goes through errors.fail, which masks a URL's password and a secret
    variable's value, whichever check wrote the message (here: a misspelt scheme)."""
    r = cli("backbone=tiny", "task=rte", f"data.glue_dir={glue_dir}", f"hydra.run.dir={tmp_path}/run",
            "tracking.uri=htps://alice:s3cretPW@mlflow.example.com", env={"MY_API_TOKEN": "tok-1234567"})
    assert r.returncode == 2 and "is not an MLflow tracking store" in r.stderr, r.stderr[-2000:]
    assert "s3cretPW" not in r.stderr and "alice:***@" in r.stderr
    r = cli("backbone=tiny", "task=rte", f"data.glue_dir={tmp_path}/tok-1234567", f"hydra.run.dir={tmp_path}/run",
            env={"MY_API_TOKEN": "tok-1234567"})  # the folder's name is the secret's value: masked
    assert r.returncode == 2 and "tok-1234567" not in r.stderr and "***" in r.stderr, r.stderr[-2000:]


def test_a_sweeps_password_stays_out_of_its_parent_and_files(glue_dir, tmp_path, mlflow_server):
    """A sweep's overrides become its parent's params, its note's command, deepen_sweep.json and the
    multirun.yaml artifact: the password of tracking.uri is in none of them, and the sweep resumes."""
    import json

    uri = mlflow_server.replace("http://", "http://alice:s3cretPW@")
    sweep = tmp_path / "sweep"
    common = ["-m", "seed=1,2", "backbone=tiny", "task=rte", "dry_run=true", f"data.glue_dir={glue_dir}",
              f"tracking.uri={uri}", "tracking.experiment=sweepcreds", f"hydra.sweep.dir={sweep}"]
    r = cli(*common)
    assert r.returncode == 0 and "s3cretPW" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    client, runs = runs_of(mlflow_server, "sweepcreds")
    (parent,) = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    assert parent.data.params["tracking.uri"] == uri.replace("s3cretPW", "***")
    for run in runs:
        assert "s3cretPW" not in str(run.data.params) + str(run.data.tags) + run.info.run_name, run.info.run_name
    logged = client.download_artifacts(parent.info.run_id, "multirun.yaml", str(tmp_path))
    assert "alice:***@" in Path(logged).read_text() and "s3cretPW" not in Path(logged).read_text()
    assert "s3cretPW" not in (sweep / "deepen_sweep.json").read_text()
    assert json.loads((sweep / "deepen_sweep.json").read_text())["uri"] == uri.replace("s3cretPW", "***")
    # The file's masked URI is not what the next attempt uses: a resume reaches the store and its parent.
    r = cli(*common, "resume=auto")
    assert r.returncode == 0 and "s3cretPW" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert f"parent run {parent.info.run_id}" in r.stdout


def test_a_second_launcher_of_one_sweep_is_refused_before_any_work(glue_dir, tmp_path):
    """While one launcher holds a sweep dir (its lock, which the kernel drops when it dies), a resume of
    that sweep is one line, exit 2, and touches neither the parent nor deepen_sweep.json."""
    import json

    from deepen_run.sweep.resume import hold

    sweep = tmp_path / "sweep"
    common = ["-m", "seed=1,2", "backbone=tiny", "task=rte", "dry_run=true", f"data.glue_dir={glue_dir}",
              f"hydra.sweep.dir={sweep}", f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    r = cli(*common)
    assert r.returncode == 0, r.stderr[-3000:]
    before = json.loads((sweep / "deepen_sweep.json").read_text())
    client, runs = runs_of(f"sqlite:///{tmp_path}/m.db")
    (parent,) = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    held = hold(sweep)  # this test process is the other launcher
    try:
        r = cli(*common, "resume=auto")
    finally:
        held.close()
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "in use by another launcher" in lines[0] and str(os.getpid()) in lines[0], r.stderr
    assert json.loads((sweep / "deepen_sweep.json").read_text()) == before
    after = client.get_run(parent.info.run_id)
    assert after.info.status == parent.info.status and after.data.tags == parent.data.tags


def test_a_damaged_tokenization_cache_file_is_rebuilt_with_one_warning(glue_dir, tmp_path, capsys):
    from conftest import make_cfg
    from deepen_run.data.glue import TASKS
    from deepen_run.data.loaders import load_task
    from deepen_run.model.backbone import load_tokenizer

    cfg = make_cfg("backbone=tiny", "task=sst2", f"data.glue_dir={glue_dir}", f"data.cache_dir={tmp_path}/cache",
                   "data.max_train_samples=64", "data.max_eval_samples=32", "data.max_seq_length=32")
    tok = load_tokenizer(cfg.backbone)
    first = load_task(TASKS["sst2"], cfg.data, tok, 1).train
    ids, idx = list(first["input_ids"]), list(first["idx"])  # copied: `first` maps the file damaged below
    files = sorted((tmp_path / "cache").glob("sst2-train-*.arrow"))
    assert len(files) == 1
    with open(files[0], "r+b") as f:  # the first 4 KB overwritten
        f.write(b"\0" * 4096)
    capsys.readouterr()
    again = load_task(TASKS["sst2"], cfg.data, tok, 1)
    err = capsys.readouterr().err
    assert "tokenization cache file" in err and "damaged" in err and str(files[0]) in err
    assert list(again.train["input_ids"]) == ids and list(again.train["idx"]) == idx
    from deepen_run.data.loaders import from_cache

    assert from_cache(str(files[0])) is not None  # rebuilt whole


def test_a_tokenizer_changed_in_its_folder_is_not_served_stale_tokens(glue_dir, tmp_path):
    """The cache is keyed by what the tokenizer does, not its path: the same folder, rewritten with
    lower-casing off, tokenizes anew (was: the lower-cased tokens of the first run, silently)."""
    import json

    from conftest import make_cfg
    from deepen_run.data.glue import TASKS
    from deepen_run.data.loaders import load_task
    from deepen_run.model.backbone import load_tokenizer
    from transformers import AutoTokenizer

    cfg = make_cfg("backbone=minilm", "task=rte", f"data.glue_dir={glue_dir}", f"data.cache_dir={tmp_path}/cache",
                   "data.max_train_samples=8", "data.max_eval_samples=8", "data.max_seq_length=32")
    folder = tmp_path / "tok"
    load_tokenizer(cfg.backbone).save_pretrained(folder)

    def dev_ids():
        tok = AutoTokenizer.from_pretrained(folder)
        return tok, load_task(TASKS["rte"], cfg.data, tok, 1, with_train=False).dev["rte"][0]["input_ids"]

    _, lowered = dev_ids()
    for name, where in (("tokenizer.json", ("normalizer", "lowercase")), ("tokenizer_config.json", ("do_lower_case",))):
        spec = json.loads((folder / name).read_text())
        (spec[where[0]] if len(where) == 2 else spec)[where[-1]] = False  # lower-casing off, both ways of saying it
        (folder / name).write_text(json.dumps(spec))
    tok, cased = dev_ids()
    assert tok.decode(cased) != tok.decode(lowered) and "[UNK]" in tok.decode(cased)  # "As" is not in the vocab
    assert len(list((tmp_path / "cache").glob("rte-dev-*.arrow"))) == 2


def test_an_unusable_cache_dir_is_one_line_before_any_weights_load(glue_dir, tmp_path):
    """data.cache_dir under a file (root too), and one without write permission (a non-root user only:
    root's os.access passes; the probe file covers a read-only mount): one line, exit 2."""
    (tmp_path / "afile").write_text("x")
    r = cli("backbone=tiny", "task=rte", f"data.glue_dir={glue_dir}", f"data.cache_dir={tmp_path}/afile/cache")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "data.cache_dir=" in lines[0] and "is a file" in lines[0], r.stderr
    from deepen_run.run.preflight import writable

    assert writable(tmp_path / "new" / "cache") is None and "is a file" in writable(tmp_path / "afile" / "c")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits (run as a non-root user)")
def test_a_read_only_cache_dir_as_a_non_root_user(glue_dir, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = cli("backbone=tiny", "task=rte", f"data.glue_dir={glue_dir}", f"data.cache_dir={ro}/cache")
    finally:
        ro.chmod(0o755)
    assert r.returncode == 2 and "data.cache_dir=" in r.stderr and "not writable" in r.stderr, r.stderr


def test_resume_of_a_run_whose_store_was_deleted_is_one_line(glue_dir, tmp_path):
    """A killed run with a checkpoint; its store then deleted: resume=auto says the run is not in the
    store and what to do, in one line, exit 2, before any weights load; the run dir stays."""
    import signal
    import time

    db = tmp_path / "m.db"
    common = ["backbone=tiny", "task=sst2", f"data.glue_dir={glue_dir}", f"tracking.uri=sqlite:///{db}",
              f"hydra.run.dir={tmp_path}/run", "data.max_train_samples=64", "data.max_eval_samples=32",
              "data.max_seq_length=32", "train.batch_size=8", "train.max_steps=100000", "train.save_every=5"]
    exe = Path(sys.executable).with_name("deepen-run")
    proc = forkserver.popen([str(exe), *common, f"data.cache_dir={tmp_path}/cache"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + HANG
        while not list((tmp_path / "run" / "checkpoints").glob("step-*/trainer_state.json")):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=HANG)
    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
    db.unlink()
    r = cli(*common, "resume=auto", f"data.cache_dir={tmp_path}/cache")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert f"run {run_id} of " in lines[0] and "not in the MLflow store" in lines[0] and "Traceback" not in r.stderr
    assert "restore that store to continue it, or start afresh" in lines[0]  # what to do
    assert list((tmp_path / "run" / "checkpoints").glob("step-*"))


def test_resume_true_with_no_checkpointed_run_to_continue_is_one_line(glue_dir, tmp_path):
    """resume=true must find a run (resume=auto would start afresh): none of this config -> one line, exit 2, no run."""
    uri = f"sqlite:///{tmp_path}/m.db"
    r = cli("backbone=tiny", "task=rte", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", "resume=true",
            f"hydra.run.dir={tmp_path}/run")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert "resume=true: no checkpointed run of this exact config" in lines[0] and "resume=auto" in lines[0]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("deepen-run")
    assert exp is None or not client.search_runs([exp.experiment_id])


@pytest.mark.parametrize("name", ["SIGHUP", "SIGINT", "SIGUSR2"])
def test_a_signal_ends_a_run_killed_with_a_checkpoint(glue_dir, tmp_path, name):
    """A closed terminal (SIGHUP), Ctrl-C (SIGINT) and a scheduler's SIGUSR2 are treated as SIGTERM is
    (tests/test_resume.py: SIGTERM, SIGUSR1): the step is saved, the run ends KILLED, exit 128 + signal."""
    import signal
    import time

    sig = getattr(signal, name)

    uri = f"sqlite:///{tmp_path}/m.db"
    exe = Path(sys.executable).with_name("deepen-run")
    proc = forkserver.popen([str(exe), "backbone=tiny", "task=sst2", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
                             f"hydra.run.dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache",
                             "data.max_train_samples=64", "data.max_eval_samples=32", "data.max_seq_length=32",
                             "train.batch_size=8", "train.max_steps=100000", "train.save_every=5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + HANG
    while not list((tmp_path / "run" / "checkpoints").glob("step-*/trainer_state.json")):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.05)
    proc.send_signal(sig)
    err = proc.communicate(timeout=HANG)[1]
    assert proc.returncode == 128 + sig, err[-3000:]
    client, (run,) = runs_of(uri)
    assert run.info.status == "KILLED" and run.data.tags["interrupted"] == name
    assert "Traceback" not in err and f"stopped by {name}; the run is KILLED, its checkpoint step-" in err


def test_a_signal_ignored_at_start_stays_ignored_as_nohup_and_a_background_job_ask(glue_dir, tmp_path):
    """`nohup deepen-run ... &` from a script starts it with SIGHUP and SIGINT ignored: closing the
    terminal must not stop it. Both reach the run after its first checkpoint and change nothing; the
    SIGTERM sent after them is the one that stops it (the first signal recorded names the stop)."""
    import signal
    import time

    uri = f"sqlite:///{tmp_path}/m.db"
    exe = Path(sys.executable).with_name("deepen-run")
    proc = subprocess.Popen(["nohup", str(exe), "backbone=tiny", "task=sst2", f"data.glue_dir={glue_dir}",
                             f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache",
                             "data.max_train_samples=64", "data.max_eval_samples=32", "data.max_seq_length=32",
                             "train.batch_size=8", "train.max_steps=100000", "train.save_every=5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # a shell's `&`
    deadline = time.time() + HANG
    while not list((tmp_path / "run" / "checkpoints").glob("step-*/trainer_state.json")):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGINT)
    time.sleep(1)  # a recorded signal would stop it at the next step's end, a few ms away
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=HANG)[1]
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM; the run is KILLED" in err, err[-3000:]
    client, (run,) = runs_of(uri)
    assert run.info.status == "KILLED" and run.data.tags["interrupted"] == "SIGTERM"


def test_a_late_dash_m_and_an_absent_report_server_are_one_line(tmp_path):
    r = cli("task=rte", "-m", "seed=1,2")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "-m goes first" in lines[0], r.stderr
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("deepen-report")
    r = subprocess.run([str(exe), "--uri", f"http://u:pw123456@127.0.0.1:{port}"], capture_output=True, text=True,
                       timeout=HANG)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "not reachable" in lines[0] and "pw123456" not in r.stderr, r.stderr


def test_off_a_terminal_no_library_bars_or_accelerate_info_lines(glue_dir, tmp_path):
    r = cli("backbone=tiny", "task=sst2", f"data.glue_dir={glue_dir}", "data.max_train_samples=64",
            "data.max_eval_samples=32", "data.max_seq_length=32", "train.batch_size=8", "train.max_steps=10",
            "train.save_every=5", "train.save_total_limit=2")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "\r" not in out and "saved in" not in out and "Saving current state" not in out, out[-3000:]


def test_an_arm_with_a_method_override_is_one_line():
    for args in (["-m", "+arm=baseline,hire_g1", "method=pals"], ["+arm=baseline", "method=pals", "dry_run=true"]):
        r = cli(*args)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "an arm sets the method" in lines[0], r.stderr


def test_a_backbone_folder_with_remote_code_names_trust_remote_code(tmp_path):
    import json

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert", "auto_map": {
        "AutoModel": "modeling_x.XModel", "AutoConfig": "configuration_x.XConfig"}}))
    r = cli("backbone=minilm", f"backbone.path={tmp_path}/m", "task=rte", "dry_run=true")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "backbone.trust_remote_code=true" in lines[0], r.stderr


def test_a_run_records_its_config_before_its_run_file(tmp_path, glue_dir, monkeypatch):
    """A process killed between writing run.json and run_config.yaml left a run whose config a resume
    read from Hydra's .hydra/config.yaml, which lacks a sweep job's run name: the resume of a SIGKILLed
    joblib sweep was refused as "another config" (seen under load). The config is now written first:
    the process dies here at the moment run.json is written, and run_config.yaml is already there."""
    from deepen_run.run import runner
    from deepen_run.run.preflight import check
    from deepen_run.run.resume import RUN_CONFIG

    home = tmp_path / "run"
    home.mkdir()
    cfg = make_cfg("backbone=tiny", "task=rte", "train.max_steps=2", "data.max_train_samples=16",
                   "data.max_eval_samples=8", "data.max_seq_length=32", "train.mixed_precision=no",
                   f"data.glue_dir={glue_dir}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                   f"data.cache_dir={tmp_path}/cache", "tracking.run_name='seed=1 · job'")

    def died(*_a, **_k):
        raise SystemExit("killed while writing run.json")

    monkeypatch.setattr(runner, "current_dir", lambda: home)
    monkeypatch.setattr(runner.resume, "write_run_file", died)
    with pytest.raises(SystemExit):
        runner.run(cfg, check(cfg))
    assert not (home / "run.json").exists()
    saved = (home / RUN_CONFIG).read_text()
    assert "run_name: seed=1 · job" in saved


def test_a_signal_that_library_code_swallows_still_stops_the_run():
    """datasets' fingerprint hashing catches everything (a bare except): a KeyboardInterrupt raised
    there while a sweep job tokenized its data was lost (seen once in CI). The handler raises nothing
    now: the signal is recorded, and the run's next check stops it."""
    import signal as sig

    from deepen_run.run.stop import Stopped, StopFlag, check

    flag, swallowed = StopFlag().install(), False
    try:
        try:
            os.kill(os.getpid(), sig.SIGINT)  # the process group's Ctrl-C, inside library code
            time.sleep(0.2)
        except BaseException:  # noqa: BLE001 (the library's bare except)
            swallowed = True
        assert not swallowed and flag.signum == sig.SIGINT
        with pytest.raises(Stopped):
            check()  # a step's end (run/checkpoint.py on_step)
    finally:
        flag.uninstall()


def test_a_signal_while_the_sweep_parent_is_being_ended_lets_it_end(tmp_path, mlflow_uri):
    """Ctrl-C among the launcher's closing writes (the counts, the why, the status): raised there, it
    left the parent RUNNING until some later run reaped it. The handler only records it now: the
    parent ends as its jobs say. The signal is a real SIGINT, sent from inside one of those writes."""
    import signal

    from deepen_run.run.stop import SIGNALS, StopFlag
    from deepen_run.sweep.launch import Launch

    class SignalledMidClose(Tracker):
        def set_tags(self, tags):
            if "sweep_failed" in tags:
                os.kill(os.getpid(), signal.SIGINT)
            super().set_tags(tags)

    tracker = SignalledMidClose(mlflow_uri, "sweeps")
    parent = tracker.start("sweep", {"sweep_role": "parent", "sweep_id": "s1"})
    info = {"dir": str(tmp_path), "n_jobs": 1, "sweep_id": "s1", "parent_run_id": parent, "uri": mlflow_uri,
            "experiment": "sweeps", "params": {}}
    (tmp_path / "deepen_jobs").mkdir()
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        launch = Launch(info, tracker).begin(StopFlag())  # a flag that recorded nothing while the sweep opened
        assert launch.close(interrupted=False) == 1  # one job planned, none ended: FAILED
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert launch.signum == signal.SIGINT
    _, (run,) = runs_of(mlflow_uri, "sweeps")
    assert run.info.status == "FAILED" and run.data.tags["sweep_failed"].startswith("1 of 1 jobs failed")
