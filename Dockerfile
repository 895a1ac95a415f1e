# The image every job of workflow/profiles/kubernetes runs in: the exact environment of
# requirements.lock (the same pins and pip flags as scripts/env.sh), the Snakemake plugins
# pinned in workflow/profiles/kubernetes/requirements.txt, and the project's code.
#
#   docker build -t ghcr.io/<you>/fedskew:$(git rev-parse --short HEAD) .
#   docker push ghcr.io/<you>/fedskew:$(git rev-parse --short HEAD)
#
# Building needs the package index (PyPI) and nothing else. torch from PyPI carries its
# CUDA libraries, so the same image trains on CPU or on a GPU node (an NVIDIA driver recent
# enough for CUDA 13 on the node). Pin the base image by digest for byte-identical rebuilds.
FROM python:3.11-slim

ENV VIRTUAL_ENV=/opt/fedskew/venv \
    PATH=/opt/fedskew/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLBACKEND=Agg

# Non-root user; uid 1000 must be able to write the profile's shared volume.
RUN groupadd --gid 1000 fedskew && useradd --uid 1000 --gid 1000 --create-home fedskew

# The environment first, so code changes reuse this layer. As in scripts/env.sh: local pip
# configuration and extra indexes are ignored and every pin is installed with --no-deps,
# so torch and torchvision are the matching pair from the one index.
COPY requirements.lock /opt/fedskew/requirements.lock
COPY workflow/profiles/kubernetes/requirements.txt /opt/fedskew/requirements-kubernetes.txt
RUN python -m venv "$VIRTUAL_ENV" \
 && env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
      "$VIRTUAL_ENV/bin/python" -m pip install --quiet --no-cache-dir --no-deps \
        -r /opt/fedskew/requirements.lock -r /opt/fedskew/requirements-kubernetes.txt \
 && "$VIRTUAL_ENV/bin/python" -m pip check \
 && "$VIRTUAL_ENV/bin/python" -c 'import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)' \
 && env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
      "$VIRTUAL_ENV/bin/python" -m pip download --quiet --no-cache-dir -d /opt/fedskew/wheels \
        -c /opt/fedskew/requirements.lock -r /opt/fedskew/requirements-kubernetes.txt

# Before each Kubernetes job Snakemake runs `pip install --target .snakemake/pip-deployments
# snakemake-storage-plugin-s3`. These settings make that install come from the wheels saved
# above (the same pins, no index), so pods need no access to PyPI.
ENV PIP_NO_INDEX=1 \
    PIP_FIND_LINKS=/opt/fedskew/wheels

# The code. Kubernetes jobs run in /workdir on the sources Snakemake ships with each job;
# this copy serves `docker run` and keeps the image self-contained.
WORKDIR /opt/fedskew/project
COPY --chown=1000:1000 params.yaml dvc.yaml pyproject.toml ./
COPY --chown=1000:1000 src/ src/
COPY --chown=1000:1000 workflow/ workflow/
ENV PYTHONPATH=/opt/fedskew/project/src \
    HOME=/home/fedskew

USER 1000:1000

# No ENTRYPOINT: the Kubernetes plugin starts every job as `/bin/sh -c "<snakemake job>"`.
CMD ["python", "-m", "fedskew", "--help"]
