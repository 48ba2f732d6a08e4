"""The MLA bundle a hospital outside the federation uses: round trip, application, and refusal of broken bundles."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from feddg.experiment import experiment_from_dict
from feddg.flare.mla.bundle import MANIFEST, MLABundle, load_bundle, save_bundle
from feddg.methods.mla.attention import DomainAttention, train_domain_attention
from feddg.methods.mla.combination import combine_state_dicts
from feddg.methods.mla.encoders import build_feature_encoder, encode, global_model_encoder
from feddg.nets.unet import build_model
from tests.conftest import tiny_experiment

SITES = ["BIDMC", "HK", "UCL"]


def _style_images(rng: np.random.Generator, i: int, n: int = 10) -> np.ndarray:
    """Images whose 'acquisition' differs by site: site i has its own smoothness and contrast curve."""
    x = rng.normal(size=(n, 1, 32, 32))
    for _ in range(i):  # site i: i passes of a 2x2 box blur
        x = (x + np.roll(x, 1, -1) + np.roll(x, 1, -2) + np.roll(x, (1, 1), (-1, -2))) / 4
    x = np.sign(x) * np.abs(x) ** (0.5 + 0.5 * i)
    return ((x - x.mean()) / x.std()).astype(np.float32)


@pytest.fixture(scope="module")
def parts():
    """Local models (BIN-Net, 3 levels), a random encoder and a DAM trained on three styled sites."""
    exp = tiny_experiment("prostate")
    exp["model"]["bin_levels"] = 3
    cfg = experiment_from_dict(exp)
    models = {}
    for i, site in enumerate(SITES):
        torch.manual_seed(i)
        models[site] = build_model(cfg)
    rng = np.random.default_rng(0)
    images = {site: _style_images(rng, i) for i, site in enumerate(SITES)}
    encoder = build_feature_encoder(1, seed=0, width=8)
    bank = {site: encode(encoder, x) for site, x in images.items()}
    attention, order, accuracy = train_domain_attention(bank, epochs=30)
    assert order == SITES and accuracy == 1.0
    return cfg, models, encoder, attention, images


@pytest.fixture
def bundle_dir(tmp_path, parts):
    cfg, models, encoder, attention, _ = parts
    return save_bundle(tmp_path / "bundle", models, encoder, attention, cfg)


def _equal_states(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_round_trip_keeps_every_part(bundle_dir, parts):
    cfg, models, encoder, attention, images = parts
    manifest = json.loads((bundle_dir / MANIFEST).read_text())
    assert manifest["sites"] == SITES and manifest["attention_mode"] == "mean"
    assert manifest["encoder"]["kind"] == "random" and manifest["encoder"]["seed"] == 0
    assert manifest["feddg_version"] and manifest["format_version"] == 1
    assert manifest["config"]["model"]["bin_levels"] == 3
    b = load_bundle(bundle_dir)
    assert isinstance(b, MLABundle) and b.sites == SITES and b.config.to_dict() == cfg.to_dict()
    assert all(_equal_states(b.local_states[s], models[s].state_dict()) for s in SITES)
    assert _equal_states(b.encoder.state_dict(), encoder.state_dict())
    assert _equal_states(b.attention.state_dict(), attention.state_dict())
    x = images["HK"]
    np.testing.assert_array_equal(b.features(x), encode(encoder, x))


def test_combine_weights_the_local_models_by_attention(bundle_dir, parts):
    _, models, _, _, images = parts
    b = load_bundle(bundle_dir)
    model, w = b.combine(images["UCL"])
    assert w.shape == (3,) and abs(w.sum() - 1) < 1e-6 and int(np.argmax(w)) == 2 and w[2] > 0.9
    expected = combine_state_dicts([models[s].state_dict() for s in SITES], w)
    assert _equal_states(model.state_dict(), expected)
    assert model.bin_levels == 3 and not model.training
    assert model(torch.from_numpy(images["UCL"][:2])).shape == (2, 1, 32, 32)
    per_image = b.weights(images["UCL"], "per_image")
    assert per_image.shape == (10, 3)
    np.testing.assert_allclose(per_image.mean(axis=0), w)
    with pytest.raises(ValueError, match="needs mode 'mean'"):
        b.combine(images["UCL"], mode="per_image")
    one_hot = b.model_for([0.0, 1.0, 0.0])  # the site's own model, exactly
    assert _equal_states(one_hot.state_dict(), models["HK"].state_dict())


def test_global_model_encoder_round_trip(tmp_path, parts):
    cfg, models, _, attention, images = parts
    torch.manual_seed(9)
    encoder = global_model_encoder(build_model(cfg))
    bank = {site: encode(encoder, x) for site, x in images.items()}
    attention, order, _ = train_domain_attention(bank, epochs=2)
    path = save_bundle(tmp_path / "b", models, encoder, attention, cfg.to_dict(), site_order=order,
                       attention_mode="per_image")
    b = load_bundle(path)
    assert b.manifest["encoder"] == {"kind": "global_model", "file": "encoder.pt"}
    assert b.attention_mode == "per_image"
    np.testing.assert_array_equal(b.features(images["BIDMC"]), bank["BIDMC"])
    assert b.weights(images["BIDMC"]).shape == (10, 3)  # the manifest's default mode


def test_save_refuses_inconsistent_parts(tmp_path, parts):
    cfg, models, encoder, attention, _ = parts
    with pytest.raises(ValueError, match="does not name exactly"):
        save_bundle(tmp_path / "a", models, encoder, attention, cfg, site_order=["BIDMC", "HK"])
    with pytest.raises(ValueError, match="outputs 2 domains but there are 3"):
        save_bundle(tmp_path / "a", models, encoder, DomainAttention(attention.in_features, 2), cfg)
    with pytest.raises(ValueError, match="encoder gives 32 features but the attention module takes 5"):
        save_bundle(tmp_path / "a", models, encoder, DomainAttention(5, 3), cfg)
    plain = experiment_from_dict(tiny_experiment("prostate"))  # bin_levels 0: the BIN models do not fit
    with pytest.raises(ValueError, match="do not fit the configured network"):
        save_bundle(tmp_path / "a", models, encoder, attention, plain)
    save_bundle(tmp_path / "a", models, encoder, attention, cfg)
    with pytest.raises(ValueError, match="already holds an MLA bundle"):
        save_bundle(tmp_path / "a", models, encoder, attention, cfg)
    save_bundle(tmp_path / "a", models, encoder, attention, cfg, overwrite=True)


# ---------------------------------------------------------------------------------------------- refusals


def _edit_manifest(path, edit):
    manifest = json.loads((path / MANIFEST).read_text())
    edit(manifest)
    (path / MANIFEST).write_text(json.dumps(manifest))


def _refused(path, message):
    return pytest.raises(ValueError, match=re.escape(f"MLA bundle {path}: ") + message)


def test_missing_manifest(tmp_path):
    with _refused(tmp_path, "manifest.json is missing"):
        load_bundle(tmp_path)


@pytest.mark.parametrize("field", ["sites", "config", "encoder", "attention", "local_models", "format_version"])
def test_missing_manifest_field(bundle_dir, field):
    _edit_manifest(bundle_dir, lambda m: m.pop(field))
    with _refused(bundle_dir, f"manifest.json: missing field '{field}'"):
        load_bundle(bundle_dir)


def test_missing_nested_field(bundle_dir):
    _edit_manifest(bundle_dir, lambda m: m["encoder"].pop("seed"))
    with _refused(bundle_dir, "manifest.json: encoder: missing field 'seed'"):
        load_bundle(bundle_dir)


def test_newer_format_version(bundle_dir):
    _edit_manifest(bundle_dir, lambda m: m.update(format_version=2))
    with _refused(bundle_dir, "manifest.json: format_version 2 is not supported"):
        load_bundle(bundle_dir)


@pytest.mark.parametrize("rel, what", [("local_models/site_01.pt", "local model of site 'HK'"),
                                       ("encoder.pt", "encoder"), ("attention.pt", "attention module")])
def test_listed_file_missing(bundle_dir, rel, what):
    (bundle_dir / rel).unlink()
    with _refused(bundle_dir, re.escape(f"file '{rel}' ({what}) listed in manifest.json is missing")):
        load_bundle(bundle_dir)


def test_unreadable_file(bundle_dir):
    (bundle_dir / "local_models" / "site_02.pt").write_bytes(b"not a tensor file")
    with _refused(bundle_dir, "cannot read 'local_models/site_02.pt'"):
        load_bundle(bundle_dir)


def test_local_models_disagree_in_keys(bundle_dir):
    f = bundle_dir / "local_models" / "site_01.pt"
    sd = torch.load(f, weights_only=True)
    del sd["final_conv.bias"]
    torch.save(sd, f)
    with _refused(bundle_dir, r"local models: state dicts disagree in keys: 'final_conv\.bias' is in model 0 "
                              r"\(BIDMC\) but not in model 1 \(HK\)"):
        load_bundle(bundle_dir)


def test_local_models_disagree_in_shapes(bundle_dir):
    f = bundle_dir / "local_models" / "site_02.pt"
    sd = torch.load(f, weights_only=True)
    sd["final_conv.weight"] = torch.zeros(2, 8, 1, 1)
    torch.save(sd, f)
    with _refused(bundle_dir, r"local models: state dicts disagree in shapes: 'final_conv\.weight' is "
                              r"\(1, 8, 1, 1\) in model 0 \(BIDMC\) but \(2, 8, 1, 1\) in model 2 \(UCL\)"):
        load_bundle(bundle_dir)


def test_local_models_that_do_not_fit_the_config(bundle_dir):
    _edit_manifest(bundle_dir, lambda m: m["config"]["model"].update(bin_levels=2))
    with _refused(bundle_dir, "local models: the local models do not fit the configured network"):
        load_bundle(bundle_dir)


def test_attention_output_size_differs_from_the_sites(bundle_dir, parts):
    _, _, _, attention, _ = parts
    bigger = DomainAttention(attention.in_features, 4)
    torch.save(bigger.state_dict(), bundle_dir / "attention.pt")
    with _refused(bundle_dir, r"the attention module outputs 4 domains \(manifest: 3\) but the bundle has 3 sites"):
        load_bundle(bundle_dir)


def test_a_site_dropped_from_the_manifest_is_refused(bundle_dir):
    _edit_manifest(bundle_dir, lambda m: m.update(sites=m["sites"][:2]))
    with _refused(bundle_dir, "the attention module outputs 3 domains"):
        load_bundle(bundle_dir)


def test_site_without_a_file(bundle_dir):
    _edit_manifest(bundle_dir, lambda m: m["local_models"].pop("UCL"))
    with _refused(bundle_dir, "manifest.json: 'local_models' lists no file for site 'UCL'"):
        load_bundle(bundle_dir)


def test_invalid_config(bundle_dir):
    _edit_manifest(bundle_dir, lambda m: m["config"]["model"].update(bin_levels=9))
    with _refused(bundle_dir, r"manifest.json: invalid 'config': model.bin_levels: input should be less than or "
                              r"equal to 5 \(got 9\)"):
        load_bundle(bundle_dir)


def test_loading_does_not_advance_the_global_rng(bundle_dir):
    state = torch.get_rng_state()
    load_bundle(bundle_dir).model_for([1 / 3, 1 / 3, 1 / 3])
    assert torch.equal(torch.get_rng_state(), state)


# ---------------------------------------------------------------------------------------------- payload form


def test_payload_round_trip_keeps_every_part(bundle_dir, parts):
    from feddg.flare.mla.bundle import bundle_from_payload, bundle_to_payload

    _, models, encoder, attention, images = parts
    payload = bundle_to_payload(load_bundle(bundle_dir))
    assert sorted(payload) == ["attention", "encoder", "local_models", "manifest"]
    arrays = [*payload["encoder"].values(), *payload["attention"].values(),
              *(v for sd in payload["local_models"].values() for v in sd.values())]
    assert all(isinstance(v, np.ndarray) for v in arrays)  # plain data for an NVFlare task
    json.dumps(payload["manifest"])
    b = bundle_from_payload(payload)
    assert b.path is None and b.sites == SITES and b.attention_mode == "mean"
    assert all(_equal_states(b.local_states[s], models[s].state_dict()) for s in SITES)
    assert _equal_states(b.encoder.state_dict(), encoder.state_dict())
    assert _equal_states(b.attention.state_dict(), attention.state_dict())
    np.testing.assert_array_equal(b.weights(images["HK"]), load_bundle(bundle_dir).weights(images["HK"]))


def _payload_refused(message):
    return pytest.raises(ValueError, match=re.escape("MLA bundle payload: ") + message)


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.pop("encoder"), r"expected exactly the parts .* \(missing \['encoder'\]"),
    (lambda p: p.update(images=np.zeros(3)), r"expected exactly the parts .* unexpected \['images'\]"),
    (lambda p: p["local_models"].pop("UCL"), "no local model for site 'UCL'"),
    (lambda p: p["local_models"].update(Mallory=p["local_models"]["HK"]),
     r"local models of sites the manifest does not list: \['Mallory'\]"),
    (lambda p: p["manifest"].update(format_version=2), "manifest.json: format_version 2 is not supported"),
    (lambda p: p["manifest"].pop("sites"), "manifest.json: missing field 'sites'"),
    (lambda p: p["local_models"]["HK"].pop("final_conv.bias"),
     r"local models: state dicts disagree in keys: 'final_conv\.bias' is in model 0 \(BIDMC\) but not in model 1"),
    (lambda p: p["local_models"]["HK"].update({"final_conv.weight": "weights"}),
     "local model of site 'HK' is not a state dict of arrays"),
    (lambda p: p["attention"].update({"fc2.weight": np.zeros((4, 64), np.float32)}),
     r"the attention module outputs 4 domains"),
    (lambda p: p["manifest"]["config"]["model"].update(bin_levels=2), "local models: the local models do not fit"),
    (lambda p: p["manifest"]["encoder"].update(kind="pretrained"), "manifest.json: unknown encoder kind 'pretrained'"),
])
def test_payload_refusals_are_those_of_a_folder(bundle_dir, edit, message):
    from feddg.flare.mla.bundle import bundle_from_payload, bundle_to_payload

    payload = bundle_to_payload(load_bundle(bundle_dir))
    edit(payload)
    with _payload_refused(message):
        bundle_from_payload(payload)


def test_payload_that_is_not_a_mapping():
    from feddg.flare.mla.bundle import bundle_from_payload

    with _payload_refused("expected a mapping"):
        bundle_from_payload([1, 2])


# ---------------------------------------------------------------------------------------------- application


def _labelled(images: np.ndarray, site: str):
    from feddg.data.dataset import SliceSet

    n = len(images)
    labels = (images[:, :1] > 0.5).astype(np.uint8)
    return SliceSet(site, images, labels, [f"c{i}" for i in range(n)], np.zeros(n, np.int64), None)


def test_evaluate_with_bundle_scores_the_combination_of_the_weight_split(bundle_dir, parts):
    from feddg.evaluation import evaluate_sliceset
    from feddg.flare.mla.bundle import evaluate_with_bundle

    _, _, _, _, images = parts
    b = load_bundle(bundle_dir)
    val, test = _labelled(images["UCL"][:5], "UCL"), _labelled(images["UCL"][5:], "UCL")
    metrics, info = evaluate_with_bundle(b, {"val": val, "test": test}, "val", torch.device("cpu"))
    w = b.weights(val.images, "mean")
    assert info["weights"] == pytest.approx(dict(zip(SITES, w))) and info["weights_from"] == "val"
    assert info["n_images"] == 5 and info["mode"] == "mean"
    expected = evaluate_sliceset(b.model_for(w), test, ("prostate",), torch.device("cpu"))["summary"]
    assert metrics["test"] == expected  # the test split is scored with the val split's weights
    per_image, info = evaluate_with_bundle(b, {"test": test}, "test", torch.device("cpu"), mode="per_image")
    assert info["mode"] == "per_image"
    assert info["weights"] == pytest.approx(dict(zip(SITES, b.weights(test.images, "per_image").mean(axis=0))))
    assert per_image["test"]["prostate"]["n_cases"] == 5


def test_per_image_mode_gives_each_image_its_own_model(bundle_dir, parts):
    from feddg.evaluation import evaluate_sliceset, predict_logits, score_logits
    from feddg.flare.mla.bundle import evaluate_with_bundle

    _, _, _, _, images = parts
    b = load_bundle(bundle_dir)
    mixed = _labelled(np.concatenate([images["BIDMC"][:2], images["UCL"][:2]]), "X")
    rows = b.weights(mixed.images, "per_image")
    logits = np.concatenate([predict_logits(b.model_for(rows[i]), mixed.images[i:i + 1], torch.device("cpu"))
                             for i in range(4)])
    metrics, _ = evaluate_with_bundle(b, {"test": mixed}, "test", torch.device("cpu"), mode="per_image")
    assert metrics["test"] == score_logits(logits, mixed, ("prostate",))["summary"]
    one_model = evaluate_sliceset(b.model_for(rows.mean(axis=0)), mixed, ("prostate",), torch.device("cpu"))
    assert metrics["test"]["loss"] != one_model["summary"]["loss"]
