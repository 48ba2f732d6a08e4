"""A real NVFlare FLContext for component tests: real Workspace, app folder with feddg.yaml, and a minimal engine."""

from __future__ import annotations

from pathlib import Path

import yaml
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext, FLContextManager
from nvflare.apis.workspace import Workspace


class Engine:
    """The parts of NVFlare's engine that the components under test call."""

    def __init__(self, root: Path, site: str, components: dict | None = None):
        self._ws = Workspace(root_dir=str(root), site_name=site)
        self.events: list[str] = []
        self.components = dict(components or {})

    def get_workspace(self):
        return self._ws

    def get_component(self, component_id):
        return self.components.get(component_id)

    def fire_event(self, event_type, _fl_ctx):
        self.events.append(event_type)


def make_context(tmp_path: Path, identity: str, exp: dict, job_id: str = "job1",
                 components: dict | None = None) -> tuple[FLContext, Path]:
    """(fl_ctx, run folder) for ``identity`` with ``exp`` as the job's feddg.yaml and ``components`` (id -> object)
    as the job's components."""
    app_root = tmp_path / f"app_{identity}"
    (app_root / "config").mkdir(parents=True, exist_ok=True)
    (app_root / "config" / "feddg.yaml").write_text(yaml.safe_dump(exp))
    ws = tmp_path / "ws" / identity
    for folder in (job_id, "startup", "local"):
        (ws / folder).mkdir(parents=True, exist_ok=True)
    manager = FLContextManager(engine=Engine(ws, identity, components), identity_name=identity, job_id=job_id,
                               private_stickers={FLContextKey.APP_ROOT: str(app_root)})
    return manager.new_context(), ws / job_id
