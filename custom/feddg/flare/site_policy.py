"""The site policy this project asks of a site: which component classes a job without custom code may build.

NVFlare 2.9 builds a job's components only from classes on the site's ``class_allow_list``
(``<site>/local/resources.json``), also in the simulator. A site running these jobs admits the ``feddg``
package and exactly the NVFlare classes the generated jobs use, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from feddg.flare import registry
from feddg.flare.site_limits import egress_limits
from feddg.flare.site_config import SiteConfig
from feddg.jsonfile import read_json_object, write_json

PACKAGE_PREFIX = "feddg."  # a package prefix must end with "." in NVFlare 2.9

# The NVFlare classes the generated jobs build: `feddg.jobs` writes its configs with these names, and a test checks
# that the jobs name exactly these (TensorBoard streaming from the sites to the server).
TB_RECEIVER = "nvflare.app_opt.tracking.tb.tb_receiver.TBAnalyticsReceiver"
TB_WRITER = "nvflare.app_opt.tracking.tb.tb_writer.TBWriter"
FED_EVENT_CONVERTER = "nvflare.app_common.widgets.convert_to_fed_event.ConvertToFedEvent"
JOB_NVFLARE_CLASSES = (TB_RECEIVER, TB_WRITER, FED_EVENT_CONVERTER)

# Components NVFlare 2.9 itself adds to every job's configs in a POC or a provisioned deployment (streaming a
# job's error log to the server); without them a job is refused at the sites even though it never names them.
INJECTED_BY_NVFLARE = (
    "nvflare.app_common.logging.job_log_receiver.JobLogReceiver",
    "nvflare.app_common.logging.job_log_streamer.JobLogStreamer",
)


def component_paths(config: Any) -> set[str]:
    """Every ``path`` of a component in an NVFlare JSON config (nested ones included)."""
    return {entry["path"] for entry in component_entries(config)}


def component_entries(config: Any) -> list[dict[str, Any]]:
    """Every component entry (a mapping with a ``path``) of an NVFlare JSON config, nested ones included, as the
    dicts inside ``config`` (so that a caller may edit their ``args``)."""
    if isinstance(config, dict):
        found = [config] if isinstance(config.get("path"), str) else []
        return found + [entry for value in config.values() for entry in component_entries(value)]
    if isinstance(config, list):
        return [entry for value in config for entry in component_entries(value)]
    return []


def class_allow_list() -> list[str]:
    """The ``feddg`` package prefix plus the NVFlare classes that the generated jobs name or NVFlare adds."""
    return [PACKAGE_PREFIX, *sorted(set(JOB_NVFLARE_CLASSES) | set(INJECTED_BY_NVFLARE))]


def install_resources(local_dir: Path) -> Path:
    """Write ``<local_dir>/resources.json`` so that it admits this project's classes
    (:func:`resources_with_allow_list`)."""
    path = Path(local_dir) / "resources.json"
    _write(path, resources_with_allow_list(local_dir))
    return path


def resources_with_allow_list(local_dir: Path) -> dict[str, Any]:
    """The content ``<local_dir>/resources.json`` should have so that it admits this project's classes; writes
    nothing.

    An existing ``resources.json`` keeps its settings and its own allow-list entries, extended with ours. Without
    one, NVFlare's ``resources.json.default`` of a startup kit is the base (its resource manager and other
    components stay), with its generic allow-list replaced by exactly this project's. ValueError naming the file
    when the one read is not a JSON object with an allow-list and components of the right kind."""
    local_dir = Path(local_dir)
    path = local_dir / "resources.json"
    default = local_dir / "resources.json.default"
    resources: dict[str, Any] = {"format_version": 2}
    allow: list[str] = []
    if path.exists():
        resources = read_json_object(path)
        allow = resources.get("class_allow_list", [])
        if not isinstance(allow, list):
            raise ValueError(f"{path}: class_allow_list must be a list of class names, got {type(allow).__name__}")
        allow = list(allow)
    elif default.exists():
        resources = read_json_object(default)
    components = resources.get("components", [])
    if not isinstance(components, list) or not all(isinstance(c, dict) for c in components):
        read = path if path.exists() else default
        raise ValueError(f"{read}: components must be a list of JSON objects")
    for entry in class_allow_list():
        if entry not in allow:
            allow.append(entry)
    resources["class_allow_list"] = allow
    return resources


# ---------------------------------------------------------------------------------------------------- full policy
# What a hospital installs into its startup kit (``feddg install-policy KIT``), beyond the allow-list above.

EGRESS_FILTER = "feddg.flare.egress_filter.SiteEgressFilter"
PRIVACY_SCOPE = "feddg"


def client_privacy(limits: Mapping[str, int | None] | None = None) -> dict[str, Any]:
    """``privacy.json``: one scope, the default, so every job runs under it whether it names it or not. On every
    task the site's egress filter checks the result against the site's limits (:func:`egress_limits` of
    ``limits``), all written out so that the file shows what is enforced; the methods' incoming task data is checked
    too (ELCFS's amplitude banks). A job naming any other scope is refused by NVFlare."""
    values = egress_limits(**(limits or {}))
    return {
        "scopes": [{
            "name": PRIVACY_SCOPE,
            "properties": {},
            "task_result_filters": [{"path": EGRESS_FILTER, "args": values}],
            "task_data_filters": [
                {"path": c.path, "args": {k: values[k] if v is None else v for k, v in c.args.items()}}
                for c in registry.site_data_filters()
            ],
        }],
        "default_scope": PRIVACY_SCOPE,
    }


def _role_permissions(submit: bool) -> dict[str, str]:
    return {
        "submit_job": "any" if submit else "none",
        "clone_job": "n:submitter" if submit else "none",
        "manage_job": "n:submitter" if submit else "none",
        "download_job": "n:submitter" if submit else "none",
        "view": "any",
        "operate": "o:site",
        "shell_commands": "none",
        "byoc": "none",
        "server-predeployed-flwr": "none",
    }


def authorization() -> dict[str, Any]:
    """``authorization.json`` for the server and every hospital: only leads submit (and manage and download their
    own jobs); nobody may run a job with custom code (``byoc``); members only view. The project admin operates the
    system (start, stop, abort any job) but does not submit."""
    return {
        "format_version": "1.0",
        "permissions": {
            "project_admin": {"submit_job": "none", "clone_job": "none", "manage_job": "any", "download_job": "any",
                              "view": "any", "operate": "any", "shell_commands": "any", "byoc": "none",
                              "server-predeployed-flwr": "none"},
            "org_admin": {**_role_permissions(submit=False), "manage_job": "o:submitter"},
            "lead": _role_permissions(submit=True),
            "member": {"view": "any"},
        },
    }


def detect_gpus() -> tuple[int, int]:
    """(number of GPUs, GiB of the smallest) on this machine; (0, 0) without CUDA."""
    try:
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            return 0, 0
        return n, min(torch.cuda.get_device_properties(i).total_memory for i in range(n)) // 2**30
    except Exception:  # noqa: BLE001 - no usable CUDA is the CPU case
        return 0, 0


def set_gpus(resources: dict[str, Any], num_gpus: int, mem_per_gpu_gib: int) -> None:
    """Name the site's GPUs in NVFlare's GPU resource manager (``num_of_gpus: 0`` on CPU-only hosts)."""
    for component in resources.get("components", []):
        if str(component.get("path", "")).endswith("GPUResourceManager"):
            component.setdefault("args", {}).update(num_of_gpus=int(num_gpus), mem_per_gpu_in_GiB=int(mem_per_gpu_gib))


def _kind(participant_dir: Path) -> str | None:
    startup = participant_dir / "startup"
    if (startup / "fed_server.json").exists():
        return "server"
    if (startup / "fed_client.json").exists():
        return "client"
    return None  # an admin kit: nothing to install


def install_site_policy(kit: Path, num_gpus: int | None = None, mem_per_gpu_gib: int | None = None,
                        limits: Mapping[str, int | None] | None = None) -> list[Path]:
    """Install the project's policy into one startup kit, or into every kit of a provisioned ``prod_NN`` folder.

    Server and clients: ``resources.json`` (allow-list; on clients the GPUs, auto-detected on this machine when
    ``num_gpus`` is None) and ``authorization.json``. Clients also: ``privacy.json`` (with ``limits``, checked
    before anything is written) and, when
    absent, a
    ``feddg_site.json.sample`` to copy and edit. Returns the files written.

    Every file of every kit is read and checked before the first one is written, so a kit with a broken file
    (a ``resources.json`` that is not a JSON object, ...) leaves all kits as they were; the error names the file
    (and with it the kit). Each file is replaced atomically (:func:`feddg.jsonfile.write_json`)."""
    kit = Path(kit)
    privacy = client_privacy(limits)
    kits = [kit] if _kind(kit) else sorted(p for p in kit.iterdir() if p.is_dir() and _kind(p))
    if not kits:
        raise ValueError(f"{kit}: no server or client startup kit here (expected startup/fed_server.json or "
                         f"startup/fed_client.json, or a folder of such kits)")
    if num_gpus is None:
        num_gpus, detected_mem = detect_gpus()
        mem_per_gpu_gib = detected_mem if mem_per_gpu_gib is None else mem_per_gpu_gib
    files: dict[Path, Any] = {}  # every file of every kit, with its new content
    for participant in kits:
        local = participant / "local"
        resources = resources_with_allow_list(local)
        if _kind(participant) == "client":
            set_gpus(resources, num_gpus, mem_per_gpu_gib or 0)
            files[local / "privacy.json"] = privacy
            if not (local / "feddg_site.json").exists():
                files[local / "feddg_site.json.sample"] = SiteConfig().model_dump()  # every key, its default
        files[local / "resources.json"] = resources
        files[local / "authorization.json"] = authorization()
    return [_write(path, content) for path, content in files.items()]


def _write(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, obj, indent=2)
    return path
