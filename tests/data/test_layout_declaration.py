"""Each data layout is declared once (feddg.layouts.LAYOUTS) and everything else is derived from the declaration: the
schema's allowed ``data.layout`` values and its layout -> task check, every ``--layout`` option of the CLI, the data
check, the loader's scanner and decoder, and the file patterns the documentation shows."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from feddg.config import TASKS, ConfigError, DataConfig, config_from_dict
from feddg.data.layouts import discover_site, layout_spec
from feddg.data.layouts.registry import implementation
from feddg.data.synthetic import TASK_LAYOUTS
from feddg.layouts import LAYOUTS, by_name, files_help, layouts_for, layouts_table
from tests.conftest import REPOSITORY


def layout_options(parser: argparse.ArgumentParser) -> dict[str, list[str] | None]:
    """Each sub-command's ``--layout`` choices (None: any value), from the parser itself."""
    found = {}
    for action in parser._subparsers._group_actions:  # the sub-command actions
        for command, sub in action.choices.items():
            for option in sub._actions:
                if option.dest == "layout":
                    found[command] = None if option.choices is None else list(option.choices)
    return found


def test_every_declaration_names_a_known_task_and_code_that_exists():
    for name, layout in LAYOUTS.items():
        assert layout.name == name and layout.task in TASKS
        assert layout.channels == TASKS[layout.task][0]  # the decoder gives the task's input channels
        assert callable(implementation(layout.scanner)) and callable(implementation(layout.decoder))
        assert layout_spec(name) is layout


def test_the_schema_allows_exactly_the_declared_layouts_and_checks_their_task():
    assert list(get_args(DataConfig.model_fields["layout"].annotation)) == list(LAYOUTS)
    for name, layout in LAYOUTS.items():
        assert config_from_dict({"data": {"task": layout.task, "layout": name, "root": None}}).data.layout == name
        other = next(task for task in TASKS if task != layout.task)
        with pytest.raises(ConfigError, match=rf"data.layout: '{name}' holds {layout.task} data, not {other} data; "
                                              rf"choose one of \[{', '.join(map(repr, layouts_for(other)))}\]"):
            config_from_dict({"data": {"task": other, "layout": name, "root": None}})
    with pytest.raises(ConfigError, match="data.layout"):
        config_from_dict({"data": {"task": "prostate", "layout": "not_a_layout", "root": None}})


def test_every_cli_layout_option_offers_exactly_the_declared_layouts():
    from feddg.cli import build_parser
    from feddg.data.check import main as check_main

    options = layout_options(build_parser())
    assert {"check-data", "evaluate", "benchmark"} <= set(options)
    assert options == {command: list(LAYOUTS) for command in options}
    with pytest.raises(SystemExit) as stop:
        check_main(["not_a_layout", "/nowhere"])
    assert stop.value.code == 2  # refused by the choices, before any file is read


def test_the_synthetic_generator_writes_declared_layouts_of_its_task():
    for task, name in TASK_LAYOUTS.items():
        assert LAYOUTS[name].task == task


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_documented_file_patterns_are_what_the_scanner_finds(tmp_path, name):
    """One image and one mask written where :attr:`Layout.image_files` / ``mask_files`` say are found as a pair."""
    layout = LAYOUTS[name]
    values = {"<SITE>": "SITEA", "{train,test}": "train", "<case>": "p1", "<slice>": "03", "<name>": "eye"}

    def materialise(pattern: str) -> Path:
        for placeholder, value in values.items():
            pattern = pattern.replace(placeholder, value)
        path = tmp_path / pattern
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")  # the scanner reads no pixel data
        return path

    image, mask = materialise(layout.image_files), materialise(layout.mask_files)
    (record,) = discover_site(name, tmp_path, "SITEA")
    assert (record.image_path, record.mask_path) == (image, mask)
    assert record.split == ("train" if layout.split_folders else None)
    assert f"{name}: images {layout.image_files}, masks {layout.mask_files}" in files_help()
    assert f"| `{name}` | {layout.task} | `{layout.image_files}` | `{layout.mask_files}` |" in layouts_table()


def test_a_declaration_with_bad_values_or_a_repeated_name_is_refused():
    good = LAYOUTS["slice_png"]
    with pytest.raises(ValueError, match=r"layout 'slice_png': decoder 'feddg.data.layouts.slice_png' is not a "
                                         r"'module:function' path"):
        replace(good, decoder="feddg.data.layouts.slice_png")
    with pytest.raises(ValueError, match=r"intensity 'minmax'"):
        replace(good, intensity="minmax")
    with pytest.raises(ValueError, match=r"suffixes \('\.PNG',\)"):
        replace(good, suffixes=(".PNG",))
    with pytest.raises(ValueError, match=r"data layouts declared twice: \['slice_png'\]"):
        by_name((good, LAYOUTS["dofe_png"], good))


def test_the_declaration_and_the_schema_load_without_numpy_pil_nibabel_or_torch():
    code = ("import sys, feddg.layouts, feddg.config; "
            "print([m for m in ('numpy', 'PIL', 'nibabel', 'torch', 'nvflare', 'monai') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# A fourth layout, declared once (like dofe_png but in other folders and with its own suffix), before anything else
# is imported: the schema, every --layout option and the data check take it, and the scanner uses its folders.
FOURTH_LAYOUT = """
import json, sys
from dataclasses import replace
from types import MappingProxyType
import feddg.layouts as declared
toy = replace(declared.LAYOUTS["dofe_png"], name="toy_png", image_folder=("img",), mask_folder=("lbl",),
              suffixes=(".tiny.png",), description="a fourth layout")
declared.LAYOUTS = declared.by_name((*declared.LAYOUTS.values(), toy))
from typing import get_args
from feddg.cli import build_parser
from feddg.config import ConfigError, DataConfig, config_from_dict
from feddg.data.check import check_data
from tests.data.test_layout_declaration import layout_options
schema = list(get_args(DataConfig.model_fields["layout"].annotation))
assert config_from_dict({"data": {"task": "fundus", "layout": "toy_png", "root": None}}).data.layout == "toy_png"
try:
    config_from_dict({"data": {"task": "prostate", "layout": "toy_png", "root": None}})
    refused = None
except ConfigError as e:
    refused = str(e)
report = check_data("toy_png", sys.argv[1])
print(json.dumps({"schema": schema, "options": layout_options(build_parser()), "refused": refused,
                  "ok": report["ok"], "task": report["task"], "problems": report["problems"],
                  "splits": report["sites"]["SITEA"]["splits"]}))
"""


def test_a_fourth_layout_declared_once_appears_everywhere(tmp_path, fx):
    import numpy as np

    image, mask = fx.fundus_pair(np.random.default_rng(0))
    fx.write_png(tmp_path / "SITEA" / "train" / "img" / "eye.tiny.png", image)
    fx.write_png(tmp_path / "SITEA" / "train" / "lbl" / "eye.tiny.png", mask)
    fx.write_png(tmp_path / "SITEA" / "test" / "img" / "eye2.tiny.png", image)
    fx.write_png(tmp_path / "SITEA" / "test" / "lbl" / "eye2.tiny.png", mask)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", FOURTH_LAYOUT, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=REPOSITORY)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    everywhere = [*LAYOUTS, "toy_png"]
    assert seen["schema"] == everywhere
    assert seen["options"] and all(choices == everywhere for choices in seen["options"].values())
    assert "'toy_png' holds fundus data, not prostate data" in seen["refused"]
    assert (seen["ok"], seen["task"], seen["problems"]) == (True, "fundus", [])
    one = {"images": 1, "cases": 1, "slices": 1}
    assert seen["splits"] == {"train": one, "test": one}


def test_the_documented_layouts_table_is_the_generated_one():
    from feddg.layouts import layouts_table

    page = REPOSITORY / "docs" / "real-data.md"
    assert layouts_table() in page.read_text(), "regenerate the table in docs/real-data.md (feddg.layouts.layouts_table)"
