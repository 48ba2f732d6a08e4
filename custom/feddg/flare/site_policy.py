"""The site policy this project asks of a site: which component classes a job without custom code may build.

NVFlare 2.9 builds a job's components only from classes on the site's ``class_allow_list``
(``<site>/local/resources.json``), also in the simulator. A site running these jobs admits the ``feddg``
package and exactly the NVFlare classes the generated jobs use, nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

PACKAGE_PREFIX = "feddg."  # a package prefix must end with "." in NVFlare 2.9

# Components NVFlare 2.9 itself adds to every job's configs in a POC or a provisioned deployment (streaming a
# job's error log to the server); without them a job is refused at the sites even though it never names them.
INJECTED_BY_NVFLARE = (
    "nvflare.app_common.logging.job_log_receiver.JobLogReceiver",
    "nvflare.app_common.logging.job_log_streamer.JobLogStreamer",
)


def component_paths(config: Any) -> set[str]:
    """Every ``path`` of a component in an NVFlare JSON config (nested ones included)."""
    found: set[str] = set()
    if isinstance(config, dict):
        if isinstance(config.get("path"), str):
            found.add(config["path"])
        for value in config.values():
            found |= component_paths(value)
    elif isinstance(config, list):
        for value in config:
            found |= component_paths(value)
    return found


def class_allow_list(job_names: Iterable[str] | None = None) -> list[str]:
    """The ``feddg`` package prefix plus the NVFlare classes that the generated jobs name or NVFlare adds."""
    from feddg.jobs import JOBS, render_job

    nvflare_classes: set[str] = set()
    for name in job_names or JOBS:
        for rel, content in render_job(name).items():
            if rel.endswith(".json") and "config_fed_" in rel:
                nvflare_classes |= {p for p in component_paths(json.loads(content)) if p.startswith("nvflare.")}
    return [PACKAGE_PREFIX, *sorted(nvflare_classes | set(INJECTED_BY_NVFLARE))]


def install_resources(local_dir: Path) -> Path:
    """Write ``<local_dir>/resources.json`` so that it admits this project's classes.

    An existing ``resources.json`` keeps its settings and its own allow-list entries, extended with ours. Without
    one, NVFlare's ``resources.json.default`` of a startup kit is the base (its resource manager and other
    components stay), with its generic allow-list replaced by exactly this project's."""
    local_dir = Path(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    path = local_dir / "resources.json"
    default = local_dir / "resources.json.default"
    resources: dict[str, Any] = {"format_version": 2}
    allow: list[str] = []
    if path.exists():
        resources = _read_object(path)
        allow = list(resources.get("class_allow_list", []))
    elif default.exists():
        resources = _read_object(default)
    for entry in class_allow_list():
        if entry not in allow:
            allow.append(entry)
    resources["class_allow_list"] = allow
    path.write_text(json.dumps(resources, indent=2) + "\n")
    return path


def _read_object(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
