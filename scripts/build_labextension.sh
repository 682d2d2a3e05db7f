#!/usr/bin/env bash
# Builds the NotebookOS JupyterLab / Notebook 7 extension (labextension/) and installs it into a JupyterLab
# virtualenv (default .venv-lab): `npm ci` from labextension/package-lock.json (JupyterLab's extension builder,
# @jupyterlab/builder, and nothing else), `jupyter-builder build` against that environment's own JupyterLab,
# then `pip install` (the prebuilt extension, the server extension and the config file that enables it).
# Called by scripts/bootstrap.sh; skipped when the sources are unchanged since the last install into that venv.
# Exit status 3: Node.js 20+ and npm are needed and missing (the bootstrap installs them with apt, or says so).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-lab}"
ext=labextension

say() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] error: %s\n' "$*" >&2; exit 1; }

digest="$(cat "$ext/package.json" "$ext/package-lock.json" "$ext/pyproject.toml" "$ext"/src/*.js "$ext"/style/* \
    "$ext"/jupyter_notebookos_lab/*.py "$ext"/jupyter-config/*/*.json | sha256sum | cut -c1-16)"
stamp="$venv/.notebookos-lab-$digest"
[ -f "$stamp" ] && exit 0
command -v npm >/dev/null 2>&1 || exit 3
[ "$(node -e 'process.stdout.write(process.versions.node.split(".")[0])')" -ge 20 ] || exit 3

say "building the NotebookOS JupyterLab extension into $venv"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
(cd "$ext" && npm ci --no-audit --no-fund --loglevel=error) >"$log" 2>&1 ||
    { cat "$log" >&2; die "npm could not install JupyterLab's extension builder (see the output above)"; }
# The builder reads which packages JupyterLab shares (and at which versions) from the JupyterLab it builds for.
core="$("$venv/bin/python" -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging", "package.json"))')"
PATH="$(dirname "$(command -v node)"):$PATH" "$venv/bin/jupyter-builder" build --core-package-file "$core" "$ext" >"$log" 2>&1 ||
    { cat "$log" >&2; die "the JupyterLab extension did not build (see the output above)"; }
"$venv/bin/python" -m pip install -q --no-deps "./$ext" >"$log" 2>&1 ||
    { cat "$log" >&2; die "pip could not install the JupyterLab extension into $venv (see the output above)"; }
rm -f "$venv"/.notebookos-lab-*
touch "$stamp"
