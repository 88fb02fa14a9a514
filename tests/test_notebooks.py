"""Every notebook runs headless in smoke mode; committed notebooks are clean.

New notebooks in notebooks/ are picked up automatically. Executed copies go to build/.
"""

import os
from pathlib import Path

import nbformat
import papermill as pm
import pytest

from labkit import exercise, ledger, notebooks

NOTEBOOKS = notebooks.discover()
BUILD = Path(__file__).resolve().parent.parent / "build"
PER_NOTEBOOK_TIMEOUT_S = 300


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.fixture(scope="session")
def kernel():
    notebooks.ensure_kernel(notebooks.KERNEL_NAME)
    return notebooks.KERNEL_NAME


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_clean(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "a notebook without code cells"
    assert "parameters" in code[0].metadata.get("tags", []), "first code cell must be tagged 'parameters'"
    assert 'SIZE = "auto"' in code[0].source and 'DEVICE = "auto"' in code[0].source
    for cell in code:
        assert not cell.outputs and cell.execution_count is None, "commit notebooks without outputs"
    assert nb.metadata.get("kernelspec", {}).get("name") == notebooks.KERNEL_NAME


def _servers(marker: str) -> set[int]:
    """Pids of `labkit serve` processes (and their document stores, `labkit/serve/docstore.py`)
    still running that this test started: they inherit
    LABKIT_TEST_RUN=`marker` through the kernel, so other people's servers on a shared
    machine are not counted."""
    import psutil

    out = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ("labkit.serve" in cmd or "docstore" in cmd) and "--port-file" in cmd:
            try:
                if p.environ().get("LABKIT_TEST_RUN") == marker:
                    out.add(p.info["pid"])
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
    return out


@pytest.mark.timeout(PER_NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(path, kernel, monkeypatch):
    marker = f"{path.stem}-{os.getpid()}"
    monkeypatch.setenv("LABKIT_TEST_RUN", marker)  # the kernel and any server it starts inherit it
    monkeypatch.setenv(exercise.SELFTEST_ENV, "1")  # every exercise's reference answer must pass its check here
    result = notebooks.run_notebook(path, BUILD, size="smoke", kernel=kernel,
                                    timeout_s=PER_NOTEBOOK_TIMEOUT_S)
    assert result.output.exists()
    left = _servers(marker)
    assert not left, f"{path.stem} left labkit serve processes running: pids {sorted(left)}"
    # Every claim this notebook owns must have been recorded through labkit.ledger.
    wanted = ledger.for_notebook(path.stem)
    recorded = {v.claim for v in ledger.read(path.stem, BUILD)}
    missing = [c for c in wanted if c not in recorded]
    assert not missing, f"{path.stem} recorded no verdict for {missing} (it recorded {sorted(recorded)})"


@pytest.mark.timeout(120)
def test_bad_size_fails_with_the_allowed_values(kernel, tmp_path):
    first = NOTEBOOKS[0]
    with pytest.raises(pm.PapermillExecutionError) as err:
        pm.execute_notebook(str(first), str(tmp_path / first.name), parameters={"SIZE": "huge"},
                            kernel_name=kernel, cwd=str(first.parent), progress_bar=False)
    msg = str(err.value)
    assert "huge" in msg and all(c in msg for c in ("smoke", "full", "auto"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_names_no_build_folder(path):
    """Side files go to `Session.out` (the --out folder), never to a path written in the notebook."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert "build/" not in cell.source, f"{path.stem}: write side files under run.out, not build/"


@pytest.mark.timeout(PER_NOTEBOOK_TIMEOUT_S)
def test_side_files_go_to_the_out_folder(kernel, tmp_path):
    """03 writes a profiler trace: with --out elsewhere it lands there and build/ is left alone."""
    import time

    path = next(p for p in NOTEBOOKS if p.stem.startswith("03"))
    trace = "03_decode_step_trace.json"
    start = time.time()
    notebooks.run_notebook(path, tmp_path, size="smoke", kernel=kernel, timeout_s=PER_NOTEBOOK_TIMEOUT_S)
    assert (tmp_path / trace).exists()
    assert (tmp_path / "ledger" / f"{path.stem}.json").exists()
    for f in (BUILD / trace, BUILD / "ledger" / f"{path.stem}.json"):
        assert not f.exists() or f.stat().st_mtime < start, f"the run with out={tmp_path} wrote {f}"
