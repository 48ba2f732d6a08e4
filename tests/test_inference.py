"""A hospital outside the federation: evaluating a saved model, segmenting NIfTI scans in their own geometry."""

from __future__ import annotations

import json
import math

import nibabel as nib
import numpy as np
import pytest
import torch

from feddg.cli import main
from feddg.experiment import experiment_from_dict
from feddg.inference import load_checkpoint, segment_nifti
from feddg.nets.unet import build_model
from tests.conftest import tiny_experiment


def save_checkpoint(path, exp, meta=None, state=None):
    """The format NVFlare's PTFileModelPersistor writes (FedDGModelPersistor): the weights under ``model``, the
    job's configuration in ``train_conf``, and the model's metadata (the workflow's run and round) in
    ``meta_props``. ``state``: other weights than those of ``exp``'s network."""
    if state is None:
        state = dict(build_model(experiment_from_dict(exp)).state_dict())
    saved = {"model": state, "train_conf": {"train": {"model": "FedDGUNet", "feddg_config": exp}}}
    if meta:
        saved["meta_props"] = meta
    torch.save(saved, path)
    return path


def _poisoned(value):
    """(weights with ``value`` in the third tensor of a tiny prostate network, that tensor's name)."""
    state = dict(build_model(experiment_from_dict(tiny_experiment("prostate"))).state_dict())
    name = list(state)[2]
    state[name] = state[name].clone()
    state[name].view(-1)[1] = value
    return state, name


def _other_network():
    exp = tiny_experiment("prostate")
    exp["model"]["bin_levels"] = 3  # BIN-Net: other parameter names
    return dict(build_model(experiment_from_dict(exp)).state_dict())


def _wider_network():
    exp = tiny_experiment("prostate")
    exp["model"]["features"] = [16, 16, 32, 64, 128, 16]  # same names, other shapes
    return dict(build_model(experiment_from_dict(exp)).state_dict())


def _write(content):
    def write(path):
        path.write_bytes(content)
    return write


def _checkpoint(**kw):
    def write(path):
        exp = kw.pop("exp", None) or tiny_experiment("prostate")
        state = kw.get("state")
        save_checkpoint(path, exp, state=state() if callable(state) else state)
    return write


def _unknown_config_key(path):
    exp = tiny_experiment("prostate")
    state = dict(build_model(experiment_from_dict(exp)).state_dict())
    exp["data"]["colour"] = "red"
    save_checkpoint(path, exp, state=state)


@pytest.mark.parametrize("write, message", [
    (_write(b""), r"model\.pt: the file is empty \(0 bytes\)"),
    (_write(b"epoch,dice\n1,0.5\n"), r"model\.pt: not a PyTorch checkpoint \(the file starts with b'epoch,di'"),
    (_write(b"PK\x03\x04 cut short"), r"model\.pt: cannot read the model checkpoint, the file is damaged"),
    (lambda path: torch.save({"weights": {}}, path), r"model\.pt: not a FedDG checkpoint"),
    (lambda path: torch.save({"model": [1, 2], "train_conf": {"train": {"feddg_config": {}}}}, path),
     r"model\.pt: not a FedDG checkpoint"),
    (_unknown_config_key, r"model\.pt: the configuration stored in the checkpoint is not valid: data\.colour: "
                          r"unknown key"),
    (_checkpoint(state=_other_network), r"model\.pt: the weights do not fit: parameter names do not match the "
                                        r"network of its stored configuration: \d+ missing \['[^']+', '[^']+', "
                                        r"'[^']+', \.\.\.\], \d+ unexpected \['[^']+', '[^']+', '[^']+', \.\.\.\]$"),
    (_checkpoint(state=lambda: {k: v for k, v in list(_wider_network().items())[:-2]}),
     r"model\.pt: the weights do not fit: parameter names do not match the network of its stored configuration: "
     r"2 missing \['[^']+', '[^']+'\]$"),
    (_checkpoint(state=_wider_network),
     r"model\.pt: the weights do not fit: parameter '[^']+' has shape \(16, 1, 3, 3\), the network of its stored "
     r"configuration has \(8, 1, 3, 3\)"),
    (_checkpoint(state=lambda: _poisoned(float("nan"))[0]),
     r"model\.pt: the weights do not fit: parameter '.+' holds NaN or infinite values"),
    (_checkpoint(state=lambda: _poisoned(float("inf"))[0]),
     r"model\.pt: the weights do not fit: parameter '.+' holds NaN or infinite values"),
], ids=["empty", "text", "damaged-zip", "no-model", "model-not-a-mapping", "unknown-config-key", "other-network",
        "missing-weights", "other-shapes", "nan", "inf"])
def test_a_bad_checkpoint_is_refused_in_one_line_naming_the_file(tmp_path, write, message):
    bad = tmp_path / "model.pt"
    write(bad)
    with pytest.raises(ValueError, match=message) as refused:
        load_checkpoint(bad)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 600


def test_the_first_non_finite_tensor_is_named(tmp_path):
    state, name = _poisoned(float("nan"))
    ckpt = save_checkpoint(tmp_path / "m.pt", tiny_experiment("prostate"), state=state)
    with pytest.raises(ValueError, match=f"parameter {name!r} holds NaN"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("command", ["evaluate", "segment"])
def test_commands_refuse_a_non_finite_checkpoint_before_writing_anything(tmp_path, synthetic_root, capsys, command):
    state, name = _poisoned(float("inf"))
    ckpt = save_checkpoint(tmp_path / "m.pt", tiny_experiment("prostate"), state=state)
    if command == "evaluate":
        argv = ["evaluate", "--model", str(ckpt), "--data-root", str(synthetic_root["prostate"]), "--sites", "RUNMC",
                "--overlays", str(tmp_path / "out"), "--json", str(tmp_path / "out" / "m.json")]
    else:
        scans = tmp_path / "scans"
        scans.mkdir()
        nib.save(nib.Nifti1Image(np.ones((32, 32, 3), np.float32), np.eye(4)), scans / "a.nii.gz")
        argv = ["segment", "--model", str(ckpt), "--out", str(tmp_path / "out"), str(scans)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"feddg {command}: error: {ckpt}: the weights do not fit: parameter {name!r} holds NaN" in err
    assert not (tmp_path / "out").exists()


def test_evaluate_command_prints_the_table_and_writes_overlays(tmp_path, synthetic_root, capsys):
    ckpt = save_checkpoint(tmp_path / "best.pt", tiny_experiment("prostate"))
    out_json = tmp_path / "metrics.json"
    code = main(["evaluate", "--model", str(ckpt), "--data-root", str(synthetic_root["prostate"]),
                 "--sites", "RUNMC", "--overlays", str(tmp_path / "overlays"), "--json", str(out_json)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "RUNMC" in printed and "Dice" in printed and "HD95" in printed
    rows = json.loads(out_json.read_text())["table"]
    assert rows and all(math.isfinite(r[m]) for r in rows for m in ("dice", "hd95", "asd"))
    assert rows[0]["unit"] == "mm"
    pngs = list((tmp_path / "overlays" / "RUNMC").glob("*.png"))
    assert len(pngs) == 3 * 4  # 3 cases x 4 slices in the tiny synthetic site


def test_evaluate_unknown_site_names_it(tmp_path, synthetic_root, capsys):
    ckpt = save_checkpoint(tmp_path / "best.pt", tiny_experiment("prostate"))
    code = main(["evaluate", "--model", str(ckpt), "--data-root", str(synthetic_root["prostate"]), "--sites", "NOPE"])
    assert code == 1
    assert "site NOPE: " in capsys.readouterr().err


def test_evaluate_scores_every_good_site_and_lists_the_broken_one(tmp_path, synthetic_root, capsys):
    """One site with a damaged scan: the other site gets its table rows, overlays and JSON entry, the broken one is
    listed at the end (stderr and JSON), and the exit code says that not everything was scored."""
    import shutil

    root = tmp_path / "data"
    for site in ("BMC", "RUNMC"):
        shutil.copytree(synthetic_root["prostate"] / site, root / site)
    (root / "BMC" / "Case01.nii.gz").write_bytes(b"truncated")
    ckpt = save_checkpoint(tmp_path / "best.pt", tiny_experiment("prostate"))
    out_json = tmp_path / "metrics.json"
    code = main(["evaluate", "--model", str(ckpt), "--data-root", str(root), "--sites", "BMC", "RUNMC",
                 "--overlays", str(tmp_path / "overlays"), "--json", str(out_json)])
    assert code == 1
    captured = capsys.readouterr()
    assert "RUNMC" in captured.out and "BMC" not in captured.out
    failures = captured.err.strip().splitlines()
    assert failures[0] == "1 of 2 site(s) failed; the others are done:"
    assert failures[1].startswith("  site BMC: ") and "Case01.nii.gz" in failures[1] and len(failures) == 2
    saved = json.loads(out_json.read_text())
    assert {r["site"] for r in saved["table"]} == {"RUNMC"} and list(saved["sites"]) == ["RUNMC"]
    assert list(saved["failed_sites"]) == ["BMC"] and "Case01.nii.gz" in saved["failed_sites"]["BMC"]
    assert len(list((tmp_path / "overlays" / "RUNMC").glob("*.png"))) == 3 * 4


@pytest.mark.parametrize("axcodes_flip", [(1, 1, 1), (-1, 1, -1)])
def test_segment_writes_masks_in_the_scans_own_geometry(tmp_path, axcodes_flip):
    """A bright box in a non-canonical scan, and a 'model' that thresholds the preprocessed intensity: the mask
    must come back on the box, in the scan's own voxel order, with the scan's affine and size."""
    exp = tiny_experiment("prostate")
    cfg = experiment_from_dict(exp)
    shape = (40, 56, 7)
    volume = np.zeros(shape, np.float32)
    volume[10:25, 20:44, 2:5] = 100.0
    # Axes permuted (stored as y, x, z) and some flipped, anisotropic spacing.
    affine = np.array([[0, 0.7 * axcodes_flip[0], 0, 10], [0.5, 0, 0, -5], [0, 0, 3.0 * axcodes_flip[2], 2],
                       [0, 0, 0, 1]], float)
    scan = tmp_path / "scan.nii.gz"
    nib.save(nib.Nifti1Image(volume, affine), scan)

    def predict(images: np.ndarray) -> np.ndarray:
        return images - 1.0  # z-scored box voxels are far above 1, background below

    out = segment_nifti(predict, scan, tmp_path / "scan_mask.nii.gz", cfg)
    mask_img = nib.load(out)
    assert mask_img.shape == shape
    np.testing.assert_allclose(mask_img.affine, affine)
    np.testing.assert_allclose(mask_img.header.get_zooms(), nib.load(scan).header.get_zooms())
    mask = np.asanyarray(mask_img.dataobj)
    assert mask.dtype == np.uint8
    box = volume > 0
    dice = 2 * np.logical_and(mask > 0, box).sum() / (mask.astype(bool).sum() + box.sum())
    assert dice > 0.9


def test_segment_command_on_a_folder(tmp_path):
    exp = tiny_experiment("prostate")
    ckpt = save_checkpoint(tmp_path / "m.pt", exp)
    scans = tmp_path / "scans"
    scans.mkdir()
    nib.save(nib.Nifti1Image(np.random.default_rng(0).normal(size=(32, 32, 3)).astype(np.float32), np.eye(4)),
             scans / "a.nii.gz")
    assert main(["segment", "--model", str(ckpt), "--out", str(tmp_path / "masks"), str(scans)]) == 0
    assert nib.load(tmp_path / "masks" / "a_mask.nii.gz").shape == (32, 32, 3)


def test_check_data_command(synthetic_root, capsys):
    assert main(["check-data", "--layout", "saml_nifti", "--root", str(synthetic_root["prostate"])]) == 0
    assert "RUNMC" in capsys.readouterr().out


def test_synth_command_writes_the_jobs_data_set(tmp_path, monkeypatch):
    """`feddg synth` with no sizes writes exactly what a job generates into its cache."""
    from feddg.data.synthetic import ensure_synthetic
    from feddg.experiment import experiment_from_dict
    from feddg.jobs import experiment

    assert main(["synth", "--task", "fundus", "--out", str(tmp_path / "out")]) == 0
    cfg = experiment_from_dict(experiment("fundus", "fedavg"))
    cfg.data.cache_dir = str(tmp_path / "cache")
    cached = ensure_synthetic(cfg.data)
    written = sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*.png"))
    assert written == sorted(p.relative_to(cached) for p in cached.rglob("*.png"))
    assert len(written) == 2 * 4 * 24  # image + mask, 4 domains, 24 images each


def test_overlays_for_folder_qualified_case_ids(tmp_path):
    """PNG layouts name cases 'train/00': the overlay is a file in the output folder, not a sub-path."""
    from feddg.data.dataset import SliceSet
    from feddg.inference import write_overlays

    labels = np.zeros((2, 1, 16, 16), np.uint8)
    labels[:, :, 4:10, 4:10] = 1
    s = SliceSet(site="X", images=np.random.default_rng(0).normal(size=(2, 1, 16, 16)).astype(np.float32),
                 labels=labels, case_ids=["train/00", "test/00"], slice_index=np.array([1, 1]), spacing=None)
    written = write_overlays(s, labels.astype(bool), tmp_path / "ov")
    assert sorted(p.name for p in written) == ["test_00_001.png", "train_00_001.png"]
    assert all(p.parent == tmp_path / "ov" for p in written)


# ---------------------------------------------------------------------------------------------- MLA bundle
def _mla_bundle(tmp_path, synthetic_root, exp):
    from feddg.data.dataset import load_site
    from feddg.methods.mla.attention import train_domain_attention
    from feddg.methods.mla.encoders import build_feature_encoder, encode
    from feddg.flare.mla.bundle import save_bundle

    cfg = experiment_from_dict({**exp, "data": {**exp["data"], "root": str(synthetic_root["prostate"])}})
    models = {}
    for i, site in enumerate(("BIDMC", "HK")):
        torch.manual_seed(i)
        models[site] = build_model(cfg)
    encoder = build_feature_encoder(1, 0, width=4)
    bank = {s: encode(encoder, load_site(cfg.data, s)["train"].images) for s in models}
    attention, order, _ = train_domain_attention(bank, epochs=2, conv_channels=8, hidden=8)
    return save_bundle(tmp_path / "bundle", models, encoder, attention, exp, site_order=order)


def test_evaluate_command_scores_an_mla_bundle_next_to_the_global_model(tmp_path, synthetic_root, capsys):
    exp = tiny_experiment("prostate")
    exp["model"]["bin_levels"] = 3
    ckpt = save_checkpoint(tmp_path / "FL_global_model.pt", exp)
    bundle = _mla_bundle(tmp_path, synthetic_root, exp)
    out_json = tmp_path / "metrics.json"
    code = main(["evaluate", "--model", str(ckpt), "--bundle", str(bundle), "--data-root",
                 str(synthetic_root["prostate"]), "--sites", "RUNMC", "--json", str(out_json)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "global RUNMC" in printed and "mla    RUNMC" in printed
    assert "MLA attention weights at RUNMC (mean, from 12 images): BIDMC " in printed
    saved = json.loads(out_json.read_text())
    assert [r["model"] for r in saved["table"]] == ["global", "mla"]
    assert all(math.isfinite(r[m]) for r in saved["table"] for m in ("dice", "hd95", "asd"))
    assert sum(saved["info"]["mla"]["RUNMC"]["weights"].values()) == pytest.approx(1.0)
    assert saved["saved_models"] == {"mla": str(bundle)}
    # a hospital with the bundle alone
    assert main(["evaluate", "--bundle", str(bundle), "--data-root", str(synthetic_root["prostate"]),
                 "--sites", "RUNMC"]) == 0
    assert "mla    RUNMC" in capsys.readouterr().out


def test_evaluate_needs_a_model_or_a_bundle(tmp_path, synthetic_root, capsys):
    assert main(["evaluate", "--data-root", str(synthetic_root["prostate"]), "--sites", "RUNMC"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["evaluate", "--bundle", str(tmp_path), "--data-root", str(synthetic_root["prostate"]),
                 "--sites", "RUNMC"]) == 2
    assert "manifest.json is missing" in capsys.readouterr().err


def test_simulate_opts_the_simulated_sites_in_for_jobs_that_keep_local_models(tmp_path):
    from feddg.simulate import configure_simulated_sites
    from feddg.recipes.export import write_job

    mla_job = write_job(tmp_path / "jobs", "prostate_mlabin")
    plain_job = write_job(tmp_path / "jobs", "prostate_fedavg")
    assert configure_simulated_sites(plain_job, tmp_path / "ws1" / "local") is None
    assert not (tmp_path / "ws1" / "local" / "feddg_site.json").exists()
    path, settings = configure_simulated_sites(mla_job, tmp_path / "ws2" / "local")
    assert json.loads(path.read_text()) == settings == {"share_local_model": True}
    path.write_text('{"share_local_model": false}')  # the user's own file stays
    assert configure_simulated_sites(mla_job, tmp_path / "ws2" / "local") is None
    assert json.loads(path.read_text()) == {"share_local_model": False}
