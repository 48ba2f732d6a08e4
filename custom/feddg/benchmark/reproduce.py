"""The reproduce check: runs of new code join a results folder only when the new code repeats the folder's runs.

A folder holds one code version: every run records the fingerprint of the code that ran it
(:func:`feddg.report.code_fingerprint`), and a sweep whose code differs from the folder's runs is refused, unless
the check first re-runs one finished cell of every method the folder holds (seed 0 where it can, on its quickest
held-out site: :func:`reproduce_cells`) with the new code and every per-case score of each comes out identical.
The evidence (each method's cell, CPU model and result) goes to ``sweep.json`` (``code_evidence``), whatever the
result: a change that touches one method's code path is caught by that method's cell. A run repeats only on its CPU
family (maker and kernels: :func:`feddg.numerics.numbers_family`), so the check re-runs cells of this machine's
family, and a code is admitted per family (:func:`admitted_codes`): a code checked on one family joins the runs of
another family made by other code only after a check on that family too. Two codes that repeat each other on one
family most likely perform the same operations in the same order, and so repeat each other on any; but that is an
argument, and the check is the measurement. Seen in this project's prostate set: code 7178543b was admitted by a
check on an Intel Xeon, then made runs on an AMD EPYC without AVX-512 beside that family's runs of three older codes,
with no check on it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from feddg.benchmark.cells import SWEEP_CPU_PIN, prepare_cell, run_cells
from feddg.benchmark.executors.base import CellExecutor
from feddg.benchmark.executors.local import LocalExecutor
from feddg.benchmark.protocol import Protocol, Run, first_difference, run_mismatch
from feddg.benchmark.record import ASIDE_DIR, SWEEP_FILE, finished, run_cpu, run_family, run_records, utc_time
from feddg.config import ConfigError
from feddg.jsonfile import read_json, write_json


REPRODUCE_DIR = "reproduce"  # where the reproduce check re-runs a cell (removed afterwards)


def case_scores_of(report: dict[str, Any]) -> dict[str, Any]:
    """Every per-case score of a run's report: model -> site -> split -> the split's per-case entries."""
    from feddg.flare.payloads import CASES

    return {model: {site: {split: summary.get(CASES) for split, summary in entry.get("splits", {}).items()}
                    for site, entry in evaluation.get("sites", {}).items()}
            for model, evaluation in report.get("models", {}).items()}


def admitted_codes(out: Path, records: dict[str, dict], family: str = "unknown") -> set[str]:
    """The code fingerprints whose runs may join the folder ``out`` with ``records`` on a machine of numbers
    ``family``. Where the folder holds finished runs of that family: the codes a reproduce check on that family
    admitted (``sweep.json``'s ``code_evidence``: a check of every method it re-ran came out identical), and the
    family's one code when all its runs were made by one. Otherwise (a family new to the folder, or ``unknown``, when
    the executor cannot tell): the codes of the folder's finished runs and each code a check on any family admitted
    (an entry of the older one-cell checks, which kept no family, counts when it says identical)."""
    evidence = [e for e in read_json(out / SWEEP_FILE).get("code_evidence", [])
                if isinstance(e, dict) and "to_code" in e]
    done = finished(records.values())
    ours = {str(r.get("code", "unknown")) for r in done if run_family(r) == family}
    if family == "unknown" or not ours:
        return {str(r.get("code", "unknown")) for r in done} | {
            e["to_code"] for e in evidence if (e["admitted"] if "methods" in e else e.get("identical", True))}
    checked_here = {e["to_code"] for e in evidence if e.get("family") == family and e.get("admitted")}
    return checked_here | (ours if len(ours) == 1 else set())


def reproduce_cells(out: Path, records: dict[str, dict], protocol: Protocol, family: str = "unknown",
                    current: str | None = None) -> dict[str, dict]:
    """Method -> the run the reproduce check of code ``current`` re-runs for it: a finished run of the sweep's
    numbers ``family`` (a run repeats only on its own: :mod:`feddg.numerics`; any family when the sweep's is
    unknown) made by other code, among the folder's runs and those moved aside under this protocol (a run moved for
    its seed's family still measures its code), seed 0 where there is one, on the held-out site with the fewest
    per-case scores (the quickest; ties by name). Every method with a finished run in the folder gets one, except,
    when the folder already admits ``current`` elsewhere (a check on another family, or its runs there), a method
    with no such run of this family: its runs of this family, if any, are all ``current``'s, and nothing of this
    family pairs with another code's. ConfigError naming the method and the family when a method has no such run
    and needs one: then nothing is run or written."""
    done = finished(records.values())
    aside = [r for name, r in run_records(out, under=ASIDE_DIR).items()
             if r.get("status") == "ok" and run_mismatch(protocol, name, r) is None]
    known = current is not None and current in admitted_codes(out, records)
    chosen = {}
    for method in sorted({r["run"]["method"] for r in done}):
        ours = [r for r in (*done, *aside) if r["run"]["method"] == method
                and family in ("unknown", run_family(r)) and str(r.get("code", "unknown")) != current]
        if not ours and known:
            continue
        if not ours:
            raise ConfigError(f"{out}: --reproduce-check re-runs a finished run of every method on this machine's "
                              f"CPU family ({family}), and {method} has none (its runs: "
                              f"{', '.join(sorted({run_family(r) for r in done if r['run']['method'] == method}))}): "
                              f"run the check on a machine of that family")
        chosen[method] = min(ours, key=lambda r: (r["run"]["seed"] != 0, _n_scores(r), r["run"]["held_out"],
                                                  r["run"]["seed"]))
    return chosen


def _n_scores(record: dict[str, Any]) -> int:
    return sum(len(cases or {}) for sites in case_scores_of(record.get("report", {})).values()
               for splits in sites.values() for cases in splits.values())


def check_code(out: Path, records: dict[str, dict], protocol: Protocol, timeout: float, reproduce: bool,
               report: Callable[[str], None], executor: CellExecutor | None = None, cpu_pin: str = SWEEP_CPU_PIN,
               family: str = "unknown") -> None:
    """Refuse to add runs made by code other than the folder's (see the module docstring); with ``reproduce``,
    re-run one cell of every method the folder holds with this code (:func:`reproduce_cells`) and accept the code
    only when every per-case score of each is identical. The check, every method's cell, CPU model and result, is
    recorded in ``sweep.json`` (``code_evidence``) whatever its result; a refusal names the first method that
    differs and its first differing case."""
    from feddg.numerics import cpu_model
    from feddg.report import code_fingerprint

    current, here = code_fingerprint(), cpu_model()
    path = out / SWEEP_FILE
    done = {r["run_id"]: r for r in sorted(finished(records.values()), key=lambda r: r["run_id"])}
    made_by = sorted({str(r.get("code", "unknown")) for r in done.values()})
    if current in admitted_codes(out, records, family) or not done:
        return
    if not reproduce:
        ours = sorted({str(r.get("code", "unknown")) for r in done.values() if run_family(r) == family})
        held = (f"its {len(done)} finished run(s) were made by code {', '.join(c[:12] for c in made_by)}; this code "
                f"is {current[:12]}" if current not in admitted_codes(out, records) else
                f"this code ({current[:12]}) has no check on this machine's CPU family ({family}), whose runs there "
                f"were made by code {', '.join(c[:12] for c in ours)}")
        raise ConfigError(
            f"{out}: {held}. A results folder holds one code version: use another --out, or --reproduce-check to "
            f"re-run one cell of each of its methods with this code first (accepted only when every per-case score "
            f"is identical)")
    chosen = reproduce_cells(out, records, protocol, family, current)  # refused here, before anything runs
    report(f"reproduce check: re-running {', '.join(r['run_id'] for r in chosen.values())} with code "
           f"{current[:12]}")
    scratch = out / REPRODUCE_DIR
    shutil.rmtree(scratch, ignore_errors=True)
    new: dict[str, dict[str, Any]] = {}
    tails: dict[str, str] = {}
    try:
        cells = [prepare_cell(Run(**old["run"]), protocol, scratch, timeout, cpu_pin) for old in chosen.values()]
        executor = executor or LocalExecutor()
        executor.check(cells)
        run_cells(protocol, cells, executor, report, lambda cell, record: new.update({cell.run_id: record}))
    finally:
        for old in chosen.values():
            log = scratch / "runs" / old["run_id"] / "simulate.log"
            tails[old["run_id"]] = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        shutil.rmtree(scratch, ignore_errors=True)
    checks, refusal = [], None
    for method, old in chosen.items():
        rid, rerun = old["run_id"], new.get(old["run_id"], {})
        entry = {"method": method, "run_id": rid, "from_code": old.get("code", "unknown"),
                 "made_on": run_cpu(old), "family": run_family(old), "status": rerun.get("status", "not run")}
        if rerun.get("status") != "ok":
            entry["identical"] = False
            refusal = refusal or (f"reproduce check: {method}'s {rid} did not finish with this code "
                                  f"({rerun.get('status')}: {rerun.get('reason')}); log tail:\n{tails[rid]}")
        else:
            difference = first_difference(case_scores_of(old["report"]), case_scores_of(rerun["report"]))
            entry.update(identical=difference is None, per_case_scores_compared=_n_scores(rerun))
            if difference is not None:
                entry["first_difference"] = difference.describe("with the old code", "with this code")
                cpu = "" if family != "unknown" else (
                    f". That run was made on {run_family(old)}, and where the runs were made now is not known here: "
                    f"a run repeats only on its CPU family (feddg.numerics.numbers_family)")
                refusal = refusal or (f"reproduce check: {method} ({rid}) gives other per-case scores with code "
                                      f"{current[:12]} ({entry['first_difference']}); this code cannot add runs to "
                                      f"{out}: use another --out{cpu}")
        checks.append(entry)
    recorded = read_json(path)
    evidence = [*recorded.get("code_evidence", []),
                {"to_code": current, "cpu": here, "family": family, "admitted": refusal is None, "methods": checks,
                 "checked": utc_time()}]
    write_json(path, {**recorded, "code_evidence": evidence}, indent=2)
    if refusal is not None:
        raise ConfigError(refusal)
    n_cases = sum(c["per_case_scores_compared"] for c in checks)
    report(f"reproduce check: {len(checks)} method(s) identical in all {n_cases} per-case scores; code "
           f"{current[:12]} accepted")
