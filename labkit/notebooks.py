"""Run the workbook's notebooks headless with papermill (used by the CLI and the tests)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from labkit import paths
from labkit.paths import NOTEBOOKS, REPO

KERNEL_NAME = "labkit"


def discover(directory: Path = NOTEBOOKS) -> list[Path]:
    """Every ``NN_topic.ipynb`` in `directory`, in chapter order."""
    return sorted(p for p in directory.glob("*.ipynb") if not p.name.startswith("."))


def make_work_copies(work: Path = REPO / "work", source: Path = NOTEBOOKS) -> list[Path]:
    """Copy every notebook that `work` lacks into it, and return the copies made.

    `make lab` opens JupyterLab on these copies: the learner's edits and outputs stay in
    work/ (git-ignored) and the committed notebooks stay clean. An existing copy is never
    overwritten; delete it to start that chapter afresh.
    """
    work.mkdir(parents=True, exist_ok=True)
    made = []
    for nb in discover(source):
        if not (work / nb.name).exists():
            shutil.copy2(nb, work / nb.name)
            made.append(work / nb.name)
    return made


def ensure_kernel(name: str = KERNEL_NAME) -> None:
    """Register a Jupyter kernel `name` for this Python if none exists yet.

    `make setup` registers it already; this keeps the tests and the CLI working in
    an environment that was set up by hand.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        from ipykernel.kernelspec import install

        install(kernel_name=name, display_name=f"Python ({name})", prefix=sys.prefix)


@dataclasses.dataclass
class RunResult:
    name: str
    ok: bool
    seconds: float
    output: Path
    error: str | None = None


def _local_kernel_manager() -> type:
    """A kernel manager that talks to the kernel over Unix sockets in a private temporary
    folder instead of loopback TCP: nothing else on the machine can connect, and ipykernel
    has no reason to warn that the channel is unencrypted."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Unicode

    class LocalKernelManager(AsyncKernelManager):
        transport = Unicode("ipc")
        ip = Unicode(str(Path(tempfile.mkdtemp(prefix="labkit-kernel-")) / "kernel"))

        async def _async_interrupt_kernel(self) -> None:
            # jupyter_client interrupts the kernel before asking it to shut down; after a run
            # it is idle, and the SIGINT only makes it log "KeyboardInterrupt caught in
            # kernel". A kernel that ignores the shutdown request is still killed after 1 s.
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return LocalKernelManager


def run_notebook(path: Path, out_dir: Path, *, size: str = "smoke", kernel: str = KERNEL_NAME,
                 timeout_s: float = 600, html: bool = False) -> RunResult:
    """Execute one notebook with SIZE=`size`; the executed copy goes to `out_dir`.

    Raises papermill's PapermillExecutionError on a cell error (the message names
    the failing cell and exception); `timeout_s` is the per-cell limit in seconds.
    """
    import papermill as pm

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    # The kernel inherits this: side files (ledger verdicts, plots) go next to the executed copy.
    os.environ[paths.OUT_ENV] = str(out_dir.resolve())
    t0 = time.perf_counter()
    pm.execute_notebook(str(path), str(out), parameters={"SIZE": size}, kernel_name=kernel,
                        execution_timeout=timeout_s, cwd=str(path.parent), progress_bar=False,
                        kernel_manager_class=_local_kernel_manager())
    if html:
        from labkit import book

        book.copy_mathjax(out_dir)
        book.export_page(out, out_dir)
    return RunResult(path.stem, True, time.perf_counter() - t0, out)


def run_all(size: str = "auto", out_dir: str | Path = "build", kernel: str = KERNEL_NAME,
            html: bool = True, only: list[str] | None = None) -> list[RunResult]:
    """Execute every notebook (or those whose name starts with one of `only`); with `html`,
    also the offline HTML book (`labkit.book`): one page per notebook and index.html."""
    ensure_kernel(kernel)
    results = []
    for path in discover():
        if only and not any(path.name.startswith(p) for p in only):
            continue
        t0 = time.perf_counter()
        try:
            results.append(run_notebook(path, Path(out_dir), size=size, kernel=kernel, html=html))
        except Exception as exc:  # report every notebook, then fail at the end
            msg = str(exc).strip().splitlines()
            results.append(RunResult(path.stem, False, time.perf_counter() - t0,
                                     Path(out_dir) / path.name, msg[-1] if msg else repr(exc)))
    if html and results:
        from labkit import book

        index = book.write_index(Path(out_dir), [(r.name, r.seconds, r.ok) for r in results],
                                 Path(out_dir) / "ledger")
        print(f"book: {index} (works offline)")
    return results
