{{/* Name of every object: pallas-agent-<agentId>, or fullnameOverride. */}}
{{- define "pallas-agent.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Chart.Name .Values.agentId | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select this agent's pod. */}}
{{- define "pallas-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
pallas.io/agent-id: {{ .Values.agentId | quote }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "pallas-agent.labels" -}}
{{ include "pallas-agent.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: edge-agent
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The image both containers run. */}}
{{- define "pallas-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The loopback address where the agent listens for its KV connector. */}}
{{- define "pallas-agent.connectorAddress" -}}
{{- printf "tcp://127.0.0.1:%d" (int .Values.vllm.kvConnector.agentPort) -}}
{{- end -}}

{{/* vLLM's --kv-transfer-config JSON. kv_load_failure_policy is always "recompute": the agent
     refuses to run beside a vLLM whose connector reports anything else (agent/app.py
     check_load_failure_policy; under vLLM's default "fail" a KV block that fails to load at a
     resume fails the UE's request). */}}
{{- define "pallas-agent.kvTransferConfig" -}}
{{- $c := .Values.vllm.kvConnector -}}
{{- dict "kv_connector" $c.className "kv_connector_module_path" $c.modulePath "kv_role" $c.role "kv_load_failure_policy" "recompute" "kv_connector_extra_config" (dict "agent_address" (include "pallas-agent.connectorAddress" .)) | toJson -}}
{{- end -}}
