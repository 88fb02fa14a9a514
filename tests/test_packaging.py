"""pyproject.toml and environment.yml must declare the same dependencies; doctor must work."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from labkit import doctor

REPO = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["test"] \
        + project["optional-dependencies"]["embed"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pip = [r for r in pip_section if not r.startswith("-e")]
    assert sorted(conda_pip) == sorted(declared)  # same names *and* the same version ranges
    assert {_name(r) for r in declared} >= {"torch", "numpy", "matplotlib", "ipywidgets",
                                            "jupyterlab", "papermill", "ipykernel", "psutil",
                                            "nvidia-ml-py", "pytest"}


def test_doctor_lists_runtime_requirements_without_extras():
    names = doctor.required_packages()
    assert "torch" in names and "papermill" in names
    assert "pytest" not in names  # test extra only


def test_doctor_runs_without_a_gpu():
    out = subprocess.run([sys.executable, "-m", "labkit", "doctor"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert "nvml" in out.stdout


def test_doctor_fails_clearly_when_a_package_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "required_packages", lambda: ["torch", "no-such-package-xyz"])
    assert doctor.main() == 1
    err = capsys.readouterr().err
    assert "no-such-package-xyz" in err and "make setup" in err


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci


def test_work_copies_never_overwrite_a_learners_edits(tmp_path):
    from labkit import notebooks

    src = tmp_path / "src"
    src.mkdir()
    for name in ("00_a.ipynb", "01_b.ipynb"):
        (src / name).write_text("{}")
    work = tmp_path / "work"
    assert [p.name for p in notebooks.make_work_copies(work, src)] == ["00_a.ipynb", "01_b.ipynb"]
    (work / "00_a.ipynb").write_text("edited")
    assert notebooks.make_work_copies(work, src) == []
    assert (work / "00_a.ipynb").read_text() == "edited"
