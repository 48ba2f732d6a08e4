"""Messages that reach the server lose paths and file names; the local detail keeps them."""

from feddg.data.errors import DataError
from feddg.flare.redact import public, scrub


def test_data_errors_keep_site_and_reason_but_not_the_files():
    err = DataError("image has no mask", site="I2CVB", paths=["/data/I2CVB/train/image/00_01.png",
                                                              "/data/I2CVB/train/mask/00_00.png"])
    msg = public(err)
    assert msg == "site I2CVB: image has no mask (2 file(s); see the site's local log)"
    assert "/data" in str(err)  # the local log keeps the detail


def test_paths_and_file_names_are_scrubbed_anywhere():
    text = "cannot read /mnt/pacs/patient_4711/Case07.nii.gz and ./rel/dir/x.png or Case08_segmentation.nii.gz"
    out = scrub(text)
    assert "/mnt" not in out and "patient_4711" not in out and "Case07" not in out and "Case08" not in out
    assert "x.png" not in out and out.startswith("cannot read <path>")
    assert public(ValueError("bad value 3 in C:\\data\\p1\\img.png")) == "ValueError: bad value 3 in <path>"
    assert scrub("round 3: val Dice 0.71 at site BIDMC") == "round 3: val Dice 0.71 at site BIDMC"
