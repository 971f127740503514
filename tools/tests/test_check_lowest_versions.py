import re
import subprocess
from pathlib import Path

import check_lowest_versions as lowest
import pytest
from check_lowest_versions import PinError, Source

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["packaging", "strict"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with `packaging`, and again with the strict reader the isolation env uses."""
    if request.param == "strict":
        monkeypatch.setattr(lowest, "Requirement", None)
        monkeypatch.setattr(lowest, "Version", None)
    else:
        pytest.importorskip("packaging")
    return request.param


def lowest_of(text: str) -> str:
    return lowest.lowest_version(lowest.read_pin(text))


# Pins


@pytest.mark.parametrize(
    ("pin", "expected"),
    [
        ("pytree-module>=0.1.0,<0.2", "0.1.0"),
        ("pytree-module>=1.2", "1.2"),
        ("pytree-module==0.3.0", "0.3.0"),
        ("pytree_Module >= 0.2.1 , < 0.3 , != 0.2.2", "0.2.1"),
        ("pytree-module[treescope]>=0.1.0,<0.2", "0.1.0"),
        ("pytree-module>=0.1.0,>=0.1.4,<0.2", "0.1.4"),
    ],
)
def test_lowest_version_of_a_pin(reader: str, pin: str, expected: str) -> None:
    assert lowest_of(pin) == expected
    assert lowest.read_pin(pin).name == "pytree-module"


@pytest.mark.parametrize("pin", ["pytree-module<0.2", "pytree-module", "pytree-module!=0.1.1"])
def test_refuses_a_pin_without_lower_bound(reader: str, pin: str) -> None:
    with pytest.raises(PinError, match="has no lower bound, so no lowest version") as error:
        lowest_of(pin)
    assert repr(pin) in str(error.value)
    assert "NAME>=LOWEST,<NEXT" in str(error.value)


@pytest.mark.parametrize(
    "pin", ["pytree-module>0.1.0,<0.2", "pytree-module~=0.1.0", "pytree-module===0.1.0"]
)
def test_refuses_a_lower_bound_that_is_not_one_release(reader: str, pin: str) -> None:
    with pytest.raises(PinError, match="which has no single lowest release"):
        lowest_of(pin)


def test_refuses_a_pin_that_excludes_its_lowest_version(reader: str) -> None:
    with pytest.raises(PinError, match=re.escape("excludes its own lowest version 0.3")):
        lowest_of("pytree-module>=0.3,<0.2")


def test_refuses_a_pin_with_an_environment_marker(reader: str) -> None:
    with pytest.raises(PinError, match=re.escape("pytree-module>=0.1.0; python_version")):
        lowest_of("pytree-module>=0.1.0; python_version >= '3.11'")


def test_strict_reader_refuses_what_it_cannot_read_and_names_the_fix() -> None:
    for pin in ["pytree-module>=0.2.0rc1", "pytree-module @ file:///x", "pytree-module>=0.1.*"]:
        with pytest.raises(PinError, match=r"cannot read the pin .* install `packaging`"):
            lowest.read_pin_strictly(pin)


def test_packaging_reads_pre_releases_and_refuses_wildcards() -> None:
    pytest.importorskip("packaging")
    assert lowest_of("pytree-module>=0.2.0rc1,<0.3") == "0.2.0rc1"
    with pytest.raises(
        PinError, match=re.escape("uses `==0.1.*`, which has no single lowest release")
    ):
        lowest_of("pytree-module==0.1.*")


def test_versions_compare_by_value(reader: str) -> None:
    key = lowest.version_key
    assert key("0.1") == key("0.1.0")
    assert key("0.1.0") < key("0.1.1") < key("0.2") < key("0.10.0") < key("1.0.0")
    assert lowest.admits(lowest.read_pin("a>=0.1,<0.2"), "0.1.0")
    assert not lowest.admits(lowest.read_pin("a>=0.1,<0.2"), "0.2.0")


# Resolution: working tree, tag or neither, in a temporary git repository


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root), *args],
        check=True,
        capture_output=True,
    )


def write_package(
    root: Path, name: str, version: str, pins: tuple[str, ...] | list[str] = ()
) -> Path:
    folder = root / "packages" / name
    (folder / "src" / name).mkdir(parents=True, exist_ok=True)
    (folder / "src" / name / "__about__.py").write_text(f'__version__ = "{version}"\n')
    dependencies = ", ".join(f'"{pin}"' for pin in ["jax>=0.10.0", *pins])
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\ndynamic = ["version"]\ndependencies = [{dependencies}]\n'
    )
    return folder


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose package `up` pins `low>=0.1.0,<0.2`; both at 0.1.0, committed."""
    write_package(tmp_path, "low", "0.1.0")
    write_package(tmp_path, "up", "0.1.0", ["low>=0.1.0,<0.2"])
    git(tmp_path, "init", "--quiet")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "--quiet", "-m", "release")
    return tmp_path


def folders(root: Path) -> dict[str, Path]:
    return {path.parent.name: path.parent for path in root.glob("packages/*/pyproject.toml")}


def test_resolves_to_the_working_tree_when_it_holds_the_lowest_version(repo: Path) -> None:
    git(repo, "tag", "low-v0.1.0")  # the working tree wins even where a tag exists
    sources = lowest.plan_lowest(repo, folders(repo), "up")
    assert sources == {"low": Source("low", "0.1.0")}
    assert lowest.covered_by_isolation(sources)


def test_resolves_to_the_release_tag_when_the_tree_moved_on(repo: Path) -> None:
    git(repo, "tag", "low-v0.1.0")
    write_package(repo, "low", "0.1.1")
    sources = lowest.plan_lowest(repo, folders(repo), "up")
    assert sources == {"low": Source("low", "0.1.0", "low-v0.1.0")}
    assert str(sources["low"]) == "low 0.1.0 (tag low-v0.1.0)"
    assert not lowest.covered_by_isolation(sources)


def test_missing_tag_names_package_version_tag_and_fixes(repo: Path) -> None:
    write_package(repo, "low", "0.1.1")
    with pytest.raises(PinError) as error:
        lowest.plan_lowest(repo, folders(repo), "up")
    message = str(error.value)
    assert "up pins 'low>=0.1.0,<0.2'" in message
    assert "low 0.1.0 is neither in the working tree (low 0.1.1) nor tagged" in message
    assert "no git tag low-v0.1.0" in message
    assert "`git tag low-v0.1.0 COMMIT`" in message
    assert "`python tools/bump_version.py 0.1.1 --package low`" in message


def test_pin_above_the_working_tree_asks_for_that_release(repo: Path) -> None:
    write_package(repo, "up", "0.1.0", ["low>=0.2.0,<0.3"])
    with pytest.raises(PinError, match=re.escape("lower the pin, or release low 0.2.0 first")):
        lowest.plan_lowest(repo, folders(repo), "up")


def test_a_sibling_pinned_only_through_another_comes_at_that_pins_lowest(repo: Path) -> None:
    write_package(repo, "mid", "0.1.0", ["low>=0.1.0,<0.2"])
    write_package(repo, "up", "0.1.0", ["mid>=0.1.0,<0.2"])
    git(repo, "tag", "low-v0.1.0")
    write_package(repo, "low", "0.1.1")
    assert lowest.plan_lowest(repo, folders(repo), "up") == {
        "mid": Source("mid", "0.1.0"),
        "low": Source("low", "0.1.0", "low-v0.1.0"),
    }


def test_reads_a_tagged_siblings_pins_from_its_tag(repo: Path) -> None:
    # mid 0.1.0 (tagged) accepted low 0.1.0; the tree's mid 0.2.0 needs low 0.1.1.
    write_package(repo, "mid", "0.1.0", ["low>=0.1.0,<0.2"])
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "mid")
    git(repo, "tag", "mid-v0.1.0")
    git(repo, "tag", "low-v0.1.0")
    write_package(repo, "low", "0.1.1")
    write_package(repo, "mid", "0.2.0", ["low>=0.1.1,<0.2"])
    write_package(repo, "up", "0.1.0", ["mid>=0.1.0,<0.3", "low>=0.1.0,<0.2"])
    assert lowest.plan_lowest(repo, folders(repo), "up") == {
        "mid": Source("mid", "0.1.0", "mid-v0.1.0"),
        "low": Source("low", "0.1.0", "low-v0.1.0"),
    }


def test_lowest_versions_that_cannot_install_together_are_refused(repo: Path) -> None:
    git(repo, "tag", "low-v0.1.0")
    write_package(repo, "low", "0.1.1")
    write_package(repo, "mid", "0.1.0", ["low>=0.1.1,<0.2"])
    write_package(repo, "up", "0.1.0", ["mid>=0.1.0,<0.2", "low>=0.1.0,<0.2"])
    with pytest.raises(PinError) as error:
        lowest.plan_lowest(repo, folders(repo), "up")
    assert "mid 0.1.0 (working tree) pins 'low>=0.1.1,<0.2', which excludes low 0.1.0" in str(
        error.value
    )
    assert "raise up's lower bound on low to 0.1.1" in str(error.value)


def test_export_tag_writes_that_releases_packages(repo: Path, tmp_path: Path) -> None:
    git(repo, "tag", "low-v0.1.0")
    write_package(repo, "low", "0.1.1")
    packages = lowest.export_tag(repo, "low-v0.1.0", tmp_path / "export")
    assert lowest.tree_version(packages["low"].folder) == "0.1.0"
    assert packages["up"].siblings == ("low",)


# The skip decision and the repository itself


def test_skips_only_when_every_sibling_comes_from_the_working_tree() -> None:
    tree = Source("pytree-module", "0.1.0")
    tagged = Source("pytree-filter", "0.1.0", "pytree-filter-v0.1.0")
    assert lowest.covered_by_isolation({"pytree-module": tree})
    assert not lowest.covered_by_isolation({"pytree-module": tree, "pytree-filter": tagged})


def test_repository_pins_resolve_and_are_covered_by_the_isolation_check() -> None:
    # The bump tool moves every lower bound to the new version, so today each lowest pin is the
    # working tree's version (as test_bump_version checks) and CI skips every package.
    repo_folders = folders(REPO)
    plans = {name: lowest.plan_lowest(REPO, repo_folders, name) for name in repo_folders}
    assert plans["pytree-filter"] == {}
    assert sorted(plans["pytree-module"]) == ["pytree-filter"]
    assert sorted(plans["pytree-nn"]) == [
        "pytree-filter",
        "pytree-graph",
        "pytree-module",
        "pytree-transforms",
    ]
    assert all(lowest.covered_by_isolation(sources) for sources in plans.values())


def test_unknown_package_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert lowest.main(["--package", "pytree-nope"]) == 2
    assert "unknown package(s) pytree-nope; known:" in capsys.readouterr().out


def test_main_fails_naming_the_missing_tag(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lowest.check_isolation, "ROOT", repo)
    assert lowest.main(["--package", "up"]) == 0
    assert "ok   up: same wheels as the isolation check: covered there" in capsys.readouterr().out
    write_package(repo, "low", "0.1.1")
    assert lowest.main([]) == 1
    output = capsys.readouterr().out
    assert "ok   low: pins no sibling: nothing to check" in output
    assert "FAIL up\n     up pins 'low>=0.1.0,<0.2'" in output
    assert "no git tag low-v0.1.0" in output
    assert "lowest-versions check failed for 1 of 2 package(s)" in output
