"""MLflow 3's model side of a run: its LoggedModel (the weights it kept, linked to its eval/* scores),
its GLUE files as dataset inputs, the registry's named versions and the system metrics monitor.
With a local store the LoggedModel's folder is written in place, its weights a hard link of the run's
checkpoints/best where those are the weights the scores describe (docs/use-a-model.md).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlparse

from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModelOutput, LoggedModelStatus, Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.file_utils import local_file_uri_to_path

from deepen_run.errors import UserError

MODEL_TYPE = "deepen-run"
MODEL_TAG = "model_id"  # the run's tag naming its LoggedModel
CONTEXT = "mlflow.data.context"  # MLflow's input tag: train / dev / test


def local_dir(uri: str) -> Optional[Path]:
    """The folder behind a file:// artifact URI or a path (None for mlflow-artifacts:/, s3://, ...: a
    remote artifact store, reached through the client)."""
    return Path(local_file_uri_to_path(uri)) if urlparse(uri).scheme in ("file", "") else None


def log_model(tracker, name: str, tags: dict[str, str], params: dict[str, str], fill: Callable[[Path], None],
              step: int, datasets: Optional[dict[str, tuple[str, str]]] = None) -> str:
    """Create the run's LoggedModel, fill its artifact folder with fill(folder), link the run's latest
    eval/* values to it and mark it READY. -> the model id. datasets: eval name (sst2, mnli-m) ->
    (dataset name, digest) of the dev set its eval/<name>/* metrics were measured on."""
    client: MlflowClient = tracker.client
    model = client.create_logged_model(tracker.experiment_id, name=name, source_run_id=tracker.run_id, tags=tags,
                                       params={k: str(v)[:6000] for k, v in params.items()}, model_type=MODEL_TYPE)
    try:
        where = local_dir(model.artifact_location)
        if where is not None:
            where.mkdir(parents=True, exist_ok=True)
            fill(where)
        else:  # a remote artifact store: write locally, upload, drop the local copy
            with tempfile.TemporaryDirectory() as tmp:
                fill(Path(tmp))
                client.log_model_artifacts(model.model_id, tmp)
        link_metrics(client, tracker.run_id, model.model_id, datasets or {})
        client.log_outputs(tracker.run_id, [LoggedModelOutput(model.model_id, step)])
        client.set_tag(tracker.run_id, MODEL_TAG, model.model_id)
        client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    except BaseException:  # a model that never became READY says so (not PENDING for ever)
        client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        raise
    return model.model_id


def link_metrics(client: MlflowClient, run_id: str, model_id: str, datasets: dict[str, tuple[str, str]]) -> None:
    """The run's latest eval/* values, logged again with the model's id and their own timestamp and
    step: MLflow keeps a metric already in the run once (same key, value, step and timestamp), and
    records the model's link to it, so the Models tab shows eval/score without a second history point.
    A task's own metrics name the dev set they were measured on (the Models tab's Dataset column)."""
    keys = [k for k in client.get_run(run_id).data.metrics if k.startswith("eval/")]
    latest = []
    for k in keys:
        hist = client.get_metric_history(run_id, k)
        last = max(hist, key=lambda m: (m.step, m.timestamp))
        name, digest = datasets.get(k.split("/")[1], (None, None)) if k.count("/") == 2 else (None, None)
        latest.append(Metric(k, last.value, last.timestamp, last.step, model_id=model_id, dataset_name=name,
                             dataset_digest=digest))
    if latest:
        client.log_batch(run_id, metrics=latest)


def model_of_run(uri: str, run_id: str) -> Optional[str]:
    """The LoggedModel a run published (the tag log_model sets), or None."""
    return MlflowClient(tracking_uri=uri).get_run(run_id).data.tags.get(MODEL_TAG) or None


def run_exists(uri: str, run_id: str) -> bool:
    """Is this run in the store (a resume's run.json, a --run, may name one of a store since deleted)?"""
    try:
        MlflowClient(tracking_uri=uri).get_run(run_id)
        return True
    except MlflowException:
        return False


def model_files(uri: str, model_id: str) -> Path:
    """A local folder holding the LoggedModel's files: MLflow gives a local artifact store's folder
    itself, and downloads a remote one's into a temporary folder."""
    from mlflow.artifacts import download_artifacts

    try:
        model = MlflowClient(tracking_uri=uri).get_logged_model(model_id)
    except MlflowException as e:
        raise UserError(f"no logged model {model_id!r} in {uri}") from e
    return Path(download_artifacts(artifact_uri=model.artifact_location, tracking_uri=uri))


def resolve_models_uri(uri: str, models_uri: str) -> str:
    """models:/<model id> or models:/<registered name>@<alias> | /<version> -> the model id."""
    rest = models_uri[len("models:/"):]
    client = MlflowClient(tracking_uri=uri)
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        elif "/" in rest:
            name, version = rest.split("/", 1)
            mv = client.get_model_version(name, version)
        else:
            return rest
        # A version made from a LoggedModel names it; the SQL store leaves model_id empty: its run's tag says.
        return mv.model_id or model_of_run(uri, mv.run_id)
    except MlflowException as e:
        raise UserError(f"{models_uri}: not in the model registry of {uri}") from e


def register(uri: str, run_id: str, name: str, alias: str = "champion") -> tuple[str, str]:
    """Register a run's LoggedModel as a new version of `name` with `alias`. -> (version, model id)."""
    model_id = model_of_run(uri, run_id)
    if model_id is None:
        raise UserError(f"run {run_id} has no logged model (it kept no weights: train.save_best=true keeps them)")
    client = MlflowClient(tracking_uri=uri)
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        try:  # a name already registered gets a version; a prompt's name is taken, and is no model
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            client.get_registered_model(name)  # raises for a prompt's name
        except MlflowException:
            raise UserError(f"--register {name!r}: {str(e).splitlines()[0]}") from e
    # The model's artifact location as the source, not models:/<id>: MLflow resolves that one through
    # the process-wide tracking URI, not this client's store.
    logged = client.get_logged_model(model_id)
    # The version carries the model's own tags (method, duplicated layers, variant): what it is shows
    # in the registry too, not only in the Models tab.
    own = {k: v for k, v in logged.tags.items() if not k.startswith("mlflow.")}
    version = client.create_model_version(name, logged.artifact_location, run_id=run_id, model_id=model_id, tags=own)
    client.set_registered_model_alias(name, alias, version.version)
    # What mlflow.register_model does besides: the model lists its versions (the Models tab's column).
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    listed = json.loads(client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
        listed + [{"name": name, "version": version.version}])})
    return version.version, model_id


def dataset_input(name: str, context: str, path: Path, digest: str) -> DatasetInput:
    """A GLUE file as MLflow dataset input: a local source (its path), data/fingerprint.py's SHA-256
    (its first 32 hex digits: MLflow's digest column holds 36 characters) as the digest. The entity
    is built directly, as MLflow's local dataset source writes it ({"uri": path})."""
    ds = Dataset(name=name, digest=short_digest(digest), source_type="local", source=json.dumps({"uri": str(path)}))
    return DatasetInput(ds, tags=[InputTag(CONTEXT, context)])


def short_digest(digest: str) -> str:
    """data/fingerprint.py's "<size>:<sha256>" -> the SHA-256's first 32 hex digits."""
    return digest.split(":")[-1][:32]


def log_datasets(tracker, inputs: list[DatasetInput], tries: int = 5) -> None:
    """Link the run to its dataset inputs. Parallel jobs log the same GLUE files at once, and MLflow's
    SQL store looks the experiment's datasets up before inserting the rest: the later of two jobs hits
    the UNIQUE constraint. Tried again, it finds them there and only links them."""
    if not (tracker.enabled and tracker.run_id and inputs):
        return
    for attempt in range(tries):
        try:
            return tracker.client.log_inputs(tracker.run_id, datasets=inputs)
        except MlflowException as e:
            if "UNIQUE constraint failed: datasets" not in str(e) or attempt == tries - 1:
                raise


def system_metrics(tracker, on: bool):
    """MLflow's CPU, memory, disk and GPU monitor (system/* metrics) for one run, started (its finish()
    stops it); None when off."""
    if not (on and tracker.enabled and tracker.run_id):
        return None
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    # every 10 s unless MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL says otherwise (MLflow reads it)
    monitor = SystemMetricsMonitor(tracker.run_id, tracking_uri=tracker.uri, resume_logging=True)
    monitor.start()
    return monitor


def copy_or_link(src: Path, dst: Path) -> None:
    """dst becomes src's bytes: a hard link where both sit on one file system, else a copy."""
    try:
        dst.hardlink_to(src)
    except OSError:
        shutil.copyfile(src, dst)
