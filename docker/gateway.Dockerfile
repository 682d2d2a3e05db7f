# NotebookOS gateway: Enterprise Gateway 3.3 + jupyter_notebookos (Python 3.11: EG 3.3 pins jupyter_server<2).
# Build from the repository root:
#   docker build -f docker/gateway.Dockerfile -t registry.example.com/notebookos/gateway:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/notebookos
# Constraints first: the pinned stack is a layer of its own, rebuilt only when the pins change.
COPY requirements/gateway.txt requirements/gateway.txt
COPY pyproject.toml setup.cfg ./
COPY jupyter_notebookos/ jupyter_notebookos/
# pyproject.toml names a README; an empty one is enough to build the wheel.
RUN touch README.md \
    && pip install --constraint requirements/gateway.txt ".[s3]" \
    && useradd --uid 1000 --gid 100 --create-home --shell /usr/sbin/nologin notebookos

USER 1000:100
WORKDIR /home/notebookos
EXPOSE 8888
ENTRYPOINT ["python", "-m", "jupyter_notebookos.gateway"]
CMD ["--ip=0.0.0.0", "--port=8888"]
