"""Discovery of image/mask pairs in the three layouts, on the real samples and on tmp_path fixtures."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from feddg.data.errors import DataError
from feddg.data.layouts import CaseRecord, discover_site, read_record, slice_png_name


def test_data_error_message_names_site_files_and_reason():
    e = DataError("image has no mask", site="I2CVB", paths=[Path("/x/a.png"), "/x/b.png"])
    assert str(e) == "site I2CVB: /x/a.png, /x/b.png: image has no mask"
    assert (e.site, e.paths, e.reason) == ("I2CVB", ("/x/a.png", "/x/b.png"), "image has no mask")
    assert isinstance(e, ValueError)
    back = pickle.loads(pickle.dumps(e))
    assert (back.site, back.paths, back.reason, str(back)) == (e.site, e.paths, e.reason, str(e))


# ----------------------------------------------------------------------------------------------- real samples


@pytest.mark.parametrize("site", ["BIDMC", "BMC", "HK", "RUNMC", "UCL"])
def test_real_slice_png_sites_pair_by_name(samples, site):
    recs = discover_site("slice_png", samples / "ProstateSlice", site)
    assert [(r.split, r.case_id) for r in recs] == [("train", "00"), ("test", "00")]
    for r in recs:
        assert r.site == site and r.image_path.name == r.mask_path.name == "00_00.png"
        assert r.image_path.parent.name == "image" and r.mask_path.parent.name == "mask"


def test_real_i2cvb_unpaired_slice_names_both_files(samples):
    with pytest.raises(DataError) as info:
        discover_site("slice_png", samples / "ProstateSlice", "I2CVB")
    e = info.value
    msg = str(e)
    assert e.site == "I2CVB" and "I2CVB" in msg
    assert "train/image/00_01.png" in msg and "train/mask/00_00.png" in msg
    assert "image has no mask" in msg and "mask has no image" in msg
    assert {Path(p).name for p in e.paths} == {"00_01.png", "00_00.png"}


@pytest.mark.parametrize("site", ["Domain1", "Domain2", "Domain3", "Domain4"])
def test_real_dofe_sites_ignore_file_lists(samples, site):
    recs = discover_site("dofe_png", samples / "Fundus", site)
    assert [r.split for r in recs] == ["train", "test"]
    for r in recs:
        assert r.image_path.suffix == ".png" and r.case_id == r.image_path.stem == r.mask_path.stem
        assert r.image_path.parent.parent.name == "ROIs"


# ----------------------------------------------------------------------------------------------- saml_nifti


def test_saml_accepts_both_segmentation_spellings_and_ignores_other_files(tmp_path, fx):
    fx.make_saml_site(tmp_path, "BMC", 2, seg="Segmentation")
    fx.make_saml_site(tmp_path, "HK", 3)
    (tmp_path / "HK" / "README.txt").write_text("not data")
    bmc = discover_site("saml_nifti", tmp_path, "BMC")
    hk = discover_site("saml_nifti", tmp_path, "HK")
    assert [r.case_id for r in bmc] == ["Case00", "Case01"]
    assert [r.mask_path.name for r in bmc] == ["Case00_Segmentation.nii.gz", "Case01_Segmentation.nii.gz"]
    assert [r.case_id for r in hk] == ["Case00", "Case01", "Case02"]
    assert all(r.split is None for r in bmc + hk)
    assert hk[1] == CaseRecord("HK", "Case01", None, tmp_path / "HK" / "Case01.nii.gz",
                               tmp_path / "HK" / "Case01_segmentation.nii.gz")


def test_saml_volume_without_segmentation(tmp_path, fx):
    fx.make_saml_site(tmp_path, "UCL", 2)
    (tmp_path / "UCL" / "Case01_segmentation.nii.gz").unlink()
    with pytest.raises(DataError, match=r"site UCL: .*Case01\.nii\.gz: .*image has no mask"):
        discover_site("saml_nifti", tmp_path, "UCL")


# ----------------------------------------------------------------------------------------------- PNG layouts


def test_slice_png_case_ids_group_slices(tmp_path, fx):
    fx.make_slice_site(tmp_path, "HK", {"train": {"03": 3, "11": 2}, "test": {"03": 1}})
    recs = discover_site("slice_png", tmp_path, "HK")
    assert [(r.split, r.case_id, r.image_path.name) for r in recs] == [
        ("train", "03", "03_00.png"), ("train", "03", "03_01.png"), ("train", "03", "03_02.png"),
        ("train", "11", "11_00.png"), ("train", "11", "11_01.png"), ("test", "03", "03_00.png"),
    ]
    assert slice_png_name("case_7_12") == ("case_7", 12)
    assert slice_png_name("single") == ("single", 0)


def test_never_pairs_with_another_slice(tmp_path, fx):
    fx.make_slice_site(tmp_path, "BMC", {"train": {"00": 2}})
    (tmp_path / "BMC" / "train" / "mask" / "00_01.png").unlink()
    with pytest.raises(DataError) as info:
        discover_site("slice_png", tmp_path, "BMC")
    assert "00_01.png" in str(info.value) and "image has no mask" in str(info.value)
    assert [Path(p).name for p in info.value.paths] == ["00_01.png"]


def test_mask_without_image(tmp_path, fx):
    fx.make_dofe_site(tmp_path, "Domain2", {"train": ["a", "b"]})
    (tmp_path / "Domain2" / "train" / "ROIs" / "image" / "b.png").unlink()
    with pytest.raises(DataError, match=r"site Domain2: .*ROIs/mask/b\.png: .*mask has no image"):
        discover_site("dofe_png", tmp_path, "Domain2")


def test_missing_mask_folder(tmp_path, fx):
    fx.make_slice_site(tmp_path, "UCL", {"train": {"00": 1}})
    for p in (tmp_path / "UCL" / "train" / "mask").iterdir():
        p.unlink()
    (tmp_path / "UCL" / "train" / "mask").rmdir()
    with pytest.raises(DataError, match=r"site UCL: .*train/mask: folder is missing"):
        discover_site("slice_png", tmp_path, "UCL")


# ----------------------------------------------------------------------------------------------- folder errors


def test_unknown_layout(tmp_path):
    with pytest.raises(DataError, match=r"unknown data layout 'nifti3d'.*dofe_png.*saml_nifti.*slice_png"):
        discover_site("nifti3d", tmp_path, "X")


def test_missing_site_folder_lists_what_is_there(tmp_path, fx):
    fx.make_saml_site(tmp_path, "BIDMC", 1)
    with pytest.raises(DataError) as info:
        discover_site("saml_nifti", tmp_path, "HK")
    msg = str(info.value)
    assert msg.startswith("site HK: ") and str(tmp_path / "HK") in msg
    assert "site folder is missing" in msg and "BIDMC" in msg


@pytest.mark.parametrize("layout", ["saml_nifti", "slice_png", "dofe_png"])
def test_empty_site_folder(tmp_path, layout):
    (tmp_path / "I2CVB").mkdir()
    if layout != "saml_nifti":
        sub = ("image",) if layout == "slice_png" else ("ROIs", "image")
        for s in (sub, sub[:-1] + ("mask",)):
            (tmp_path / "I2CVB" / "train").joinpath(*s).mkdir(parents=True)
    with pytest.raises(DataError, match=r"site I2CVB: .*I2CVB: site folder has no images"):
        discover_site(layout, tmp_path, "I2CVB")


def test_no_split_folders(tmp_path):
    (tmp_path / "HK" / "image").mkdir(parents=True)
    with pytest.raises(DataError, match=r"site HK: .*no train/ or test/ folder"):
        discover_site("slice_png", tmp_path, "HK")


def test_discovery_reads_no_pixels(tmp_path, fx):
    """Discovery pairs by name only; a corrupt file is found by decoding, not by discovery."""
    fx.make_slice_site(tmp_path, "HK", {"train": {"00": 1}})
    (tmp_path / "HK" / "train" / "image" / "00_00.png").write_bytes(b"not a png")
    (rec,) = discover_site("slice_png", tmp_path, "HK")
    with pytest.raises(DataError, match=r"site HK: .*image/00_00\.png: cannot read image file"):
        read_record("slice_png", rec)
