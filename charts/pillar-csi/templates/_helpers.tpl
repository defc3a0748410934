{{/* The chart name, or nameOverride. */}}
{{- define "pillar-csi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<name>, or the release alone when it already contains the name; fullnameOverride wins. */}}
{{- define "pillar-csi.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "pillar-csi.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespace of every namespaced object. */}}
{{- define "pillar-csi.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* A component's object name: <fullname>-<component>. */}}
{{- define "pillar-csi.componentName" -}}
{{- printf "%s-%s" (include "pillar-csi.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select a component's pods (call with dict "root" $ "component" "agent"). */}}
{{- define "pillar-csi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pillar-csi.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every object's labels (call with dict "root" $ "component" "agent"). */}}
{{- define "pillar-csi.labels" -}}
{{ include "pillar-csi.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: pillar-csi
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The pillar-csi image. */}}
{{- define "pillar-csi.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* mTLS is on unless mtls.insecurePlaintext says otherwise. */}}
{{- define "pillar-csi.mtls.enabled" -}}
{{- if not .Values.mtls.insecurePlaintext -}}true{{- end -}}
{{- end -}}

{{/* cert-manager issues the certificates (mTLS on and certManager.enabled). */}}
{{- define "pillar-csi.mtls.certManager" -}}
{{- if and (not .Values.mtls.insecurePlaintext) .Values.mtls.certManager.enabled -}}true{{- end -}}
{{- end -}}

{{/* The agent's server Secret. */}}
{{- define "pillar-csi.mtls.agentSecret" -}}
{{- if include "pillar-csi.mtls.certManager" . -}}
{{- printf "%s-mtls" (include "pillar-csi.componentName" (dict "root" . "component" "agent")) -}}
{{- else -}}
{{- .Values.mtls.agentSecretName -}}
{{- end -}}
{{- end -}}

{{/* The controller's client Secret. */}}
{{- define "pillar-csi.mtls.controllerSecret" -}}
{{- if include "pillar-csi.mtls.certManager" . -}}
{{- printf "%s-mtls" (include "pillar-csi.componentName" (dict "root" . "component" "controller")) -}}
{{- else -}}
{{- .Values.mtls.controllerSecretName -}}
{{- end -}}
{{- end -}}

{{/* The name agent certificates are issued for; empty: the PillarAgent's address. */}}
{{- define "pillar-csi.mtls.serverName" -}}
{{- if include "pillar-csi.mtls.certManager" . -}}
{{- printf "%s.%s.svc" (include "pillar-csi.componentName" (dict "root" . "component" "agent")) (include "pillar-csi.namespace" .) -}}
{{- else -}}
{{- .Values.mtls.serverName -}}
{{- end -}}
{{- end -}}

{{/* A YAML list of RBAC rules from files/rbac/<name>.yaml, indented for a rules: key. */}}
{{- define "pillar-csi.rules" -}}
{{- $rules := list -}}
{{- range .files -}}
{{- $rules = concat $rules ($.root.Files.Get (printf "files/rbac/%s.yaml" .) | fromYamlArray) -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end -}}

{{/* The host folders that hold filesystem volumes, as a JSON list:
agent.nfs.hostPaths, or /<pool>/<parentDataset> of each zfsDataset backend;
then the path of each directory backend. */}}
{{- define "pillar-csi.agent.filesystemPaths" -}}
{{- $paths := list -}}
{{- if .Values.agent.nfs.hostPaths -}}
{{- $paths = .Values.agent.nfs.hostPaths -}}
{{- else -}}
{{- range .Values.agent.backends -}}
{{- with .zfsDataset -}}
{{- $paths = append $paths (printf "/%s" (trimSuffix "/" (printf "%s/%s" .pool (default "" .parentDataset)))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range .Values.agent.backends -}}
{{- with .directory -}}
{{- $paths = append $paths .path -}}
{{- end -}}
{{- end -}}
{{- toJson $paths -}}
{{- end -}}
