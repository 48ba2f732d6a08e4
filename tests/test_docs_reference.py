"""The "feddg.yaml reference" page is generated from the experiment schema: every key with its type, default,
allowed values and description, every key described, and the committed page equal to what the schema gives."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from feddg.docs_reference import UndescribedError, load_schema, main, render, undescribed
from feddg.experiment import experiment_schema
from tests.conftest import REPOSITORY

PAGE = REPOSITORY / "docs" / "reference" / "feddg-yaml.md"
# Every key of experiment_schema() has Field(description=...): a key added without one fails the drift test.
REQUIRE_DESCRIPTIONS = True


class _Inner(BaseModel):
    """How the inner things are sized."""

    model_config = ConfigDict(extra="forbid")
    width: int = Field(32, ge=1, description="channels of the first stage")


class _Outer(BaseModel):
    """The outer section."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["mean", "per_image"] = Field("mean", description="how to combine | per site")
    ratio: float = Field(0.2, ge=0, lt=1, description="share held out")
    cap: int | None = Field(None, gt=0, description="an upper bound; null: none")
    widths: list[int] = Field(default_factory=lambda: [16, 32], min_length=2, max_length=2,
                              description="the two ``widths``")
    name: str = Field(description="required, no default")
    inner: _Inner = Field(default_factory=_Inner, description="the inner settings")


class _Schema(BaseModel):
    outer: _Outer = Field(description="what the outer section holds")


def _row(page: str, key: str) -> list[str]:
    line = next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def test_each_key_shows_its_type_default_allowed_values_and_description():
    page = render(_Schema, require_descriptions=True)
    assert _row(page, "mode") == ["`mode`", "string", '`"mean"`', 'one of `"mean"`, `"per_image"`',
                                  "how to combine \\| per site"]  # a pipe would split the table's cell
    assert _row(page, "ratio") == ["`ratio`", "number", "`0.2`", "0 <= x < 1", "share held out"]
    assert _row(page, "cap") == ["`cap`", "integer or null", "`null`", "x > 0", "an upper bound; null: none"]
    assert _row(page, "widths") == ["`widths`", "list of integer", "`[16, 32]`", "exactly 2 items",
                                    "the two `widths`"]  # default_factory called; reST code as markdown code
    assert _row(page, "name")[2] == "required"
    assert _row(page, "width") == ["`width`", "integer", "`32`", "x >= 1", "channels of the first stage"]


def test_a_nested_section_has_its_own_table_linked_from_its_parent():
    page = render(_Schema)
    assert "## `outer` {#outer}\n\nWhat the outer section holds. The outer section.\n" in page
    assert "## `outer.inner` {#outer-inner}\n\nThe inner settings. How the inner things are sized.\n" in page
    assert _row(page, "inner") == ["`inner`", "section", "", "", "see [`outer.inner`](#outer-inner)"]
    assert page.index("## `outer`") < page.index("## `outer.inner`")


def test_every_key_and_section_without_a_description_is_named_at_once():
    class Bare(BaseModel):
        rounds: int = 3
        lr: float = Field(1e-3, description="learning rate")

    class Schema(BaseModel):
        train: Bare = Field(default_factory=Bare)

    assert undescribed(Schema) == ["train (section)", "train.rounds"]
    with pytest.raises(UndescribedError, match=r"no description .*: train \(section\), train\.rounds$"):
        render(Schema, require_descriptions=True)
    assert "| `rounds` | integer | `3` |  |  |" in render(Schema)  # without the flag: rendered, description empty


def test_the_committed_page_is_what_the_experiment_schema_gives():
    """The drift test: a key, default, range or description changed in the schema (a method's section included)
    without regenerating the page fails here."""
    expected = render(experiment_schema(), require_descriptions=REQUIRE_DESCRIPTIONS)
    assert PAGE.read_text() == expected, "regenerate with: python -m feddg.docs_reference"
    for section in ("data", "data.synthetic", "model", "train", "eval", "ga", "gradalign", "elcfs", "mla"):
        assert f"## `{section}`" in expected


def test_check_names_the_drift_and_writing_fixes_it(tmp_path, capsys):
    page = tmp_path / "feddg-yaml.md"
    args = ["--page", str(page), "--schema", "feddg.config:FedDGConfig"]
    assert main([*args, "--check"]) == 1
    assert f"{page}: is missing; regenerate with python -m feddg.docs_reference" in capsys.readouterr().err
    assert main(args) == 0 and main([*args, "--check"]) == 0
    page.write_text(page.read_text().replace("| `rounds` | integer | `5` |", "| `rounds` | integer | `7` |"))
    assert main([*args, "--check"]) == 1
    err = capsys.readouterr().err
    assert "differs from the schema feddg.config:FedDGConfig (line " in err and "`7`" in err and "`5`" in err


def test_a_schema_that_is_not_a_model_is_refused_by_name(capsys):
    with pytest.raises(ValueError, match="expected module:name"):
        load_schema("feddg.config")
    with pytest.raises(ValueError, match="not a pydantic model class"):
        load_schema("feddg.config:TASKS")
    assert load_schema("feddg.experiment:experiment_schema") is experiment_schema()  # a function is called
    assert main(["--schema", "feddg.nowhere:X", "--check"]) == 2
    assert "--schema 'feddg.nowhere:X'" in capsys.readouterr().err
