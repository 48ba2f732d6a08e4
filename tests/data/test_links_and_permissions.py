"""Paths that cannot be used are problems naming the path, never silently skipped: symbolic links that are dangling
or loop (issue 11, case 1) and folders or files the OS refuses to read (case 4)."""

from __future__ import annotations

import os
import pickle
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from feddg.data.check import check_data, format_report
from feddg.data.dataset import load_site
from feddg.data.errors import DataError
from feddg.data.layouts import scan_site

NOBODY = 65534  # the conventional unprivileged uid/gid


# ----------------------------------------------------------------------------------------------- symbolic links


def _dangling(link: Path) -> Path:
    """Replace ``link`` (a file or folder) with a symbolic link to a path that does not exist."""
    _remove(link)
    link.symlink_to(link.parent / f"gone-{link.name}")
    return link


def _looping(link: Path) -> Path:
    """Replace ``link`` with a symbolic link that points to itself."""
    _remove(link)
    link.symlink_to(link)
    return link


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


def _slice_sites(root: Path, fx) -> None:
    fx.make_slice_site(root, "HK", {"train": {"00": 2}, "test": {"05": 1}})
    fx.make_slice_site(root, "UCL", {"train": {"00": 1}, "test": {"05": 1}})


BROKEN_LINKS = {
    # name: (layout, paths (relative to the root) to break, how)
    "dangling image": ("slice_png", ["HK/train/image/00_01.png"], _dangling),
    "looping mask": ("slice_png", ["HK/train/mask/00_00.png"], _looping),
    "image and mask both dangling": ("slice_png", ["HK/test/image/05_00.png", "HK/test/mask/05_00.png"], _dangling),
    "dangling site folder": ("slice_png", ["HK"], _dangling),
    "looping split folder": ("slice_png", ["HK/test"], _looping),
    "dangling mask folder": ("slice_png", ["HK/train/mask"], _dangling),
    "looping fundus image folder": ("dofe_png", ["HK/train/ROIs/image"], _looping),
    "dangling nifti volume": ("saml_nifti", ["HK/Case01.nii.gz"], _dangling),
    "looping nifti mask": ("saml_nifti", ["HK/Case00_segmentation.nii.gz"], _looping),
}


def _write_sites(layout: str, root: Path, fx) -> None:
    if layout == "slice_png":
        _slice_sites(root, fx)
    elif layout == "dofe_png":
        fx.make_dofe_site(root, "HK", {"train": ["a", "b"], "test": ["c"]})
        fx.make_dofe_site(root, "UCL", {"train": ["a"], "test": ["c"]})
    else:
        fx.make_saml_site(root, "HK", 2)
        fx.make_saml_site(root, "UCL", 1)


@pytest.mark.parametrize("case", sorted(BROKEN_LINKS))
def test_broken_symbolic_link_is_a_problem_naming_it(tmp_path, fx, case):
    layout, rels, breaker = BROKEN_LINKS[case]
    _write_sites(layout, tmp_path, fx)
    links = [breaker(tmp_path / rel) for rel in rels]

    report = check_data(layout, tmp_path)
    assert report["ok"] is False and "no problems found" not in format_report(report)
    assert list(report["sites"]) == ["HK", "UCL"]  # a dangling site link is still listed as a site
    problems = report["sites"]["HK"]["problems"]
    for link in links:
        (mine,) = [p for p in problems if f"{link}: broken symbolic link" in p]
        assert mine.startswith("site HK: ") and os.readlink(link) in mine
    assert not any("unpaired" in p for p in problems), "a broken link's partner is not unpaired"
    assert report["sites"]["UCL"]["problems"] == []

    cfg = fx.config(tmp_path, layout, ["HK", "UCL"], unseen="HK")
    with pytest.raises(DataError) as info:
        load_site(cfg, "HK")  # what `feddg evaluate` and training call: no case may disappear
    assert info.value.site == "HK" and "broken symbolic link" in str(info.value)
    assert str(links[0]) in info.value.paths


def test_links_to_real_files_and_folders_keep_working(tmp_path, fx):
    store = tmp_path / "store"
    _slice_sites(store, fx)
    root = tmp_path / "root"
    root.mkdir()
    (root / "UCL").symlink_to(store / "UCL", target_is_directory=True)  # a whole site linked
    hk = root / "HK"
    for sub in ("train/image", "train/mask", "test/image", "test/mask"):
        (hk / sub).mkdir(parents=True)
        for f in (store / "HK" / sub).iterdir():
            (hk / sub / f.name).symlink_to(f)  # every file linked
    report = check_data("slice_png", root)
    assert report["ok"] is True and report["problems"] == []
    assert report["sites"]["HK"]["splits"]["train"]["images"] == 2
    assert report["sites"]["UCL"]["splits"]["train"]["images"] == 1
    out = load_site(fx.config(root, "slice_png", ["HK", "UCL"], unseen="HK"), "HK")
    assert len(out["test"]) == 3


def test_pipe_named_like_an_image_is_a_problem(tmp_path, fx):
    """Not a link, but skipped silently the same way: a named pipe (reading it would block) is no image."""
    _slice_sites(tmp_path, fx)
    pipe = tmp_path / "HK" / "train" / "image" / "00_01.png"
    pipe.unlink()
    os.mkfifo(pipe)
    records, problems = scan_site("slice_png", tmp_path, "HK")
    assert [str(p) for p in problems] == [f"site HK: {pipe}: not a regular file"]
    assert pipe not in [r.image_path for r in records] and len(records) == 2


# ----------------------------------------------------------------------------------------------- permissions


def _run_unprivileged(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child that file permissions apply to, its result or exception handed back.

    Root reads a chmod-000 folder anyway, so as root (as in CI containers) the child first drops to uid/gid 65534;
    otherwise chmod alone blocks it. Everything the child runs must already be imported: the unprivileged child may
    not be able to read the Python installation (e.g. under /root).
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            outcome: tuple[str, Any] = ("returned", fn())
        except BaseException as e:  # handed to the parent to raise there
            outcome = ("raised", e)
        with os.fdopen(write_end, "wb") as f:
            f.write(pickle.dumps(outcome))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise value
    return value


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A temporary folder the unprivileged child can reach (pytest's tmp_path lies under a root-only folder)."""
    path = Path(tempfile.mkdtemp(prefix="feddg-permissions-"))
    path.chmod(0o755)
    yield path
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            p.chmod(stat.S_IRWXU)
    shutil.rmtree(path)


def _unreadable(path: Path) -> Path:
    path.chmod(0)
    return path


@pytest.mark.parametrize("layout", ["slice_png", "saml_nifti"])
def test_unreadable_site_folder_is_that_sites_problem(shared_tmp, fx, layout):
    _write_sites(layout, shared_tmp, fx)
    assert check_data(layout, shared_tmp)["ok"]  # a control run, which also imports every reader lazily loaded
    bad = _unreadable(shared_tmp / "HK")
    report = _run_unprivileged(lambda: check_data(layout, shared_tmp))
    (problem,) = report["sites"]["HK"]["problems"]
    assert problem == f"site HK: {bad}: cannot list folder (Permission denied)"
    assert report["sites"]["UCL"]["problems"] == [] and report["sites"]["UCL"]["splits"]  # the others are checked
    assert report["problems"] == [problem] and report["ok"] is False
    cfg = fx.config(shared_tmp, layout, ["HK", "UCL"], unseen="UCL")
    with pytest.raises(DataError) as info:
        _run_unprivileged(lambda: load_site(cfg, "HK"))
    assert str(info.value) == problem


def test_unreadable_split_folder_and_file(shared_tmp, fx):
    _slice_sites(shared_tmp, fx)
    assert check_data("slice_png", shared_tmp)["ok"]
    mask_dir = _unreadable(shared_tmp / "HK" / "test" / "mask")
    image = _unreadable(shared_tmp / "HK" / "train" / "image" / "00_01.png")
    report = _run_unprivileged(lambda: check_data("slice_png", shared_tmp))
    problems = report["sites"]["HK"]["problems"]
    assert f"site HK: {mask_dir}: cannot list folder (Permission denied)" in problems
    assert f"site HK: {image}: cannot read image file (Permission denied)" in problems
    assert len(problems) == 2
    assert report["sites"]["HK"]["splits"]["train"] == {"images": 2, "cases": 1, "slices": 1}  # the rest is checked


def test_unreadable_data_root_is_reported(shared_tmp, fx):
    root = shared_tmp / "data"
    _slice_sites(root, fx)
    assert check_data("slice_png", root)["ok"]
    _unreadable(root)
    report = _run_unprivileged(lambda: check_data("slice_png", root))
    assert report["problems"] == [f"{root}: cannot list folder (Permission denied)"] and report["sites"] == {}
    named = _run_unprivileged(lambda: check_data("slice_png", root, ["HK"]))
    assert named["problems"] == [f"site HK: {root / 'HK'}: cannot access (Permission denied)"]
