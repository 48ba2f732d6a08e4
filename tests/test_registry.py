"""The registry composes methods from parts that own their settings, site hooks and server files: what one part
declares, no other may; the experiment schema is the base sections plus the parts' sections; a plug-in method is
registered from an entry point; and none of it imports torch or NVFlare."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from feddg.config import ConfigError
from feddg.experiment import Section, experiment_from_dict, experiment_schema
from feddg.flare import registry
from feddg.flare.ga.part import GENERALIZATION_GAP
from feddg.flare.ga.part import PART as GA
from feddg.flare.method_spec import Component, Method, MethodPart, ServerFile, SiteHook
from feddg.flare.registry import hook_sends, register, register_entry_points, server_files, unregister
from tests.conftest import tiny_experiment
from tests.imports import heavy_imports
from tests.toy_method.plugin import write_plugin

AGG = Component("feddg.flare.fedavg.aggregator.SampleSizeAggregator")


@pytest.fixture
def toy():
    from tests.toy_method.part import METHOD

    yield register(METHOD)
    unregister(METHOD.name)


@pytest.mark.parametrize("clash,what", [
    (MethodPart(name="other", aggregator=AGG, section=Section("ga", GA.section.settings, "x")),
     "feddg.yaml section 'ga'"),
    (MethodPart(name="other", aggregator=AGG, site_hooks=(SiteHook(Component("x.Hook", id="h"),
                                                                   sends=(GENERALIZATION_GAP,)),)),
     "site hook metadata key 'generalization_gap'"),
    (MethodPart(name="other", aggregator=AGG, server_files=(ServerFile("ga_weights.json", writer="x.W"),)),
     "server file 'ga_weights.json'"),
], ids=["section", "hook-key", "server-file"])
def test_a_part_that_declares_what_another_part_has_is_refused_naming_both(clash, what):
    with pytest.raises(ValueError, match=rf"part 'other' declares the {what}, which part 'ga' declares already"):
        register(Method("clash", (clash,)))
    assert "clash" not in registry.methods()


def test_a_section_named_like_a_base_section_is_refused_and_nothing_is_registered():
    from feddg.experiment import sections

    before = sections()
    part = MethodPart(name="odd", aggregator=AGG, section=Section("train", GA.section.settings, "x"))
    with pytest.raises(ValueError, match=r"method 'odd': part 'odd': feddg.yaml section 'train' is a base section"):
        register(Method("odd", (part,)))
    assert "odd" not in registry.methods() and sections() == before


def test_two_parts_of_one_new_method_may_not_clash_either():
    a = MethodPart(name="a", aggregator=AGG, server_files=(ServerFile("same.json", writer="x.A"),))
    b = MethodPart(name="b", server_files=(ServerFile("same.json", writer="x.B"),))
    with pytest.raises(ValueError, match="part 'b' declares the server file 'same.json', which part 'a'"):
        register(Method("pair", (a, b)))


def test_the_schema_is_the_base_sections_and_every_registered_section(toy):
    assert list(experiment_schema().model_fields) == ["data", "model", "train", "eval", "ga", "gradalign", "elcfs",
                                                      "mla", "median"]
    exp = tiny_experiment("prostate")
    assert experiment_from_dict({**exp, "median": {"trim": 2}}).median.trim == 2
    with pytest.raises(ConfigError, match=r"median\.trimm: unknown key; known keys are \['trim'\]"):
        experiment_from_dict({**exp, "median": {"trimm": 2}})
    with pytest.raises(ConfigError, match=r"median\.trim: must leave at least one of the 5 training sites, got 5"):
        experiment_from_dict({**exp, "median": {"trim": 5}})  # the part's own check, run on the whole experiment
    unregister("median")
    with pytest.raises(ConfigError, match=r"median: unknown key; known keys are"):
        experiment_from_dict({**exp, "median": {"trim": 2}})


def test_a_section_key_without_description_or_with_a_wrong_type_is_still_refused_by_name():
    exp = tiny_experiment("prostate")
    with pytest.raises(ConfigError, match=r"ga\.step_size: .*got '0\.1'"):
        experiment_from_dict({**exp, "ga": {"step_size": "0.1"}})


def test_every_key_of_the_schema_has_a_description(toy):
    def walk(model, prefix):
        for name, field in model.model_fields.items():
            assert field.description, f"{prefix}{name} has no description"
            inner = field.annotation
            if isinstance(inner, type) and hasattr(inner, "model_fields"):
                walk(inner, f"{prefix}{name}.")
    walk(experiment_schema(), "")


def test_hooks_and_server_files_are_read_from_the_parts(toy):
    from tests.toy_method.hook import UpdateNorm

    assert hook_sends(UpdateNorm) == ("median_update_norm",)
    assert {"median_update_norm", GENERALIZATION_GAP} <= registry.train_meta()
    assert {f.name for f in server_files()} == {"ga_weights.json", "median_history.json"}
    assert registry.method("elcfs_ga").executor_args == {"site_hooks": ["generalization_gap"]}
    assert "site_hooks" not in registry.method("fedavg").executor_args


def test_the_sweep_keeps_and_resume_carries_a_plugin_methods_server_file(toy, tmp_path):
    from feddg.benchmark.cells import kept_files
    from feddg.recipes.export import write_job
    from feddg.resume import _carried_histories

    assert "median_history.json" in kept_files()
    job = write_job(tmp_path, "prostate_median")
    server = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "median_history.json").write_text(json.dumps({"history": [{"round": 0}, {"round": 1}]}))
    carried = _carried_histories(server, previous, done=2)
    (file, (writers, found)), = carried.items()
    assert file.name == "median_history.json" and found == previous / "median_history.json"
    assert [w["path"] for w in writers] == ["tests.toy_method.aggregator.MedianAggregator"]
    with pytest.raises(ValueError, match="the history ends with round 1, but the model was saved after round 2"):
        _carried_histories(server, previous, done=3)


def test_a_plugin_is_registered_from_its_entry_point_and_a_broken_one_is_named(tmp_path, monkeypatch):
    folder = write_plugin(tmp_path / "good")
    monkeypatch.syspath_prepend(str(folder))
    try:
        assert register_entry_points() == ["median"]
        assert register_entry_points() == []  # already there: nothing added twice
    finally:
        unregister("median")
    broken = tmp_path / "broken" / "feddg_broken-0.0.dist-info"
    broken.mkdir(parents=True)
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: feddg-broken\nVersion: 0.0\n")
    (broken / "entry_points.txt").write_text("[feddg.methods]\nbroken = no_such_module:METHOD\n")
    monkeypatch.syspath_prepend(str(broken.parent))
    with pytest.raises(ImportError, match=r"entry point 'broken' = 'no_such_module:METHOD' \(group feddg.methods\)"):
        register_entry_points()
    unregister("median")


def test_the_registry_imports_neither_torch_nor_nvflare():
    code = ("import feddg.experiment as e, feddg.flare.registry as r; e.experiment_schema(); r.site_limits(); "
            "r.server_files()")
    assert heavy_imports(code) == []


def test_a_method_registered_twice_is_refused(toy):
    with pytest.raises(ValueError, match="a method named 'median' is registered already"):
        register(replace(toy))


def test_a_site_hook_without_a_component_id_is_refused_by_its_path():
    with pytest.raises(ValueError, match=r"site hook x\.Hook: its Component needs an id"):
        SiteHook(Component("x.Hook"), sends=("k",))
