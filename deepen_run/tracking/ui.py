"""The MLflow UI: experiments open as classic ML experiments with the columns that matter in view,
and `make ui` prints its URL once the server answers.

MLflow 3 shows an experiment as GenAI (training runs hidden behind "Evaluation runs") unless its tag
`mlflow.experimentKind` is `custom_model_development`; the URL parameter workflowType=machine_learning
sets the UI's own switch. The runs table's columns come from a shared view state: the experiment tag
`mlflow.sharedViewState.<key>` (JSON), opened by the URL parameter `viewStateShareKey=<key>`. The table
puts every metric column before the tags, so only tags are selected: `score` (eval/score rounded),
what tells runs apart, and a sweep's swept keys. A sweep job unfolds its parent row.

MLflow's Assistant panel opens by itself over the table on a first visit whenever the page's host is
`localhost` or `127.0.0.1`, and no server setting stops that: `make ui` prints its links on
`localhost.` (the same loopback host, spelled as a fully qualified name) and lets the server accept
that host name (--allowed-hosts, --cors-allowed-origins).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from deepen_run.errors import fail
from deepen_run.masking import mask_uri
from deepen_run.signals import catch

KIND = ("mlflow.experimentKind", "custom_model_development")
VIEW = "deepen-run"  # the share key
VIEW_TAG = f"mlflow.sharedViewState.{VIEW}"
DEFAULT_UI = "http://127.0.0.1:5000"
MAKE_UI = "http://localhost.:5000"  # make ui's links (see above); plain `mlflow ui` does not allow this host
# Tags only: the table puts every selected metric column before the tags, and shows a metric's every
# digit cut off (0.77293577…), so the rounded `score` tag (run/names.py SCORE_TAG) was off screen at
# 1600 px behind eval/score, params/ratio and train/runtime_s. Metrics stay one click away (Columns).
FIRST = ("tags.`score`",)
LAST = ("tags.`method`", "tags.`task`", "tags.`backbone`", "tags.`duplicate_layers`", "tags.`variant`",
        "tags.`seed`", "tags.`dry_run`")


def _swept_before(before: list[str]) -> list[str]:
    """The tag columns a sweep put after FIRST: up to the first metric, or to the LAST columns."""
    rest = before[len(FIRST):] if before[:len(FIRST)] == list(FIRST) else []
    for i, c in enumerate(rest):
        if not c.startswith("tags.") or rest[i:] == [x for x in LAST if x not in rest[:i]]:
            return rest[:i]
    return rest


def apply(client, experiment_id: str, expand: str | None = None, swept: list[str] = ()) -> None:
    """Mark the experiment classic ML, unfold `expand` (a sweep's parent run) and set its default
    columns: the score tag, then the swept keys (`swept`, a starting sweep's tag columns, else the
    latest sweep's), then what tells runs apart."""
    exp = client.get_experiment(experiment_id)
    if exp.tags.get(KIND[0]) != KIND[1]:
        client.set_experiment_tag(experiment_id, *KIND)
    try:
        old = json.loads(exp.tags.get(VIEW_TAG, "{}"))
    except ValueError:
        old = {}
    expanded = dict(old.get("runsExpanded", {})) | ({expand: True} if expand else {})
    swept = [c for c in (list(swept) or _swept_before(old.get("selectedColumns", []))) if c not in FIRST]
    state = {"selectedColumns": [*FIRST, *swept, *(c for c in LAST if c not in swept)],
             "orderByKey": "attributes.start_time", "orderByAsc": False, "runsExpanded": expanded}
    if state != old:
        client.set_experiment_tag(experiment_id, VIEW_TAG, json.dumps(state))


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def serve(store: str, artifacts: str, port: int, experiments: tuple[str, ...] = ("deepen-run", "deepen-probe")) -> int:
    """`make ui`: start `mlflow ui`, wait until it answers, then print where to look."""
    from mlflow.tracking import MlflowClient

    if store.startswith(("http://", "https://")):  # MLFLOW_TRACKING_URI names a server: it serves its own UI
        print(f"{mask_uri(store)} is a tracking server: its UI is {mask_uri(store).rstrip('/')}/ (nothing to start)")
        return 0
    base, shown = f"http://127.0.0.1:{port}", f"http://localhost.:{port}"  # see the module's docstring
    hosts = [f"{h}:{port}" for h in ("localhost.", "localhost", "127.0.0.1")]
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--default-artifact-root", artifacts,
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--allowed-hosts", ",".join(hosts),
           "--cors-allowed-origins", ",".join(f"http://{h}" for h in hosts)]
    # Its own process group, so stop() reaches mlflow's server workers too; SIGTERM (kill, make's
    # forwarding of it, a job scheduler) stops it as Ctrl-C does.
    # MLflow 3's server job runner (background jobs of its GenAI features, a pool of huey worker processes)
    # serves nothing this UI shows: off unless the user turns it on, so the UI starts and idles lighter.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    with socket.socket() as probe:  # else the links printed below would lead to whatever holds the port
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            fail(f"port {port} is not free ({e.strerror}): another server holds it; pick another with "
                 f"make ui UI_PORT=<port>", 1, prog="make ui")
    proc = subprocess.Popen(cmd, start_new_session=True, env=env)
    # Signals only recorded; the waits below stop the server, which no hangup reaches (a session of its own).
    asked: list[int] = []
    catch((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), lambda signum, frame: asked.append(signum))
    while proc.poll() is None and not asked:
        try:
            if urllib.request.urlopen(f"{base}/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.5)
    if asked:
        return stop(proc)
    if proc.poll() is not None:
        return proc.returncode or 1  # it exited before it answered: not a success
    client = MlflowClient(store)
    print(f"\nMLflow UI is up: {shown}  (Ctrl-C stops it; {base} works too, with MLflow's Assistant panel)")
    for name in experiments:
        exp = client.get_experiment_by_name(name)
        if exp is not None:  # experiments made before these settings existed get them now
            apply(client, exp.experiment_id)
            print(f"  {name}: {shown}/#/experiments/{exp.experiment_id}/runs?viewStateShareKey={VIEW}"
                  "&workflowType=machine_learning")
    sys.stdout.flush()
    while proc.poll() is None and not asked:
        time.sleep(0.2)
    return stop(proc) if asked else proc.returncode


def stop(proc: subprocess.Popen, grace_s: float = 15.0) -> int:
    """SIGTERM to the server's process group (the mlflow command and its workers), SIGKILL to what
    is left after grace_s: nothing stays listening on the port."""
    def signal_group(sig) -> bool:
        try:
            os.killpg(proc.pid, sig)
            return True
        except ProcessLookupError:  # no process of the group is left
            return False

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (proc.poll() is None or signal_group(0)):
        time.sleep(0.1)
    signal_group(signal.SIGKILL)
    return proc.wait()


def port_of(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        fail(f"UI_PORT={text} is not a port: give a number from 1 to 65535", 2, prog="make ui")
    return int(text)


if __name__ == "__main__":
    # make ui passes $MLFLOW_TRACKING_URI (else the checkout's store); $MLFLOW_EXPERIMENT_NAME gets its link too
    named = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    sys.exit(serve(sys.argv[1], sys.argv[2], port_of(sys.argv[3]),
                   tuple(dict.fromkeys(("deepen-run", "deepen-probe", *([named] if named else []))))))
