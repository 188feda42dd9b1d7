"""The GLUE leaderboard zip: predict=true over the bundled tasks writes submission/glue_submission.zip
with the server's file names, the missing ones named in one line; deepen-report --submission gathers
the same from runs."""
import io
import zipfile

import pytest

from conftest import cli, runs_of
from deepen_run.run.submission import SERVER_FILES

pytestmark = [pytest.mark.e2e, pytest.mark.subprocess]

# The names the GLUE server takes (gluebenchmark.com's submission instructions), in its order.
GLUE_SERVER = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "MNLI-mm", "QNLI", "RTE", "WNLI", "AX")
BUNDLED = ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"]  # the tasks with train.tsv in the bundle


def test_server_file_names():
    assert SERVER_FILES == GLUE_SERVER


def test_predict_over_the_bundled_tasks_writes_one_zip(glue_dir, mlflow_uri, tmp_path, capsys):
    r = cli("backbone=tiny", f"task.names=[{','.join(BUNDLED)}]", "predict=true", "data.max_train_samples=16",
            "data.max_eval_samples=16", "data.max_seq_length=32", "train.max_steps=6", "train.batch_size=4",
            f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}", env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "glue_submission.zip: missing 5 of 11: QQP, MNLI-m, MNLI-mm, QNLI, AX" in r.stdout
    client, (run,) = runs_of(mlflow_uri)
    local = client.download_artifacts(run.info.run_id, "submission/glue_submission.zip", str(tmp_path))
    with zipfile.ZipFile(local) as z:
        names = z.namelist()
        assert names == ["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "RTE.tsv", "WNLI.tsv"]
        assert set(n[:-4] for n in names) <= set(GLUE_SERVER)
        sst2 = z.read("SST-2.tsv").decode().splitlines()
        rte = z.read("RTE.tsv").decode().splitlines()
    assert sst2[0] == "index\tprediction" and len(sst2) == 1 + 1821
    assert {ln.split("\t")[1] for ln in rte[1:]} <= {"entailment", "not_entailment"}

    out = tmp_path / "leaderboard.zip"
    from deepen_run.report.main import main

    capsys.readouterr()
    main(["--uri", mlflow_uri, "--submission", str(out)])
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"wrote {out} (6 files); missing 5 of 11: QQP, MNLI-m, MNLI-mm, QNLI, AX"
    with zipfile.ZipFile(io.BytesIO(out.read_bytes())) as z:
        assert z.namelist() == names and z.read("SST-2.tsv").decode().splitlines() == sst2
