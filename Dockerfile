# The slotshift services in one image: `slotshift controlplane|gateway|agent|engine-sim`.
#   docker build -t slotshift:0.1.0 .
#   docker run --rm -v "$PWD/deploy/local:/etc/slotshift/config:ro" slotshift:0.1.0 engine-sim
# Kubernetes manifests: deploy/kubernetes; one host: deploy/compose/compose.yaml.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/slotshift
WORKDIR /src
# Dependencies first, from the lock, in their own layer: a change to the code alone reuses it.
COPY requirements/constraints.txt requirements/constraints.txt
COPY pyproject.toml README.md ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/dependencies.txt \
    && /opt/slotshift/bin/pip install -c requirements/constraints.txt -r /tmp/dependencies.txt
COPY slotshift slotshift
COPY slotshift_tools slotshift_tools
COPY controlplane controlplane
COPY admission_gateway admission_gateway
COPY telemetry_agent telemetry_agent
COPY engine_sim engine_sim
RUN /opt/slotshift/bin/pip install --no-deps -c requirements/constraints.txt . \
    && /opt/slotshift/bin/slotshift --help > /dev/null

FROM ${PYTHON_IMAGE}
# The same uid as the Kubernetes manifests' runAsUser, so files mounted for it are readable here;
# /var/lib/slotshift is the control plane's state (a volume mounts there; new volumes copy its owner).
RUN groupadd --system --gid 10001 slotshift \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin slotshift \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/slotshift
COPY --from=builder /opt/slotshift /opt/slotshift
# The root filesystem is read-only in the cluster: no bytecode written at run time (pip compiled
# it at install), logs straight to stdout.
ENV PATH=/opt/slotshift/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SLOTSHIFT_CONFIG=/etc/slotshift/config/slotshift.yaml
WORKDIR /opt/slotshift
USER 10001:10001
# gateway 8080, engine-sim 8000, control plane gRPC 50051 and metrics 9100, agent metrics 9101.
EXPOSE 8080 8000 50051 9100 9101
ENTRYPOINT ["slotshift"]
CMD ["--help"]
