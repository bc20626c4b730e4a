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
{{- dict "kv_connector" $c.className "kv_connector_module_path" $c.modulePath "kv_role" $c.role "kv_load_failure_policy" "recompute" "kv_connector_extra_config" (merge (dict "agent_address" (include "pallas-agent.connectorAddress" .)) (default dict $c.extraConfig)) | toJson -}}
{{- end -}}

{{/* The TLS Secret: tls.secretName, else one per agent, <fullname>-tls. */}}
{{- define "pallas-agent.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "pallas-agent.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{/* The pod's ServiceAccount. */}}
{{- define "pallas-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pallas-agent.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The directory: the agent ids this agent admits as PeerTransfer callers and migration
     targets (keys of agent.peerFronts and agent.peerIdentities), sorted, once each. */}}
{{- define "pallas-agent.directory" -}}
{{- concat (keys .Values.agent.peerFronts) .Values.agent.peerIdentities | uniq | sortAlpha | join "," -}}
{{- end -}}

{{/* Refuse values that render a pod which would never migrate. */}}
{{- define "pallas-agent.validate" -}}
{{- $dir := include "pallas-agent.directory" . -}}
{{- if and .Values.tls.enabled (not $dir) -}}
{{- fail (printf "agent.peerFronts or agent.peerIdentities must name the other agents: with tls.enabled the agent admits as migration targets and PeerTransfer callers only the agents listed there, so with none every migration is refused. Set e.g. --set agent.peerFronts.edge-b=http://pallas-agent-edge-b.%s.svc.cluster.local:%v (or tls.enabled=false, plaintext)" .Release.Namespace .Values.agent.frontPort) -}}
{{- end -}}
{{- if has .Values.agentId (splitList "," $dir) -}}
{{- fail (printf "agent.peerFronts/agent.peerIdentities list this agent's own id %q: the directory names the other agents" .Values.agentId) -}}
{{- end -}}
{{- end -}}
