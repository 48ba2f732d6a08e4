"""Privacy audit of the ELCFS amplitude payload on the real sample images: phase retrieval by the server.

    python benchmarks/privacy_audit.py [--size 64 384] [--iterations 1000] [--restarts 4] [--data DIR]

For each real sample image (12 prostate slices, 8 fundus images in ../shared/data/midss-samples), runs Fienup's
HIO+ER phase retrieval (benchmarks/phase_retrieval_attack.py) against what the server receives in

* ``full``: the paper's design, the whole amplitude spectrum (H x W values per channel), and
* ``window``: this project's design, the centred (2b+1) x (2b+1) low-frequency window, b = max(floor(alpha H), 1),

and scores the reconstruction against the original (SSIM and Pearson correlation, at the best circular shift and
point reflection, the inherent ambiguities of phase retrieval). Two guesses that need nothing but the image mean
(the window's DC) are scored the same way as the baseline every attacker has: a constant image and a centred
Gaussian blob. An attack that does not beat them has learnt nothing about the image.

Images: read as 8-bit, centre-cropped to a square (fundus; prostate slices already are), resized with the
project's own resize (bilinear, antialiased), scaled to [0, 1]. Fundus RGB images are attacked on their luminance
(ITU-R 601, PIL's "L"): every channel's payload is the same kind of single-channel problem, and luminance is the
channel that carries the visible structure. The attacker gets no support constraint by default (the slices fill
their frame); ``--support-fraction 0.9`` gives it a centred box instead.

Control: the same attacks on a synthetic phantom (three shapes on a zero background inside the centred half of the
frame, with that support given to the attacker), a case where phase retrieval is well posed; the full-spectrum
attack should rebuild it (SSIM, corr ~1), which shows that the attack is real and a failure on the real images is
the payload's property, not the attack's. Its baselines include the support box filled with the image mean,
since there the attacker is credited with the support.

Runtime on a 2-core x86 CPU with the defaults: about 10 s at 64 px, 5-6 min at 384 px (7-9 s per attack).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
from PIL import Image

from feddg.data.dataset import crop_square, resize_images
from feddg.flare.elcfs.settings import ELCFSSettings
from feddg.numbers import finite, positive
from feddg.report import script_command

from phase_retrieval_attack import format_table, run_audit, summarize, synthetic_phantom  # next to this script

JOB = ELCFSSettings()  # the window the ELCFS jobs send unless their feddg.yaml says otherwise

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def load_samples(data: Path, size: int) -> list[tuple[str, np.ndarray]]:
    """(name, (size, size) float64 in [0, 1]) for every sample image; names are collection/site/split/file."""
    root = data / "midss-samples"
    files = sorted((root / "ProstateSlice").glob("*/*/image/*.png"))
    files += sorted((root / "Fundus").glob("*/*/ROIs/image/*.png"))
    if not files:
        raise SystemExit(f"no sample images found under {root} (pass --data to the folder holding midss-samples/)")
    out = []
    for f in files:
        rel = f.relative_to(root)
        site, split = rel.parts[1], rel.parts[2]
        collection = "prostate" if rel.parts[0] == "ProstateSlice" else "fundus"
        a = crop_square(np.asarray(Image.open(f).convert("L"), np.float32) / 255.0)
        image = resize_images(a[None, None], size)[0, 0].astype(np.float64)
        out.append((f"{collection}/{site}/{split}/{f.stem}", image))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, nargs="+", default=[64, 384],
                        help="image sizes to audit (default: 64, the CPU jobs' size, and 384, the papers')")
    parser.add_argument("--iterations", type=int, default=1000, help="HIO+ER iterations per restart")
    parser.add_argument("--restarts", type=int, default=4, help="random restarts; the best Fourier fit is kept")
    parser.add_argument("--beta", type=finite, default=0.9)
    parser.add_argument("--alpha", type=finite, default=JOB.alpha, help=f"default: the jobs' ({JOB.alpha})")
    parser.add_argument("--min-half-width", type=int, default=JOB.min_half_width,
                        help=f"default: the jobs' ({JOB.min_half_width})")
    parser.add_argument("--support-fraction", type=positive, default=None,
                        help="give both attacks a centred support box of this fraction of each side "
                             "(default: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding midss-samples/")
    args = parser.parse_args()

    print("command: " + script_command("benchmarks/privacy_audit.py"))
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.processor() or platform.machine()}")
    for size in args.size:
        images = load_samples(args.data, size)
        t = time.perf_counter()
        rows = run_audit(images, alpha=args.alpha, min_half_width=args.min_half_width, iterations=args.iterations,
                         restarts=args.restarts, seed=args.seed, support_fraction=args.support_fraction, beta=args.beta)
        total = time.perf_counter() - t
        support = "none (whole frame)" if args.support_fraction is None else args.support_fraction
        print(f"\n=== size {size}x{size}: {len(images)} images, "
              f"{args.iterations} iterations x {args.restarts} restarts, support {support}, "
              f"alpha {args.alpha}, min half-width {args.min_half_width}; {total:.1f} s in all ===")
        print(format_table(rows))
        for collection in ("prostate", "fundus"):
            print(f"\nmean over {collection} images")
            for design, s in summarize([r for r in rows if r["image"].startswith(collection + "/")]).items():
                print(f"  {design:<16} values/ch {s['values']:>7.0f}   SSIM {s['ssim']:.3f}   corr {s['corr']:.3f}")
        phantom, _ = synthetic_phantom(size, 0.5)
        t = time.perf_counter()
        control = run_audit([(f"control: phantom {size}px", phantom)], alpha=args.alpha,
                            min_half_width=args.min_half_width, iterations=args.iterations, restarts=args.restarts,
                            seed=args.seed, support_fraction=0.5, beta=args.beta)
        print(f"\ncontrol (synthetic phantom, support = centred half of the frame, given to the attacker; "
              f"{time.perf_counter() - t:.1f} s)")
        print(format_table(control).split("\n\n")[0])


if __name__ == "__main__":
    main()
