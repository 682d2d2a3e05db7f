# NotebookOS replica (kernel) image: one replica of a kernel per pod, started as `python -m jupyter_notebookos.kernel`.
# s3fs is included (extra "s3") so replicas can use an S3-compatible object store (AWS_ENDPOINT_URL from the chart).
# GPUs come from the NVIDIA container runtime (runtimeClassName nvidia), which injects the driver; CUDA user-space
# libraries come with the frameworks' wheels (e.g. torch), so the base stays python:3.11-slim.
# Build from the repository root:
#   docker build -f docker/kernel.Dockerfile -t registry.example.com/notebookos/kernel:0.1.0 .
#   docker build -f docker/kernel.Dockerfile --build-arg EXTRA_PACKAGES="torch==2.5.1" -t .../kernel:0.1.0-cuda12 .
FROM python:3.11-slim

ARG EXTRA_PACKAGES=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

WORKDIR /opt/notebookos
COPY requirements/gateway.txt requirements/gateway.txt
COPY pyproject.toml setup.cfg ./
COPY jupyter_notebookos/ jupyter_notebookos/
# jovyan (1000) in group users (100): the uid/gid EG's kernel images use, and what fsGroup 100 expects.
RUN touch README.md \
    && pip install --constraint requirements/gateway.txt ".[s3]" \
    && if [ -n "$EXTRA_PACKAGES" ]; then pip install $EXTRA_PACKAGES; fi \
    && useradd --uid 1000 --gid 100 --create-home --shell /bin/bash jovyan

USER 1000:100
WORKDIR /home/jovyan
CMD ["python", "-m", "jupyter_notebookos.kernel"]
