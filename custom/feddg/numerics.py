"""CPU numerics: what a run's numbers repeat on (:func:`numbers_family`), and one setting that pins the kernels,
``FEDDG_CPU_PIN``, with its home here.

PyTorch picks its CPU kernels by instruction set at run time, and so do oneDNN (convolutions) and MKL (matrix
products): the same seed and code give other numbers on an Intel Xeon with AVX-512 than on an AMD EPYC with AVX2
only (one prostate cell moved by 0.019 Dice, 178 of 204 per-case scores differed:
``benchmarks/results/cpu_check_prostate``). ``FEDDG_CPU_PIN=avx2`` caps all three at AVX2 through their documented
switches (:data:`PINNED`): ``ATEN_CPU_CAPABILITY`` (PyTorch's own kernels), ``ONEDNN_MAX_CPU_ISA`` (oneDNN) and
``MKL_CBWR`` (MKL's conditional numerical reproducibility). They are read when each library loads, so they must be
in a process's environment before it imports torch: ``feddg simulate`` exports them before it starts NVFlare's
simulator, whose site processes inherit them.

AVX2 is the pin because it leaves the runs of the AVX2-only AMD EPYC machines bit for bit as they were (measured
2026-11-28 on one: a U-Net trained 20 steps gave the same weights pinned and unpinned, while ``MKL_CBWR=COMPATIBLE``
or ``ATEN_CPU_CAPABILITY=default`` changed them). ``off`` (the default of ``feddg simulate`` and of the benchmark)
lets every library use the fastest path of the machine. What a run used is recorded in its report
(:func:`numerics`) and ``run.json``.

What the pin does not do: make an Intel machine repeat an AMD one. Pinned, an Intel Xeon gives other numbers than
unpinned (the pin does change its kernels) and other numbers than an AMD EPYC: re-running two AMD runs of the
prostate protocol with the same code, 173 and 171 of 204 per-case scores differed (2026-11-28,
``benchmarks/results/cpu_check_prostate``). oneDNN blocks its convolution loops by the CPU's cache sizes, which no
ISA cap fixes, and two AMD EPYC machines without AVX-512 of different generations differ too (2026-12-01:
:func:`cpu_signature`). So a run repeats on its :func:`numbers_family` (the CPU's maker, the kernels it ran and,
where recorded, the CPU's generation and caches, or the family another generation was measured to repeat:
:data:`SAME_NUMBERS`), and the benchmark keeps each seed's runs within one family (:mod:`feddg.benchmark.record`);
its default is ``off``, the machine's fastest kernels, since pinning buys no repeatability across makers. What the
pin still gives: one kernel family on Intel machines with and without AVX-512.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CPU_PIN_ENV = "FEDDG_CPU_PIN"
PINNED: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"},
    "off": {},
}
CPU_PIN_MODES = tuple(PINNED)


def cpu_pin_mode(environ: Mapping[str, str] | None = None) -> str:
    """The pin ``FEDDG_CPU_PIN`` asks for (``off`` when unset); ValueError naming the variable for another value."""
    environ = os.environ if environ is None else environ
    mode = environ.get(CPU_PIN_ENV, "off").strip() or "off"
    if mode not in PINNED:
        raise ValueError(f"{CPU_PIN_ENV}={mode!r}: give one of {', '.join(CPU_PIN_MODES)}")
    return mode


def pinned_environment(mode: str) -> dict[str, str]:
    """The variables that pin the numerics for ``mode``, ``FEDDG_CPU_PIN`` itself included (so that the processes
    started with them record it)."""
    if mode not in PINNED:
        raise ValueError(f"CPU pin {mode!r}: give one of {', '.join(CPU_PIN_MODES)}")
    return {CPU_PIN_ENV: mode, **PINNED[mode]}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else the platform's processor or machine). A run's results depend on
    it, not only on the code and the seed: one cell re-run with the same code on an Intel Xeon differed from its AMD
    EPYC run in 178 of 204 per-case scores (``benchmarks/results/cpu_check_prostate``)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's flags (``/proc/cpuinfo``; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


CPUINFO = Path("/proc/cpuinfo")
CACHES = Path("/sys/devices/system/cpu/cpu0/cache")  # Linux: one index*/ folder per cache of the first core


def cpu_signature(cpuinfo: Path = CPUINFO, caches: Path = CACHES) -> str | None:
    """What, beside its maker and instruction set, sets the numbers of a CPU's convolutions: its generation (the
    ``cpu family`` and ``model`` numbers of ``/proc/cpuinfo``, which a virtual machine's model name, plain "AMD
    EPYC", does not tell) and the sizes of its data caches, by which oneDNN blocks its loops; e.g. ``23/49 L1d 32K
    L2 512K L3 16M``. None where the first two cannot be read (not Linux).

    Why: two AMD EPYC machines without AVX-512, one of 2026-11-26 and one of 2026-12-01 (23/49, L3 16M), gave other
    numbers for one prostate cell from the first round on, with the code of 2026-11-26 as with the later one (the
    sites' first-round losses differ in the fifth digit: docs/benchmark.md, "CPU numerics",
    ``benchmarks/results/cpu_check_prostate/amd_avx2_23-49_first_rounds_*``)."""
    try:
        first_cpu = cpuinfo.read_text().partition("\n\n")[0]  # one block of lines per logical CPU
    except OSError:
        return None
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first_cpu.splitlines())}
    if not fields.get("cpu family") or not fields.get("model"):
        return None
    sizes = {}
    for index in sorted(caches.glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            sizes[f"L{level}{'d' if kind == 'Data' else ''}"] = _size(size)
    caches_text = "".join(f" {name} {size}" for name, size in sorted(sizes.items()))
    return f"{fields['cpu family']}/{fields['model']}{caches_text}"


def _size(sysfs: str) -> str:
    """``16384K`` (sysfs) -> ``16M``; another text as it is."""
    if sysfs.endswith("K") and sysfs[:-1].isdigit() and int(sysfs[:-1]) % 1024 == 0:
        return f"{int(sysfs[:-1]) // 1024}M"
    return sysfs


def numerics(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a run records of its numerics: the pin, whether the CPU has AVX-512 (where an unpinned run takes other
    kernels than an AVX2 machine), the variables of every pin as this process sees them, and the kernels PyTorch
    picked (when torch is loaded)."""
    environ = os.environ if environ is None else environ
    variables = sorted({k for pinned in PINNED.values() for k in pinned})
    out: dict[str, Any] = {"cpu_pin": cpu_pin_mode(environ), "avx512": has_avx512(),
                           "variables": {k: environ.get(k) for k in variables}}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def effective_kernels(cpu_pin: str | None, avx512: bool | None) -> str:
    """The kernel family a run's numbers come from: ``avx2`` on a CPU without AVX-512 (pinned or not: the pin
    changes nothing there); ``avx2-pinned`` pinned on a CPU with AVX-512, a family of its own (the pin caps the
    instruction set, not the CPU's generation: below); ``native-avx512`` unpinned on a CPU with it; ``unknown`` when
    the record cannot tell whether the CPU has AVX-512."""
    if avx512 is None:
        return "unknown"
    if not avx512:
        return "avx2"
    return "avx2-pinned" if cpu_pin == "avx2" else "native-avx512"


def cpu_maker(cpu: str | None) -> str | None:
    """``AMD`` or ``Intel`` from a CPU model name (``/proc/cpuinfo``'s, or a results folder's timeline's), else the
    name itself; None for None."""
    if cpu is None:
        return None
    return next((maker for maker in ("AMD", "Intel") if maker.lower() in cpu.lower()), cpu)


# CPU signature -> the signature whose family its runs join, because they were measured to give the same numbers:
# whole protocol runs of that family made again on a machine of this signature, every per-case score identical. The
# signature alone decides nothing here; the measurement does, and a signature not listed keeps a family of its own.
SAME_NUMBERS: dict[str, str] = {
    # 2026-12-02: the AMD EPYC 25/1 re-ran two whole runs of the 23/49 machine (the prostate set's FedAvg and uniform
    # held out at RUNMC, seed 6, its admitted code): 0 of 204 per-case scores and no round's training loss differed
    # (benchmarks/results/cpu_check_prostate/amd_avx2_25-1_code_7178543b_*_RUNMC_seed6). Its L1d and L2 are the
    # 23/49 machine's; its generation and L3 are not. Like that machine, it does not repeat seeds 0-2's
    # (amd_avx2_25-1_first_rounds_fedavg_BIDMC_seed0).
    "25/1 L1d 32K L2 512K L3 32M": "23/49 L1d 32K L2 512K L3 16M",
}


def numbers_family(cpu: str | None, cpu_pin: str | None, avx512: bool | None,
                   signature: str | None = None) -> str:
    """What a run repeats bit for bit on: the CPU's maker and the kernel family it ran (:func:`effective_kernels`),
    e.g. ``AMD avx2``, ``AMD native-avx512``, ``Intel native-avx512``, ``Intel avx2-pinned``, and the CPU's
    generation and caches (:func:`cpu_signature`) where the run recorded them, e.g. ``AMD avx2 [23/49 L1d 32K L2
    512K L3 16M]``; ``unknown`` when the record cannot tell the maker or the kernels. A family without a signature
    is that of runs made before runs recorded it: one machine of that maker and kernels, whose generation is not
    known, so a machine with a signature never joins it (one did not repeat it: :func:`cpu_signature`). A signature
    measured to repeat another's family takes that family's name (:data:`SAME_NUMBERS`).

    The pin does not carry a run across CPUs that differ in more than the instruction set: oneDNN sizes its
    convolution loops by the CPU's caches, and the ISA cap does not fix that. So the maker is part of the family
    (measured 2026-11-28 on an Intel Xeon, pinned, re-running two AMD EPYC runs of the prostate protocol with the
    same code: 173 and 171 of 204 per-case scores differed, held-out Dice 0.5096 against 0.5587 and 0.4848 against
    0.4947, as unpinned Intel runs did: 178), and so is the CPU's having AVX-512, pinned or not (measured
    2026-11-29 on an AMD EPYC with AVX-512, pinned to AVX2, re-running two runs of an AMD EPYC without it with the
    set's admitted code: 179 and 180 of 204 differed, 0.5713 against 0.5587 and 0.5413 against 0.5502;
    ``benchmarks/results/cpu_check_prostate``). Runs of one family compare pair by pair; a seed's runs must share
    one (a pair's two runs then do), while different seeds may come from different families: each seed is its own
    draw."""
    kernels = effective_kernels(cpu_pin, avx512)
    maker = cpu_maker(cpu)
    if maker is None or kernels == "unknown":
        return "unknown"
    signature = SAME_NUMBERS.get(signature, signature) if signature else None
    return f"{maker} {kernels} [{signature}]" if signature else f"{maker} {kernels}"


def has_avx512() -> bool:
    """Whether this machine's CPU has AVX-512 (``avx512f`` among :func:`cpu_flags`)."""
    return "avx512f" in cpu_flags()


def host_cpu() -> dict[str, Any]:
    """What a run record says of the CPU that made it (its executor's fields): ``cpu`` (:func:`cpu_model`),
    ``avx512`` (:func:`has_avx512`) and ``cpu_signature`` (:func:`cpu_signature`)."""
    return {"cpu": cpu_model(), "avx512": has_avx512(), "cpu_signature": cpu_signature()}


def host_family(cpu_pin: str, cpu: Mapping[str, Any] | None = None) -> str:
    """The numbers family of runs made with ``cpu_pin`` on this machine, or on the machine whose :func:`host_cpu`
    fields are ``cpu`` (:func:`numbers_family`)."""
    cpu = host_cpu() if cpu is None else cpu
    return numbers_family(cpu["cpu"], cpu_pin, cpu["avx512"], cpu["cpu_signature"])
