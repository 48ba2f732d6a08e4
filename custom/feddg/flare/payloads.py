"""What may travel between a site and the server, as DXOs, and the checks that enforce it: the contracts of the
tasks every method has, and the envelope every payload travels in.

Builders and checks live together so that the executor that builds a payload, the job's filters, the site's egress
filter (:mod:`feddg.flare.egress_filter`) and the server agree on one definition; a method's own payloads live in
its folder (``feddg.flare.<method>.payloads``) with the same shape. The checks raise :class:`PayloadRejected` with a
reason that names what is wrong but never carries the values.

  * ``train`` result: DXO ``WEIGHTS`` or ``WEIGHT_DIFF`` with exactly the keys and shapes of the job's network,
      finite numbers (:func:`feddg.flare.updates.check_update`, the one "weights fit the network" check), at most
      a site's parameter budget; meta: scalars under :data:`TRAIN_META`.
  * ``evaluate`` result: DXO ``METRICS``, nested summaries of scalars, per split; a split's summary may carry the
      per-case scores under :data:`CASES` (:func:`case_scores`: Dice, HD95 and ASD of each structure by an
      anonymous index, never a case id or a file name); meta :data:`EVALUATE_META`.
  * ``site_info`` result: DXO ``METRICS`` with two short strings (feddg version, preprocessing hash).
  * the results of these three tasks name the run their site process serves (:data:`RUN_META`, a random id the
      server drew; :func:`run_of`, :func:`with_run`).
  * every payload (:func:`check_envelope`): nothing outside the DXO and its headers, no arrays in the headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, MetaKey, from_shareable
from nvflare.apis.shareable import ReservedHeaderKey, Shareable


from feddg.flare.constants import FedDGMeta
from feddg.flare.updates import UpdateRejected, check_update

_DXO_KEY = "DXO"  # where DXO.to_shareable stores the payload
_HEADERS_KEY = ReservedHeaderKey.HEADERS
# Meta keys NVFlare itself may add to a DXO on its way out.
NVFLARE_META = {MetaKey.FILTER_HISTORY}

# Scalars the results of the shared tasks may carry in their metadata; each names the run its site serves.
RUN_META = {FedDGMeta.RUN_ID}
TRAIN_META = {FedDGMeta.NUM_TRAIN_SAMPLES, FedDGMeta.VAL_DICE, FedDGMeta.VAL_LOSS, FedDGMeta.TRAIN_LOSS,
              MetaKey.NUM_STEPS_CURRENT_ROUND} | RUN_META
EVALUATE_META = {FedDGMeta.MODEL_NAME, FedDGMeta.ROUND} | RUN_META


CASES = "cases"  # key of the per-case scores in an evaluate result's split summary
CASE_METRICS = ("dice", "hd95", "asd")


def case_scores(cases: Sequence[Mapping[str, Any]], label_names: Sequence[str]) -> dict[str, Any]:
    """The per-case scores of one split as they travel: ``{"0": {structure: {"dice", "hd95", "asd"}}, "1": ...}``
    in evaluation order (:func:`feddg.evaluation.evaluate_sliceset`'s ``cases``, whose structures are keyed by index);
    the case ids and empty-mask flags stay at the site. The index is stable for a site's split across runs of one
    experiment (the splits do not depend on the method or the seed), which is what pairs two methods' scores."""
    return {str(i): {name: {m: float(case[str(l)][m]) for m in CASE_METRICS} for l, name in enumerate(label_names)}
            for i, case in enumerate(cases)}


def with_case_scores(result: Mapping[str, Any], label_names: Sequence[str], share: bool) -> dict[str, Any]:
    """One split's entry of the evaluate result from :func:`feddg.evaluation.evaluate_sliceset`'s output: the
    summary, plus the per-case scores when the site shares them (its ``share_case_scores``)."""
    summary = dict(result["summary"])
    if share:
        summary[CASES] = case_scores(result["cases"], label_names)
    return summary


def check_case_scores(split: str, summary: Mapping[str, Any]) -> None:
    """The per-case scores of one split's summary, when present: consecutive indices "0".."n-1", each holding the
    summary's structures with exactly Dice, HD95 and ASD as finite numbers, as many cases as the summary counts."""
    cases = summary.get(CASES)
    if cases is None:
        return
    if not isinstance(cases, Mapping):
        raise PayloadRejected(f"split {split}: the per-case scores are not a mapping")
    if list(cases) != [str(i) for i in range(len(cases))]:
        raise PayloadRejected(f"split {split}: per-case scores must be keyed by the indices 0..n-1, nothing else")
    structures = {k for k, v in summary.items() if isinstance(v, Mapping) and "n_cases" in v}
    for name in structures:
        if summary[name]["n_cases"] != len(cases):
            raise PayloadRejected(f"split {split}: {len(cases)} per-case scores for {summary[name]['n_cases']} cases")
    for index, case in cases.items():
        if not isinstance(case, Mapping) or set(case) != structures:
            raise PayloadRejected(f"split {split}, case {index}: expected the structures {sorted(structures)}")
        for name, values in case.items():
            if not isinstance(values, Mapping) or set(values) != set(CASE_METRICS):
                raise PayloadRejected(f"split {split}, case {index}, {name}: expected exactly {list(CASE_METRICS)}")
            if not all(_is_finite_number(v) for v in values.values()):
                raise PayloadRejected(f"split {split}, case {index}, {name}: the scores must be finite numbers")


def smallest_cap(*caps: int | None) -> int | None:
    """The tightest of the caps a job and a site set on a payload (None: no cap set)."""
    given = [c for c in caps if c is not None]
    return min(given) if given else None


class PayloadRejected(ValueError):
    """A payload is not what the task may carry; the message says why (never the values)."""

def _is_finite_number(value: Any) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and bool(np.isfinite(value)))


def _is_scalar(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, np.integer, np.floating)):
        return True
    return isinstance(value, str) and len(value) <= 256


def check_scalar_meta(dxo: DXO, allowed: set[str], max_list: int = 0) -> None:
    """Meta keys are among ``allowed`` and hold scalars (or, with ``max_list``, short lists / maps of scalars)."""
    for key, value in (dxo.meta or {}).items():
        if key in NVFLARE_META:
            continue
        if key not in allowed:
            raise PayloadRejected(f"meta key {key!r} is not one this task may send")
        if _is_scalar(value):
            continue
        items = list(value.values()) if isinstance(value, Mapping) else value
        if (max_list and isinstance(items, (list, tuple)) and len(items) <= max_list
                and all(_is_scalar(v) for v in items)
                and (not isinstance(value, Mapping) or all(isinstance(k, str) and len(k) <= 256 for k in value))):
            continue
        raise PayloadRejected(f"meta {key!r} is not a scalar")


def check_weights_payload(dxo: DXO, reference: Mapping[str, np.ndarray], max_parameters: int) -> None:
    """Model weights or weight differences that fit the reference network: numpy arrays of integers or floats
    with exactly its keys and shapes, finite (:func:`feddg.flare.updates.check_update`), at most
    ``max_parameters`` values."""
    if dxo.data_kind not in (DataKind.WEIGHTS, DataKind.WEIGHT_DIFF):
        raise PayloadRejected(f"expected model weights or weight differences, got {dxo.data_kind}")
    if not isinstance(dxo.data, dict):
        raise PayloadRejected("the weights are not a mapping")
    for name, value in dxo.data.items():
        if not isinstance(value, np.ndarray):
            raise PayloadRejected(f"parameter {name!r} is not an array")
        if value.dtype.kind not in "fiu":
            raise PayloadRejected(f"parameter {name!r} has dtype {value.dtype}")
    try:
        check_update(dxo.data, reference, against="the job's network")
    except UpdateRejected as e:
        raise PayloadRejected(str(e)) from None
    total = sum(value.size for value in dxo.data.values())
    if total > max_parameters:
        raise PayloadRejected(f"{total} values exceed the site's limit of {max_parameters} parameters")


def check_metrics_payload(dxo: DXO, max_values: int = 10_000, max_depth: int = 6) -> None:
    """METRICS: nested mappings whose leaves are scalars; no arrays, a bounded number of values."""
    if dxo.data_kind != DataKind.METRICS:
        raise PayloadRejected(f"expected metrics, got {dxo.data_kind}")
    count = 0

    def walk(node: Any, depth: int) -> None:
        nonlocal count
        if depth > max_depth:
            raise PayloadRejected("metrics nest too deeply")
        if isinstance(node, Mapping):
            for key, value in node.items():
                if not isinstance(key, str) or len(key) > 256:
                    raise PayloadRejected("metric names must be short strings")
                walk(value, depth + 1)
            return
        if not _is_scalar(node):
            raise PayloadRejected(f"a metric value is a {type(node).__name__}, not a scalar")
        count += 1
        if count > max_values:
            raise PayloadRejected(f"more than {max_values} metric values")

    walk(dxo.data, 0)


def check_train_result(dxo: DXO | None, reference: Mapping[str, np.ndarray], max_parameters: int,
                       method_meta: Iterable[str] = ()) -> None:
    """The ``train`` result: the site's weights (or their difference) and scalar metadata under
    :data:`TRAIN_META` and the keys the methods add (``method_meta``)."""
    dxo = required(dxo)
    check_weights_payload(dxo, reference, max_parameters)
    check_scalar_meta(dxo, TRAIN_META | set(method_meta))


def check_evaluate_result(dxo: DXO | None) -> None:
    """The ``evaluate`` result: metric summaries of the model it received."""
    dxo = required(dxo)
    check_split_summaries(dxo)
    check_scalar_meta(dxo, EVALUATE_META)


def check_split_summaries(dxo: DXO) -> None:
    """METRICS holding one summary per split, each with its per-case scores when present (:func:`case_scores`)."""
    check_metrics_payload(dxo)
    for split, summary in dxo.data.items():
        if isinstance(summary, Mapping):
            check_case_scores(split, summary)


def check_site_info_result(dxo: DXO | None) -> None:
    """The ``site_info`` result: the site's feddg version and preprocessing hash."""
    dxo = required(dxo)
    check_metrics_payload(dxo, max_values=2)
    check_scalar_meta(dxo, RUN_META)


def run_of(shareable: Shareable) -> str | None:
    """The run a task or a result names (:attr:`FedDGMeta.RUN_ID` in its DXO's meta); None when it names none or
    carries no DXO."""
    raw = shareable.get(_DXO_KEY)
    meta = raw.get("meta") if isinstance(raw, Mapping) else None
    run = meta.get(FedDGMeta.RUN_ID) if isinstance(meta, Mapping) else None
    return None if run is None else str(run)


def with_run(reply: Shareable, run: str) -> Shareable:
    """``reply`` with ``run`` named in its DXO's meta; a reply without a DXO (an error) as it is."""
    if _DXO_KEY not in reply:
        return reply
    dxo = from_shareable(reply)
    dxo.set_meta_prop(FedDGMeta.RUN_ID, run)
    dxo.update_shareable(reply)
    return reply


def required(dxo: DXO | None) -> DXO:
    if dxo is None:
        raise PayloadRejected("no DXO")
    return dxo

def check_envelope(shareable: Shareable) -> DXO | None:
    """The Shareable carries nothing outside its DXO and its headers, and no array hides in a header.

    Returns the DXO, or None for a reply without one (an error reply carries nothing)."""
    extra = sorted(str(k) for k in shareable.keys() if k not in (_DXO_KEY, _HEADERS_KEY))
    if extra:
        raise PayloadRejected(f"unexpected top-level keys {extra[:5]} next to the DXO")
    headers = shareable.get(_HEADERS_KEY) or {}
    for key, value in headers.items():
        if key == ReservedHeaderKey.PEER_CTX:  # NVFlare's own context, set by the framework
            continue
        if holds_bulk_data(value):
            raise PayloadRejected(f"header {key!r} carries array data")
    if _DXO_KEY not in shareable:
        return None
    try:
        raw = shareable[_DXO_KEY]
        return DXO(data_kind=raw["kind"], data=raw["data"], meta=raw.get("meta"))
    except (KeyError, TypeError, ValueError) as e:
        raise PayloadRejected(f"malformed DXO: {e}") from e


def holds_bulk_data(value: Any, depth: int = 0) -> bool:
    if isinstance(value, (np.ndarray, bytes, bytearray, memoryview)) or type(value).__module__.startswith("torch"):
        return True
    if depth > 3:
        return True
    if isinstance(value, Mapping):
        return any(holds_bulk_data(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return len(value) > 16 or any(holds_bulk_data(v, depth + 1) for v in value)
    return False

def check_declared_meta(dxo: DXO, allowed: Iterable[str]) -> None:
    extra = sorted(set(dxo.meta or {}) - set(allowed) - NVFLARE_META)
    if extra:
        raise PayloadRejected(f"unexpected meta keys {extra}")
    for key, value in (dxo.meta or {}).items():
        if key in NVFLARE_META:
            continue
        if holds_bulk_data(value) or (isinstance(value, (list, tuple)) and len(value) > 2):
            raise PayloadRejected(f"meta {key!r} carries more than a scalar or a pair")
