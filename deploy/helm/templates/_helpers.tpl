{{/* The chart name, for the app.kubernetes.io/name label. */}}
{{- define "portwise.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every object: the release name when it contains the chart
name (a release `portwise` gives the base's names: portwise,
portwise-metrics, portwise-leader-election, ...), else RELEASE-NAME.
*/}}
{{- define "portwise.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "portwise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "portwise.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "portwise.labels" -}}
{{ include "portwise.selectorLabels" . }}
app.kubernetes.io/part-of: portwise
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "portwise.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "portwise.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "portwise.leaseName" -}}
{{- default (include "portwise.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* The ConfigMap mounted at modulesDir, or "" for none. */}}
{{- define "portwise.modulesConfigMap" -}}
{{- if .Values.modules.existingConfigMap }}
{{- .Values.modules.existingConfigMap }}
{{- else if .Values.modules.create }}
{{- printf "%s-modules" (include "portwise.fullname" .) }}
{{- end }}
{{- end }}

{{- define "portwise.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/* Refuses values that cannot work; included by the Deployment. */}}
{{- define "portwise.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled=true: without it every replica writes" }}
{{- end }}
{{- if .Values.modules.oci }}
{{- fail "modules.oci is reserved for a later change: portwise cannot load modules from OCI registries yet; use modules.binaryData or modules.existingConfigMap" }}
{{- end }}
{{- if not .Values.config.modulesDir }}
{{- if or .Values.modules.binaryData .Values.modules.existingConfigMap }}
{{- fail "modules are given but config.modulesDir is empty: portwise would not load them" }}
{{- end }}
{{- end }}
{{- end }}
