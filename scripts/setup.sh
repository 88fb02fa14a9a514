#!/usr/bin/env bash
# Set up (or refresh) the labkit environment: venv, torch, labkit + test extra, Jupyter kernel.
#
#   LABKIT_VENV=.venv     where the virtual environment lives; "active" = use the current python
#   LABKIT_TORCH=spec     torch requirement to install when torch is missing (overrides the default)
#   LABKIT_TORCH_ARGS=..  extra pip arguments for that torch install (e.g. a CPU wheel index)
#
# torch is installed first and on its own: on a machine without an NVIDIA GPU that is the
# pinned CPU build (torch==2.13.0), so nothing later can pull a multi-GB CUDA build. A torch
# that is already installed (your CUDA build, say) is kept as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${LABKIT_VENV:-.venv}
if [ "$VENV" = "active" ]; then
  PY=$(command -v python || command -v python3)
else
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  PY="$VENV/bin/python"
fi
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

if "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: keeping installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  if [ -n "${LABKIT_TORCH:-}" ]; then spec=$LABKIT_TORCH
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then spec="torch"
  else spec="torch==2.13.0"; fi
  echo "setup: installing $spec"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q "$spec" ${LABKIT_TORCH_ARGS:-} 2>&1 | quiet
fi
echo "setup: installing labkit with its test and embed extras"
"$PY" -m pip install -q -e ".[test,embed]" 2>&1 | quiet
"$PY" -m ipykernel install --sys-prefix --name labkit --display-name "Python (labkit)" >/dev/null
"$PY" -m labkit doctor >/dev/null || { "$PY" -m labkit doctor; exit 1; }
echo "setup: done (kernel 'labkit' registered in $("$PY" -c 'import sys; print(sys.prefix)'))"
