"""The server's copy of the training sites' final local models, kept for MLA only where a site opted in.

MLA (MLA-BIN, Eq. 4) combines the sites' *local* models l_i, which plain FedAvg never keeps. A site lets the server
keep its final local model by setting ``"share_local_model": true`` in its own ``local/feddg_site.json``
(:mod:`feddg.flare.site_config`); its executor then flags the training result
(:data:`feddg.flare.mla.payloads.SHARE_LOCAL_MODEL`), and
:class:`LocalModelKeeper`, which :class:`feddg.flare.controller.LeaveOneSiteOutFedAvg` hands the final round's
results, stores the flagged updates here as soon as each arrives. :class:`feddg.flare.mla.workflow.MLAWorkflow` reads
them after training.

    <server run folder>/mla_local_models/
      index.json       which site is in which file, the round, the site's training-set size; the sites whose
                       final update came without the flag ("declined")
      site_00.pt ...   one state dict (torch.save of plain tensors) per site

Site names may contain any character, so files are numbered and the index maps each site to its file. Each model
file is written to a temporary name and renamed into place, then the index is rewritten atomically
(:func:`feddg.jsonfile.write_json`): a model listed in the index is complete.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from feddg.flare.constants import FedDGMeta
from feddg.flare.controller import cast_like
from feddg.flare.updates import UpdateRejected, check_update
from feddg.jsonfile import read_json, write_json
from feddg.flare.mla.payloads import SHARE_LOCAL_MODEL

LOCAL_MODELS_DIR = "mla_local_models"
INDEX_FILE = "index.json"
FORMAT = "feddg-mla-local-models"
OPT_IN_HINT = 'to opt in, the site sets "share_local_model": true in its own local/feddg_site.json'


class LocalModelStore:
    """The folder of kept local models (created on the first write). Safe to call from several threads (NVFlare
    may hand results of different sites to the server workflow concurrently)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ index
    def index(self) -> dict[str, Any]:
        data = read_json(self.folder / INDEX_FILE)
        if data.get("format") != FORMAT or not isinstance(data.get("sites"), dict):
            return {"format": FORMAT, "sites": {}, "declined": []}
        data.setdefault("declined", [])
        return data

    def sites(self) -> list[str]:
        """The sites whose local model is kept, in the order they arrived."""
        return list(self.index()["sites"])

    def declined(self) -> list[str]:
        """The sites whose final update came without the opt-in flag."""
        return list(self.index()["declined"])

    def _write_index(self, index: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / INDEX_FILE, index, indent=2)

    # ------------------------------------------------------------------ writing
    def save(self, site: str, params: Mapping[str, Any], round_: int, num_train_samples: Any = None) -> Path:
        """Store ``site``'s full local weights (arrays or tensors) and list them in the index."""
        state = {k: torch.as_tensor(np.array(v)) if not isinstance(v, torch.Tensor) else v.detach().cpu().clone()
                 for k, v in params.items()}
        with self._lock:
            index = self.index()
            entry = index["sites"].get(site)
            if entry is not None:
                rel = entry["file"]
            else:
                used = {e["file"] for e in index["sites"].values()}
                rel = next(f"site_{i:02d}.pt" for i in range(len(used) + 1) if f"site_{i:02d}.pt" not in used)
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / rel
            tmp = self.folder / f".{rel}.tmp"
            torch.save(state, tmp)
            os.replace(tmp, path)
            n = num_train_samples if isinstance(num_train_samples, (int, float)) and not isinstance(
                num_train_samples, bool) else None
            index["sites"][site] = {"file": rel, "round": int(round_), "num_train_samples": n}
            index["declined"] = [s for s in index["declined"] if s != site]
            self._write_index(index)
            return path

    def decline(self, site: str) -> None:
        """Record that ``site``'s final update came without the opt-in flag (and drop any model kept for it)."""
        with self._lock:
            index = self.index()
            self._drop(index, site)
            if site not in index["declined"]:
                index["declined"].append(site)
            self._write_index(index)

    def discard(self, site: str) -> None:
        """Forget ``site``'s kept model (its update was rejected after all)."""
        with self._lock:
            index = self.index()
            if site in index["sites"]:
                self._drop(index, site)
                self._write_index(index)

    def _drop(self, index: dict[str, Any], site: str) -> None:
        entry = index["sites"].pop(site, None)
        if entry is not None:
            try:
                (self.folder / entry["file"]).unlink()
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ reading
    def load(self, site: str) -> dict[str, torch.Tensor]:
        entry = self.index()["sites"].get(site)
        if entry is None:
            raise KeyError(f"no local model of site {site!r} is kept in {self.folder}")
        sd = torch.load(self.folder / entry["file"], map_location="cpu", weights_only=True)
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise ValueError(f"{self.folder / entry['file']}: not a state dict of tensors")
        return sd


class LocalModelKeeper(FLComponent):
    """MLA's :class:`~feddg.flare.controller.FinalRoundReceiver`: in the final round, stores the local model of every
    training site whose update carries ``share_local_model: true`` (set by the site's executor from the site's own
    ``local/feddg_site.json``; a job cannot opt a site in) in ``<run folder>/mla_local_models/``
    (:class:`LocalModelStore`), each as soon as it arrives. A WEIGHT_DIFF update is stored as received global model +
    difference. Sites that did not opt in are named in the log; an update the round rejects is forgotten."""

    def __init__(self) -> None:
        super().__init__()
        self._store: LocalModelStore | None = None

    def handle_event(self, event_type: str, fl_ctx: FLContext) -> None:
        if event_type == EventType.START_RUN:
            run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
            self._store = LocalModelStore(os.path.join(run_dir, LOCAL_MODELS_DIR))

    @property
    def store(self) -> LocalModelStore:
        if self._store is None:
            raise RuntimeError("the local model keeper has not seen the start of the run")
        return self._store

    def receive(self, result: FLModel, sent: Mapping[str, Any], round_: int) -> None:
        site = (result.meta or {}).get("client_name", "?")
        if (result.meta or {}).get(SHARE_LOCAL_MODEL) is not True:
            self.store.decline(site)
            self.logger.info(f"round {round_}: site {site} did not opt in to share its local model, so the server "
                             f"does not keep it and MLA will leave {site} out ({OPT_IN_HINT})")
            return
        try:
            check_update(result.params, sent)
        except UpdateRejected:
            return  # the round rejects it and says why
        params = result.params
        if result.params_type == ParamsType.DIFF:
            params = {k: cast_like(np.asarray(sent[k]) + np.asarray(v), sent[k]) for k, v in params.items()}
        path = self.store.save(site, params, round_, result.meta.get(FedDGMeta.NUM_TRAIN_SAMPLES))
        self.logger.info(f"round {round_}: kept the local model of site {site} for MLA ({path})")

    def discard(self, site: str) -> None:
        self.store.discard(site)

