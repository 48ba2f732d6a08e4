"""`feddg segment` never overwrites a mask silently, skips label files, and segments every good scan of a batch."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from feddg.cli import main
from tests.conftest import tiny_experiment
from tests.test_inference import save_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    return save_checkpoint(tmp_path / "m.pt", tiny_experiment("prostate"))


def _scan(path, value=0.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    volume = np.random.default_rng(0).normal(size=(32, 32, 3)).astype(np.float32) + value
    nib.save(nib.Nifti1Image(volume, np.eye(4)), path)
    return path


def _written(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("layout", ["two-folders", "nii-and-nii.gz"])
def test_two_scans_that_map_to_one_mask_are_refused_before_anything_is_written(tmp_path, ckpt, capsys, layout):
    if layout == "two-folders":
        first, second = _scan(tmp_path / "day1" / "a.nii.gz"), _scan(tmp_path / "day2" / "a.nii.gz")
        inputs = [str(tmp_path / "day1"), str(tmp_path / "day2")]
    else:
        first, second = _scan(tmp_path / "scans" / "a.nii"), _scan(tmp_path / "scans" / "a.nii.gz")
        inputs = [str(tmp_path / "scans")]
    assert main(["segment", "--model", str(ckpt), "--out", str(tmp_path / "masks"), *inputs]) == 2
    err = capsys.readouterr().err
    assert f"{first}" in err and f"{second}" in err and f"{tmp_path / 'masks' / 'a_mask.nii.gz'}" in err
    assert len(err.strip().splitlines()) == 1
    assert _written(tmp_path / "masks") == []


def test_the_same_scan_named_twice_is_segmented_once(tmp_path, ckpt):
    scan = _scan(tmp_path / "scans" / "a.nii.gz")
    assert main(["segment", "--model", str(ckpt), "--out", str(tmp_path / "masks"), str(scan.parent), str(scan)]) == 0
    assert _written(tmp_path / "masks") == ["a_mask.nii.gz"]


def test_an_existing_mask_is_replaced_only_with_overwrite(tmp_path, ckpt, capsys):
    _scan(tmp_path / "scans" / "a.nii.gz")
    _scan(tmp_path / "scans" / "b.nii.gz")
    masks = tmp_path / "masks"
    masks.mkdir()
    (masks / "b_mask.nii.gz").write_bytes(b"a radiologist's corrected mask")
    argv = ["segment", "--model", str(ckpt), "--out", str(masks), str(tmp_path / "scans")]
    assert main(argv) == 2
    assert f"1 mask file(s) exist already in {masks} (b_mask.nii.gz); pass --overwrite" in capsys.readouterr().err
    assert _written(masks) == ["b_mask.nii.gz"]  # a's mask was not written either
    assert (masks / "b_mask.nii.gz").read_bytes() == b"a radiologist's corrected mask"
    assert main([*argv, "--overwrite"]) == 0
    assert nib.load(masks / "b_mask.nii.gz").shape == (32, 32, 3)
    assert _written(masks) == ["a_mask.nii.gz", "b_mask.nii.gz"]


def test_a_mask_may_not_replace_an_input_scan(tmp_path, ckpt, capsys):
    folder = tmp_path / "scans"
    _scan(folder / "a.nii.gz")
    _scan(folder / "a_mask.nii.gz")  # a scan that happens to have the name of a's mask
    assert main(["segment", "--model", str(ckpt), "--out", str(folder), "--overwrite", str(folder)]) == 2
    assert f"{folder / 'a_mask.nii.gz'} is both a scan to segment and the mask of {folder / 'a.nii.gz'}" \
        in capsys.readouterr().err
    assert _written(folder) == ["a.nii.gz", "a_mask.nii.gz"]


def test_label_files_of_a_saml_site_folder_are_skipped_with_a_note(tmp_path, ckpt, capsys):
    site = tmp_path / "BMC"
    for name in ("Case00.nii.gz", "Case00_segmentation.nii.gz", "Case01.nii.gz", "Case01_Segmentation.nii.gz"):
        _scan(site / name)
    assert main(["segment", "--model", str(ckpt), "--out", str(tmp_path / "masks"), str(site)]) == 0
    out = capsys.readouterr().out
    assert f"skipped 2 label file(s) (<case>_segmentation) in {site}: Case00_segmentation.nii.gz, " \
           f"Case01_Segmentation.nii.gz" in out
    assert _written(tmp_path / "masks") == ["Case00_mask.nii.gz", "Case01_mask.nii.gz"]


def test_a_folder_of_label_files_only_has_nothing_to_segment(tmp_path, ckpt, capsys):
    _scan(tmp_path / "BMC" / "Case00_segmentation.nii.gz")
    assert main(["segment", "--model", str(ckpt), "--out", str(tmp_path / "masks"), str(tmp_path / "BMC")]) == 2
    assert "no NIfTI scans to segment" in capsys.readouterr().err


def test_missing_and_non_nifti_inputs_are_all_named(tmp_path, ckpt, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["segment", "--model", str(ckpt), "--out", str(tmp_path / "masks"), str(tmp_path / "nope.nii.gz"),
                 str(tmp_path / "notes.txt")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope.nii.gz'}: no such file or folder; {tmp_path / 'notes.txt'}: not a NIfTI file" in err


def test_a_bad_scan_does_not_stop_the_others_and_is_reported_at_the_end(tmp_path, ckpt, capsys):
    scans = tmp_path / "scans"
    _scan(scans / "a.nii.gz")
    (scans / "b.nii.gz").write_bytes(b"not a volume")
    _scan(scans / "c.nii.gz")
    assert main(["segment", "--model", str(ckpt), "--out", str(tmp_path / "masks"), str(scans)]) == 1
    captured = capsys.readouterr()
    assert _written(tmp_path / "masks") == ["a_mask.nii.gz", "c_mask.nii.gz"]
    assert f"{scans / 'c.nii.gz'} -> " in captured.out
    failures = captured.err.strip().splitlines()
    assert failures[0] == "1 of 3 scan(s) failed; the others are done:"
    assert failures[1].startswith(f"  {scans / 'b.nii.gz'}: ") and len(failures) == 2
