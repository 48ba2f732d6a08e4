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
    """The ``feddg`` package prefix plus the NVFlare classes that the generated jobs name."""
    from feddg.jobs import JOBS, render_job

    nvflare_classes: set[str] = set()
    for name in job_names or JOBS:
        for rel, content in render_job(name).items():
            if rel.endswith(".json") and "config_fed_" in rel:
                nvflare_classes |= {p for p in component_paths(json.loads(content)) if p.startswith("nvflare.")}
    return [PACKAGE_PREFIX, *sorted(nvflare_classes)]


def install_resources(local_dir: Path) -> Path:
    """Write (or extend) ``<local_dir>/resources.json`` so that it admits this project's classes.

    An existing file keeps its other settings and its own allow-list entries."""
    local_dir = Path(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    path = local_dir / "resources.json"
    resources: dict[str, Any] = {"format_version": 2}
    if path.exists():
        resources = json.loads(path.read_text())
        if not isinstance(resources, dict):
            raise ValueError(f"{path}: expected a JSON object")
    allow = list(resources.get("class_allow_list", []))
    for entry in class_allow_list():
        if entry not in allow:
            allow.append(entry)
    resources["class_allow_list"] = allow
    path.write_text(json.dumps(resources, indent=2) + "\n")
    return path
